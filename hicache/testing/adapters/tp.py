"""A tensor-parallel cache as one `CacheUnderTest`: N controller ranks in lockstep.

Each rank is a `ControllerAdapter` (on the null, CPU or CUDA plane: on CUDA each rank its
own GPU when there is one per rank, else all on one) with its own fault injector, over one
`ThreadGroup`; every protocol call runs on every rank at once (`_all`), so the ranks meet at
the agreement points of spec/tp.toml as a real TP cache's processes do. What the machine
observes is rank 0's, after checking that every rank observed the same (admissions, ready,
prefill outcomes); `check` adds the cross-rank invariants (I7, I8, I10, I11) to every rank's
own checks, and C4's `landed` rule over every collective step (tplanded.py). Faults are
per rank and independent:

    faults rule (schedules)   every rank draws the same rates with its own seed: a refused
                              reservation, a failed or late completion on one rank only (F15)
    aim, fail                 one rank, in turn (rank k of the k-th aimed fault); the TP
                              machines' `refused_on_one_rank` aims a refusal at one rank
                              while the lower tiers hold evictable nodes (F15)
    end_on_one_rank           an op done or failed (a read stopped part way too) on one
                              rank only while the others still move it: the machine
                              ticks, cancels the op's request, or both (F15, C4, C5)
    free_window(rank, pick)   a rank frees one node's sliding window alone (its own SWA memory):
                              the ranks' legal endpoints differ (F17, the min-of-maxima mutant)
    rank-local knobs          each rank its own check_mode, verify and kernels (`tp_setups`:
                              CacheConfig.RANK_LOCAL; C0 holds every other field, capacities
                              too, equal, and the SPMD rule gives every rank the same calls)

The reference model follows the cache as a whole: rank 0's page changes, and a page's window
freed while any rank has it freed (the agreed hit is legal on every rank, so it is legal for
the union of freed windows).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from hicache.core.trace import TraceEvent, TraceHeader
from hicache.distributed.cluster import abandon
from hicache.distributed.rankview import rank_view
from hicache.distributed.simulated import ThreadGroup
from hicache.errors import HiCacheError
from hicache.invariants import check_ranks
from hicache.testing.adapters.controller import ControllerAdapter, Setup
from hicache.testing.adapters.tplanded import LandedRule
from hicache.testing.protocol import (
    WINDOW_FREED,
    WINDOW_REVIVED,
    Admission,
    FaultSchedule,
    PageChange,
)

if TYPE_CHECKING:
    from hypothesis import strategies as st

T = TypeVar("T")
PLANES = ("null", "cpu", "cuda")
TIMEOUT_S = 5.0  # a collective the other ranks never reach fails the step after this long
CUDA_TIMEOUT_S = 60.0  # on CUDA: a rank's first transfers may compile kernels meanwhile
WINDOW_STATES = (WINDOW_FREED, WINDOW_REVIVED)


class RankDisagreement(HiCacheError):
    """The ranks answered one call differently (what I7 would find one step later)."""


@dataclass(frozen=True)
class TPSetup:
    """One run: the ranks' shared setup and how many ranks; `local[r]`, where given, is rank
    r's own values of fields a rank may set for itself (CacheConfig.RANK_LOCAL: check_mode,
    verify, backend, ...), over `base`'s (spec/tp.md, C0: every other field is equal)."""

    base: Setup
    size: int = 2
    local: tuple[tuple[tuple[str, Any], ...], ...] = ()

    def rank(self, r: int) -> Setup:
        """Rank `r`'s setup: `base` with its own rank-local values."""
        return replace(self.base, **dict(self.local[r])) if r < len(self.local) else self.base


