"""The table executor: the one path by which a lifecycle row changes the control plane.

Every residency transition the control plane applies goes through `Executor.plan` and
`Executor.run` (spec/lifecycle.md, `apply_transition`):

    plan(name, segments)   look the row up in the loaded tables; check its source sub-state and
                           every guard on every segment, and that the pages its effects need
                           exist. Pure: raises IllegalTransition / OutOfPages, nothing changed.
    run(step)              run the row's effects in table order (reserve / publish / release /
                           free on the tier's PageTable, lock / unlock on the tree), write the
                           sub-state, trace one event per segment.

So a row edited in the tables is a behaviour change: nothing here names a transition.

A *segment* is the logical pages one trace event describes, in token order:

    node's pages      a transfer, an eviction, an insert: before = the node's triple
    request's copy    compute / discard: a request's private L1 pages over one node's tokens,
                      or over tokens no node holds (node None); before = the request's view
                      (its copy in L1, the tree's L2 and L3 sub-states of those tokens)

A request's copy is a *duplicate* while the tree itself holds (or is loading) those tokens in
L1: the logical page already has its L1 copy, so the duplicate is outside the composite graph
and its events carry no `before`/`after` (spec/lifecycle.md, "Whose state a composite is").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from hicache.core.lifecycle import (
    ABSENT,
    PRIVATE,
    RESIDENT,
    Effect,
    Guard,
    Lifecycle,
    States,
    Transition,
    composite_name,
)
from hicache.core.pages import Pages, PageTable, pages
from hicache.core.tiers import TIERS, Tier
from hicache.core.trace import Tracer
from hicache.core.tree import HiRadixTree, TreeNode
from hicache.errors import IllegalTransition, OutOfPages


class RequestRange(NamedTuple):
    """What request guards read: the range [start, end) in tokens, the prompt's length, how
    many private pages the request already holds, and the page size."""

    start: int
    end: int
    prompt_len: int
    private_held: int
    page_size: int


_NEW = tuple.__new__
"""A named tuple built from all its fields at once, without its Python-level `__new__` (a
call per segment and per step: `_NEW(Segment, (node, start, end, before, duplicate))`)."""


class Segment(NamedTuple):
    """Logical pages [start, end) (tokens, page aligned) that one event describes (immutable;
    a named tuple: built on every call, at a fraction of a frozen dataclass's cost)."""

    node: TreeNode | None
    start: int
    end: int
    before: States
    duplicate: bool = False  # a request's copy beside the tree's own L1 copy

    def n_pages(self, page_size: int) -> int:
        return (self.end - self.start) // page_size


class Step(NamedTuple):
    """A planned transition: checked, not yet run (immutable, a named tuple as `Segment`)."""

    transition: Transition
    segments: tuple[Segment, ...]
    pages: Pages | None  # the pages the ownership effect moves; None: `reserve` picks them
    n_pages: int
    lock_node: TreeNode | None  # where lock/unlock effects land (an op's deepest node)
    request_id: int | None
    op_id: int | None
    afters: tuple[States, ...] = ()  # per segment, the triple after the row (plan's check)

    def with_node(self, i: int, node: TreeNode) -> Step:
        """The same step with segment `i` now naming `node` (a node insert just created)."""
        segs = list(self.segments)
        segs[i] = segs[i]._replace(node=node)
        return self._replace(segments=tuple(segs))


class _Context:
    """The guard context of one segment of a step (hicache.core.lifecycle.GuardContext)."""

    def __init__(
        self, seg: Segment, step_nodes: Sequence[TreeNode], rng: RequestRange | None
    ) -> None:
        self.seg, self.step_nodes, self.rng = seg, step_nodes, rng

    def leaf(self, tier: Tier) -> bool:
        node, i = self.seg.node, TIERS.index(tier)
        return node is not None and all(c.state[i] == ABSENT for c in node.children.values())

    def parent_resident(self, tier: Tier) -> bool:
        node = self.seg.node
        parent = None if node is None else node.parent
        return (
            parent is None
            or parent.is_root
            or parent.state[TIERS.index(tier)] == RESIDENT
            or any(parent is n for n in self.step_nodes)
        )

    def parent_in(self, tier: Tier, state: str) -> bool:
        node = self.seg.node
        parent = None if node is None else node.parent
        return self.parent_resident(tier) or (
            parent is not None and parent.state[TIERS.index(tier)] == state
        )

    def children_settled(self, tier: Tier) -> bool:
        node, i = self.seg.node, TIERS.index(tier)
        return node is None or all(
            c.state[i] in (ABSENT, RESIDENT) or any(c is n for n in self.step_nodes)
            for c in node.children.values()
        )

    def request(self, rule: str) -> bool:
        r = self.rng
        if r is None:
            return False  # a request guard on a row applied without a request: refuse
        if rule == "aligned(range)":
            return r.end > r.start and (r.end - r.start) % r.page_size == 0
        if rule == "range <= prompt":
            return r.end <= -(-r.prompt_len // r.page_size) * r.page_size
        if rule == "no_private(request)":
            return r.private_held == 0
        raise AssertionError(f"request guard {rule!r} has no predicate")  # the parser knows it


_EQ, _NE, _UNLOCKED, _CONTEXT = 0, 1, 2, 3
_NO_LOCKS = (0, 0, 0)


class _Row(NamedTuple):
    """What `plan` and `run` read of one row, read off it once (`Executor._read`): the row,
    its tier's index, whether its source is pending, its guards as (code, tier index, state,
    guard) -- a sub-state or lock guard tested inline, any other through `Guard.holds` with
    the segment's `_Context` -- and its effects as (op, tier index, effect)."""

    t: Transition
    i: int
    pending: bool
    guards: tuple[tuple[int, int, str, Guard], ...]
    effects: tuple[tuple[str, int, Effect], ...]


def _compile(t: Transition) -> _Row:
    guards: list[tuple[int, int, str, Guard]] = []
    for g in t.guards:
        code = {"==": _EQ, "!=": _NE, "unlocked": _UNLOCKED}.get(g.op, _CONTEXT)
        gi = -1 if g.tier is None else TIERS.index(g.tier)
        guards.append((code, gi, g.state, g))
    return _Row(
        t,
        TIERS.index(t.tier),
        t.source not in (ABSENT, RESIDENT, PRIVATE),
        tuple(guards),
        tuple((e.op, TIERS.index(e.tier), e) for e in t.effects),
    )


def _locks(node: TreeNode, own: frozenset[int]) -> tuple[int, int, int]:
    """What `locks(Ln) == 0` reads of `node`: its path-lock count per tier (a lock on it or on
    a descendant), or, in a tier of `own` (tier indices; hash-keyed, spec/tree.md), the locks
    on its own pages only: its count less its children's."""
    lock = node.lock
    if not own:
        return (lock[0], lock[1], lock[2])
    out = [
        lock[t] - sum(c.lock[t] for c in node.children.values()) if t in own else lock[t]
        for t in range(3)
    ]
    return (out[0], out[1], out[2])


class Executor:
    """Runs lifecycle rows against the tree, the page tables and the tracer it is given."""

    def __init__(
        self, lifecycle: Lifecycle, tree: HiRadixTree, tables: Sequence[PageTable], tracer: Tracer
    ) -> None:
        self.lifecycle, self.tree, self.tables, self.tracer = lifecycle, tree, tables, tracer
        self._rows: dict[str, _Row] = {}

    def _read(self, name: str, t: Transition) -> _Row:
        """Row `t` (named `name` in the loaded tables) read and kept: `plan` and `run` take
        the kept one while the tables still hold that row under that name."""
        row = self._rows[name] = _compile(t)
        return row

    def plan(
        self,
        name: str,
        segments: Sequence[Segment],
        *,
        pages_moved: Pages | None = None,
        lock_node: TreeNode | None = None,
        request_id: int | None = None,
        op_id: int | None = None,
        rng: RequestRange | None = None,
    ) -> Step:
        """Check row `name` on every segment; IllegalTransition or OutOfPages, nothing changed
        (R3: every check before any effect; R4).

        `pages_moved` are the pages a publish/release moves (the op's or the request's, in
        token order); a `free` takes the nodes' values; a `reserve` is checked against the
        tier's free count. `lock_node` is where lock/unlock effects land (default: the last
        segment's node). An op's end must name the op owning each node's pending slot.

        Each segment is checked as `Lifecycle.check` checks it (source sub-state, then every
        guard in table order): sub-state and lock guards inline, the others through
        `Guard.holds`; when one fails, `Lifecycle.check` itself runs and raises its error."""
        t = self.lifecycle.transitions.get(name)
        if t is None:
            raise IllegalTransition(name, "-", "-", "no such transition in the loaded tables")
        row = self._rows.get(name)
        if row is None or row.t is not t:
            row = self._read(name, t)
        ps = self.tree.page_size
        i, source, dest, guards = row.i, t.source, t.dest, row.guards
        nodes = [s.node for s in segments if s.node is not None]
        afters: list[States] = []
        own = self.lifecycle.own_lock_tiers
        for seg in segments:
            node, before = seg.node, seg.before
            ok = before[i] == source
            if ok and guards:
                ctx: _Context | None = None
                for code, gi, state, g in guards:
                    if code == _EQ:
                        ok = before[gi] == state
                    elif code == _NE:
                        ok = before[gi] != state
                    elif code == _UNLOCKED:
                        ok = node is None or (_locks(node, own) if own else node.lock)[gi] == 0
                    else:
                        if ctx is None:
                            ctx = _Context(seg, nodes, rng)
                        ok = g.holds(before, _NO_LOCKS, ctx)
                    if not ok:
                        break
            if not ok:  # Lifecycle.check raises the failure's own error
                locks = _NO_LOCKS if node is None else _locks(node, own)
                self.lifecycle.check(name, before, locks, _Context(seg, nodes, rng))
                raise AssertionError(f"{name}: Lifecycle.check passed a segment plan refused")
            afters.append(
                (dest, before[1], before[2])
                if i == 0
                else (before[0], dest, before[2])
                if i == 1
                else (before[0], before[1], dest)
            )
            if row.pending and (node is None or node.pending[i] != op_id):
                # R7: verify the op still owns the node's pending slot (a second end would not).
                raise IllegalTransition(
                    name,
                    str(t.tier),
                    composite_name(before),
                    f"node {_id(node)} is not pending on op {op_id} (R7)",
                )
        if not segments:  # request guards still apply to an empty range
            self.lifecycle.check(
                name,
                _source_view(t),
                (0, 0, 0),
                _Context(Segment(None, 0, 0, _source_view(t)), [], rng),
            )
        n_pages = 0
        for s in segments:
            n_pages += (s.end - s.start) // ps
        moved = pages_moved
        deepest = lock_node or (nodes[-1] if nodes else None)
        for op, k, e in row.effects:
            if op == "reserve" and self.tables[k].free_count < n_pages:
                raise OutOfPages(str(e.tier), n_pages, self.tables[k].free_count)
            if op == "free":
                moved = _concat([_value(n, k) for n in nodes])
            if (op == "publish" or op == "release") and (moved is None or moved.size != n_pages):
                raise IllegalTransition(
                    name,
                    str(t.tier),
                    "-",
                    f"{n_pages} pages to move, {0 if moved is None else moved.size} given",
                )
            if (op == "lock" or op == "unlock") and deepest is None:
                raise IllegalTransition(name, str(t.tier), "-", f"{e} needs a node")
        return _NEW(
            Step, (t, tuple(segments), moved, n_pages, deepest, request_id, op_id, tuple(afters))
        )

    def run(self, step: Step) -> Pages:
        """Run a planned step: the row's effects in order (R3), then each node's sub-state, then
        one trace event per segment, after the change (R75). Returns the pages the ownership
        effect moved."""
        t, ps = step.transition, self.tree.page_size
        row = self._rows.get(t.name)
        if row is None or row.t is not t:
            row = self._read(t.name, t)
        i = row.i
        moved = step.pages
        for op, k, _ in row.effects:
            if op == "reserve":
                moved = self.tables[k].reserve(step.n_pages) if step.n_pages else pages()
            elif op == "publish" or op == "release" or op == "free":
                assert moved is not None  # Verify: plan() found the pages this moves.
                getattr(self.tables[k], op)(moved)
            else:
                assert step.lock_node is not None  # Verify: plan() found a node to lock.
                # R6: one path lock on the step's deepest node is an op's one source lock.
                (self.tree.lock if op == "lock" else self.tree.unlock)(step.lock_node, k)
        assert moved is not None  # Verify: every row has one ownership effect (the parser).
        at, tier, on_copy = 0, str(t.tier), t.acts_on_copy
        afters, op_id, request_id = step.afters, step.op_id, step.request_id
        # The pages as a list, sliced per segment for its event; a segment's pages as an array
        # only where a node takes them as its value (the tree stores its own copy, so the
        # whole array serves a segment that spans it).
        listed, valued = moved.tolist(), t.dest == RESIDENT
        for j, seg in enumerate(step.segments):
            node = seg.node
            end = at + (seg.end - seg.start) // ps
            # The triple after the row: plan's (its `before` is the segment's, unchanged since).
            after = afters[j] if j < len(afters) else self.lifecycle.check(t.name, seg.before)
            if node is not None and not on_copy and not seg.duplicate:
                mine = (
                    None
                    if not valued
                    else moved
                    if at == 0 and end == len(listed)
                    else moved[at:end]
                )
                self._write(node, i, t, mine, op_id)
                # Verify the event names the state the node is now in.
                st = node.state
                assert (st[0], st[1], st[2]) == after, (
                    f"{t.name}: node {node.node_id} is {_states(node)}, not {after}"
                )
            if self.tracer.enabled:
                self.tracer.emit_fields(
                    {
                        "event": t.name,
                        "tier": tier,
                        "node": None if node is None else node.node_id,
                        "op": op_id,
                        "request": request_id,
                        "token_start": seg.start,
                        "token_end": seg.end,
                        "pages": tuple(listed[at:end]),
                        "before": None if seg.duplicate else composite_name(seg.before),
                        "after": None if seg.duplicate else composite_name(after),
                    }
                )
            at = end
        return moved

    def _write(
        self, node: TreeNode, i: int, t: Transition, mine: Pages | None, op_id: int | None
    ) -> None:
        """The node's sub-state in tier `i` becomes the row's target; its value is the moved
        pages `mine` when that is RESIDENT (None otherwise: nothing), its pending slot follows
        the state."""
        self.tree.set_value(node, i, mine if t.dest == RESIDENT else None, t.dest)
        node.pending[i] = op_id if t.dest.endswith("_PENDING") else None


def node_segments(nodes: Sequence[TreeNode]) -> list[Segment]:
    """One segment per node of a parent-first chain: its whole key, its own triple."""
    out: list[Segment] = []
    start = 0
    parent = nodes[0].parent if nodes else None
    while parent is not None:
        start += len(parent.key)
        parent = parent.parent
    for n in nodes:
        st = n.state
        out.append(_NEW(Segment, (n, start, start + len(n.key), (st[0], st[1], st[2]), False)))
        start += len(n.key)
    return out


def copy_segments(
    tree: HiRadixTree, tokens: Sequence[int], start: int, end: int, copy: str
) -> list[Segment]:
    """A request's copy of tokens [start, end) cut where tree nodes begin and end, without
    splitting anything: one segment per node covering some of it (its view: the request's
    copy `copy` in L1, the node's L2 and L3; a duplicate when the tree holds L1 itself), and
    one for the tokens no node holds (the all-ABSENT view), in token order."""
    ps, out = tree.page_size, []
    aligned = min(end, len(tokens) // ps * ps)
    node, pos = tree.root, 0
    while pos < aligned:
        child = node.children.get(tuple(tokens[pos : pos + ps]))
        if child is None:
            break
        n = 1  # pages of `child` the tokens match (children are keyed by their first page)
        while (
            n * ps < len(child.key)
            and pos + (n + 1) * ps <= aligned
            and child.key[n * ps : (n + 1) * ps] == tuple(tokens[pos + n * ps : pos + (n + 1) * ps])
        ):
            n += 1
        covered = pos + n * ps
        if covered > start:
            view = (copy, child.state[1], child.state[2])
            out.append(
                _NEW(
                    Segment,
                    (child, max(pos, start), min(covered, end), view, child.state[0] != ABSENT),
                )
            )
        if n * ps < len(child.key) or covered >= end:
            pos = covered
            break
        node, pos = child, covered
    if max(pos, start) < end:
        out.append(_NEW(Segment, (None, max(pos, start), end, (copy, ABSENT, ABSENT), False)))
    return out


def _source_view(t: Transition) -> States:
    view = [ABSENT, ABSENT, ABSENT]
    view[TIERS.index(t.tier)] = t.source
    return (view[0], view[1], view[2])


def _states(n: TreeNode) -> States:
    return (n.state[0], n.state[1], n.state[2])


def _id(n: TreeNode | None) -> str:
    return "-" if n is None else str(n.node_id)


def _value(n: TreeNode, t: int) -> Pages:
    v = n.value[t]
    if v is None:
        raise IllegalTransition(
            "free",
            str(TIERS[t]),
            composite_name(_states(n)),
            f"node {n.node_id} holds nothing in {TIERS[t]}",
        )
    return v


def _concat(parts: Sequence[Pages]) -> Pages:
    if len(parts) == 1:
        return parts[0].astype(np.int64)  # a copy, as concatenate's
    return np.concatenate(parts).astype(np.int64) if parts else pages()
