"""Issuing one transfer with the fault aimed at it (`faults.Aim`), on any data plane.

    action       applied                        the op is observed
    ----------   ----------------------------   ---------------------------------------------
    corrupt      before issue: the first slot   FAILED, CorruptSlot (the real plane's own
                 the S2H reads is corrupted     checksum catches it), a miss
    fail         after issue: `fail`            FAILED, TransferError
    short_read   after issue: `fail`            FAILED, UnreadableSlot (as a read that stays
                                                short), a miss
    delay        after issue: wrapped           `polls` polls after it finished
    partial      after issue, a group's S2H:    FAILED, StoppedEarly, with `landed`: the
                 the null plane fails it at     drawn leading run of each pool's pages; with
                 once; a plane with bytes lets  bytes, every page the report names holds
                 it run to its end, then        its slot's bytes and every page past a run
                 overwrites each pool's pages   holds UNLANDED_BYTE, as bytes that never
                 past its run (`StoppedHandle`) arrived hold anything but the slot's
    alloc/crash  not here: the controller's reservation and publication apply them

`fail` quiesces first (handles.py), so a real transfer failed this way no longer touches its
pages when it is observed. Contract: raises what the plane's transfer method raises.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

from hicache.core.pages import Pages
from hicache.core.tiers import Direction
from hicache.dataplane.faults import Aim
from hicache.dataplane.handles import DelayedHandle, TransferHandle, TransferStatus, cancel_within
from hicache.dataplane.null import StoppedEarly
from hicache.dataplane.plane import DataPlane
from hicache.errors import TransferError, UnreadableSlot


@runtime_checkable
class Unlands(Protocol):
    """A plane with bytes whose S2H may stop part way (a pool group's)."""

    def unland(self, l2_pages: Pages, landed: Mapping[str, int]) -> None:
        """Write over each pool's pages of L2 anchor pages `l2_pages` past its leading run
        of `landed[pool]` (a pool not named: all of them)."""


def issue_aimed(
    engine: DataPlane,
    direction: Direction,
    source: Pages,
    target: Pages,
    aim: Aim | None,
    landed: Mapping[str, int] | None = None,
) -> TransferHandle:
    """`engine`'s `direction` transfer of `source` -> `target`, meeting `aim` (None: none);
    `landed`: a `partial` aim's per-pool report (pages of each pool that landed)."""
    if aim is not None and aim.action == "corrupt":
        engine.corrupt_slot(int(source[0]))
    handle = getattr(engine, direction.value.lower())(source, target)
    assert isinstance(handle, TransferHandle), "every plane's transfer returns a handle"
    if aim is None:
        return handle
    if aim.action == "fail":
        handle.fail(
            TransferError(f"{direction}: failed by an aimed fault; release the target pages")
        )
    elif aim.action == "short_read":
        slots = tuple(int(s) for s in source.tolist())
        handle.fail(UnreadableSlot(slots, engine.l3_path, "an aimed short read that persists"))
    elif aim.action == "partial":
        # Verify the caller drew the report: a partial stop without one would read as "all
        # or nothing" (F12: a pool missing from a report counts none, never all).
        assert landed is not None, "a partial aim needs its landing report"
        if engine.has_bytes:
            # Verify the plane can stop part way: only a pool group's S2H draws a report.
            assert isinstance(engine, Unlands), (
                f"{type(engine).__name__} cannot stop an S2H part way"
            )
            report, plane = dict(landed), engine
            return StoppedHandle(handle, report, lambda: plane.unland(target, report))
        handle.landed = dict(landed)
        handle.fail(StoppedEarly())
    elif aim.action == "delay":
        return DelayedHandle(handle, aim.polls)
    return handle


class StoppedHandle(TransferHandle):
    """An S2H of a plane with bytes, stopped part way (an aimed `partial`): the wrapped
    transfer runs to its end; then `unland` writes over every page past each pool's run of
    `landed` (what had not arrived when it stopped), and the end is observed FAILED with
    StoppedEarly and `landed`. The report is then true: a publication within its clamp
    serves the slot's bytes, one beyond it serves bytes no slot held (I4 and the restore's
    verification see them). A wrapped transfer that fails by itself (a corrupt slot, an I/O
    error) is observed as it failed, `landed` None: nothing usable."""

    def __init__(
        self, inner: TransferHandle, landed: dict[str, int], unland: Callable[[], None]
    ) -> None:
        super().__init__(inner.direction, inner.nbytes)
        self.inner = inner
        self.timings = inner.timings
        self._report = landed
        self._unland = unland

    def _probe(self) -> TransferStatus:
        status = self.inner.poll()
        if status is TransferStatus.DONE:
            self._unland()  # the hardware is done with the pages: nothing races the write
            self.error, self.landed = StoppedEarly(), self._report
            return TransferStatus.FAILED
        if status.final:
            self.error = self.inner.error
        return status

    def _quiesce(self, timeout_s: float | None) -> bool:
        return cancel_within(self.inner, timeout_s)

    def _block(self, seconds: float) -> None:
        self.inner.wait(seconds)