class TPAdapter:
    """`setup.size` controller ranks as one cache (module docstring)."""

    tiers = ControllerAdapter.tiers

    def __init__(self, setup: TPSetup) -> None:
        if setup.base.plane not in PLANES:
            raise ValueError(
                f"plane {setup.base.plane!r}: the TP machine runs on one of {', '.join(PLANES)}"
            )
        self.setup = setup
        self.size = setup.size
        self.timeout_s = CUDA_TIMEOUT_S if setup.base.plane == "cuda" else TIMEOUT_S
        self.group = ThreadGroup(self.size, self.timeout_s)
        self.ranks: list[ControllerAdapter] = self.group.run(
            lambda r: ControllerAdapter(setup.rank(r), self.group.member(r))
        )
        self.page_size = self.ranks[0].page_size
        self.hit_window = self.ranks[0].hit_window
        self.replay_window = self.ranks[0].replay_window
        self._turn = 0  # the rank the next one-rank fault strikes
        self._extra: set[tuple[int, ...]] = set()  # pages the model has freed for other ranks
        self._landed = LandedRule()  # C4's `landed` rule, over every collective step
        self._broken: list[str] = []  # what it found (`_all`), for `check`

    # -- every rank ---------------------------------------------------------------------------

    def _all(self, fn: Callable[[ControllerAdapter], T]) -> list[T]:
        """`fn` on every rank at once; C4's `landed` rule over what it settled (tplanded)."""
        self._landed.watch(self.rank_controllers)
        out = self.group.run(lambda r: fn(self.ranks[r]))
        self._broken += self._landed.broken(self.rank_controllers)
        return out

    def _same(self, what: str, got: Sequence[T]) -> T:
        differ = [r for r, g in enumerate(got) if g != got[0]]
        if differ:
            raise RankDisagreement(
                f"{what}: rank(s) {differ} answered {got[differ[0]]!r}, rank 0 {got[0]!r}"
            )
        return got[0]

    def _next_rank(self) -> int:
        rank, self._turn = self._turn % self.size, self._turn + 1
        return rank

    @property
    def ctl(self) -> Any:
        """Rank 0's controller (the controller machine's own checks read it)."""
        return self.ranks[0].ctl

    @property
    def faults(self) -> Any:
        return self.ranks[0].faults

    def control_planes(self) -> list[Any]:
        """Every rank's control plane, in rank order: the machine's illegal calls go to one
        rank's at a time, between collective steps (each refused, nothing changed)."""
        return [a.ctl.cp for a in self.ranks]

    @property
    def rank_controllers(self) -> list[Any]:
        """Every rank's controller, in rank order (the machine's byte checks read each)."""
        return [a.ctl for a in self.ranks]

    @property
    def rank_faults(self) -> list[Any]:
        """Every rank's fault injector: a byte one rank flips in rank 0's L3 copy of a
        replicated pool is read by every rank."""
        return [a.faults for a in self.ranks]

    # -- requests -----------------------------------------------------------------------------

    def submit(self, request_id: int, tokens: Sequence[int]) -> Admission:
        return self._same(
            f"admission of request {request_id}", self._all(lambda a: a.submit(request_id, tokens))
        )

    def ready(self, request_id: int) -> bool:
        return self._same(f"ready({request_id})", self._all(lambda a: a.ready(request_id)))

    def prefill(self, request_id: int) -> bool:
        return self._same(f"prefill({request_id})", self._all(lambda a: a.prefill(request_id)))

    def finish(self, request_id: int) -> None:
        self._all(lambda a: a.finish(request_id))

    def check_ranks(self) -> None:
        """The ranks' own cross-rank check, over the collectives (C7-C9): InvariantViolation
        on every rank when their views differ."""
        self._all(lambda a: a.ctl.check_ranks())

    def cancel_restore(self, request_id: int) -> None:
        self._all(lambda a: a.cancel_restore(request_id))

    def live(self) -> set[int]:
        return self.ranks[0].live()

    def cached_len(self, request_id: int) -> int:
        return self.ranks[0].cached_len(request_id)

    def served_digests(self, request_id: int) -> list[int] | None:
        """Rank 0's (`ControllerAdapter.served_digests`: None without bytes or for a group,
        whose replicated pools I8 compares across ranks instead)."""
        return self.ranks[0].served_digests(request_id)

    # -- transfers ----------------------------------------------------------------------------

    def tick(self) -> None:
        self._all(lambda a: a.tick())

    def has_work(self) -> bool:
        return any(a.has_work() for a in self.ranks)

    def pending_ops(self) -> list[int]:
        """Ops still moving on some rank (the same op ids on every rank)."""
        return sorted({op for a in self.ranks for op in a.pending_ops()})

    def complete(self, op_id: int) -> None:
        for a in self.ranks:  # local: no collective (the next tick agrees on it)
            if op_id in a.pending_ops():
                a.complete(op_id)

    def fail(self, op_id: int, kind: str) -> None:
        """On one rank (in turn, among those still moving it): a transfer failing there only."""
        moving = [r for r, a in enumerate(self.ranks) if op_id in a.pending_ops()]
        rank = moving[self._next_rank() % len(moving)]
        self.ranks[rank].fail(op_id, kind)

    def end_on_one_rank(self, op_id: int, rank: int, how: str, landed: int = 0) -> int | None:
        """Op `op_id` ends on one rank only, the `rank`-th (modulo) of those still moving it:
        `how` "done" (per the schedule), or a failure of `ControllerAdapter.fail`'s kinds
        ("partial": an S2H that stops after `landed` anchor pages). No tick: the others
        still move it, so the next tick waits for them (C4) or, when it failed, cancels
        theirs. The request that issued the op (None: none) -- whose cancel may come first."""
        moving = [a for a in self.ranks if op_id in a.pending_ops()]
        one = moving[rank % len(moving)]
        if how == "done":
            one.complete(op_id)
        else:
            one.fail(op_id, how, landed)
        return one.ctl.cp.ops[op_id].request_id

    def evict(self, tier: str, n_pages: int) -> None:
        self._all(lambda a: a.evict(tier, n_pages))

    def set_faults(self, schedule: FaultSchedule) -> None:
        for r, a in enumerate(self.ranks):  # the same rates, each rank its own draws
            a.set_faults(replace(schedule, seed=schedule.seed * 1009 + r))

    def aim(self, action: str, tier: str) -> None:
        self.ranks[self._next_rank()].aim(action, tier)

    def damage_storage(self, how: str) -> None:
        self._all(lambda a: a.damage_storage(how))

    def drain(self) -> None:
        """Every rank's transfers end (each per its schedule); tick, in lockstep, until no
        rank has anything in flight or wanted."""
        for _ in range(64):
            if not any(a.ctl.handles or a.ctl.backups.pending for a in self.ranks):
                return
            for a in self.ranks:
                for op_id in a.pending_ops():
                    a.complete(op_id)
            self.tick()
        raise RankDisagreement("drain: transfers still pending after 64 ticks")

    def free_window(self, rank: int, pick: int) -> bool:
        """Rank `rank` alone frees the window of one node it could (the `pick`-th candidate,
        least recently used first); False when it has none."""
        ctl = self.ranks[rank % self.size].ctl
        found = ctl.cp.windows.candidates(ctl.cp.tree.nodes())
        if not found:
            return False
        ctl.cp.tombstone(found[pick % len(found)])
        return True

    def free_windows_apart(self, pick: int) -> tuple[int, ...] | None:
        """Two ranks free two windows of one path: rank a a node's, rank b its child's (the
        `pick`-th such pair). Rank b's largest legal L1 endpoint is then the parent's end,
        where rank a's window is freed: the least of the ranks' own hits is legal on no rank
        but b, and only the intersection of their endpoint masks (C1a) serves both. Returns
        the tokens through the child (the prompt that meets both windows); None with one
        rank, or no such pair."""
        if self.size < 2:
            return None
        a = self._next_rank()
        b = (a + 1) % self.size
        ca, cb = self.ranks[a].ctl, self.ranks[b].ctl
        parents = {n.node_id: n for n in ca.cp.windows.candidates(ca.cp.tree.nodes())}
        pairs = [
            (parents[n.parent.node_id], n)
            for n in cb.cp.windows.candidates(cb.cp.tree.nodes())
            if n.parent is not None and n.parent.node_id in parents
        ]
        if not pairs:
            return None
        parent, child = pairs[pick % len(pairs)]
        ca.cp.tombstone(parent)
        cb.cp.tombstone(child)
        return tuple(t for n in reversed(cb.cp.tree.path_to_root(child)) for t in n.key)

    # -- lifetime -----------------------------------------------------------------------------

    def restart(self) -> None:
        """The job restarts: every rank closes and opens again over a new group."""
        self._abandon_if_broken()
        self.group = ThreadGroup(self.size, self.timeout_s)
        self.group.run(lambda r: self.ranks[r].restart(self.group.member(r)))
        self._extra.clear()
        self._broken.clear()
        self._landed.clear()

    def close(self) -> None:
        self._abandon_if_broken()
        for a in self.ranks:  # closing makes no collective
            a.close()

    def _abandon_if_broken(self) -> None:
        """A step failed on some rank (a crash aimed at one rank, a collective error): every
        rank's controller is the dead job's, publishing nothing more."""
        if self.group.failed is not None:
            abandon([a.ctl for a in self.ranks], self.group.failed)

    # -- observation --------------------------------------------------------------------------

    def changes(self) -> list[PageChange]:
        """Rank 0's page changes, with every rank's freed windows folded in: the reference
        sees a page's window freed while any rank has it freed. Other ranks' changes are
        read and dropped: a C2 abort may show there as an issue and its cancel that rank 0
        never made (their states meet again; I7 compares them)."""
        for a in self.ranks[1:]:
            a.changes()
        out: list[PageChange] = []
        for c in self.ranks[0].changes():
            if c.state in WINDOW_STATES and c.prefix in self._extra:
                if c.state == WINDOW_FREED:
                    self._extra.discard(c.prefix)  # rank 0's own now: the model has it freed
                continue
            if c.state == WINDOW_REVIVED and c.prefix in self._others():
                self._extra.add(c.prefix)  # still freed on another rank
                continue
            if c.tier == self.tiers[0] and c.state == "ABSENT":
                self._extra.discard(c.prefix)  # it left L1: back with its window
            out.append(c)
        mine = _freed_prefixes(self.ranks[0].ctl)
        want = self._others() - mine
        out += [PageChange(self.tiers[0], p, WINDOW_FREED) for p in sorted(want - self._extra)]
        out += [
            PageChange(self.tiers[0], p, WINDOW_REVIVED)
            for p in sorted(self._extra - want)
            if p not in mine and p in _resident_prefixes(self.ranks[0].ctl)
        ]
        self._extra = want
        return out

    def _others(self) -> set[tuple[int, ...]]:
        """L1 pages whose window some rank but 0 has freed now."""
        return set().union(*(_freed_prefixes(a.ctl) for a in self.ranks[1:]))

    def check(self) -> list[str]:
        found = [f"rank {r}: {p}" for r, a in enumerate(self.ranks) for p in a.check()]
        found += self._broken
        return found + [str(v) for v in check_ranks([rank_view(a.ctl) for a in self.ranks])]

    def trace(self) -> list[TraceEvent]:
        return self.ranks[0].trace()

    def trace_header(self) -> TraceHeader:
        return self.ranks[0].trace_header()

    def fault_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for a in self.ranks:
            for site, n in a.fault_counts().items():
                out[site] = out.get(site, 0) + n
        return out


