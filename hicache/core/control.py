"""The control plane: the executable spec's state, and the only code that changes it.

`ControlPlane` joins the HiRadixTree (topology + per-tier values), one `PageTable` per tier
(physical-page ownership), the pending-op table, the live requests, the lifecycle machine and
the tracer. Every public method applies spec transitions to a set of logical pages *atomically*, and
every transition goes through one path, `hicache.core.execute` (`apply` below for node rows):

    1. plan       every step's row, source sub-state, guards and pages, from the loaded
                  tables -- raise a typed error with NOTHING changed if any fails;
    2. run        the row's effects in table order (page-table moves, locks), the sub-states;
    3. trace      one event per segment (spec/trace.md), only when a sink is set;
    4. check      the invariants, per the check mode (off / every / periodic N).

No bytes move here. The controller (data plane attached) calls `issue`, then later -- when a
handle's completion is *observed* -- `complete`, `fail` or `cancel`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from itertools import pairwise
from typing import ClassVar

import numpy as np

from hicache.choices import HitPolicy
from hicache.core.execute import Executor, RequestRange, Segment, Step, copy_segments, node_segments
from hicache.core.lifecycle import (
    ABSENT,
    PRIVATE,
    RESIDENT,
    Lifecycle,
    States,
    Transition,
    load_lifecycle,
)
from hicache.core.pages import Pages, pages
from hicache.core.poison import refuse_when_poisoned
from hicache.core.queries import PlaneQueries
from hicache.core.records import LiveRequest, PendingOp, Request, UnknownOp
from hicache.core.snapshot import Digests
from hicache.core.tiers import TIERS, Direction, Tier, tier_index
from hicache.core.trace import Tracer
from hicache.core.tracewalk import walk as walk_trace
from hicache.core.tree import HiRadixTree, MatchResult, TreeNode
from hicache.errors import IllegalTransition, InvariantViolation
from hicache.invariants.checker import InvariantChecker, parse_check_mode
from hicache.pools.hits import ALL_POOLS
from hicache.pools.spec import PoolGroup
from hicache.pools.tierpools import tier_tables
from hicache.pools.windows import L1Windows

READS = ("clone",)
"""ControlPlane's own public methods that change nothing: they answer on a poisoned plane, as
PlaneQueries' do."""


