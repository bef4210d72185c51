"""L3 health: bad slots and a lost file, each ending in a miss (spec/restore.md, "L3 faults").

Contract:

- A slot that failed its checksum (`corrupt`) or could not be read whole (`unreadable`) is
  put into *quarantine* (by slot and generation, so a split of its node or a later reuse of
  the slot is followed exactly): from then on no restore plans an L3 read through the node
  holding it (`servable_len`, `stops_at`; R44). Its L3 copy -- that node's only -- is dropped
  (`invalidate_l3`) as soon as no reader holds it. L3 stays closed under ancestors (S6), so
  descendants still holding L3 leave it first; their bytes are good, so they are *evicted*
  (`evict_l3`, traced as the eviction it is, never as an invalidation) and counted apart as
  `below_bad_slot` (R43). Until the drop, the tree still reports the copy in L3 (`match` is
  mechanical); the planner is what refuses it. The node's L1 and L2 copies are untouched,
  and once its L3 copy is gone a backup writes a fresh slot.
- A lost file (removed or replaced under us) takes L3 *offline* for the controller's life (R45):
  every L3 copy is dropped (`invalidate_l3`, leaves first) as soon as no reader holds it.
- `l3_invalidated_pages[reason]` counts the pages each `invalidate_l3` dropped, by reason;
  pressure eviction is counted apart (`evicted_pages`), so corruption never reads as pressure.
"""

from __future__ import annotations

from hicache.controller.metrics import Metrics
from hicache.core.control import ControlPlane
from hicache.core.tiers import Tier
from hicache.core.tree import MatchResult, TreeNode
from hicache.errors import IllegalTransition, StorageError


class L3Health:
    def __init__(self, cp: ControlPlane, metrics: Metrics) -> None:
        self.cp = cp
        self.metrics = metrics
        self.offline_reason: str | None = None  # set once the L3 file is lost (for good)
        # Bad slots: slot -> (its generation when it failed, reason). Kept by slot, not by node:
        # a split moves the slot to the upper node, and the generation tells a slot that was
        # freed and written again (a new, good copy) from the bad one.
        self.quarantine: dict[int, tuple[int, str]] = {}

    @property
    def online(self) -> bool:
        """Whether L3 serves restores and takes backups (False once its file was lost)."""
        return self.offline_reason is None

    def take_offline(self, error: StorageError) -> None:
        """The L3 file was removed or replaced under us: its slots are lost for good. L1 and
        L2 keep serving. Recovery: close the controller, build one on a new L3 path."""
        if self.offline_reason is None:
            self.offline_reason = str(error)
        self.drop_unread()

    def bad_slot(self, nodes: list[TreeNode], slot: int, reason: str) -> None:
        """Slot `slot` of L3 failed (`corrupt` or `unreadable`) during a read of `nodes`:
        quarantine it, and drop its node's copy now if nothing holds it."""
        if self.cp.holder(Tier.L3, slot, nodes) is not None and slot not in self.quarantine:
            self.quarantine[slot] = (self.cp.generation(Tier.L3, slot), reason)
        self.drop_unread()

    def stops_at(self, node: TreeNode) -> bool:
        """Whether a restore must not read `node` from L3 (it holds a bad slot, or L3 is
        offline)."""
        return not self.online or any(
            self.cp.holder(Tier.L3, slot, [node]) is not None for slot in self._bad_slots()
        )

    def servable_len(self, match: MatchResult) -> int:
        """The L3 hit length a restore may use: `match`'s L3 run, cut before the first node
        it must not read (0 when L3 is offline)."""
        tokens = 0
        for node in match.path:
            if not self.cp.holds(node, Tier.L3) or self.stops_at(node):
                break
            tokens += len(node.key)
        return min(tokens, match.lengths[2])

    def drop_unread(self) -> None:
        """Drop every quarantined copy (offline: every copy) that no reader holds, evicting
        the healthy copies below it first; the rest stay until a later tick. Each drop of a
        bad copy is one `invalidate_l3`."""
        for slot in self._bad_slots():
            node = self.cp.holder(Tier.L3, slot)
            if node is None:
                continue  # dropped with an earlier bad slot of the same node
            reason = self.quarantine[slot][1]
            for below in reversed(self.cp.subtree_holding(node, Tier.L3)[1:]):  # leaves first
                if below in self.cp.candidates(Tier.L3):
                    self.metrics.invalidated("below_bad_slot", self.cp.evict_node(below, Tier.L3))
            if node in self.cp.candidates(Tier.L3):
                self._drop(node, reason)
        self._bad_slots()  # forget the slots just dropped
        while not self.online:
            if not any(self._drop(n, "l3_offline") for n in self.cp.candidates(Tier.L3)):
                return

    def _bad_slots(self) -> list[int]:
        """The quarantined slots still holding their bad copy; forgets the others (dropped,
        evicted, or freed and written again since)."""
        for slot, (generation, _) in list(self.quarantine.items()):
            if (
                self.cp.generation(Tier.L3, slot) != generation
                or self.cp.holder(Tier.L3, slot) is None
            ):
                del self.quarantine[slot]
        return list(self.quarantine)

    def _drop(self, node: TreeNode, reason: str) -> bool:
        try:
            self.metrics.invalidated(reason, self.cp.evict_node(node, Tier.L3, "invalidate_l3"))
        except IllegalTransition:
            return False  # a promotion reads it right now (its guard): next tick
        return True