def _pages_of(ctl: Any, keep: Callable[[Any], bool]) -> set[tuple[int, ...]]:
    """The token prefixes naming each L1 page of the nodes `keep` accepts (RESIDENT in L1)."""
    out: set[tuple[int, ...]] = set()
    ps = ctl.config.kv.page_size
    for n in ctl.cp.tree.nodes():
        if not ctl.cp.holds(n, "L1") or not keep(n):
            continue
        path = ctl.cp.tree.path_to_root(n)[::-1]
        tokens = tuple(t for m in path for t in m.key)
        start = len(tokens) - len(n.key)
        out.update(tokens[:end] for end in range(start + ps, len(tokens) + 1, ps))
    return out


def _freed_prefixes(ctl: Any) -> set[tuple[int, ...]]:
    return _pages_of(ctl, ctl.cp.windows.freed)


def _resident_prefixes(ctl: Any) -> set[tuple[int, ...]]:
    return _pages_of(ctl, lambda n: True)


def tp_adapter(setup: TPSetup) -> TPAdapter:
    return TPAdapter(setup)


RANK_CHECKS = ("off", "every", "periodic 3")
"""The check modes a rank may draw for itself (`tp_setups`)."""

RANKS_MAX = 3  # the most ranks a TP machine draws (`rank_local` draws for each)