@refuse_when_poisoned(*READS)  # after an InvariantViolation, only reads (poison.py)
class ControlPlane(PlaneQueries):
    """Tree + page tables + pending ops + requests, changed only through spec transitions."""

    poisoned: InvariantViolation | None = None  # the violation that poisoned the plane, if any
    walk_default: ClassVar[bool] = False  # `walk` when a builder passes none (walking.py)

    def __init__(
        self,
        page_size: int,
        capacities: Sequence[int],
        *,
        check_mode: str = "every",
        tracer: Tracer | None = None,
        digests: Digests | None = None,
        lifecycle: Lifecycle | None = None,
        pools: PoolGroup | None = None,
        pool_capacities: Mapping[str, Mapping[str, int]] | None = None,
        hit_policy: HitPolicy | str = ALL_POOLS,
        walk: bool | None = None,
    ) -> None:
        """`pools`: the tiers' pool group. With more than the anchor, each tier's table is a
        `TierPools` (hicache/pools/tierpools.py): the tree's values are anchor pages and
        every side pool follows them; `pool_capacities[tier][pool]` sizes a side pool (in
        its own pages; default: the tier's capacity * its ratio). None or one pool: one
        `TierTable` per tier, a group of one (hicache/pools/tiertable.py). `hit_policy`:
        the group hit policy (spec/pools.md) that decides whether a freed L1 window ends an
        L1 hit (`all_pools`) or is recomputed (`anchor_recompute_swa`); ConfigError for an
        unknown one or a group it cannot serve.
        `walk`: judge every event this plane traces by the tables' `transitions` machine as it
        is emitted (hicache/core/tracewalk.py; a tracer without a sink gets one); a step the machine
        does not take raises MachineDisagreement. None: `walk_default`, False unless code
        that builds its planes deep inside is walked from outside (hicache/testing/walking.py:
        the test suite, `hicache fuzz`); with no sink nothing is traced."""
        if len(capacities) != len(TIERS):
            raise ValueError(
                f"capacities: one per tier {[str(t) for t in TIERS]}, got {list(capacities)}"
            )
        self.lifecycle = lifecycle or load_lifecycle()
        self.tree = HiRadixTree(page_size)
        self.page_size = page_size
        self.tables = tier_tables(
            [str(t) for t in TIERS], capacities, page_size, pools, pool_capacities
        )
        self.ops: dict[int, PendingOp] = {}
        self.requests: dict[int, Request] = {}
        self.tracer = tracer or Tracer()
        self.digests = digests
        self.checker = InvariantChecker(parse_check_mode(check_mode))
        self._next_op = 1
        self.windows = L1Windows(self.tables[0], page_size, hit_policy)
        self.executor = Executor(self.lifecycle, self.tree, self.tables, self.tracer)
        self.tree.on_split.append(self._on_split)
        # Told (the nodes `_remove_dead` removed, the nearest node left on their path: an
        # ancestor, or the root): where a caller that remembers a node (the backup planner's
        # wishes) moves it to.
        self.on_remove: list[Callable[[list[TreeNode], TreeNode], None]] = []
        self.tracer.begin(self.trace_header())  # a sink that writes a file puts it first
        if self.walk_default if walk is None else walk:
            walk_trace(self.tracer, self.lifecycle)

    # -- requests -------------------------------------------------------------------------

    def begin_request(
        self,
        request_id: int,
        tokens: Sequence[int],
        match_len: int | None = None,
        agree: Callable[[MatchResult], Sequence[int]] | None = None,
    ) -> MatchResult:
        """Match the prompt's first `match_len` tokens (default and most: `len(tokens) - 1`,
        the rule `match_short_of_last_token`: the last prompt token is always computed, for the
        first output's logits), lock its L1 hit, and serve that prefix from the cache
        (`cached_len` = L1 hit length). Returns the match (per-tier lengths and handles).
        LiveRequest / IllegalTransition, nothing changed: a live id, an empty prompt, or a
        `match_len` outside 0..len(tokens) - 1. Under `all_pools`, the L1 hit ends at the last
        node end whose window every trailing pool holds (a freed window: `tombstone`); under
        `anchor_recompute_swa` it ends before the window it replays, when a page of it is
        freed (`L1Windows.clip`; the node straddling that window's start is split first).
        `agree(match)`, when given (tensor-parallel ranks, spec/tp.md C1), returns the hit in
        tokens per tier every rank uses, each at most this rank's and at a node end of its
        path; the match is cut to it before anything is locked or traced."""
        if request_id in self.requests:
            raise LiveRequest(request_id)
        most = len(tokens) - 1
        limit = most if match_len is None else match_len
        # R16: verify the match leaves the last prompt token to compute
        # (rule match_short_of_last_token).
        if not 0 <= limit <= most:
            raise IllegalTransition(
                "begin_request",
                "L1",
                "-",
                f"match_len {match_len} with {len(tokens)} "
                f"prompt tokens: need 0 <= match_len <= {most} (the last token is computed, R16)",
            )
        self._split_at_replay(tokens[:limit])
        m = self.tree.match(tokens[:limit], l1_clip=self.windows.clip, touch=agree is None)
        if agree is not None:  # touched once cut: every rank refreshes the same nodes (I7)
            m = _cut_to(m, agree(m), self.tree.root)
            self.tree.touch_match(m)
        l1 = m.handles[0]
        if not l1.is_root:
            self.tree.lock(l1, 0)
        req = Request(request_id, tuple(tokens), l1, m.lengths[0], m.lengths[0])
        self.requests[request_id] = req
        if self.tracer.enabled:
            self.tracer.emit_fields(
                {
                    "event": "begin_request",
                    "request": request_id,
                    "detail": {
                        "hit": list(m.lengths),
                        "tokens": len(tokens),
                        "prompt": list(map(int, tokens)),
                    },
                }
            )
            self.tracer.emit_fields(
                {"event": "cached_len", "request": request_id, "token_end": req.cached_len}
            )
        self._check(lambda: f"begin_request {request_id}")
        return m

    def _split_at_replay(self, tokens: Sequence[int]) -> None:
        """Under `anchor_recompute_swa`: split the node of the L1 run of `tokens` that
        straddles the start of the window a hit on it would replay (`L1Windows.replay_start`),
        so that a replay recomputes whole nodes and its copy revives their windows (a window
        is freed per node, I9). Made whatever the windows hold, so every rank of a
        tensor-parallel cache splits alike (I7); the match below would split at its end too."""
        if not self.windows.replay_pages:
            return
        m = self.tree.match(tokens, touch=False)
        deepest = self.leading_run(m.path, Tier.L1)
        at = self.windows.replay_start(m.path[: m.path.index(deepest) + 1] if deepest else ())
        cut = self.tree.cut(tokens[:at]) if at else None
        if cut is not None:
            self.tree.split(cut.node, cut.at_tokens)

    def compute(self, request_id: int, n_tokens: int) -> Pages:
        """Reserve private L1 pages for the request's next `n_tokens` tokens, after its
        published prefix: transition `compute`, whose guards are the range rules
        (`aligned(range)`, `range <= prompt`, `no_private(request)`). One event per node the
        range covers (and one for tokens no node holds), each with the request's view
        (spec/lifecycle.md, "Whose state a composite is"). The range may end in the prompt's
        partial last page (the *tail page*): computed like any page, never inserted, released
        at the request's end."""
        req = self._request(request_id)
        start, end = req.published_len, req.published_len + n_tokens
        segments = copy_segments(self.tree, req.tokens, start, end, ABSENT) if n_tokens > 0 else []
        rng = RequestRange(start, end, len(req.tokens), int(req.private_pages.size), self.page_size)
        step = self.executor.plan("compute", segments, request_id=request_id, rng=rng)
        got = self.executor.run(step)
        req.private_pages, req.private_start = got, start
        self._check(lambda: f"compute {request_id}")
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
        # R17: validate before any split: walk without splitting; the node the walk ends inside
        # (`cut`) stands for the upper part a split will make, which has the same states.
        m = self.tree.match(req.tokens[:end], split=False, touch=False)
        cut = self.tree.cut(req.tokens[:end])
        walked = [*m.path, cut.node] if cut is not None else list(m.path)
        matched = m.matched_len + (0 if cut is None else cut.at_tokens)
        steps: list[tuple[Step, TreeNode | None]] = []  # (step, parent of the node it creates)
        pos = 0
        for node in walked:
            n_start = pos
            pos += cut.at_tokens if cut is not None and node is cut.node else len(node.key)
            if pos <= req.private_start:
                continue
            # Verify node boundaries line up with the private range (splits only add boundaries).
            assert n_start >= req.private_start, "a node straddles the request's published boundary"
            if node.state[0] not in (ABSENT, RESIDENT):
                break  # load-back in flight: keep the rest private (see docstring)
            view = (PRIVATE, node.state[1], node.state[2])
            duplicate = node.state[0] == RESIDENT  # R14: a duplicate is released, never inserted
            steps.append(
                (
                    self._copy_step(
                        "discard" if duplicate else "insert",
                        req,
                        node,
                        n_start,
                        pos,
                        view,
                        duplicate,
                    ),
                    None,
                )
            )
        else:
            if matched < end:
                first = max(matched, req.private_start)
                parent = walked[-1] if walked else self.tree.root
                steps.append(
                    (
                        self._copy_step(
                            "insert", req, None, first, end, (PRIVATE, ABSENT, ABSENT), False
                        ),
                        parent,
                    )
                )
        # -- change (every step was planned: nothing below can fail) --
        if cut is not None and any(
            step.segments[0].node is cut.node or under is cut.node for step, under in steps
        ):
            upper = self.tree.split(cut.node, cut.at_tokens)  # validated: the first change
            steps = [
                (
                    step.with_node(0, upper) if step.segments[0].node is cut.node else step,
                    upper if under is cut.node else under,
                )
                for step, under in steps
            ]
        published, deepest, used = req.published_len, req.locked, 0
        for step, under in steps:
            if under is not None:
                step = step.with_node(
                    0, self.tree.add_child(under, req.tokens[step.segments[0].start : end])
                )
            self._revive(step, req.request_id)
            self.executor.run(step)
            done = step.segments[0].node
            assert done is not None  # Verify: every insert step names its node now.
            deepest, used = done, used + step.n_pages
            published += step.n_pages * ps
        if deepest is not req.locked:
            self.tree.lock(deepest, 0)
            if not req.locked.is_root:
                self.tree.unlock(req.locked, 0)
            req.locked = deepest
        req.private_pages = req.private_pages[used:]
        req.private_start += used * ps
        req.published_len = req.cached_len = published
        if self.tracer.enabled:
            self.tracer.emit_fields(
                {"event": "cached_len", "request": request_id, "token_end": req.cached_len}
            )
        self._check(lambda: f"insert {request_id}")
        return req.cached_len

    def _revive(self, step: Step, request_id: int) -> None:
        """Before a `discard` over a node whose L1 window is freed: the node takes the
        request's copy of that window (the request computed the same tokens), traced
        `revive`; the discard then releases the rest of the request's pages."""
        node = step.segments[0].node
        if step.transition.name != "discard" or node is None or not self.windows.freed(node):
            return
        table, value = self.windows.table, node.value[0]
        # Verify: a freed window is in L1, and a discard names the request's pages.
        assert table is not None and value is not None and step.pages is not None
        table.revive(value, step.pages)
        if self.tracer.enabled:
            self.tracer.emit(
                "revive",
                tier="L1",
                node=node.node_id,
                request=request_id,
                pages=tuple(int(p) for p in value),
            )

    def _copy_step(
        self,
        name: str,
        req: Request,
        node: TreeNode | None,
        start: int,
        end: int,
        view: States,
        duplicate: bool,
    ) -> Step:
        """Plan `insert` or `discard` of the request's private pages over [start, end)."""
        ps = self.page_size
        mine = req.private_pages[
            (start - req.private_start) // ps : (end - req.private_start) // ps
        ]
        return self.executor.plan(
            name,
            [Segment(node, start, end, view, duplicate)],
            pages_moved=mine,
            request_id=req.request_id,
        )

    def advance_cached_len(self, request_id: int, node: TreeNode) -> int:
        """After a restore into L1 completed and was published: take the request's L1 lock
        down to `node` and serve its prefix from the cache (I5: publication precedes this).
        IllegalTransition, nothing changed: a node on the path not RESIDENT in L1, one off the
        request's locked prefix, private pages held, an end a freed window refuses
        (`servable_in_l1` names the deepest legal one), or `node` the root or removed."""
        req = self._request(request_id)
        self._verify_live([node], "cached_len", Tier.L1)
        path = self.tree.path_to_root(node)
        # Verify every node up to `node` is published in L1
        # (completion -> publication -> cached_len, I5).
        bad = [n.node_id for n in path if n.state[0] != RESIDENT]
        if bad:
            raise IllegalTransition(
                "cached_len", "L1", "-", f"nodes {bad} are not RESIDENT in L1 yet"
            )
        if req.locked not in path and not req.locked.is_root:
            raise IllegalTransition(
                "cached_len", "L1", "-", "node does not extend the request's locked prefix"
            )
        if req.private_pages.size:
            raise IllegalTransition(
                "cached_len",
                "L1",
                "L1_PRIVATE",
                "the request holds private pages; insert them first",
            )
        # Verify the prefix may end here: no freed window within the hit's window before it.
        if self.windows.clip(path[::-1]) * self.page_size != self.tree.prefix_tokens(node):
            raise IllegalTransition(
                "cached_len",
                "L1",
                "-",
                f"node {node.node_id}'s L1 window or one "
                "before it is freed: serve up to servable_in_l1, recompute the rest",
            )
        self.tree.lock(node, 0)
        if not req.locked.is_root:
            self.tree.unlock(req.locked, 0)
        req.locked = node
        req.published_len = req.cached_len = self.tree.prefix_tokens(node)
        if self.tracer.enabled:
            self.tracer.emit_fields(
                {
                    "event": "cached_len",
                    "request": request_id,
                    "node": node.node_id,
                    "token_end": req.cached_len,
                }
            )
        self._check(lambda: f"cached_len {request_id}")
        return req.cached_len

    def pin(self, request_id: int, node: TreeNode, tier: Tier | str) -> None:
        """Lock `node`'s path in `tier` for the request until `unpin` or the
        request's end: what a multi-stage restore holds on the nodes it planned, so that no
        eviction (nested make-room included) removes them between its stages. Traced `lock`.
        IllegalTransition (nothing changed) if `node` is not in the tree."""
        req = self._request(request_id)
        t = tier_index(tier)
        self._verify_live([node], "lock", TIERS[t])
        self.tree.lock(node, t)
        req.pins.append((node, t))
        if self.tracer.enabled:
            self.tracer.emit_fields(
                {
                    "event": "lock",
                    "tier": str(TIERS[t]),
                    "node": node.node_id,
                    "request": request_id,
                }
            )

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
                self.tracer.emit_fields(
                    {
                        "event": "unlock",
                        "tier": str(TIERS[t]),
                        "node": n.node_id,
                        "request": request_id,
                    }
                )
        for n, _ in reversed(gone):
            if self.tree.contains(n):
                self._remove_dead(n)
        if gone:
            self._check(lambda: f"unpin {request_id}")
        return len(gone)

    def end_request(self, request_id: int) -> None:
        """Finish or abort: release private pages (`discard`), its pins and its prefix lock.
        The caller first ends the transfers the request issued (`cancel`, once its handle is
        quiet): IllegalTransition, nothing changed, while one is pending -- its pages would
        otherwise outlive the request that owns them (spec/restore.md)."""
        req = self._request(request_id)
        # R40: verify no op issued for this request is still pending.
        mine = sorted(op.op_id for op in self.ops.values() if op.request_id == request_id)
        if mine:
            raise IllegalTransition(
                "end_request",
                "-",
                "-",
                f"request {request_id} still has "
                f"ops {mine} pending; cancel them (quiesce their handles) first (R40)",
            )
        self.unpin(request_id)
        if req.private_pages.size:
            end = req.private_start + req.private_pages.size * self.page_size
            segments = copy_segments(self.tree, req.tokens, req.private_start, end, PRIVATE)
            self.executor.run(
                self.executor.plan(
                    "discard", segments, pages_moved=req.private_pages, request_id=request_id
                )
            )
            req.private_pages = pages()
        if not req.locked.is_root:
            self.tree.unlock(req.locked, 0)
        del self.requests[request_id]
        if self.tracer.enabled:
            self.tracer.emit_fields({"event": "end_request", "request": request_id})
        self._check(lambda: f"end_request {request_id}")

    # -- transfers ------------------------------------------------------------------------

    def issue(
        self, direction: Direction, nodes: Sequence[TreeNode], request_id: int | None = None
    ) -> PendingOp:
        """`<dir>_issue` on every node: reserve private target pages, lock the source, mark
        the target tier pending -- the row's effects, run by the executor. `nodes` must be a
        parent-first chain; the row's guard `parent(<target>) == RESIDENT` refuses a chain
        whose first node's parent lacks the target tier (no backup gap, S6). OutOfPages or
        IllegalTransition leave everything unchanged."""
        src = TIERS.index(direction.source)
        name = f"{direction.value.lower()}_issue"
        if not nodes:
            raise IllegalTransition(name, str(direction.target), "-", "no nodes")
        for parent, child in pairwise(nodes):
            if child.parent is not parent:
                raise IllegalTransition(
                    name,
                    str(direction.target),
                    "-",
                    f"node {child.node_id} is not a child of {parent.node_id}",
                )
        self._verify_live(nodes, name, direction.target)
        if request_id is not None:
            self._request(request_id)
        freed = [n.node_id for n in nodes if direction.source is Tier.L1 and self.windows.freed(n)]
        if freed:  # a backup copies the whole group; the host tiers never hold a freed window
            raise IllegalTransition(
                name,
                str(direction.target),
                "-",
                f"node {freed[0]}'s window is freed in L1: a backup needs "
                "every pool; evict it instead (R68)",
            )
        op_id = self._next_op
        step = self.executor.plan(name, node_segments(nodes), request_id=request_id, op_id=op_id)
        source = np.concatenate([_value(n, src) for n in nodes])  # the source is published
        # -- change --
        target = self.executor.run(step)
        op = PendingOp(op_id, direction, list(nodes), source.astype(np.int64), target, request_id)
        self._next_op += 1
        self.ops[op_id] = op
        self._check(lambda: f"{name} op {op_id}")
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

    @property
    def next_op_id(self) -> int:
        """The id the next issued op gets (ids are never reused)."""
        return self._next_op

    def faults_off(self, tier: Tier) -> AbstractContextManager[None]:
        """No injected reservation fault of `tier`'s table inside (a test's fault hook,
        `set_reserve_fault`): a tensor-parallel rank whose issue such a fault refused still
        takes the op as every rank does (spec/tp.md C2, the deferred reserve)."""
        return self.tables[TIERS.index(tier)].faults_off()

    def skip_op_id(self) -> None:
        """Use up the next op id without an op: a tensor-parallel rank whose issue failed
        before it took one, while other ranks' took it (spec/tp.md C2), so the ranks' op ids
        stay equal."""
        self._next_op += 1

    def complete_part(self, op_id: int, keep: int) -> PendingOp:
        """The *partial end* of an S2H op whose first `keep` nodes landed and the rest did
        not (a clamped read, spec/pools.md F11-F13; spec/lifecycle.md, rule
        `partial_end_s2h_only`): `s2h_complete` on nodes `[0, keep)` over the first pages of
        the op's page list, then `s2h_fail` on the rest, which releases their target pages in
        every pool. keep == 0 is `fail`, keep == len(nodes) is `complete`. Both rows are
        checked before either runs (IllegalTransition -- an op of another direction, or a
        `keep` out of range -- and UnknownOp: nothing changed). Lock movement, as the spec
        states it: each row unlocks the source at its own step's deepest node, so the step
        first takes one more L3 lock on the kept part's last node; the complete rows release
        it, the fail rows the op's own (at its last node): one source lock goes, as at any
        end."""
        op = self.ops.get(op_id)
        if op is None:
            raise UnknownOp(op_id)
        if op.direction is not Direction.S2H:
            d = op.direction.value.lower()
            raise IllegalTransition(
                f"{d}_complete",
                str(op.direction.target),
                "-",
                f"rule partial_end_s2h_only (R5): op {op_id}'s direction is "
                f"{op.direction.value}, and only an S2H may end part way ({d}_complete on its "
                f"first nodes, {d}_fail on the rest): end it with complete, fail or cancel on "
                "every node",
            )
        if not 0 <= keep <= len(op.nodes):
            raise IllegalTransition(
                f"{op.direction.value.lower()}_complete",
                str(op.direction.target),
                "-",
                f"keep {keep} of the op's {len(op.nodes)} nodes",
            )
        if keep in (0, len(op.nodes)):
            return self._finish(op_id, "fail" if keep == 0 else "complete")
        d = op.direction.value.lower()
        cut = sum(n.num_pages for n in op.nodes[:keep])
        kept, rest = node_segments(op.nodes[:keep]), node_segments(op.nodes)[keep:]
        done = self.executor.plan(
            f"{d}_complete",
            kept,
            pages_moved=op.target_pages[:cut],
            request_id=op.request_id,
            op_id=op_id,
        )
        failed = self.executor.plan(
            f"{d}_fail",
            rest,
            pages_moved=op.target_pages[cut:],
            request_id=op.request_id,
            op_id=op_id,
        )
        # -- change --  (R6: the extra source lock lives only inside this step)
        self.tree.lock(op.nodes[keep - 1], TIERS.index(op.direction.source))
        self.executor.run(done)
        self.executor.run(failed)
        del self.ops[op_id]
        for n in reversed(op.nodes):
            if self.tree.contains(n):
                self._remove_dead(n)
        self._check(lambda: f"{d}_complete of {keep} node(s), {d}_fail of the rest, op {op_id}")
        return op

    def _finish(self, op_id: int, outcome: str) -> PendingOp:
        """Run `<dir>_<outcome>` on every node of the op, in path order, over the op's one
        ordered page list (cut by the nodes' key lengths: a split while the op was pending
        only added a cut), then remove the nodes it leaves dead, each traced `node_remove`."""
        op = self.ops.get(op_id)
        if op is None:
            raise UnknownOp(op_id)
        name = f"{op.direction.value.lower()}_{outcome}"
        step = self.executor.plan(
            name,
            node_segments(op.nodes),
            pages_moved=op.target_pages,
            request_id=op.request_id,
            op_id=op_id,
        )
        self.executor.run(step)
        del self.ops[op_id]
        for n in reversed(op.nodes):
            if self.tree.contains(n):
                self._remove_dead(n)
        self._check(lambda: f"{name} op {op_id}")
        return op

    # -- windows --------------------------------------------------------------------------

    def tombstone(self, node: TreeNode) -> Pages:
        """Free `node`'s window in L1 (spec/pools.md, "Freed windows"): the pages of every
        trailing side pool its L1 value holds (and of the state pools on their indices) go
        FREE; its anchor pages and sidecars stay RESIDENT. Guards, as an L1 eviction's: the
        node is live and RESIDENT in L1, no request or op holds it there (unlocked: a backup
        in flight locks its source), and its window is still present. Traced `tombstone`
        (tier L1, the node's anchor pages). Returns those anchor pages. IllegalTransition,
        nothing changed, when a guard fails or the L1 group has no trailing pool."""
        self._verify_live([node], "tombstone", Tier.L1)
        value = node.value[0]
        why = (
            "L1 has no trailing pool to free"
            if not self.windows.tombstones
            else "it is not RESIDENT in L1"
            if node.state[0] != RESIDENT or value is None
            else f"it is locked in L1 ({node.lock[0]})"
            if node.lock[0]
            else "its window is already freed"
            if self.windows.freed(node)
            else ""
        )
        if why:
            raise IllegalTransition("tombstone", "L1", node.state[0], f"node {node.node_id}: {why}")
        table = self.windows.table
        assert value is not None and table is not None  # Verify: the guards above.
        table.tombstone(value)
        if self.tracer.enabled:
            self.tracer.emit(
                "tombstone", tier="L1", node=node.node_id, pages=tuple(int(p) for p in value)
            )
        self._check(lambda: f"tombstone node {node.node_id}")
        return value

    # -- eviction -------------------------------------------------------------------------

    def evict(
        self,
        tier: Tier | str,
        n_pages: int,
        keep: Collection[TreeNode] = (),
        *,
        before: Callable[[TreeNode], None] | None = None,
    ) -> int:
        """Per-tier LRU leaf eviction (`evict_lN`, spec/eviction.md) until at least `n_pages`
        pages of `tier` are freed or no candidate is left. Returns the pages freed (0 when
        `n_pages` <= 0). This is the only eviction loop: every eviction under pressure, the
        controller's included, runs here (R22).

        Granularity is one node's value in `tier` (all its pages together), so a call may
        free more than `n_pages` (R25). The victim is always the first of `candidates(tier, keep)`:
        the least recently used (ties: the older node) unlocked, not-pending leaf in `tier`
        whose `evict_lN` guards hold, never a node of `keep` (the caller's protected set: a
        transfer's chain parent, which must keep its copy until the issue, spec S6).

        `before(victim)`, when given, runs once per victim before it is evicted and may change
        the cache (write-back: back the victim up to L2 first). The victim is then evicted only
        if it is still a candidate; otherwise the next one is chosen. A victim is offered to
        `before` at most once per call, which bounds the loop by the tree's size."""
        t = tier_index(tier)
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
            freed += self.evict_node(victim, TIERS[t], name)
        return freed

    def evict_node(self, node: TreeNode, tier: Tier | str, name: str | None = None) -> int:
        """Evict one node's value in `tier` (`evict_lN`, or `invalidate_l3`): the row's
        guards (unlocked, a leaf in the tier, ...) and its `free` effect. Returns pages freed."""
        t = tier_index(tier)
        name = name or f"evict_{str(TIERS[t]).lower()}"
        self._verify_live([node], name, TIERS[t])
        freed = self.apply(name, [node])
        return int(freed.size)

    def apply(
        self,
        name: str,
        nodes: Sequence[TreeNode],
        pages_moved: Pages | None = None,
        *,
        request_id: int | None = None,
        op_id: int | None = None,
    ) -> Pages:
        """Apply lifecycle row `name` to a parent-first chain of live nodes: check its source
        state and guards on every node, run its effects in table order, trace one event per
        node, remove the nodes left dead (traced `node_remove`), check the invariants.
        `pages_moved` are the pages a publish/release moves. Returns the pages the row's
        ownership effect moved. IllegalTransition / OutOfPages: nothing changed.

        A transfer's rows (`<dir>_issue`, `_complete`, `_fail`, `_cancel`) are refused here
        (IllegalTransition; an end only after its plan, so that a stale ack is refused as
        one, "not pending on op"): an op is one record from its issue to its end on every
        node it covers, and only `issue`, `complete`, `fail`, `cancel` and `complete_part`
        keep that record; run here, a row would start an op no record holds, or end one on
        some nodes and leave it pending (spec/lifecycle.md, "A transfer is one pending
        operation")."""
        row = self.lifecycle.transitions.get(name)
        if row is not None and row.kind == "issue":
            raise _op_row_refused(row)
        step = self.executor.plan(
            name, node_segments(nodes), pages_moved=pages_moved, request_id=request_id, op_id=op_id
        )
        # Verify the row ends no op: the op table would no longer match the nodes.
        if step.transition.direction is not None:
            raise _op_row_refused(step.transition)
        moved = self.executor.run(step)
        for n in reversed(nodes):
            if self.tree.contains(n):
                self._remove_dead(n)
        self._check(lambda: f"{name} nodes {[n.node_id for n in nodes]}")
        return moved

    def _remove_dead(self, node: TreeNode) -> None:
        """Remove `node` and then its ancestors while they are dead; each removal is traced
        `node_remove` (every removal of the reference goes through here, R20), then the
        `on_remove` hooks are told what went and the nearest node left on its path."""
        path = self.tree.path_to_root(node) if self.on_remove and node.is_dead() else []
        removed = self.tree.remove_if_dead(node)
        for r in removed:
            if self.tracer.enabled:
                self.tracer.emit_fields({"event": "node_remove", "node": r.node_id})
        if removed and self.on_remove:
            left = path[len(removed)] if len(path) > len(removed) else self.tree.root
            for hook in self.on_remove:
                hook(removed, left)

    def _verify_live(self, nodes: Sequence[TreeNode], event: str, tier: Tier) -> None:
        """IllegalTransition unless every node is a live, non-root node of this tree: a caller
        holding a node the tree has since removed must re-match, never act on it."""
        for n in nodes:
            if n.is_root or not self.tree.contains(n):
                why = "the root holds no pages" if n.is_root else "it was removed from the tree"
                raise IllegalTransition(
                    event, str(tier), "-", f"node {n.node_id}: {why}; match again (R21)"
                )

    def _check(self, context: str | Callable[[], str]) -> None:
        """Run the checks the mode says are due. On a violation the plane (and its tree) is
        poisoned before the violation propagates: every later transition raises PlanePoisoned
        (R59). `context` gives the transition's name for the report: formatted only then."""
        try:
            self.checker.after_transition(self.snapshot, context)
        except InvariantViolation as violation:
            self.poison(violation)
            raise

    def poison(self, violation: InvariantViolation) -> None:
        """From now on every transition of this plane and its tree raises PlanePoisoned
        naming `violation` (found here, or by a check across ranks)."""
        self.poisoned = violation
        self.tree.poison(violation)

    def clone(self) -> ControlPlane:
        """An independent copy with tracing off (a fresh Tracer, no sink) and the same check
        mode, made field by field: what the model checker branches on (`copy.deepcopy` of a
        small plane costs about 0.4 ms: it walks the lifecycle tables, the tracer, every
        numpy array through the generic protocol). Copied: the tree (`HiRadixTree.clone`),
        each page table's owner and generation arrays, the op table, the requests (their
        pins), a fresh InvariantChecker; shared, as no transition mutates them in place:
        the lifecycle tables, page_size, page arrays (node values, an op's source and target
        pages, a request's private pages: every writer replaces them). A recording executor
        keeps its shared set. tests/test_modelcheck.py checks the copy against
        `copy.deepcopy` and its independence. A read: a poisoned plane's copy is poisoned."""
        new: ControlPlane = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        tree = self.tree.clone()
        node = tree.node
        new.tree = tree
        new.tables = tuple(t.clone() for t in self.tables)
        new.ops = {
            i: PendingOp(
                op.op_id,
                op.direction,
                [node(n.node_id) for n in op.nodes],
                op.source_pages,
                op.target_pages,
                op.request_id,
            )
            for i, op in self.ops.items()
        }
        new.requests = {
            i: Request(
                r.request_id,
                r.tokens,
                node(r.locked.node_id),
                r.published_len,
                r.cached_len,
                r.private_pages,
                r.private_start,
                [(node(n.node_id), t) for n, t in r.pins],
            )
            for i, r in self.requests.items()
        }
        new.tracer = Tracer()
        new.checker = InvariantChecker(self.checker.mode, self.checker.checks)
        executor = object.__new__(type(self.executor))
        executor.__dict__.update(self.executor.__dict__)
        executor.tree, executor.tables, executor.tracer = tree, new.tables, new.tracer
        new.executor = executor
        tree.on_split = [new._on_split]
        return new

    def _on_split(self, upper: TreeNode, lower: TreeNode) -> None:
        """A split inserts `upper` before `lower`; ops covering `lower` now cover both, and
        their page lists stay as they are (R9)."""
        for op in self.ops.values():
            for i, n in enumerate(op.nodes):
                if n is lower:
                    op.nodes.insert(i, upper)
                    break
        if self.tracer.enabled:
            self.tracer.emit_fields(
                {
                    "event": "split",
                    "node": lower.node_id,
                    "detail": {"upper": upper.node_id, "at": len(upper.key)},
                }
            )


