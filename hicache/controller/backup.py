"""The backup chain: D2H after insert, H2S after D2H, asynchronous, never blocking a request.

    write policy              when a node is backed up to L2
    ------------------------  -------------------------------------------------------
    write_through             on insert (first hit)
    write_through_selective   once the node has been matched twice (second hit)
    write_back                only when L1 evicts it (the eviction waits for the D2H)

L3 follows L2 for every policy: a completed D2H queues the H2S of the same chain.

A *chain* is a run of path nodes lacking the target tier whose first node's parent holds it
(structural check S6 `tier_ancestor_closed` in spec/invariants.md: no backup gap). Nodes
behind a chain whose transfer is still pending stay wanted and are retried on a later tick.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from hicache.errors import OutOfPages, StorageError
from hicache.lifecycle import ABSENT, RESIDENT
from hicache.tiers import TIERS, Direction
from hicache.tree import TreeNode

if TYPE_CHECKING:
    from hicache.controller.controller import CacheController

WANTED_MAX = 65536  # bound on remembered backup targets; beyond it the oldest are forgotten


def chain_lacking(node: TreeNode, direction: Direction) -> list[TreeNode]:
    """Parent-first nodes on `node`'s path that hold the source tier and lack the target, and
    whose first node's parent holds the target (or is the root). Empty when blocked (a
    node on the way is pending in the target tier) or nothing is missing."""
    src, dst = TIERS.index(direction.source), TIERS.index(direction.target)
    path: list[TreeNode] = []
    n: TreeNode | None = node
    while n is not None and not n.is_root:
        path.append(n)
        n = n.parent
    path.reverse()
    chain: list[TreeNode] = []
    for n in path:
        if n.state[dst] == RESIDENT and not chain:
            continue
        if n.state[dst] != ABSENT or n.state[src] != RESIDENT:
            break  # pending here, or the source is gone: the chain ends (or is blocked)
        chain.append(n)
    if chain:
        parent = chain[0].parent
        assert parent is not None
        if not parent.is_root and parent.state[dst] != RESIDENT:
            return []
    return chain


class BackupChain:
    """Keeps the wanted backups and issues them when their chain is free."""

    def __init__(self, ctl: CacheController) -> None:
        # A weak proxy: the controller owns this chain, and a strong back-reference would make
        # a cycle that keeps a closed controller's pools (GPU and pinned memory) alive until
        # the garbage collector happens to run.
        self.ctl: CacheController = weakref.proxy(ctl)
        self.wanted: dict[Direction, dict[int, TreeNode]] = {Direction.D2H: {}, Direction.H2S: {}}

    def want(self, direction: Direction, node: TreeNode) -> None:
        queue = self.wanted[direction]
        queue.pop(node.node_id, None)
        queue[node.node_id] = node
        if len(queue) > WANTED_MAX:
            queue.pop(next(iter(queue)))

    def after_insert(self, node: TreeNode) -> None:
        if self.ctl.config.write_policy == "write_through":
            self.want(Direction.D2H, node)

    def after_match(self, node: TreeNode) -> None:
        if self.ctl.config.write_policy == "write_through_selective" and node.hits >= 2:
            self.want(Direction.D2H, node)

    def after_d2h(self, node: TreeNode) -> None:
        self.want(Direction.H2S, node)

    def tick(self) -> None:
        """Issue every wanted chain that can go now; forget targets with nothing to do."""
        for direction in (Direction.D2H, Direction.H2S):
            queue = self.wanted[direction]
            for node_id, node in list(queue.items()):
                if not self.ctl.alive(node):
                    del queue[node_id]  # removed from the tree meanwhile
                    continue
                chain = chain_lacking(node, direction)
                if not chain:
                    if not _blocked(node, direction):
                        del queue[node_id]
                    continue
                self.issue(direction, chain)
                del queue[node_id]

    def issue(self, direction: Direction, chain: list[TreeNode]) -> None:
        """Issue one backup (the controller evicts in the target tier if it is full); when no
        room can be made the backup is dropped and its tokens counted, not retried."""
        try:
            self.ctl.issue(direction, chain)
        except (OutOfPages, StorageError) as e:
            tokens = sum(len(n.key) for n in chain)
            if isinstance(e, StorageError):
                reason = "l3_offline"  # the file is lost; L1 and L2 keep serving
            else:
                reason = "host_pressure" if direction is Direction.D2H else "storage_pressure"
            self.ctl.metrics.drop(reason, tokens)


def _blocked(node: TreeNode, direction: Direction) -> bool:
    """Whether some node on the path is pending in the target tier (retry later)."""
    dst = TIERS.index(direction.target)
    n: TreeNode | None = node
    while n is not None and not n.is_root:
        if n.state[dst] not in (ABSENT, RESIDENT):
            return True
        n = n.parent
    return False
