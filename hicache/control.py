"""The control plane: the executable spec's state, and the only code that changes it.

`ControlPlane` joins the HiRadixTree (topology + per-tier values), one `PageTable` per tier
(physical-page ownership), the pending-op table, the live requests, the lifecycle machine and
the tracer. Every public method is one spec transition applied to a set of logical pages
(the pages of one or more nodes) *atomically*:

    1. validate   every affected node's transition with `Lifecycle.check` (and every other
                  precondition) -- raise a typed error with NOTHING changed if any fails;
    2. apply      page-table moves, tree values/sub-states, locks;
    3. trace      one event per node touched (spec/trace.md), only when a sink is set;
    4. check      the invariants, per the check mode (off / every / periodic N).

No bytes move here. The controller (data plane attached) calls `issue`, then later -- when a
handle's completion is *observed* -- `complete`, `fail` or `cancel`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Collection, Iterable, Sequence

import numpy as np
import numpy.typing as npt

from hicache.errors import HiCacheError, IllegalTransition
from hicache.invariants.checker import InvariantChecker, parse_check_mode
from hicache.invariants.snapshot import (
    NodeView, OpView, Pages, RequestView, Snapshot, TierView, pages,
)
from hicache.lifecycle import ABSENT, PRIVATE, RESIDENT, Lifecycle, States, composite_name, load_lifecycle
from hicache.pages import PageTable
from hicache.tiers import TIERS, Direction, Tier
from hicache.trace import Tracer
from hicache.tree import HiRadixTree, MatchResult, TreeNode

Digests = Callable[[str, Pages], npt.NDArray[np.uint64]]


class UnknownRequest(HiCacheError):
    def __init__(self, request_id: int) -> None:
        super().__init__(f"request {request_id} is not live; call begin_request first")


class UnknownOp(HiCacheError):
    def __init__(self, op_id: int) -> None:
        super().__init__(f"op {op_id} is not pending (already completed, failed or cancelled?)")


@dataclass
class PendingOp:
    """One transfer between `issue` and its observed completion. `nodes` are in path order
    (parent first); page arrays are the nodes' pages concatenated in that order."""

    op_id: int
    direction: Direction
    nodes: list[TreeNode]
    source_pages: Pages
    target_pages: Pages
    request_id: int | None

    @property
    def token_range(self) -> tuple[int, int]:
        start = _prefix_start(self.nodes[0])
        return start, start + sum(len(n.key) for n in self.nodes)


@dataclass
class Request:
    """A live request. `locked` is the deepest node whose L1 prefix it holds locked (root:
    none); `cached_len` tokens of its prefix are served from the cache (<= published_len)."""

    request_id: int
    tokens: tuple[int, ...]
    locked: TreeNode
    published_len: int = 0
    cached_len: int = 0
    private_pages: Pages = field(default_factory=pages)
    private_start: int = 0  # token offset the private pages begin at
    pins: list[tuple[TreeNode, int]] = field(default_factory=list)  # (node, tier index) locks


def _prefix_start(node: TreeNode) -> int:
    start = 0
    p = node.parent
    while p is not None:
        start += len(p.key)
        p = p.parent
    return start


