"""The controller's own fault sites: a reservation that fails, and a crash before publication.

    site / aim              consulted                        effect
    ----------------------  -------------------------------  ---------------------------------
    ALLOC_L1/L2/L3, alloc   `issue`, after make-room         OutOfPages for the target tier
    CRASH_BEFORE_PUBLISH,   `Transfers.settle` of a DONE,    SimulatedCrash; the controller
    crash                   before `complete`                refuses all but close()
    (a collective, not      every call, before it runs       GroupBroken once the rank's group
    drawn)                                                   broke (a CollectiveError): the
                                                             controller refuses all but close()
    (hardware, not drawn)   every cancel the controller       QuiesceTimeout past
                            makes (`cancel`)                 quiesce_timeout_s; the controller
                                                             is wedged: refuses all but close()
    partial (aim)           `issue` of an S2H                the per-pool landing report
                                                             the handle fails with (`landing`)

Contract: the hooks only decide; the controller acts (spec/faults.md, "A crash between a
transfer and its publication"). With `faults=None` nothing is drawn.
"""

from __future__ import annotations

from hicache.core.tiers import Direction, Tier
from hicache.dataplane.faults import ALLOC_SITES, Aim, FaultInjector, FaultSite, SimulatedCrash
from hicache.dataplane.handles import TransferHandle
from hicache.distributed.collectives import CollectiveError, GroupBroken, Guarded
from hicache.errors import OutOfPages, QuiesceTimeout
from hicache.pools.spec import PoolGroup


class ControllerFaults:
    def __init__(
        self,
        faults: FaultInjector | None,
        quiesce_timeout_s: float,
        group: Guarded | None = None,
    ) -> None:
        """`group`: the rank's guarded collectives (`Agreement.c`), whose `broken` is the
        error that broke them, if any (None: no group, never broken)."""
        self.faults = faults
        self.group = group
        self.crash_ops: set[int] = set()  # ops aimed at `crash`: the process dies on their DONE
        self.crashed: SimulatedCrash | None = None  # set once; then only close() runs
        self.quiesce_timeout_s = quiesce_timeout_s
        self.wedged: QuiesceTimeout | None = None  # set once; then only close() runs

    def cancel(self, handle: TransferHandle, op_id: int) -> None:
        """R79: cancel op `op_id`'s `handle`, waiting at most `quiesce_timeout_s` for the hardware
        to go quiet. Past it the op stays in flight (its pages the hardware's), the
        controller is wedged, and QuiesceTimeout is raised (spec/faults.md)."""
        try:
            handle.cancel(self.quiesce_timeout_s)
        except QuiesceTimeout as e:
            raise self.wedge(f"op {op_id} ({handle.direction}) cancel") from e

    def wedge(self, what: str) -> QuiesceTimeout:
        """The hardware of `what` did not go quiet within quiesce_timeout_s: the controller
        is wedged from now on; the error to raise."""
        self.wedged = QuiesceTimeout(what, self.quiesce_timeout_s)
        return self.wedged

    def aimed(self, direction: Direction, request_id: int | None) -> Aim | None:
        """The fault aimed at the op about to be issued, if any (consumed)."""
        return self.faults.aimed(direction, request_id) if self.faults is not None else None

    def reserve(self, tier: Tier, need: int, free: int, aim: Aim | None) -> None:
        """ALLOC_<tier> (or an aimed `alloc`): OutOfPages, as if `tier` were full."""
        aimed = aim is not None and aim.action == "alloc"
        if aimed or (self.faults is not None and self.faults.fire(ALLOC_SITES[tier])):
            raise OutOfPages(str(tier), need, free)

    def landing(
        self, aim: Aim | None, group: PoolGroup, anchor_pages: int
    ) -> dict[str, int] | None:
        """An aimed `partial`'s report for an S2H of `anchor_pages` anchor pages: each
        backed-up pool of `group`, in its own pages, drawn by `FaultInjector.landing` (one
        pool stopped part way or left out); None for any other aim."""
        if aim is None or aim.action != "partial" or self.faults is None:
            return None
        kept = group.backed_up()
        return self.faults.landing({p.name: anchor_pages * kept.ratio(p.name) for p in kept.pools})

    def crash_now(self, op_id: int, what: str) -> SimulatedCrash | None:
        """The crash to raise between op `op_id`'s DONE and its publication, or None."""
        due = op_id in self.crash_ops
        self.crash_ops.discard(op_id)
        if not due and (
            self.faults is None or not self.faults.fire(FaultSite.CRASH_BEFORE_PUBLISH)
        ):
            return None
        self.crashed = SimulatedCrash(
            f"injected crash: op {op_id} ({what}) moved its bytes but was not published; close "
            "this controller and open a new one (it starts empty, R47)"
        )
        return self.crashed

    @property
    def dead(self) -> bool:
        """Crashed, wedged, or its group broken: publishes nothing more, only close() runs."""
        return self.crashed is not None or self.wedged is not None or self._broken() is not None

    def refuse_if_crashed(self) -> None:
        """SimulatedCrash after a crash, QuiesceTimeout once wedged, GroupBroken once a
        collective failed: only close() runs."""
        broken = self._broken()
        if broken is not None:
            raise GroupBroken("this call", f"{type(broken).__name__}: {broken}")
        if self.wedged is not None:
            raise QuiesceTimeout(
                f"this controller is wedged ({self.wedged.what})", self.wedged.timeout_s
            )
        if self.crashed is not None:
            raise SimulatedCrash(
                f"this controller crashed ({self.crashed}); close it and open a new one (R57)"
            )

    def _broken(self) -> CollectiveError | None:
        """The error that broke the rank's group, if any."""
        return self.group.broken if self.group is not None else None
