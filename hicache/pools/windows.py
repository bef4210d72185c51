"""Windows in L1: which anchor pages still hold their trailing pools, and where an L1 hit may end.

A group with a trailing side pool (hit policy `TRAILING_PAGES`: dsv4's `swa`) can lose a
node's *window* in L1 while the node's anchor pages and sidecars stay (`TierPools.tombstone`,
the control plane's `tombstone`). A hit then needs more than the anchor's pages: under the
group hit policy `all_pools` it may end only where every required trailing pool has the
`window_pages` pages before it (`swa_boundaries` over the L1 run, read at node ends), so the
L1 hit is clipped to the last such end. Under `anchor_recompute_swa` the trailing pools are
not required: the hit is the anchor's, and its window is recomputed.

    L1 run        A (4 pages, window)   B (2, freed)   C (3, window)      swa W = 4
    accepted      0       4                            (9: only 3 since the gap)
    L1 hit        4 pages: A; B and C are recomputed (and their pages discarded at insert)

Contract: `L1Windows` reads the L1 table and node values only; it changes nothing. A plane
without such a group (one pool, or no trailing side pool) clips nothing.
"""

from __future__ import annotations

from typing import Sequence

from hicache.pages import PageTable
from hicache.pools.hits import ALL_POOLS, check_policy, required_pools, swa_boundaries
from hicache.pools.tierpools import TierPools
from hicache.treenode import TreeNode


class L1Windows:
    """The L1 table's windows, read for hits under group hit policy `policy`."""

    def __init__(self, table: PageTable, page_size: int, policy: str = ALL_POOLS) -> None:
        self.policy = check_policy(policy)
        self.page_size = page_size  # tokens per anchor page
        self.table = table if isinstance(table, TierPools) and table.window else None
        required: set[str] = set()
        if isinstance(table, TierPools):
            required = set(required_pools(table.group, policy))  # ConfigError: a bad pairing
        # (pool, window in the pool's pages, ratio) for every trailing pool a hit needs.
        self.required: tuple[tuple[str, int, int], ...] = () if self.table is None else tuple(
            (name, self.table.group.pool(name).window_pages, self.table.ratios[name])
            for name in self.table.window if name in required)

    @property
    def tombstones(self) -> bool:
        """Whether L1 can free a window at all (a group with a trailing side pool)."""
        return self.table is not None

    def freed(self, node: TreeNode) -> bool:
        """Whether `node`'s L1 value has lost its window (False without one, or a value)."""
        value = node.value[0]
        if self.table is None or value is None or not value.size:
            return False
        return not bool(self.table.window_present(value[:1])[0])

    def clip(self, run: Sequence[TreeNode]) -> int:
        """How many nodes of `run` (the L1 run of a match, root's child first) a hit may
        cover: all of them when no required trailing pool, else up to the last node end that
        every required trailing pool accepts (`swa_boundaries`, in that pool's pages)."""
        if not self.required or not any(self.freed(n) for n in run):
            return len(run)
        keep = len(run)
        for _, window, ratio in self.required:
            path = [(len(n.key) // self.page_size * ratio, not self.freed(n)) for n in run]
            accepted = set(swa_boundaries(path, window))
            best, end = 0, 0
            for i, (pages, _) in enumerate(path):
                end += pages
                if end in accepted:
                    best = i + 1
            keep = min(keep, best)
        return keep