class ControlPlane:
    """Tree + page tables + pending ops + requests, changed only through spec transitions."""

    def __init__(
        self,
        page_size: int,
        capacities: Sequence[int],
        *,
        check_mode: str = "every",
        tracer: Tracer | None = None,
        digests: Digests | None = None,
        lifecycle: Lifecycle | None = None,
    ) -> None:
        if len(capacities) != len(TIERS):
            raise ValueError(f"capacities: one per tier {[str(t) for t in TIERS]}, got {list(capacities)}")
        self.lifecycle = lifecycle or load_lifecycle()
        self.tree = HiRadixTree(page_size)
        self.page_size = page_size
        self.tables = tuple(PageTable(str(t), c) for t, c in zip(TIERS, capacities))
        self.ops: dict[int, PendingOp] = {}
        self.requests: dict[int, Request] = {}
        self.tracer = tracer or Tracer()
        self.digests = digests
        self.checker = InvariantChecker(parse_check_mode(check_mode))
        self._next_op = 1
        self.tree.on_split.append(self._on_split)

    # -- requests -------------------------------------------------------------------------

    def begin_request(self, request_id: int, tokens: Sequence[int], match_len: int | None = None) -> MatchResult:
        """Match the prompt (its first `match_len` tokens, default all), lock its L1 hit, and
        serve that prefix from the cache (`cached_len` = L1 hit length). Returns the match
        (per-tier lengths and handles)."""
        if request_id in self.requests:
            raise HiCacheError(f"request {request_id} is already live; end it first")
        m = self.tree.match(tokens[: len(tokens) if match_len is None else max(0, match_len)])
        l1 = m.handles[0]
        if not l1.is_root:
            self.tree.lock(l1, 0)
        req = Request(request_id, tuple(tokens), l1, m.lengths[0], m.lengths[0])
        self.requests[request_id] = req
        if self.tracer.enabled:
            self.tracer.emit("request_start", request=request_id,
                             detail={"hit": list(m.lengths), "tokens": len(tokens)})
            self.tracer.emit("cached_len", request=request_id, token_end=req.cached_len)
        self._check(f"begin_request {request_id}")
        return m

    def compute(self, request_id: int, n_tokens: int) -> Pages:
        """Reserve private L1 pages for the request's next `n_tokens` (page aligned) tokens,
        after its published prefix: transition `compute` (ABSENT -> PRIVATE). The range may
        end in the prompt's partial last page (the *tail page*): it is computed like any page
        but never inserted -- it stays private to the request and is released at its end."""
        req = self._request(request_id)
        # Verify the range is page aligned and inside the prompt (invariant I3).
        if n_tokens % self.page_size or n_tokens <= 0:
            raise IllegalTransition("compute", "L1", "ABSENT", f"{n_tokens} tokens is not a positive multiple of page size {self.page_size}")
        if req.private_pages.size:
            raise IllegalTransition("compute", "L1", "L1_PRIVATE", "the request already holds private pages; insert or end it first")
        if req.published_len + n_tokens > -(-len(req.tokens) // self.page_size) * self.page_size:
            raise IllegalTransition("compute", "L1", "ABSENT", "range runs past the prompt's last page")
        got = self.tables[0].reserve(n_tokens // self.page_size)
        req.private_pages, req.private_start = got, req.published_len
        if self.tracer.enabled:
            self.tracer.emit("compute", tier="L1", request=request_id, token_start=req.private_start,
                             token_end=req.private_start + n_tokens, pages=tuple(int(p) for p in got),
                             before="ABSENT", after="L1_PRIVATE")
        self._check(f"compute {request_id}")
        return got

    def insert(self, request_id: int) -> int:
        """Publish the request's private pages into the tree (`insert`), discarding the pages
        of nodes already in L1 (`discard`); stop before a node whose L1 load-back is pending
        (those pages stay private to the request). Advances published_len and cached_len.
        Returns the new cached_len."""
        req = self._request(request_id)
        if not req.private_pages.size:
            return req.cached_len
        ps = self.page_size
        # Only whole pages of the prompt are published; a tail page stays private.
        end = min(req.private_start + req.private_pages.size * ps, len(req.tokens) // ps * ps)
        if end <= req.private_start:
            return req.cached_len
        m = self.tree.match(req.tokens[:end], touch=False)
        plan: list[tuple[TreeNode, str, Pages]] = []
        pos = 0
        for node in m.path:
            n_start, pos = pos, pos + len(node.key)
            if pos <= req.private_start:
                continue
            # Verify node boundaries line up with the private range (splits only add boundaries).
            assert n_start >= req.private_start, "a node straddles the request's published boundary"
            mine = req.private_pages[(n_start - req.private_start) // ps:(pos - req.private_start) // ps]
            l1 = node.state[0]
            if l1 == ABSENT:
                plan.append((node, "insert", mine))
            elif l1 == RESIDENT:
                plan.append((node, "discard", mine))
            else:
                break  # load-back in flight: keep the rest private (see docstring)
        else:
            if m.matched_len < end:
                first = (max(m.matched_len, req.private_start) - req.private_start) // ps
                last = (end - req.private_start) // ps
                parent = m.path[-1] if m.path else self.tree.root
                plan.append((parent, "new", req.private_pages[first:last]))
        for node, what, _ in plan:
            sub = node.state if what != "new" else [ABSENT, ABSENT, ABSENT]
            self.lifecycle.check("insert" if what != "discard" else "discard", (PRIVATE, sub[1], sub[2]))
        published = req.published_len
        deepest = req.locked
        used = 0
        for node, what, mine in plan:
            used += mine.size
            if what == "discard":
                self.tables[0].release(mine)
                self._emit_node("discard", node, 0, mine, (PRIVATE, node.state[1], node.state[2]), request_id)
            else:
                if what == "new":
                    start = max(m.matched_len, req.private_start)
                    node = self.tree.add_child(node, req.tokens[start:end])
                before = (PRIVATE, node.state[1], node.state[2])
                self.tables[0].publish(mine)
                self.tree.set_value(node, 0, mine, RESIDENT)
                self._emit_node("insert", node, 0, mine, before, request_id)
            deepest = node
            published += mine.size * ps
        if deepest is not req.locked:
            self.tree.lock(deepest, 0)
            if not req.locked.is_root:
                self.tree.unlock(req.locked, 0)
            req.locked = deepest
        req.private_pages = req.private_pages[used:]
        req.private_start += used * ps
        req.published_len = req.cached_len = published
        if self.tracer.enabled:
            self.tracer.emit("cached_len", request=request_id, token_end=req.cached_len)
        self._check(f"insert {request_id}")
        return req.cached_len

    def advance_cached_len(self, request_id: int, node: TreeNode) -> int:
        """After a restore into L1 completed and was published: take the request's L1 lock
        down to `node` and serve its prefix from the cache (I5: publication precedes this)."""
        req = self._request(request_id)
        path = self.tree.path_to_root(node)
        # Verify every node up to `node` is published in L1 (completion -> publication -> cached_len).
        bad = [n.node_id for n in path if n.state[0] != RESIDENT]
        if bad:
            raise IllegalTransition("cached_len", "L1", "-", f"nodes {bad} are not RESIDENT in L1 yet")
        if req.locked not in path and not req.locked.is_root:
            raise IllegalTransition("cached_len", "L1", "-", "node does not extend the request's locked prefix")
        if req.private_pages.size:
            raise IllegalTransition("cached_len", "L1", "L1_PRIVATE", "the request holds private pages; insert them first")
        self.tree.lock(node, 0)
        if not req.locked.is_root:
            self.tree.unlock(req.locked, 0)
        req.locked = node
        req.published_len = req.cached_len = self.tree.prefix_tokens(node)
        if self.tracer.enabled:
            self.tracer.emit("cached_len", request=request_id, node=node.node_id, token_end=req.cached_len)
        self._check(f"cached_len {request_id}")
        return req.cached_len

    def pin(self, request_id: int, node: TreeNode, tier: int) -> None:
        """Lock `node`'s path in tier index `tier` for the request until `unpin` or the
        request's end: what a multi-stage restore holds on the nodes it planned, so that no
        eviction (nested make-room included) removes them between its stages. Traced `lock`.
        IllegalTransition (nothing changed) if `node` is not in the tree."""
        req = self._request(request_id)
        self._verify_live([node], "lock", TIERS[tier])
        self.tree.lock(node, tier)
        req.pins.append((node, tier))
        if self.tracer.enabled:
            self.tracer.emit("lock", tier=str(TIERS[tier]), node=node.node_id, request=request_id)

    def unpin(self, request_id: int, node: TreeNode | None = None) -> int:
        """Release the request's pins (all of them, or those on `node`), newest first; a node
        left dead by it is removed. Returns how many were released."""
        req = self._request(request_id)
        keep = [(n, t) for n, t in req.pins if node is not None and n is not node]
        gone = [(n, t) for n, t in req.pins if node is None or n is node]
        req.pins = keep
        for n, t in reversed(gone):
            self.tree.unlock(n, t)
            if self.tracer.enabled:
                self.tracer.emit("unlock", tier=str(TIERS[t]), node=n.node_id, request=request_id)
        for n, _ in reversed(gone):
            for r in self.tree.remove_if_dead(n):
                if self.tracer.enabled:
                    self.tracer.emit("node_remove", node=r.node_id)
        if gone:
            self._check(f"unpin {request_id}")
        return len(gone)

    def end_request(self, request_id: int) -> None:
        """Finish or abort: release private pages (`discard`), its pins and its prefix lock.
        Transfers it issued stay pending; the caller cancels them first (see `cancel`)."""
        req = self._request(request_id)
        self.unpin(request_id)
        if req.private_pages.size:
            self.tables[0].release(req.private_pages)
            if self.tracer.enabled:
                self.tracer.emit("discard", tier="L1", request=request_id, pages=tuple(int(p) for p in req.private_pages),
                                 before="L1_PRIVATE", after="ABSENT")
        if not req.locked.is_root:
            self.tree.unlock(req.locked, 0)
        del self.requests[request_id]
        if self.tracer.enabled:
            self.tracer.emit("request_end", request=request_id)
        self._check(f"end_request {request_id}")

    # -- transfers ------------------------------------------------------------------------

    def issue(self, direction: Direction, nodes: Sequence[TreeNode], request_id: int | None = None) -> PendingOp:
        """`<dir>_issue` on every node: reserve private target pages, lock the source, mark
        the target tier pending. `nodes` must be a parent-first chain whose first node's
        parent already holds the target tier (no backup gap, S6). OutOfPages or
        IllegalTransition leave everything unchanged."""
        src, dst = TIERS.index(direction.source), TIERS.index(direction.target)
        name = f"{direction.value.lower()}_issue"
        if not nodes:
            raise IllegalTransition(name, str(direction.target), "-", "no nodes")
        for parent, child in zip(nodes, nodes[1:]):
            if child.parent is not parent:
                raise IllegalTransition(name, str(direction.target), "-", f"node {child.node_id} is not a child of {parent.node_id}")
        self._verify_live(nodes, name, direction.target)
        first_parent = nodes[0].parent
        assert first_parent is not None, "a live non-root node has a parent"
        if not first_parent.is_root and first_parent.state[dst] != RESIDENT:
            raise IllegalTransition(
                name, str(direction.target), composite_name(_states(first_parent)),
                f"parent node {first_parent.node_id} does not hold {direction.target} (a backup gap)",
            )
        if request_id is not None:
            self._request(request_id)
        for n in nodes:
            self.lifecycle.check(name, _states(n), _locks(n))
        n_pages = sum(n.num_pages for n in nodes)
        target = self.tables[dst].reserve(n_pages)  # OutOfPages here changes nothing
        source = np.concatenate([_value(n, src) for n in nodes]) if nodes else pages()
        op = PendingOp(self._next_op, direction, list(nodes), source.astype(np.int64), target, request_id)
        self._next_op += 1
        self.ops[op.op_id] = op
        # One path lock on the deepest node pins the whole chain and its ancestors (and stays
        # right when a split later adds a node to the chain).
        self.tree.lock(nodes[-1], src)
        at = 0
        for n in nodes:
            before = _states(n)
            self.tree.set_value(n, dst, None, f"{direction.value}_PENDING")
            n.pending[dst] = op.op_id
            self._emit_node(name, n, dst, target[at:at + n.num_pages], before, request_id, op.op_id)
            at += n.num_pages
        self._check(f"{name} op {op.op_id}")
        return op

    def complete(self, op_id: int) -> PendingOp:
        """`<dir>_complete`: the completion was observed successful; publish the target pages
        as the nodes' values and unlock the source."""
        return self._finish(op_id, "complete")

    def fail(self, op_id: int) -> PendingOp:
        """`<dir>_fail`: release only the still-private target pages, unlock the source."""
        return self._finish(op_id, "fail")

    def cancel(self, op_id: int) -> PendingOp:
        """`<dir>_cancel`: as `fail`, for aborts, drain and shutdown."""
        return self._finish(op_id, "cancel")

    def _finish(self, op_id: int, outcome: str) -> PendingOp:
        op = self.ops.get(op_id)
        if op is None:
            raise UnknownOp(op_id)
        src, dst = TIERS.index(op.direction.source), TIERS.index(op.direction.target)
        name = f"{op.direction.value.lower()}_{outcome}"
        for n in op.nodes:
            # Verify the op still owns each node's pending slot (a second finish would not).
            assert n.pending[dst] == op_id, f"node {n.node_id} is not pending on op {op_id}"
            self.lifecycle.check(name, _states(n), _locks(n))
        if outcome == "complete":
            self.tables[dst].publish(op.target_pages)
        else:
            self.tables[dst].release(op.target_pages)
        at = 0
        for n in op.nodes:
            before = _states(n)
            mine = op.target_pages[at:at + n.num_pages]
            at += n.num_pages
            n.pending[dst] = None
            if outcome == "complete":
                self.tree.set_value(n, dst, mine, RESIDENT)
            else:
                self.tree.set_value(n, dst, None, ABSENT)
            self._emit_node(name, n, dst, mine, before, op.request_id, op.op_id)
        self.tree.unlock(op.nodes[-1], src)
        del self.ops[op_id]
        if outcome != "complete":
            for n in reversed(op.nodes):
                self.tree.remove_if_dead(n)
        self._check(f"{name} op {op_id}")
        return op

    # -- eviction -------------------------------------------------------------------------

    def evict(self, tier: Tier | str, n_pages: int, keep: Collection[TreeNode] = (), *,
              before: Callable[[TreeNode], None] | None = None) -> int:
        """Per-tier LRU leaf eviction (`evict_lN`, spec/eviction.md) until at least `n_pages`
        pages of `tier` are freed or no candidate is left. Returns the pages freed (0 when
        `n_pages` <= 0). This is the only eviction loop: every eviction under pressure, the
        controller's included, runs here.

        Granularity is one node's value in `tier` (all its pages together), so a call may
        free more than `n_pages`. The victim is always the first of `candidates(tier, keep)`:
        the least recently used (ties: the older node) unlocked, not-pending leaf in `tier`
        whose `evict_lN` guards hold, never a node of `keep` (the caller's protected set: a
        transfer's chain parent, which must keep its copy until the issue, spec S6).

        `before(victim)`, when given, runs once per victim before it is evicted and may change
        the cache (write-back: back the victim up to L2 first). The victim is then evicted only
        if it is still a candidate; otherwise the next one is chosen. A victim is offered to
        `before` at most once per call, which bounds the loop by the tree's size."""
        t = TIERS.index(Tier(tier))
        name = f"evict_{str(TIERS[t]).lower()}"
        offered: set[int] = set()
        freed = 0
        while freed < n_pages:
            found = self.candidates(TIERS[t], keep)
            if not found:
                break
            victim = found[0]
            if before is not None and victim.node_id not in offered:
                offered.add(victim.node_id)
                before(victim)
                continue  # choose again: `before` may have changed which node goes first
            freed += self.evict_node(victim, t, name)
        return freed

    def evict_node(self, node: TreeNode, t: int, name: str | None = None) -> int:
        """Evict one node's value in tier index `t` (`evict_lN`, or `invalidate_l3`)."""
        name = name or f"evict_{str(TIERS[t]).lower()}"
        before = _states(node)
        self.lifecycle.check(name, before, _locks(node))
        if any(c.state[t] != ABSENT for c in node.children.values()):
            raise IllegalTransition(name, str(TIERS[t]), composite_name(before), "not a leaf in this tier (children hold it)")
        mine = _value(node, t)
        self.tables[t].free(mine)
        self.tree.set_value(node, t, None, ABSENT)
        self._emit_node(name, node, t, mine, before, None, None)
        removed = self.tree.remove_if_dead(node)
        if self.tracer.enabled:
            for r in removed:
                self.tracer.emit("node_remove", node=r.node_id)
        self._check(f"{name} node {node.node_id}")
        return int(mine.size)

    # -- queries (the controller asks; it never reads node fields) ------------------------

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

    def prefix_pages(self, node: TreeNode, tier: Tier | str) -> Pages:
        """`tier`'s physical pages of the whole prefix ending at `node`, in token order (the
        root's: none). IllegalTransition if some node on the path does not hold `tier`."""
        t = TIERS.index(Tier(tier))
        path = [] if node.is_root else list(reversed(self.tree.path_to_root(node)))
        values = [n.value[t] for n in path]
        if any(v is None for v in values):
            gap = next(n.node_id for n, v in zip(path, values) if v is None)
            raise IllegalTransition("-", str(TIERS[t]), "-", f"node {gap} on the path does not hold {TIERS[t]}")
        return np.concatenate([v for v in values if v is not None]) if values else pages()

    def holder(self, tier: Tier | str, page: int, nodes: Iterable[TreeNode] | None = None) -> TreeNode | None:
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
        return [n for n in self.tree.evictable(t)
                if n.node_id not in kept and self._allows(name, n)]

    def _allows(self, name: str, node: TreeNode) -> bool:
        """Whether transition `name` is enabled on `node` (its guards hold), changing nothing."""
        try:
            self.lifecycle.check(name, _states(node), _locks(node))
        except IllegalTransition:
            return False
        return True

    def free_pages(self, tier: Tier | str) -> int:
        """Pages of `tier` that are FREE (neither private nor published)."""
        return self.tables[TIERS.index(Tier(tier))].free_count

    def usage(self, tier: Tier | str) -> dict[str, int]:
        """`tier`'s pages by owner (capacity, free, private, tree) and how many published
        pages are evictable now or locked."""
        t = TIERS.index(Tier(tier))
        table = self.tables[t]
        return {
            "capacity": table.capacity, "free": table.free_count, "private": table.count(1),
            "tree": table.count(2), "evictable": sum(n.num_pages for n in self.candidates(TIERS[t])),
            "locked": sum(n.num_pages for n in self.tree.nodes() if n.lock[t] > 0 and n.state[t] == RESIDENT),
        }

    def cached_len(self, request_id: int) -> int:
        """Tokens of the request's prompt served from the cache (UnknownRequest if not live)."""
        return self._request(request_id).cached_len

    def prefix_node(self, request_id: int) -> TreeNode:
        """The deepest node whose L1 prefix the request holds locked (the root: none)."""
        return self._request(request_id).locked

    # -- observation ----------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """Every record, independently, as plain data for the invariant checkers."""
        views = []
        for n in [self.tree.root, *self.tree.nodes()]:
            views.append(NodeView(
                node_id=n.node_id,
                parent_id=None if n.parent is None else n.parent.node_id,
                child_ids=tuple(c.node_id for c in n.children.values()),
                key_tokens=len(n.key),
                values={str(t): n.value[i] for i, t in enumerate(TIERS)},
                states={str(t): n.state[i] for i, t in enumerate(TIERS)},
                locks={str(t): n.lock[i] for i, t in enumerate(TIERS)},
                pending={str(t): n.pending[i] for i, t in enumerate(TIERS)},
                parent_link_ok=n.parent is None or any(c is n for c in n.parent.children.values()),
            ))
        ops = tuple(
            OpView(op.op_id, op.direction.value, str(op.direction.source), str(op.direction.target),
                   tuple(n.node_id for n in op.nodes), op.source_pages, op.target_pages, *op.token_range)
            for op in self.ops.values()
        )
        reqs = tuple(
            RequestView(r.request_id, r.cached_len, r.published_len, {"L1": r.private_pages})
            for r in self.requests.values()
        )
        tiers = {
            str(t): TierView(str(t), tab.capacity, tab.owner.copy(), self.tree.pages_held[i])
            for i, (t, tab) in enumerate(zip(TIERS, self.tables))
        }
        return Snapshot(self.page_size, tiers, tuple(views), ops, reqs, self.digests, self.tree.root.node_id)

    def _verify_live(self, nodes: Sequence[TreeNode], event: str, tier: Tier) -> None:
        """IllegalTransition unless every node is a live, non-root node of this tree: a caller
        holding a node the tree has since removed must re-match, never act on it."""
        for n in nodes:
            if n.is_root or not self.tree.contains(n):
                why = "the root holds no pages" if n.is_root else "it was removed from the tree"
                raise IllegalTransition(event, str(tier), "-", f"node {n.node_id}: {why}; match again")

    def _check(self, context: str) -> None:
        self.checker.after_transition(self.snapshot, context)

    def _request(self, request_id: int) -> Request:
        req = self.requests.get(request_id)
        if req is None:
            raise UnknownRequest(request_id)
        return req

    def _on_split(self, upper: TreeNode, lower: TreeNode) -> None:
        """A split inserts `upper` before `lower`; ops covering `lower` now cover both."""
        for op in self.ops.values():
            for i, n in enumerate(op.nodes):
                if n is lower:
                    op.nodes.insert(i, upper)
                    break
        if self.tracer.enabled:
            self.tracer.emit("split", node=lower.node_id, detail={"upper": upper.node_id, "at": len(upper.key)})

    def _emit_node(self, event: str, node: TreeNode, t: int, touched: Pages, before: States,
                   request_id: int | None, op_id: int | None = None) -> None:
        if not self.tracer.enabled:
            return
        start = _prefix_start(node)
        self.tracer.emit(
            event, tier=str(TIERS[t]), node=node.node_id, op=op_id, request=request_id,
            token_start=start, token_end=start + len(node.key), pages=tuple(int(p) for p in touched),
            before=composite_name(before), after=composite_name(_states(node)),
        )


def _states(n: TreeNode) -> States:
    return (n.state[0], n.state[1], n.state[2])


def _locks(n: TreeNode) -> tuple[int, int, int]:
    return (n.lock[0], n.lock[1], n.lock[2])


def _value(n: TreeNode, t: int) -> Pages:
    v = n.value[t]
    assert v is not None, f"node {n.node_id} holds nothing in {TIERS[t]}"
    return v
