"""Mutants that break liveness, durability or efficiency, never safety: every invariant holds
and the reference model agrees, yet the cache does less than the spec promises. What catches
each is a property of hicache/testing/liveness (the controller adapter's probes).

Registered in `hicache.testing.mutants` (its table names each one); `ZOO` lists this
module's mutants in the order `hicache fuzz --mutant list` prints them.
"""

from __future__ import annotations

import contextlib
from typing import Any

from hicache.testing.mutants.base import Mutant, swapped


def _l3_head_only() -> contextlib.AbstractContextManager[None]:
    """A completed D2H wants its chain's first node in L3 (`op.nodes[0]`), not its last: the
    H2S chain stops at that node, so the deeper nodes of every longer chain never reach L3
    (and nothing is counted: no backup was refused)."""
    from hicache.controller.transfers import Transfers
    from hicache.core.tiers import Direction

    original = Transfers.__dict__["settle"]

    def settle(self: Any, op_id: int, *args: Any, **kwargs: Any) -> None:
        op = self.cp.ops[op_id]
        if op.direction is not Direction.D2H:
            return original(self, op_id, *args, **kwargs)  # type: ignore[no-any-return]
        head, planner = op.nodes[0], self.backups
        planner.after_d2h = lambda node: type(planner).after_d2h(planner, head)
        try:
            original(self, op_id, *args, **kwargs)
        finally:
            del planner.after_d2h

    return swapped(Transfers, "settle", settle)


def _lru_unsorted() -> contextlib.AbstractContextManager[None]:
    """A tier's eviction candidates in the order they became leaves, not least recently used
    first: the sort was left out (ticks are still kept, so hits and pins look right)."""
    from hicache.core.tree import HiRadixTree

    def candidates(self: Any, tier: int) -> list[Any]:
        self._check_tier(tier)
        return [
            n for n in self._leaves[tier].values() if n.lock[tier] == 0 and n.pending[tier] is None
        ]

    return swapped(HiRadixTree, "candidates", candidates)


def _quarantine_forgets() -> contextlib.AbstractContextManager[None]:
    """The quarantine forgets a bad slot while its bad copy is still held (the holder test
    inverted): the copy is never dropped, its slot never reclaimed, and restores plan reads
    of it again (each fails and falls back: nothing unsafe is served)."""
    from hicache.controller.l3health import L3Health
    from hicache.core.tiers import Tier

    def _bad_slots(self: Any) -> list[int]:
        for slot, (generation, _) in list(self.quarantine.items()):
            if (
                self.cp.generation(Tier.L3, slot) != generation
                or self.cp.holder(Tier.L3, slot) is not None
            ):
                del self.quarantine[slot]
        return list(self.quarantine)

    return swapped(L3Health, "_bad_slots", _bad_slots)


def _writeback_parent() -> contextlib.AbstractContextManager[None]:
    """Write-back backs up the L1 victim's parent (the chain read from the wrong node): the
    parent's chain reaches L2, the victim's does not, and the victim is evicted without a
    copy while `host_pressure` is not counted (the backup "succeeded")."""
    from hicache.controller.transfers import Transfers

    original = Transfers.__dict__["back_up_now"]

    def back_up_now(self: Any, node: Any) -> bool:
        return bool(original(self, node.parent if node.parent is not None else node))

    return swapped(Transfers, "back_up_now", back_up_now)


def _l3_hit_min() -> contextlib.AbstractContextManager[None]:
    """The L3 hit the policy is offered is the *least* of the L2 hit and what L3 may serve
    (`min` for `max`): an L3 restore is never offered past the L2 hit, so a prompt only L3
    holds is recomputed although a legal plan restores it."""
    from hicache.controller.materialize import plan_reach
    from hicache.controller.ranks import RankAgreement

    def policy_hits(self: Any, m: Any) -> tuple[int, int, int]:
        reach = plan_reach(self.cp, m, self.l3.stops_at)
        l3 = min(m.lengths[1], self.l3.servable_len(m))
        return m.lengths[0], min(m.lengths[1], reach), min(l3, reach)

    return swapped(RankAgreement, "policy_hits", policy_hits)


ZOO: tuple[Mutant, ...] = (
    Mutant(
        "LV-l3-head-only",
        "-",
        "Transfers.settle",
        "a completed D2H wants its chain's first node in L3: deeper nodes never reach L3",
        _l3_head_only,
    ),
    Mutant(
        "LV-lru-unsorted",
        "-",
        "HiRadixTree.candidates",
        "eviction candidates in leaf order, not least recently used first",
        _lru_unsorted,
    ),
    Mutant(
        "LV-quarantine-forgets",
        "-",
        "L3Health._bad_slots",
        "the quarantine forgets a slot whose bad copy is held: the copy is never dropped",
        _quarantine_forgets,
    ),
    Mutant(
        "LV-writeback-parent",
        "-",
        "Transfers.back_up_now",
        "write-back backs up the victim's parent: the victim is lost, nothing counted",
        _writeback_parent,
    ),
    Mutant(
        "LV-l3-hit-min",
        "-",
        "RankAgreement.policy_hits",
        "the L3 hit offered is min(L2 hit, L3 servable): an L3-only prompt is recomputed",
        _l3_hit_min,
    ),
)
