"""The backup planner: which chains to copy down a tier (D2H, then H2S), and when.

    write policy              when a node is wanted in L2
    ------------------------  -------------------------------------------------------
    write_through             on insert (first hit)
    write_through_selective   once the node has been matched twice (second hit)
    write_back                only when L1 evicts it (eviction.py asks for it then)

L3 follows L2 for every policy: a completed D2H makes the same node wanted in L3 (H2S).
These are R28; a chain is R29, the wanted sets' order and bound R31.

Contract: the planner decides, it never acts. `due()` yields the chains to issue now; the
controller issues them (and counts a chain it cannot issue as dropped). A *chain* is a
parent-first run of path nodes that hold the source tier and lack the target, whose first
node's parent holds the target (or is the root): issuing it opens no backup gap (structural
check S6 `tier_ancestor_closed`, spec/invariants.md). A wanted node behind a chain whose
transfer is still pending stays wanted and is planned again on a later tick; one that leaves
the tree passes its wish to the nearest node left on its path (the ancestors its chain would
have taken along still need it). At most `WANTED_MAX` targets are remembered per direction;
beyond it the oldest are forgotten.
Every question about a node goes to the control plane (its queries), never to node fields.
"""

from __future__ import annotations

from collections.abc import Iterator

from hicache.choices import WritePolicy
from hicache.core.control import ControlPlane
from hicache.core.lifecycle import ABSENT, RESIDENT
from hicache.core.tiers import Direction, Tier
from hicache.core.tree import TreeNode

WANTED_MAX = 65536  # R31: bound on remembered backup targets per direction
Chain = list[TreeNode]


def chain_lacking(
    cp: ControlPlane, node: TreeNode, direction: Direction, windows: bool = True
) -> Chain:
    """Parent-first nodes on `node`'s path that hold the source tier and lack the target, and
    whose first node's parent holds the target (or is the root): R29. Empty when blocked (a node
    on the way is pending in the target tier, or lost its source) or nothing is missing.
    With `windows`, a D2H chain also ends before a node whose L1 window is freed; without
    (tensor-parallel ranks, whose windows may differ) the issue refuses it instead."""
    src, dst = direction.source, direction.target
    path = list(reversed(cp.tree.path_to_root(node))) if not node.is_root else []
    chain: Chain = []
    for n in path:
        if cp.holds(n, dst) and not chain:
            continue
        if (
            cp.residency(n, dst) != ABSENT
            or not cp.holds(n, src)
            or (windows and src is Tier.L1 and cp.windows.freed(n))
        ):
            break  # pending here, or the source is gone (or its window): the chain ends
        chain.append(n)
    if chain:
        parent = chain[0].parent
        assert parent is not None, "a live non-root node has a parent"
        if not cp.holds(parent, dst):
            return []
    return chain


def blocked(cp: ControlPlane, node: TreeNode, direction: Direction) -> bool:
    """Whether some node on `node`'s path is pending in the target tier (plan again later)."""
    return any(
        cp.residency(n, direction.target) not in (ABSENT, RESIDENT)
        for n in cp.tree.path_to_root(node)
    )


class BackupPlanner:
    """Remembers the wanted backups per direction and plans the chains that can go now."""

    def __init__(self, cp: ControlPlane, write_policy: WritePolicy, windows: bool = True) -> None:
        self.cp = cp
        self.write_policy = write_policy
        self.windows = windows  # `chain_lacking`'s: False across ranks
        self.wanted: dict[Direction, dict[int, TreeNode]] = {Direction.D2H: {}, Direction.H2S: {}}
        cp.on_remove.append(self._removed)

    @property
    def pending(self) -> bool:
        """Whether some backup is still wanted (a drain must keep ticking)."""
        return any(self.wanted.values())

    def want(self, direction: Direction, node: TreeNode) -> None:
        queue = self.wanted[direction]
        queue.pop(node.node_id, None)
        queue[node.node_id] = node
        if len(queue) > WANTED_MAX:
            queue.pop(next(iter(queue)))

    def _removed(self, nodes: list[TreeNode], left: TreeNode) -> None:
        """Nodes left the tree (dead: they hold nothing): a wish on one of them passes to
        `left`, the nearest node left on their path, whose chain holds what the wish still
        needs (R31, rule 4 of spec/policies.md); none passes to the root."""
        for direction, queue in self.wanted.items():
            wished = [queue.pop(n.node_id, None) for n in nodes]
            if any(w is not None for w in wished) and not left.is_root:
                self.want(direction, left)

    def after_insert(self, node: TreeNode) -> None:
        if self.write_policy is WritePolicy.WRITE_THROUGH:
            self.want(Direction.D2H, node)

    def after_match(self, node: TreeNode) -> None:
        if self.write_policy is WritePolicy.WRITE_THROUGH_SELECTIVE and self.cp.hits(node) >= 2:
            self.want(Direction.D2H, node)

    def after_d2h(self, node: TreeNode) -> None:
        self.want(Direction.H2S, node)

    def due(self) -> Iterator[tuple[Direction, Chain]]:
        """The chains to issue now, D2H first, one at a time: each is planned only when the
        caller asks for the next, so it sees what issuing the previous one changed (its
        make-room may have evicted a node an earlier plan relied on). Forgets targets with
        nothing left to do (a removed one's wish passed on already: `_removed`). A yielded
        chain's target is no longer wanted: issuing it is the caller's job, and one that
        cannot be issued is dropped."""
        for direction in (Direction.D2H, Direction.H2S):
            queue = self.wanted[direction]
            for node_id, node in list(queue.items()):
                if node_id not in queue:
                    continue
                if not self.cp.is_live(node):
                    del queue[node_id]
                    continue
                chain = chain_lacking(self.cp, node, direction, self.windows)
                if not chain:
                    if not blocked(self.cp, node, direction):
                        del queue[node_id]
                    continue
                del queue[node_id]
                yield direction, chain
