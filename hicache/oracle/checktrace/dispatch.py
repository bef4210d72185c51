"""Which reference call a trace's next events stand for (spec/appendix-tools.md, "check-trace").

Every `ControlPlane` call emits a fixed pattern of events; `decide` reads the pattern's head
(looking ahead as far as it must) and returns the call, not yet run. The replay then runs it
and compares what the reference emitted with the trace, event by event, so the call's events
need not be counted here.

    trace's next events (of request r / op o)          reference call
    -------------------------------------------------  ---------------------------------------
    [split...] begin_request                            begin_request(r, detail.prompt)
    compute, compute, ... (one request)                 compute(r, tokens they cover)
    [split...] insert | cached_len (no node)            insert(r)
    discard... then insert / cached_len                 insert(r)
    revive, discard ... (a freed window's, in insert)   insert(r)
    discard... then end_request                         end_request(r)
    discard... then the trace's end                     insert(r) if it emits them, else
                                                        end_request(r)
    unlock... [node_remove / discard...] end_request    end_request(r)
    unlock... of every pin of r                         unpin(r)
    unlock (some pins of r)                             unpin(r, node)
    lock                                                pin(r, node, tier)
    <dir>_issue... (one op id)                          issue(dir, [nodes...], r)
    <dir>_complete | _fail | _cancel                    complete | fail | cancel(op)
    <dir>_complete... then <dir>_fail (one op)          complete_part(op, complete events):
                                                        an S2H's partial end (the reference
                                                        refuses any other direction's)
    tombstone                                           tombstone(node)
    evict_lN | invalidate_l3                            evict_node(node, tier, name)
    cached_len with node                                advance_cached_len(r, node)
    end_request                                         end_request(r)

Split events come first in the pattern of the call that splits (a match or an insert), so
they are skipped to find the call. The look-ahead is bounded by `LOOKAHEAD_MAX` events.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from hicache.core.control import ControlPlane
from hicache.core.lifecycle import composite_name
from hicache.core.tiers import TIERS, direction_of, tier_index, tier_of
from hicache.core.trace import TraceEvent
from hicache.core.tree import TreeNode
from hicache.errors import HiCacheError
from hicache.oracle.checktrace.maps import IdMap, PageMap
from hicache.oracle.checktrace.reader import Line

LOOKAHEAD_MAX = 65_536
"""Most events one call's pattern may span (a chain of that many nodes is far beyond any
real cache's tree depth)."""

ENDS = ("complete", "fail", "cancel")
INSERT_EVENTS = ("insert", "discard", "revive")  # what `insert(r)` emits (revive: a group's)


class Unreplayable(HiCacheError):
    """The next events name something the reference cannot act on (an unknown node or op,
    a request not live): the event is not enabled. `line` is the event that names it."""

    def __init__(self, line: Line, why: str) -> None:
        self.line, self.why = line, why
        super().__init__(why)


class Ambiguous(Unreplayable):
    """A trace that omits `split` names a new node that several reference nodes fit: the
    trace does not carry what identifies it, so it cannot be checked (malformed input)."""


class Lookahead(Protocol):
    def peek(self, i: int) -> Line | None:
        """The i-th unconsumed event line (0 = the next), reading ahead; None past the end."""


@dataclass
class Call:
    """One reference call the trace's next events stand for, not yet run."""

    text: Callable[[], str]  # its `label`, formatted when a report asks for it
    run: Callable[[], object]
    nodes: list[TreeNode] = field(default_factory=list)  # reference nodes it concerns
    request: int | None = None
    op: int | None = None  # the reference op it ends
    blame: int | None = None  # look-ahead index of the line a refusal of the call itself is
    # blamed on (`end_request` after the unlocks and discards it emits first); None: the head
    alternative: Call | None = None  # a run cut by the trace's end: the other call it may
    # stand for, made instead when this one, tried on a copy of the reference, does not emit
    # the events the trace has left
    on: Callable[[ControlPlane], object] | None = None  # this call on a given plane (the copy)

    @property
    def label(self) -> str:
        """E.g. "issue(D2H, trace nodes [3, 4], trace request 1)", in the trace's ids."""
        return self.text()


