"""The control plane's read-only side: the queries the controller asks, and the snapshot.

`PlaneQueries` is the base of `ControlPlane`. Nothing here changes the plane, so every method
stays available on a poisoned plane (spec/invariants.md, "A poisoned plane"): callers that
must not read node fields (the controller, spec/restore.md) ask these instead.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

import numpy as np

from hicache.core.execute import Executor, node_segments
from hicache.core.lifecycle import ABSENT, RESIDENT, Lifecycle
from hicache.core.pages import Pages, pages
from hicache.core.records import PendingOp, Request, UnknownRequest
from hicache.core.snapshot import Digests, NodeView, OpView, RequestView, Snapshot, TierView
from hicache.core.tiers import TIERS, Tier
from hicache.core.trace import TraceHeader, Tracer
from hicache.core.tree import HiRadixTree, TreeNode
from hicache.errors import IllegalTransition
from hicache.pools.tiertable import TierTable
from hicache.pools.windows import L1Windows

TIER_NAMES = tuple(str(t) for t in TIERS)  # "L1", "L2", "L3": the snapshot's keys
_L1, _L2, _L3 = TIER_NAMES  # the snapshot spells its per-tier dicts out (faster than zip)
_D2H_PENDING = "D2H_PENDING"  # L2's state while a backup from L1 is in flight (lifecycle.toml)


class PlaneQueries:
    """Read-only questions about the tree, the page tables, the requests and the ops."""

    tree: HiRadixTree
    tables: tuple[TierTable, ...]  # one per tier: a pool group, or a single pool's (of one)
    executor: Executor
    lifecycle: Lifecycle  # its `hash_keyed_tiers` are named in the snapshot's tier views
    page_size: int
    ops: dict[int, PendingOp]
    requests: dict[int, Request]
    digests: Digests | None  # page digests for I4 (the data plane's), or None
    windows: L1Windows  # L1's freed windows, read for hits (spec/pools.md, "Freed windows")
    tracer: Tracer
    _next_op: int  # the id the next issued op takes (ControlPlane.next_op_id)

    def holds(self, node: TreeNode, tier: Tier | str) -> bool:
        """Whether `node`'s pages are published (RESIDENT) in `tier`. The root holds every
        tier (it has no pages: an empty prefix is always present)."""
        return node.is_root or node.state[TIERS.index(Tier(tier))] == RESIDENT

    def residency(self, node: TreeNode, tier: Tier | str) -> str:
        """`node`'s residency sub-state in `tier` (spec/lifecycle.toml: ABSENT, RESIDENT or
        `<DIR>_PENDING`); RESIDENT for the root."""
        return RESIDENT if node.is_root else node.state[TIERS.index(Tier(tier))]

    def filling_op(self, node: TreeNode, tier: Tier | str) -> int | None:
        """The id of the pending op filling `node` in `tier`, or None."""
        return None if node.is_root else node.pending[TIERS.index(Tier(tier))]

    def hits(self, node: TreeNode) -> int:
        """How many touching matches passed through `node` (what selective write-through reads)."""
        return node.hits

    def is_live(self, node: TreeNode) -> bool:
        """Whether `node` (this very object) is still in the tree; a removed node must never
        be acted on (match again)."""
        return self.tree.contains(node)

    def leading_run(self, nodes: Sequence[TreeNode], tier: Tier | str) -> TreeNode | None:
        """The last node of the leading run of `nodes` (parent first) RESIDENT in `tier`;
        None when the first is not."""
        deepest = None
        for n in nodes:
            if not self.holds(n, tier):
                break
            deepest = n
        return deepest

    def servable_mask(self, nodes: Sequence[TreeNode]) -> list[int]:
        """Over `nodes` (parent first, along one path): entry i (0..len) is 1 when the prefix
        through the i-th node may be served from L1 -- nodes[:i] all RESIDENT in L1 and, under
        the group hit policy, no freed window refusing that end (`windows.clip`, spec/pools.md
        "Freed windows"); entry 0 (serve none of them) is always 1. What tensor-parallel
        ranks intersect before a prefill serves (spec/tp.md C1c)."""
        mask = [1]
        deepest = self.leading_run(nodes, Tier.L1)
        run = [] if deepest is None else list(nodes[: nodes.index(deepest) + 1])
        for i in range(1, len(nodes) + 1):
            if i > len(run):
                mask.append(0)
            elif not self.windows.tombstones:
                mask.append(1)
            else:
                path = self.tree.path_to_root(run[i - 1])[::-1]
                end = self.windows.clip(path) * self.page_size
                mask.append(int(end == self.tree.prefix_tokens(run[i - 1])))
        return mask

    def servable_in_l1(self, nodes: Sequence[TreeNode]) -> TreeNode | None:
        """The deepest node of `nodes` at whose end the prefix may be served from L1
        (`servable_mask`'s largest entry), or None when no node of `nodes` qualifies."""
        mask = self.servable_mask(nodes)
        last = max(i for i, ok in enumerate(mask) if ok)
        return nodes[last - 1] if last else None

    def prefix_pages(self, node: TreeNode, tier: Tier | str) -> Pages:
        """`tier`'s physical pages of the whole prefix ending at `node`, in token order (the
        root's: none). IllegalTransition if some node on the path does not hold `tier`."""
        t = TIERS.index(Tier(tier))
        path = [] if node.is_root else list(reversed(self.tree.path_to_root(node)))
        values = [n.value[t] for n in path]
        if any(v is None for v in values):
            gap = next(n.node_id for n, v in zip(path, values) if v is None)
            raise IllegalTransition(
                "-", str(TIERS[t]), "-", f"node {gap} on the path does not hold {TIERS[t]}"
            )
        return np.concatenate([v for v in values if v is not None]) if values else pages()

    def holder(
        self, tier: Tier | str, page: int, nodes: Iterable[TreeNode] | None = None
    ) -> TreeNode | None:
        """The node (among `nodes`, default every node) whose `tier` value holds physical
        page `page`, or None."""
        t = TIERS.index(Tier(tier))
        for n in self.tree.nodes() if nodes is None else nodes:
            v = n.value[t]
            if v is not None and page in v:
                return n
        return None

    def generation(self, tier: Tier | str, page: int) -> int:
        """How many times physical page `page` of `tier` has been reserved: (page, generation)
        names one content, so a remembered page is the same only while this is unchanged."""
        return int(self.tables[TIERS.index(Tier(tier))].generation[page])

    def subtree_holding(self, node: TreeNode, tier: Tier | str) -> list[TreeNode]:
        """`node` and every descendant reached through nodes RESIDENT in `tier`, parent first
        (empty when `node` does not hold `tier`)."""
        t = TIERS.index(Tier(tier))
        found: list[TreeNode] = []
        stack = [node]
        while stack:
            n = stack.pop()
            if not n.is_root and n.state[t] == RESIDENT:
                found.append(n)
                stack.extend(n.children.values())
        return found

    def candidates(self, tier: Tier | str, keep: Collection[TreeNode] = ()) -> list[TreeNode]:
        """Eviction candidates of `tier`, in eviction order (spec/eviction.md): leaves in
        `tier`, unlocked and not pending there, whose `evict_lN` guards hold, not in `keep`;
        least recently used first, ties broken by the older node id."""
        t = TIERS.index(Tier(tier))
        name = f"evict_{str(TIERS[t]).lower()}"
        kept = {n.node_id for n in keep}
        return [
            n for n in self.tree.candidates(t) if n.node_id not in kept and self._allows(name, n)
        ]

    def evictable_l1(self, keep: Collection[TreeNode] = ()) -> int:
        """L1 pages `evict("L1", n, keep)` could free now, leaf by leaf: those of every node
        resident in L1 whose whole L1 subtree could go -- unlocked in L1, no backup of it in
        flight (the `evict_l1` guards; tests/test_eviction_room.py holds this to the table),
        not in `keep`, no load-back pending below it. A caller refusing for lack of room
        asks this first, so that a refused operation evicts nothing (spec/README.md)."""
        kept = {n.node_id for n in keep}
        order, stack = [], [self.tree.root]  # parents before children; walked in reverse
        while stack:
            n = stack.pop()
            order.append(n)
            stack.extend(n.children.values())
        goes: dict[int, bool] = {}  # node id -> the node and its whole L1 subtree can go
        freed = 0
        for n in reversed(order):  # children before their parent (no recursion: trees run deep)
            goes[n.node_id] = can = (
                not n.is_root
                and n.state[0] == RESIDENT
                and n.lock[0] == 0
                and n.state[1] != _D2H_PENDING
                and n.node_id not in kept
                and all(goes[c.node_id] or c.state[0] == ABSENT for c in n.children.values())
            )
            freed += n.num_pages if can else 0
        return freed

    def _allows(self, name: str, node: TreeNode) -> bool:
        """Whether transition `name` is enabled on `node` (the row's source sub-state and every
        guard hold, context guards included), changing nothing: the executor's pure plan."""
        try:
            self.executor.plan(name, node_segments([node]))
        except IllegalTransition:
            return False
        return True

    def free_pages(self, tier: Tier | str) -> int:
        """Pages of `tier` that are FREE (neither private nor published)."""
        return self.tables[TIERS.index(Tier(tier))].free_count

    def usage(self, tier: Tier | str) -> dict[str, int]:
        """`tier`'s pages by owner (capacity, free, private, tree) and how many published
        pages are eviction candidates now, or locked (all counts in anchor pages). A pool
        group adds `free.<pool>` per allocating pool (in its own pages); pools without an
        allocator (sidecar, state) have no free list and are skipped."""
        t = TIERS.index(Tier(tier))
        table = self.tables[t]
        out = {
            "capacity": table.capacity,
            "free": table.free_count,
            "private": table.count(1),
            "tree": table.count(2),
            "candidates": sum(n.num_pages for n in self.candidates(TIERS[t])),
            "locked": sum(
                n.num_pages for n in self.tree.nodes() if n.lock[t] > 0 and n.state[t] == RESIDENT
            ),
        }
        if len(table.pools) > 1:
            out.update({f"free.{pool}": n for pool, n in table.free_pages_by_pool().items()})
        return out

    def cached_len(self, request_id: int) -> int:
        """Tokens of the request's prompt served from the cache (UnknownRequest if not live)."""
        return self._request(request_id).cached_len

    def prefix_node(self, request_id: int) -> TreeNode:
        """The deepest node whose L1 prefix the request holds locked (the root: none)."""
        return self._request(request_id).locked

    # -- observation ----------------------------------------------------------------------

    def trace_header(self, engine: str = "hicache control plane") -> TraceHeader:
        """The header a trace of this plane starts with (spec/trace.md, "Header"); a plane
        with a pool group names it, its hit policy and its side pools' capacities."""
        return TraceHeader(
            self.page_size,
            {t.tier: t.capacity for t in self.tables},
            engine=engine,
            pools=self._pools_header(),
        )

    def _pools_header(self) -> dict[str, object]:
        """The header's `pools` (empty for a single-pool plane)."""
        groups = [t for t in self.tables if len(t.pools) > 1]
        if not groups:
            return {}
        side = {
            t.tier: {name: t.pool_tables()[name].capacity for name in t.held_by} for t in groups
        }
        return {
            "group": groups[0].group_name,
            "hit_policy": self.windows.policy,
            "capacities": side,
        }

    def snapshot(self) -> Snapshot:
        """Every record, independently, as plain data for the invariant checkers."""
        ps = self.page_size
        views = tuple(
            [
                NodeView(
                    n.node_id,
                    None if (parent := n.parent) is None else parent.node_id,
                    tuple([c.node_id for c in n.children.values()]),
                    len(n.key),
                    {_L1: (v := n.value)[0], _L2: v[1], _L3: v[2]},
                    {_L1: (st := n.state)[0], _L2: st[1], _L3: st[2]},
                    {_L1: (lk := n.lock)[0], _L2: lk[1], _L3: lk[2]},
                    {_L1: (pd := n.pending)[0], _L2: pd[1], _L3: pd[2]},
                    parent is None or parent.children.get(n.key[:ps]) is n,
                )
                for n in [self.tree.root, *self.tree.nodes()]
            ]
        )
        # Each op holds one path lock in its source tier, on its deepest node (see `issue`).
        ops = tuple(
            OpView(
                op.op_id,
                op.direction.value,
                str(op.direction.source),
                str(op.direction.target),
                tuple(n.node_id for n in op.nodes),
                op.source_pages,
                op.target_pages,
                *op.token_range,
                lock_node_id=op.nodes[-1].node_id,
            )
            for op in self.ops.values()
        )
        reqs = tuple(
            RequestView(
                r.request_id,
                r.cached_len,
                locked_node_id=r.locked.node_id,
                pins=tuple((n.node_id, str(TIERS[t])) for n, t in r.pins),
                private_pages={"L1": r.private_pages},
            )
            for r in self.requests.values()
        )
        tiers = {
            str(t): TierView(
                str(t),
                tab.capacity,
                tab.owner.copy(),
                self.tree.pages_held[i],
                tab.pool_views(),
                self.windows.hit_pages if i == 0 else 0,
                t in self.lifecycle.hash_keyed_tiers,
                t in self.lifecycle.stacked_tiers,
            )
            for i, (t, tab) in enumerate(zip(TIERS, self.tables))
        }
        return Snapshot(
            self.page_size, tiers, views, ops, reqs, self.digests, self.tree.root.node_id
        )

    def state_key(self) -> tuple[object, ...]:
        """Everything the plane records, as one plain hashable tuple: the tree's records with
        their history (`HiRadixTree.state_key`: LRU ticks, hits, id counter), every tier's
        page table (owners, reservation generations; a pool group's side pools and held-by
        maps), the pending ops in issue order and the next op id, the live requests (tokens,
        lock, lengths, private pages, pins in order) and the trace events emitted so far.
        Equal keys before and after a call mean the call changed nothing: what "raise, state
        unchanged" promises of every refused call (spec/README.md), and what the fuzz
        machine holds each illegal call to (hicache/testing/illegal.py). Names and history
        are kept, never renamed (hicache/oracle/modelcheck/canonical.py reduces for its search)."""
        tables = tuple(
            [
                (
                    t.owner.tobytes(),
                    t.generation.tobytes(),
                    t.side_key(),
                )
                for t in self.tables
            ]
        )
        ops = tuple(
            [
                (
                    op.op_id,
                    op.direction.value,
                    tuple([n.node_id for n in op.nodes]),
                    op.source_pages.tobytes(),
                    op.target_pages.tobytes(),
                    op.request_id,
                )
                for op in self.ops.values()
            ]
        )
        reqs = tuple(
            [
                (
                    r.request_id,
                    r.tokens,
                    r.locked.node_id,
                    r.published_len,
                    r.cached_len,
                    r.private_pages.tobytes(),
                    r.private_start,
                    tuple([(n.node_id, t) for n, t in r.pins]),
                )
                for r in self.requests.values()
            ]
        )
        return (self.tree.state_key(), tables, ops, self._next_op, reqs, self.tracer.seq)

    def _request(self, request_id: int) -> Request:
        req = self.requests.get(request_id)
        if req is None:
            raise UnknownRequest(request_id)
        return req
