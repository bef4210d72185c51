"""The transfers in flight, as a driver sees them: which op, which way, for whom, which stage.

    stage      direction   issued by
    ---------  ---------   ------------------------------------------------------------
    load_l2    H2D         a restore's L2 part (or shared nodes it loads itself)
    promote    S2H         a restore's L3 part, first step (L3 -> L2)
    load_l3    H2D         a restore's L3 part, second step (L2 -> L1, after `promote`)
    backup     D2H, H2S    the backup planner (no request)

Contract: `pending_transfers` only reads; a driver that chooses completions op by op (a
fuzzer on the null data plane) picks an `op_id` here and calls `finish(ok)` on
`controller.handles[op_id]`, which the next `tick` observes. Ordered by op id (issue order).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from hicache.controller.restore import RestoreStager
from hicache.core.control import ControlPlane
from hicache.core.tiers import Direction
from hicache.dataplane.handles import TransferHandle, cancel_within, deadline_of, remaining

Stage = Literal["load_l2", "promote", "load_l3", "backup"]
STAGES: tuple[Stage, ...] = ("load_l2", "promote", "load_l3", "backup")


class PendingTransfer(NamedTuple):
    op_id: int
    direction: Direction
    request_id: int | None  # None: a backup (the cache's, not a request's)
    stage: Stage
    pages: int  # pages the transfer moves


def pending_transfers(cp: ControlPlane, stager: RestoreStager) -> list[PendingTransfer]:
    """Every op the control plane holds pending, with its stage (see the module table)."""
    out: list[PendingTransfer] = []
    for op_id in sorted(cp.ops):
        op = cp.ops[op_id]
        mat = stager.owner.get(op_id)
        stage: Stage = "backup"
        if op.direction is Direction.S2H:
            stage = "promote"
        elif op.direction is Direction.H2D:
            in_l3_part = mat is not None and bool(mat.l3_part) and op.nodes[-1] is mat.l3_part[-1]
            stage = "load_l3" if in_l3_part else "load_l2"
        out.append(
            PendingTransfer(op_id, op.direction, op.request_id, stage, int(op.target_pages.size))
        )
    return out


class LeakedOp(NamedTuple):
    """An op `close` could not quiesce within quiesce_timeout_s (spec/faults.md, "Hardware
    that never goes quiet"): its `pages` target pages of `tier` stay private and its source
    stays locked in the closed control plane, and its data plane is parked
    (hicache.dataplane.leaks) until the hardware goes quiet."""

    op_id: int
    direction: Direction
    tier: str
    pages: int


def quiesce_or_leak(
    cp: ControlPlane, handles: dict[int, TransferHandle], timeout_s: float
) -> list[LeakedOp]:
    """Cancel every handle in `handles`, waiting at most `timeout_s` seconds in all; clears
    `handles`. The ops whose hardware was still busy then, leaked (their handles PENDING)."""
    deadline = deadline_of(timeout_s)
    leaked = [
        LeakedOp(
            op_id,
            cp.ops[op_id].direction,
            str(cp.ops[op_id].direction.target),
            int(cp.ops[op_id].target_pages.size),
        )
        for op_id, handle in handles.items()
        if not cancel_within(handle, remaining(deadline))
    ]
    handles.clear()
    return leaked