def _scan(ahead: Lookahead, start: int, keep: Callable[[Line], bool]) -> int:
    """The index of the first line at or after `start` that `keep` rejects (or the end)."""
    i = start
    while True:
        line = ahead.peek(i)
        if line is None or not keep(line) or i - start >= LOOKAHEAD_MAX:
            return i
        i += 1


class Resolver:
    """Trace node ids -> the reference's live nodes. With `by_range` (a trace that omits
    `split`), a node the trace names for the first time is found by its token range: the one
    unnamed reference node covering exactly [token_start, token_end) (of the event's
    request's prompt, when it names one) -- the upper part of a split the trace left out."""

    def __init__(
        self,
        cp: ControlPlane,
        nodes: IdMap,
        by_range: bool,
        pages: Mapping[str, PageMap] | None = None,
    ) -> None:
        self.cp, self.nodes, self.by_range = cp, nodes, by_range
        self.pages = pages or {}

    def __call__(self, line: Line, engine_id: int | None) -> TreeNode:
        """The reference node trace node `engine_id` stands for; Unreplayable when unbound
        (and not found by range) or removed."""
        if engine_id is None:
            raise Unreplayable(line, f"{line.event.event} names no node; the reference needs one")
        ref = self.nodes.to_ref.get(engine_id)
        if ref is None and self.by_range:
            ref = self._by_range(line, engine_id)
        if ref is None:
            raise Unreplayable(
                line,
                f"trace node {engine_id} is unknown: no earlier event created it in the "
                "trace (an insert, a split) or it was removed",
            )
        found = self.cp.tree.get(ref)
        if found is None:
            raise Unreplayable(
                line,
                f"trace node {engine_id} (the reference's node {ref}) was removed from the tree",
            )
        return found

    def _by_range(self, line: Line, engine_id: int) -> int | None:
        """The one unnamed reference node with the event's token range (any range, for an
        event without one: a `lock`) on the event's request's prompt (any, without one)."""
        e = line.event
        req = self.cp.requests.get(e.request) if e.request is not None else None
        if req is None and e.token_end is None:
            return None
        found = []
        for n in self.cp.tree.nodes():
            if n.node_id in self.nodes.to_engine:
                continue
            path = list(reversed(self.cp.tree.path_to_root(n)))
            end = sum(len(p.key) for p in path)
            if e.token_end is not None and (end - len(n.key), end) != (e.token_start, e.token_end):
                continue
            if req is not None and tuple(t for p in path for t in p.key) != req.tokens[:end]:
                continue
            found.append(n)
        if len(found) > 1:
            found = self._narrow(e, found)
        if len(found) > 1:
            where = (
                f"tokens [{e.token_start}, {e.token_end})"
                if e.token_end is not None
                else "its request's prompt"
            )
            raise Ambiguous(
                line,
                f"trace node {engine_id} cannot be identified: {len(found)} reference nodes "
                f"cover {where} in that state (the trace omits split; name the event's "
                "request or carry pages to tell them apart)",
            )
        if not found:
            return None
        # Verify the binding is new on both sides before it is made.
        assert self.nodes.match(engine_id, found[0].node_id) is None
        return found[0].node_id

    def _narrow(self, e: TraceEvent, found: list[TreeNode]) -> list[TreeNode]:
        """Of several candidates, those in the event's `before` state, and those holding the
        reference pages the event's pages are bound to (an eviction's, a load's source)."""
        if e.before is not None and e.node is not None:
            found = [
                n for n in found if composite_name((n.state[0], n.state[1], n.state[2])) == e.before
            ]
        m = self.pages.get(e.tier or "")
        frees = e.event.startswith("evict_") or e.event == "invalidate_l3"  # pages the node holds
        if m is not None and e.pages and frees and len(found) > 1:
            i = tier_index(e.tier)
            want = [m.to_ref.get(p) for p in e.pages]
            found = [n for n in found if (v := n.value[i]) is not None and v.tolist() == want]
        return found


def _request(line: Line) -> int:
    r = line.event.request
    if r is None:
        raise Unreplayable(line, f"{line.event.event} names no request; the reference needs one")
    return r


