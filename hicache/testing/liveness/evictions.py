"""The eviction order on every tier of the controller: each victim the spec's loop names.

spec/eviction.md's one loop frees, in tier T, the first of `candidates(T, keep)` again and
again: the nodes RESIDENT in T whose `evict_<t>` guards hold (unlocked in T, a leaf in T,
the other tiers' sub-states the row names), not in `keep`, least recently used first by T's
own `last_access`, ties to the older node id; until `want` pages are freed or none is left.
`EvictionProbe` wraps the controller's `ControlPlane.evict` (that loop) and `evict_node` (its
step) on one control plane, and judges every step of every loop against that definition,
computed here from the tables' guards and the tree's fields, not by the plane's own
candidate query:

    when                          finding
    ----------------------------  ------------------------------------------------------------
    a step of a loop evicts v     `eviction order`: v is not the spec's first candidate now
    a step after `want` is freed  `eviction count`: the loop went on after freeing enough
    the loop returns short        `eviction count`: fewer than `want` freed, a candidate left

On one tier the reference model checks the same order from what the engine reports
(evictorder.py); with L2 and L3 the candidates depend on locks, pins and `keep` that the
protocol does not report, so this probe reads them from the controller's tree. Steps outside
a loop (an `invalidate_l3`, a copy evicted below a bad slot, a promotion dropped after
`prefill`) are not pressure and are not judged here.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from hicache.core.lifecycle import ABSENT, RESIDENT, Guard, Lifecycle
from hicache.core.tiers import TIERS, Tier
from hicache.core.tree import TreeNode


@dataclass
class Loop:
    """One call of the loop: its tier, the pages it wants, the ids it keeps, pages freed."""

    tier: Tier
    want: int
    keep: frozenset[int]
    freed: int = 0


class EvictionProbe:
    """Judges every eviction loop of one control plane (module docstring)."""

    def __init__(self, cp: Any, lifecycle: Lifecycle, findings: list[str]) -> None:
        self.cp = cp
        self.findings = findings
        self.guards = {t: lifecycle.transitions[f"evict_{t.value.lower()}"].guards for t in TIERS}
        for guards in self.guards.values():
            for g in guards:
                # Verify the probe can read every guard an eviction row has.
                assert g.op in ("unlocked", "leaf", "==", "!="), f"eviction guard {g.text!r}"
        self.loops: list[Loop] = []  # nested: write-back's backup makes room in L2 inside L1's
        self._evict: Callable[..., int] = cp.evict
        self._evict_node: Callable[..., int] = cp.evict_node
        cp.evict = self.evict  # the loop calls `self.evict_node`: this one's
        cp.evict_node = self.evict_node

    def evict(
        self, tier: Tier | str, n_pages: int, keep: Collection[TreeNode] = (), **hook: Any
    ) -> int:
        """`ControlPlane.evict` (its `before` hook passed on), judged step by step."""
        loop = Loop(Tier(tier), n_pages, frozenset(n.node_id for n in keep))
        self.loops.append(loop)
        try:
            freed = self._evict(tier, n_pages, keep, **hook)
        finally:
            self.loops.pop()
        left = self.candidates(loop) if loop.freed < n_pages else []
        if left:
            self.findings.append(
                f"eviction count: evict({loop.tier}, {n_pages}) freed {loop.freed} pages and "
                f"stopped with node {left[0].node_id} a candidate (spec/eviction.md: until "
                "want pages are freed or no candidate is left)"
            )
        return freed

    def evict_node(self, node: TreeNode, tier: Tier | str, name: str | None = None) -> int:
        loop = self.loops[-1] if self.loops else None
        t = Tier(tier)
        mine = loop is not None and t is loop.tier and name in (None, f"evict_{t.value.lower()}")
        if mine:
            assert loop is not None  # Verify: `mine` says so.
            self._verify_step(loop, node)
        freed = self._evict_node(node, tier, name)
        if mine:
            assert loop is not None
            loop.freed += freed
        return freed

    def _verify_step(self, loop: Loop, node: TreeNode) -> None:
        t, tier = TIERS.index(loop.tier), loop.tier
        if loop.freed >= loop.want:
            self.findings.append(
                f"eviction count: evict({tier}, {loop.want}) evicted node {node.node_id} after "
                f"freeing {loop.freed} pages (spec/eviction.md: no more once want is freed)"
            )
        found = self.candidates(loop)
        if not found or found[0] is not node:
            first = (
                f"node {found[0].node_id} (tick {found[0].last_access[t]})"
                if found
                else "no candidate"
            )
            self.findings.append(
                f"eviction order: evict_{tier.value.lower()} of node {node.node_id} (tick "
                f"{node.last_access[t]}), but the spec's first candidate is {first} "
                "(spec/eviction.md: least recently used leaf of the tier, ties to the older id)"
            )

    def candidates(self, loop: Loop) -> list[TreeNode]:
        """`candidates(T, keep)` of spec/eviction.md, in order, from the tree's fields."""
        t, guards = TIERS.index(loop.tier), self.guards[loop.tier]
        found = [
            n
            for n in self.cp.tree.nodes()
            if not n.is_root
            and n.state[t] == RESIDENT
            and n.node_id not in loop.keep
            and all(_holds(g, n) for g in guards)
        ]
        return sorted(found, key=lambda n: (n.last_access[t], n.node_id))


def _holds(guard: Guard, node: TreeNode) -> bool:
    """Whether an eviction row's guard holds on `node`, read from its fields."""
    assert guard.tier is not None  # Verify: eviction rows have no request guard.
    i = TIERS.index(guard.tier)
    if guard.op == "unlocked":
        return node.lock[i] == 0
    if guard.op == "leaf":
        return all(c.state[i] == ABSENT for c in node.children.values())
    return (node.state[i] == guard.state) == (guard.op == "==")