def _op_row_refused(row: Transition) -> IllegalTransition:
    """Why `apply` refuses a transfer's row (ControlPlane.apply)."""
    return IllegalTransition(
        row.name,
        str(row.tier),
        "-",
        "a transfer's rows run through issue, complete, fail, cancel or complete_part, "
        "which keep its op record; apply runs evictions and invalidation (R8)",
    )


def _value(n: TreeNode, t: int) -> Pages:
    """The node's pages in tier index `t`; IllegalTransition when it holds none there (a
    transfer's source must be published: an edited row that drops that guard is refused
    here, before anything changed)."""
    v = n.value[t]
    if v is None:
        raise IllegalTransition(
            "issue",
            str(TIERS[t]),
            n.state[t],
            f"node {n.node_id} holds nothing in {TIERS[t]} to read from",
        )
    return v


def _cut_to(m: MatchResult, lengths: Sequence[int], root: TreeNode) -> MatchResult:
    """`m` with each tier's hit cut to `lengths[t]` tokens: the deepest node of its run whose
    prefix ends there (the agreed hits of tensor-parallel ranks, spec/tp.md C1)."""
    handles, ends, pos = [root, root, root], [0, 0, 0], 0
    for node in m.path:
        pos += len(node.key)
        for t in range(len(handles)):
            if pos <= m.lengths[t] and pos <= lengths[t]:
                handles[t], ends[t] = node, pos
    # Verify every agreed hit is a node end of this rank's run: the ranks' trees are equal
    # (I7), so an agreed end is one here too, never inside a node or past the local hit.
    assert ends == [min(a, b) for a, b in zip(m.lengths, lengths)] == list(lengths), (ends, lengths)
    handles = [h if e else root for h, e in zip(handles, ends)]
    return MatchResult(
        (ends[0], ends[1], ends[2]), (handles[0], handles[1], handles[2]), m.path, m.matched_len
    )