def decide(cp: ControlPlane, ahead: Lookahead, resolve: Resolver, ops: IdMap) -> Call | None:
    """The call the next events stand for; None when only splits are left (a trace cut just
    after them: nothing to check). Unreplayable when it names what the reference lacks."""
    head = ahead.peek(0)
    if head is not None and head.event.event == "split":  # splits lead: skip past them
        k = _scan(ahead, 0, lambda ln: ln.event.event == "split")
        head = ahead.peek(k)
    else:
        k = 0
    if head is None:
        return None
    e = head.event
    name = e.event
    if name == "begin_request":
        r = _request(head)
        prompt = e.detail.get("prompt")
        assert isinstance(
            prompt, list
        )  # Verify: the schema requires detail.prompt, a list of ints.
        return Call(
            lambda: f"begin_request(trace request {r})",
            lambda: cp.begin_request(r, prompt),
            request=r,
        )
    if name == "compute":
        return _compute(cp, ahead, k, head)
    if name in INSERT_EVENTS:
        r = _request(head)
        end = _scan(ahead, k, lambda ln: ln.event.event in INSERT_EVENTS and ln.event.request == r)
        after = ahead.peek(end)
        if (
            name == "discard"
            and after is not None
            and after.event.event == "end_request"
            and after.event.request == r
        ):
            return Call(
                lambda: f"end_request(trace request {r})",
                lambda: cp.end_request(r),
                request=r,
                blame=end,
            )
        if name == "discard" and after is None:  # cut before what tells insert from end_request
            ending = Call(
                lambda: f"end_request(trace request {r})", lambda: cp.end_request(r), request=r
            )
            return Call(
                lambda: f"insert(trace request {r})",
                lambda: cp.insert(r),
                request=r,
                alternative=ending,
                on=lambda plane: plane.insert(r),
            )
        return Call(lambda: f"insert(trace request {r})", lambda: cp.insert(r), request=r)
    if name == "cached_len":
        r = _request(head)
        if e.node is None:
            return Call(lambda: f"insert(trace request {r})", lambda: cp.insert(r), request=r)
        node = resolve(head, e.node)
        return Call(
            lambda: f"advance_cached_len(trace request {r}, trace node {e.node})",
            lambda: cp.advance_cached_len(r, node),
            nodes=[node],
            request=r,
        )
    if name == "end_request":
        r = _request(head)
        return Call(lambda: f"end_request(trace request {r})", lambda: cp.end_request(r), request=r)
    if name == "lock":
        r = _request(head)
        node = resolve(head, e.node)
        tier = tier_of(e.tier)
        return Call(
            lambda: f"pin(trace request {r}, trace node {e.node}, {tier})",
            lambda: cp.pin(r, node, tier),
            nodes=[node],
            request=r,
        )
    if name == "unlock":
        return _unlock(cp, ahead, k, head, resolve)
    if name.endswith("_issue"):
        return _issue(cp, ahead, k, head, resolve, ops)
    if name.split("_")[-1] in ENDS:
        return _end(cp, ahead, k, head, ops)
    if name == "tombstone":
        node = resolve(head, e.node)
        return Call(
            lambda: f"tombstone(trace node {e.node})", lambda: cp.tombstone(node), nodes=[node]
        )
    if name.startswith("evict_") or name == "invalidate_l3":
        node = resolve(head, e.node)
        tier = tier_of(e.tier)
        return Call(
            lambda: f"evict_node(trace node {e.node}, {tier}, {name})",
            lambda: cp.evict_node(node, tier, name),
            nodes=[node],
        )
    raise Unreplayable(
        head,
        f"{name} is emitted only within a call (after the event that starts it), never on its own",
    )


def _compute(cp: ControlPlane, ahead: Lookahead, k: int, head: Line) -> Call:
    r = _request(head)
    end = _scan(ahead, k, lambda ln: ln.event.event == "compute" and ln.event.request == r)
    last = ahead.peek(end - 1)
    assert last is not None  # Verify: the scan covered `head` at least.
    start, stop = head.event.token_start, last.event.token_end
    if start is None or stop is None:
        raise Unreplayable(
            head, "compute names no token range; the reference needs the tokens it reserves for"
        )
    n = stop - start
    return Call(
        lambda: f"compute(trace request {r}, {n} tokens)", lambda: cp.compute(r, n), request=r
    )


