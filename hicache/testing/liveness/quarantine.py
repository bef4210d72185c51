"""Bad L3 slots: a copy a read found bad is gone by the end of the tick the spec names.

spec/restore.md ("L3 faults", "The order of a controller's steps"): an S2H that fails with a
bad slot (`CorruptSlot`, `UnreadableSlot`) quarantines that slot, and the L3 copy holding it
is dropped at once if no reader holds it (phase 1), else on the first tick after the last
reader let go (phase 4); once L3 is offline, every L3 copy goes the same way. So after every
`tick` (and `drain`, which ends with one):

    what is left                                 unless                          finding
    -------------------------------------------  ------------------------------  ----------
    the bad copy: the slot's holder, the slot    the copy's L3 subtree has a     quarantine
    not reserved again since the read            reader (a lock in L3, a          kept
                                                 transfer pending in L3, an S2H
                                                 promoting it into L2)
    with L3 offline, any L3 copy                 the same                        offline
                                                                                 copy kept

The bad slots are learnt from the data plane's side: the error of every S2H handle that left
the controller's in-flight set during a call, with the slot's generation when the read was
issued (`in_flight` before the call, `after` it) -- not from the controller's own quarantine,
which is what is judged. `quarantined(node)` answers the restore probe (restores.py): a node
holding a bad copy is no L3 part of any plan.
"""

from __future__ import annotations

from typing import Any

from hicache.core.lifecycle import ABSENT, RESIDENT
from hicache.core.tiers import Direction, Tier
from hicache.core.tree import TreeNode
from hicache.errors import CorruptSlot, UnreadableSlot

Flight = dict[int, tuple[Any, dict[int, int]]]  # op id -> (handle, L3 slot -> generation)
TICKS = ("tick", "drain")  # the calls that end with a tick's phase 4
S2H_PENDING = f"{Direction.S2H.value}_PENDING"


class Quarantine:
    """The bad L3 copies of one controller, and the check after each tick (module docstring)."""

    def __init__(self, ctl: Any, findings: list[str]) -> None:
        self.ctl = ctl
        self.findings = findings
        self.bad: dict[int, int] = {}  # L3 slot -> the generation of its bad copy

    def in_flight(self) -> Flight:
        """The S2H reads in flight now, each with its source slots' generations."""
        cp, out = self.ctl.cp, {}
        for op_id, handle in self.ctl.handles.items():
            op = cp.ops.get(op_id)
            if op is not None and op.direction is Direction.S2H:
                slots = (int(s) for s in op.source_pages)
                out[op_id] = (handle, {s: cp.generation(Tier.L3, s) for s in slots})
        return out

    def after(self, call: str, flight: Flight) -> None:
        """Learn the bad slots of the reads that ended during `call`; after a tick, verify
        that no bad copy (offline: no L3 copy) without a reader is left."""
        for op_id, (handle, generations) in flight.items():
            if op_id in self.ctl.handles:
                continue  # still in flight
            error = getattr(handle, "error", None)
            if isinstance(error, (CorruptSlot, UnreadableSlot)):
                for slot in error.slots:
                    if slot in generations:
                        self.bad[slot] = generations[slot]
        if call in TICKS:
            self._verify_dropped()

    def holder(self, slot: int) -> TreeNode | None:
        """The node holding bad slot `slot`'s bad copy, or None once it is gone."""
        cp = self.ctl.cp
        if cp.generation(Tier.L3, slot) != self.bad[slot]:
            return None  # reserved again since: a new copy
        node: TreeNode | None = cp.holder(Tier.L3, slot)
        return node

    def quarantined(self, node: TreeNode) -> bool:
        """Whether `node` holds a bad L3 copy (no restore may read it from L3)."""
        value = node.value[2]
        return value is not None and any(
            slot in value and self.holder(slot) is node for slot in self.bad
        )

    def _verify_dropped(self) -> None:
        for slot in list(self.bad):
            node = self.holder(slot)
            if node is None:
                del self.bad[slot]
            elif not self._read(node):
                self.findings.append(
                    f"quarantine kept: node {node.node_id} still holds L3 slot {slot}, which "
                    "a read found bad, after a tick with no reader holding it "
                    "(spec/restore.md: dropped at once, or on the tick after its last reader)"
                )
        if self.ctl.l3_online:
            return
        for node in self.ctl.cp.tree.nodes():
            if not node.is_root and node.state[2] == RESIDENT and not self._read(node):
                self.findings.append(
                    f"offline copy kept: node {node.node_id} still holds L3 after a tick with "
                    "L3 offline and no reader holding it (spec/restore.md, L3 faults)"
                )
                return

    @staticmethod
    def _read(node: TreeNode) -> bool:
        """Whether a reader or writer holds `node`'s L3 subtree: a lock in L3 (locks count up
        the path), a transfer pending in L3, or an S2H promoting one of them into L2."""
        if node.lock[2] > 0:
            return True
        stack = [node]
        while stack:
            n = stack.pop()
            if n.state[2] not in (ABSENT, RESIDENT) or n.state[1] == S2H_PENDING:
                return True
            stack.extend(c for c in n.children.values() if c.state[2] != ABSENT)
        return False
