"""Windows in L1: which anchor pages still hold their trailing pools, and where an L1 hit may end.

A group with a trailing side pool (hit policy `TRAILING_PAGES`: dsv4's `swa`) can lose a
node's *window* in L1 while the node's anchor pages and sidecars stay (`TierPools.tombstone`,
the control plane's `tombstone`). A hit then needs more than the anchor's pages: under the
group hit policy `all_pools` it may end only at an endpoint every required pool accepts
(`agreed_hit` over the L1 run's pages: a trailing pool needs its `window_pages` before the
end), so the L1 hit is clipped there -- mid-node too (the tree then splits the node). Under
`anchor_recompute_swa` the trailing pools are not required: the anchor serves the whole run,
but when the window before its end (`replay_pages` anchor pages) has a freed page, that window
is replayed -- the L1 hit ends where it begins, the request recomputes it, and its copy revives
the freed windows (`ControlPlane._revive`), so the next hit on it replays nothing.

    L1 run (pages)   a0 a1 | a2 a3 | a4 a5      swa W = 2 (ratio 1); node 2's window freed
    swa present      ■  ■  | □  □  | ■  ■
    legal ends       0 1 2            6          (3..5: a gap within the 2 pages before)
    L1 hit           6 pages: the window before the end is whole again (SGLang #29204, F23)

Contract: `L1Windows` reads the L1 table and node values only; it changes nothing. A plane
without such a group (one pool, or no trailing side pool) clips nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

import numpy as np

from hicache.choices import HitPolicy
from hicache.core.lifecycle import RESIDENT
from hicache.core.pages import PageTable
from hicache.core.treenode import TreeNode
from hicache.pools.hits import ALL_POOLS, agreed_hit, check_policy, matched_pools, required_pools
from hicache.pools.tierpools import TierPools


class L1Windows:
    """The L1 table's windows, read for hits under group hit policy `policy`; `page_size` is
    tokens per anchor page."""

    def __init__(
        self, table: PageTable, page_size: int, policy: HitPolicy | str = ALL_POOLS
    ) -> None:
        self.policy = check_policy(policy)
        self.page_size = page_size
        self.table = table if isinstance(table, TierPools) and table.window else None
        if isinstance(table, TierPools):
            required_pools(table.group, policy)  # ConfigError: a group this policy cannot serve

    @property
    def tombstones(self) -> bool:
        """Whether L1 can free a window at all (a group with a trailing side pool)."""
        return self.table is not None

    @property
    def hit_pages(self) -> int:
        """Anchor pages an L1 hit needs, each with its window, just before its end: the
        widest required trailing pool's `ceil(window_pages / ratio)` (0: no clip, as under
        `anchor_recompute_swa` or without a trailing pool)."""
        return self._window_anchor_pages() if self.policy == ALL_POOLS else 0

    @property
    def replay_pages(self) -> int:
        """Under `anchor_recompute_swa`: the anchor pages before the anchor's hit that are
        replayed when one of them lost its window (R68) -- the widest trailing pool's window,
        `ceil(window_pages / ratio)` (0 under `all_pools` or without a trailing pool)."""
        return 0 if self.policy == ALL_POOLS else self._window_anchor_pages()

    def _window_anchor_pages(self) -> int:
        if self.table is None:
            return 0
        group = self.table.group
        return max(
            -(-group.pool(name).window_pages // self.table.ratios[name])
            for name in self.table.window
        )

    def replay_start(self, run: Sequence[TreeNode]) -> int | None:
        """Under `anchor_recompute_swa`: the token where the window a hit ending with the L1
        run `run` (root's child first) would replay begins (None: no replay, or it begins at
        0). The control plane splits the node straddling it before it matches, so the
        replay recomputes -- and revives -- whole nodes."""
        n = sum(len(node.key) for node in run) // self.page_size
        start = n - self.replay_pages
        return start * self.page_size if self.replay_pages and start > 0 else None

    def freed(self, node: TreeNode) -> bool:
        """Whether `node`'s L1 value has lost its window (False without one, or a value)."""
        value = node.value[0]
        if self.table is None or value is None or not value.size:
            return False
        return not bool(self.table.window_present(value[:1])[0])

    # -- hits ----------------------------------------------------------------------------------

    def clip(self, run: Sequence[TreeNode]) -> int:
        """The anchor pages of `run` (the L1 run of a match, root's child first) an L1 hit
        may cover under the policy. `all_pools`: all of them unless a required pool's window
        is freed somewhere, else the largest endpoint every required pool accepts.
        `anchor_recompute_swa`: all of them unless a page of the last `replay_pages` lost its
        window, else all but those (the replayed window; 0 when the run is shorter)."""
        if self.policy == ALL_POOLS:
            return self._hit(run)
        n = sum(len(node.key) for node in run) // self.page_size
        window, end = max(0, n - self.replay_pages), 0
        for node in run:
            end += len(node.key) // self.page_size
            if end > window and self.freed(node):
                return window
        return n

    def endpoint_mask(self, run: Sequence[TreeNode], bound: int) -> list[int]:
        """Over anchor endpoints 0..`bound` of the L1 run `run` (root's child first): 1 where
        the endpoint is 0, or a node end at which `clip` lets an L1 hit end. What the ranks of
        a tensor-parallel cache intersect (spec/tp.md C1b): the largest common endpoint is
        legal on every rank, the minimum of per-rank maxima need not be."""
        mask = [0] * (bound + 1)
        mask[0], end = 1, 0
        for i, node in enumerate(run):
            end += len(node.key) // self.page_size
            if end > bound:
                break
            mask[end] = int(self.clip(run[: i + 1]) == end)
        return mask

    def share(self, path: Sequence[TreeNode], hit_tokens: int) -> tuple[int, int]:
        """A freed window's share of a match over `path` whose L1 hit is `hit_tokens`:
        (tokens of the L1 run the hit left out, but for a replay: `all_pools` clipped them,
        or the ranks agreed on less; tokens of the window replayed: `anchor_recompute_swa`,
        when a page of the window before the run's end lost its window, the window's
        `replay_pages`, all of the run when shorter). Both are recomputed."""
        if self.table is None:
            return 0, 0
        run: list[TreeNode] = []
        for node in path:
            if node.state[0] != RESIDENT:
                break
            run.append(node)
        held = sum(len(n.key) for n in run)
        replayed = 0 if self.policy == ALL_POOLS else held - self.clip(run) * self.page_size
        return held - hit_tokens - replayed, replayed

    def _hit(self, run: Sequence[TreeNode]) -> int:
        """`agreed_hit` under `all_pools` over the anchor pages of `run`."""
        n = sum(len(node.key) // self.page_size for node in run)
        if self.table is None or not any(self.freed(node) for node in run):
            return n
        table = self.table
        present = np.concatenate(
            [table.window_present(node.value[0]) for node in run if node.value[0] is not None]
        )[:n]
        group = table.group
        presence = {
            p.name: (
                np.repeat(present, group.ratio(p.name))
                if p.source in table.window
                else np.ones(n * group.ratio(p.name), dtype=bool)
            ).tolist()
            for p in matched_pools(group)
        }
        return agreed_hit(group, presence, n, ALL_POOLS).hit

    # -- make-room -----------------------------------------------------------------------------

    def anchor_free(self) -> int:
        """FREE anchor pages of L1 (the anchor's own table: windows aside)."""
        assert self.table is not None, "only a plane whose L1 frees windows asks"
        return self.table.group_table.tables[self.table.anchor].free_count

    def window_free(self) -> int:
        """Anchor pages whose window the trailing pools could give now (`window_pages_free`)."""
        assert self.table is not None, "only a plane whose L1 frees windows asks"
        return self.table.window_pages_free()

    def candidates(
        self, nodes: Iterable[TreeNode], keep: Collection[TreeNode] = ()
    ) -> list[TreeNode]:
        """Nodes whose L1 window may be freed now, least recently used in L1 first (ties: the
        older node): RESIDENT in L1 with the window present, unlocked there (no request, pin
        or backup in flight holds it), not in `keep`. Internal nodes too: a freed window
        keeps the node, so there is no leaf rule (SGLang frees internal nodes' SWA first)."""
        if self.table is None:
            return []
        kept = {n.node_id for n in keep}
        found = [
            n
            for n in nodes
            if not n.is_root
            and n.state[0] == RESIDENT
            and not n.lock[0]
            and n.node_id not in kept
            and not self.freed(n)
        ]
        return sorted(found, key=lambda n: (n.last_access[0], n.node_id))