def _unlock(cp: ControlPlane, ahead: Lookahead, k: int, head: Line, resolve: Resolver) -> Call:
    """`unpin(r)` or `end_request(r)` (which unpins first) when the run of unlocks releases
    every pin of r, newest first, as they do; else `unpin(r, node)` of the first one."""
    r = _request(head)
    run = _scan(ahead, k, lambda ln: ln.event.event == "unlock" and ln.event.request == r)
    req = cp.requests.get(r)
    pins = [] if req is None else list(reversed(req.pins))
    released = [ahead.peek(i) for i in range(k, run)]
    every = len(pins) == len(released) and all(
        ln is not None
        and resolve.nodes.to_ref.get(ln.event.node or -1) == n.node_id
        and ln.event.tier == str(TIERS[t])
        for ln, (n, t) in zip(released, pins)
    )
    if every:
        rest = _scan(
            ahead,
            run,
            lambda ln: (
                ln.event.event == "node_remove"
                or (ln.event.event == "discard" and ln.event.request == r)
            ),
        )
        after = ahead.peek(rest)
        if after is not None and after.event.event == "end_request" and after.event.request == r:
            return Call(
                lambda: f"end_request(trace request {r})",
                lambda: cp.end_request(r),
                request=r,
                blame=rest,
            )
        return Call(
            lambda: f"unpin(trace request {r})",
            lambda: cp.unpin(r),
            nodes=[n for n, _ in pins],
            request=r,
        )
    node = resolve(head, head.event.node)
    return Call(
        lambda: f"unpin(trace request {r}, trace node {head.event.node})",
        lambda: cp.unpin(r, node),
        nodes=[node],
        request=r,
    )


def _issue(
    cp: ControlPlane, ahead: Lookahead, k: int, head: Line, resolve: Resolver, ops: IdMap
) -> Call:
    e = head.event
    if e.op is None:
        raise Unreplayable(head, f"{e.event} names no op")
    if e.op in ops.to_ref:
        raise Unreplayable(
            head,
            f"trace op {e.op} is already pending (the reference's op {ops.to_ref[e.op]}); "
            "an op id is reused only after its end",
        )
    end = _scan(ahead, k, lambda ln: ln.event.event == e.event and ln.event.op == e.op)
    chain: list[TreeNode] = []
    ids: list[int | None] = []
    for i in range(k, end):
        line = ahead.peek(i)
        assert line is not None  # Verify: the scan read these lines.
        chain.append(resolve(line, line.event.node))
        ids.append(line.event.node)
    direction = direction_of(e.event.split("_")[0].upper())
    r = e.request
    by = "no request" if r is None else f"trace request {r}"
    return Call(
        lambda: f"issue({direction}, trace nodes {ids}, {by})",
        lambda: cp.issue(direction, chain, r),
        nodes=chain,
        request=r,
    )


def _end(cp: ControlPlane, ahead: Lookahead, k: int, head: Line, ops: IdMap) -> Call:
    """`complete`, `fail` or `cancel` of the op; `complete_part(op, keep)` when its first
    `keep` nodes' `<dir>_complete` events are followed by `<dir>_fail` of the same op (a
    partly landed read publishes whole nodes, spec/pools.md F11-F13)."""
    e = head.event
    outcome = e.event.split("_")[-1]
    if e.op is None:
        raise Unreplayable(head, f"{e.event} names no op")
    ref = ops.to_ref.get(e.op)
    if ref is None or ref not in cp.ops:
        raise Unreplayable(
            head, f"trace op {e.op} is not pending: it was never issued, or it already ended"
        )
    op = cp.ops[ref]
    # The op's end events, read ahead (whatever the outcome: a caller copying the replay at
    # a call boundary knows then which lines the call reads).
    end = _scan(ahead, k, lambda ln: ln.event.event == e.event and ln.event.op == e.op)
    if outcome == "complete":
        after = ahead.peek(end)
        failed = e.event.replace("_complete", "_fail")
        if after is not None and after.event.event == failed and after.event.op == e.op:
            keep = end - k
            return Call(
                lambda: f"complete_part(trace op {e.op}, {keep} nodes)",
                lambda: cp.complete_part(ref, keep),
                nodes=list(op.nodes),
                request=op.request_id,
                op=ref,
            )
    run = getattr(cp, outcome)
    return Call(
        lambda: f"{outcome}(trace op {e.op})",
        lambda: run(ref),
        nodes=list(op.nodes),
        request=op.request_id,
        op=ref,
    )
