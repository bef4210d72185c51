"""C4's `landed` rule, checked by the TP fuzz around every collective step: no rank
publishes more of an op than every rank landed (spec/tp.md C4; the TP model check's
`hicache.oracle.modelcheck.tprules`, over the fuzz's ranks).

Each rank's end of an op is read from its handle as the controller settles it (a watch on
`Transfers.settle`): done, all the op's nodes; a read stopped part way, its clamp
(`clamped_nodes`); failed, cancelled or still moving, none. After the step, an op settled on
every rank may leave RESIDENT in its target tier, on no rank, more nodes than the least of
those (each rank's count read as its settle returns). A rank that publishes what it never
landed keeps the ranks equal (every rank agrees on the wrong count), so I7 cannot see it;
this rule can.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hicache.controller.clamp import clamped_nodes
from hicache.core.lifecycle import RESIDENT
from hicache.core.tiers import TIERS, Direction
from hicache.dataplane.handles import TransferStatus


class LandedRule:
    """C4's `landed` rule over a TP adapter's ranks (module docstring): `watch` each rank's
    controller before a collective step, then `broken` lists what the step broke."""

    def __init__(self) -> None:
        # op id -> rank -> (the op, whole nodes landed, nodes its settle published)
        self.ends: dict[int, dict[int, tuple[Any, int, int]]] = {}

    def watch(self, ctls: Sequence[Any]) -> None:
        """Record each rank's end of every op its controller settles from now on (a new
        controller after a restart is watched from its first step)."""
        for rank, ctl in enumerate(ctls):
            transfers = ctl.transfers
            if transfers.__dict__.get("settle_watched") is self:
                continue
            transfers.settle_watched = self
            transfers.settle = self._watched(rank, ctl)

    def _watched(self, rank: int, ctl: Any) -> Any:
        transfers = ctl.transfers

        def settle(op_id: int, *args: Any, **kwargs: Any) -> None:
            op, landed = ctl.cp.ops[op_id], _landed(ctl, op_id)
            type(transfers).settle(transfers, op_id, *args, **kwargs)  # the class's (a mutant's)
            # Read at once: a later op of the same step may publish these nodes by itself.
            self.ends.setdefault(op_id, {})[rank] = (op, landed, _published(ctl, op))

        return settle

    def broken(self, ctls: Sequence[Any]) -> list[str]:
        """The ops settled since the last call with some rank of `ctls` publishing more of
        their nodes than every rank landed."""
        found = []
        for op_id, ends in list(self.ends.items()):
            if op_id in ctls[0].cp.ops:
                continue  # not settled after all (a crash before publication): again later
            del self.ends[op_id]
            if len(ends) < len(ctls):
                continue  # settled on some ranks only: a C2 abort's own issue, not C4's
            landed = [ends[r][1] for r in range(len(ctls))]
            found += [
                f"C4 landed: rank {r} published {ends[r][2]} node(s) of op {op_id} "
                f"({ends[r][0].direction}), and the ranks landed {landed}: at most "
                f"{min(landed)} may be kept"
                for r in range(len(ctls))
                if ends[r][2] > min(landed)
            ]
        return found

    def clear(self) -> None:
        self.ends.clear()


def _landed(ctl: Any, op_id: int) -> int:
    """The whole nodes of op `op_id` this rank's handle landed, as it stands at settle: done,
    all; a read stopped part way, its clamp; failed, cancelled or still moving, none."""
    handle = ctl.handles[op_id]
    nodes = ctl.cp.ops[op_id].nodes
    if handle.status is TransferStatus.DONE:
        return len(nodes)
    if (
        handle.status is TransferStatus.FAILED
        and handle.landed is not None
        and ctl.cp.ops[op_id].direction is Direction.S2H
    ):
        return clamped_nodes(ctl.group, nodes, handle.landed)
    return 0


def _published(ctl: Any, op: Any) -> int:
    """How many of `op`'s nodes this rank holds RESIDENT in the op's target tier."""
    t = TIERS.index(op.direction.target)
    live = {n.node_id: n for n in ctl.cp.tree.nodes()}
    return sum(1 for n in op.nodes if n.node_id in live and live[n.node_id].state[t] == RESIDENT)


__all__ = ["LandedRule"]
