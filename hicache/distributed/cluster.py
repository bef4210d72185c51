"""`SimulatedCluster`: the N ranks of one tensor-parallel cache, in one process.

    cluster = SimulatedCluster(config, size=2)            # every rank's C0 runs here
    cluster.run(lambda ctl: ctl.admit(1, prompt))         # one step, on every rank
    cluster.check()                                       # I7, I8, I10, I11 (invariants/ranks.py)
    cluster.close()

Each rank is a `CacheController` of the same configuration with its own data plane (`engine`:
a factory, by rank; default: the config's), its own fault injector (`faults`, by rank:
independent per-rank faults) and its own tracer; the ranks meet only at the agreement
points, through a `ThreadGroup`. A step that fails on one rank ends the step on every rank
(`ThreadGroup.run` re-raises the root cause); the cluster is then broken (its ranks' collective
counts differ) and is closed and rebuilt by the caller, as a job whose rank died restarts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from hicache.controller.config import CacheConfig
from hicache.controller.controller import CacheController
from hicache.core.snapshot import RankView
from hicache.core.trace import Tracer
from hicache.dataplane.faults import FaultInjector, SimulatedCrash
from hicache.dataplane.plane import DataPlane
from hicache.distributed.rankview import rank_view
from hicache.distributed.simulated import ThreadGroup
from hicache.invariants import Violation, check_ranks

T = TypeVar("T")


class SimulatedCluster:
    """`size` rank controllers of `config` in lockstep (module docstring)."""

    def __init__(
        self,
        config: CacheConfig | Sequence[CacheConfig],
        size: int,
        *,
        engine: Callable[[int], DataPlane] | None = None,
        faults: Callable[[int], FaultInjector | None] | None = None,
        tracer: Callable[[int], Tracer | None] | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        """`config`: one for every rank, or one per rank (C0 refuses a difference with a
        ConfigError naming the field)."""
        configs = list(config) if isinstance(config, Sequence) else [config] * size
        if len(configs) != size:
            raise ValueError(f"{len(configs)} configs for {size} ranks")
        self.group = ThreadGroup(size, timeout_s)
        self.size = size

        def build(rank: int) -> CacheController:
            return CacheController(
                configs[rank],
                faults=faults(rank) if faults else None,
                tracer=tracer(rank) if tracer else None,
                engine=engine(rank) if engine else None,
                collectives=self.group.member(rank),
            )

        self.ranks: list[CacheController] = self.group.run(build)

    def run(self, fn: Callable[[CacheController], T]) -> list[T]:
        """`fn(rank's controller)` on every rank at once; the results by rank."""
        return self.group.run(lambda rank: fn(self.ranks[rank]))

    def views(self) -> list[RankView]:
        return [rank_view(c) for c in self.ranks]

    def check(self) -> list[Violation]:
        """The cross-rank invariants over every rank's view now."""
        return check_ranks(self.views())

    def close(self) -> None:
        """Close every rank: cancel, release, end (in lockstep while the group is whole,
        each on its own once a step broke it: a dead job makes no more collectives)."""
        if self.group.failed is None:
            try:
                self.run(lambda c: c.close())
                return
            except Exception:  # a rank failed closing: close the rest alone
                pass
        abandon(self.ranks, self.group.failed)
        for c in self.ranks:
            c.close()


def abandon(ranks: Sequence[CacheController], why: str | None) -> None:
    """A step failed on some rank (`why`): the job restarts, so every rank's controller
    publishes nothing more, as after a crash (its `close` quiesces and releases only). A
    rank whose own step ended normally may be mid-way through a transfer the others never
    agreed on (its C2 or C4 was broken off): closing it normally would finish requests whose
    ops are still pending."""
    for c in ranks:
        c.hooks.crashed = c.hooks.crashed or SimulatedCrash(
            f"a step of the job failed on some rank ({why}); the job restarts"
        )


__all__ = ["SimulatedCluster", "abandon"]