def tp_setups(plane: str, pools: str, sizes: tuple[int, ...]) -> st.SearchStrategy[TPSetup]:
    """The TP machine's runs: the controller's setups over `sizes` ranks, `rank_check_every`
    drawn (0 twice as often, 1 or 3: every rank alike, C0), and, half of the time, ranks that
    differ where a rank may (CacheConfig.RANK_LOCAL): each its own check_mode and, on a plane
    with bytes, its own verify, and one rank's kernels Triton's. A rank with less room is not
    drawn: the capacities are in C0's fingerprint, so such ranks are refused at startup
    (tests/test_tp.py), never run.

    On a CPU at most one rank runs Triton, the others torch: the interpreter patches
    Triton's language module while a kernel runs, so two ranks' threads in it at once break
    each other (and `auto` probes with it once TRITON_INTERPRET is set)."""
    from hypothesis import strategies as st

    from hicache.testing.adapters.controller import setups

    bytes_ = plane != "null"
    base = st.builds(
        replace,
        setups(plane, pools=pools),
        rank_check_every=st.sampled_from((0, 0, 1, 3)),
        **({"backend": st.just("torch")} if bytes_ else {}),
    )
    one = st.tuples(st.sampled_from(RANK_CHECKS), st.booleans() if bytes_ else st.just(True))
    local = st.builds(
        rank_local,
        st.tuples(*[one] * RANKS_MAX),
        st.sampled_from((None, *range(RANKS_MAX))) if bytes_ else st.none(),
        st.just(bytes_),
    )
    return st.builds(
        TPSetup,
        base=base,
        size=st.sampled_from(sizes),
        local=st.one_of(st.just(()), local),
    )


def rank_local(
    drawn: tuple[tuple[str, bool], ...], triton_rank: int | None, bytes_: bool
) -> tuple[tuple[tuple[str, Any], ...], ...]:
    """`TPSetup.local` from each rank's drawn (check_mode, verify): verify only on a plane
    with bytes, and `triton_rank`'s kernels Triton's."""
    out = []
    for r, (check_mode, verify) in enumerate(drawn):
        fields: list[tuple[str, Any]] = [("check_mode", check_mode)]
        if bytes_:
            fields.append(("verify", verify))
        if r == triton_rank:
            fields.append(("backend", "triton"))
        out.append(tuple(fields))
    return tuple(out)


__all__ = ["RankDisagreement", "TPAdapter", "TPSetup", "tp_adapter", "tp_setups"]
