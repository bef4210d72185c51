"""Issuing one transfer with the fault aimed at it (`faults.Aim`), on any data plane.

    action       applied                        the op is observed
    ----------   ----------------------------   ---------------------------------------------
    corrupt      before issue: the first slot   FAILED, CorruptSlot (the real plane's own
                 the S2H reads is corrupted     checksum catches it), a miss
    fail         after issue: `fail`            FAILED, TransferError
    short_read   after issue: `fail`            FAILED, UnreadableSlot (as a read that stays
                                                short), a miss
    delay        after issue: wrapped           `polls` polls after it finished
    alloc/crash  not here: the controller's reservation and publication apply them

`fail` quiesces first (handles.py), so a real transfer failed this way no longer touches its
pages when it is observed. Contract: raises what the plane's transfer method raises.
"""

from __future__ import annotations

from collections.abc import Mapping

from hicache.dataplane.faults import Aim
from hicache.dataplane.handles import DelayedHandle, TransferHandle
from hicache.dataplane.null import StoppedEarly
from hicache.dataplane.plane import DataPlane
from hicache.errors import TransferError, UnreadableSlot
from hicache.pages import Pages
from hicache.tiers import Direction


def issue_aimed(engine: DataPlane, direction: Direction, source: Pages, target: Pages,
                aim: Aim | None, landed: Mapping[str, int] | None = None) -> TransferHandle:
    """`engine`'s `direction` transfer of `source` -> `target`, meeting `aim` (None: none);
    `landed`: a `partial` aim's per-pool report (pages of each pool that landed)."""
    if aim is not None and aim.action == "corrupt":
        engine.corrupt_slot(int(source[0]))
    handle = getattr(engine, direction.value.lower())(source, target)
    assert isinstance(handle, TransferHandle), "every plane's transfer returns a handle"
    if aim is None:
        return handle
    if aim.action == "fail":
        handle.fail(TransferError(f"{direction}: failed by an aimed fault; release the target pages"))
    elif aim.action == "short_read":
        slots = tuple(int(s) for s in source.tolist())
        handle.fail(UnreadableSlot(slots, engine.l3_path, "an aimed short read that persists"))
    elif aim.action == "partial":
        # Verify the caller drew the report: a partial stop without one would read as "all
        # or nothing" (F12: a pool missing from a report counts none, never all).
        assert landed is not None, "a partial aim needs its landing report"
        handle.landed = dict(landed)
        handle.fail(StoppedEarly())
    elif aim.action == "delay":
        return DelayedHandle(handle, aim.polls)
    return handle
