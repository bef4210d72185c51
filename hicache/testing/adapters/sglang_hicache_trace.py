"""A spec/trace.md trace of what sglang's hierarchical cache (UnifiedRadixCache, L1 + L2,
write-through) did, for `hicache check-trace`: the one-tier writer (sglang_trace.py) for the
request's events, plus the two tiers' transfers and evictions, found by comparing the tree
before and after each engine call (`Snapshot`).

    sglang did                                  events (spec/trace.md)
    ------------------------------------------  ---------------------------------------------
    a split (match_prefix, insert)              split (SGLangTrace.splits)
    match_prefix + lock at admission            begin_request (hit [L1, L2, 0]), cached_len
    load_back + ready_to_load_host_cache        h2d_issue per node it gave a device value,
                                                naming no request (below)
    an ack leaves ongoing_load_back             h2d_complete per node of that load
    start_writing (write_through_pending_id)    d2h_issue per node, one op per parent chain
    an ack leaves ongoing_write_through         d2h_complete per node of that backup
    a node loses its device value               evict_l1 (write-through: its L2 copy stays)
    a node loses its host value                 evict_l2
    prefill from the loaded node                cached_len (with that node), compute, insert

Node ids are `UnifiedTreeNode.id`, pages the allocators' page ids (slot // page size; L2: the
host pool's). An op is one acknowledgement (its ack id), cut into parent-first chains when
its nodes are not one (spec/trace.md rule 2: an issue names a chain); a split while an op is
in flight adds the new upper node to it (rule 4). The header omits what the one-tier trace
omits (`states`, `locks`, `node_remove`). Write-through only: under write-back sglang
reclaims host copies in no leaf order (the results file, finding 2).

A load-back is the tree's op, not a request's: sglang keeps it by node (`ongoing_load_back`),
any request whose match meets its nodes waits for it, and a request that ends (is aborted)
while it is in flight leaves it running to land in the tree. So its events name no request
(spec/trace.md: a request's own op would have to be cancelled before the request ends, R40),
and each waiting request's cached_len moves past its nodes once it lands. Backups and
load-backs are stacked in L2 and L1 (spec/tree.md, "Stacked ops"; findings 7 and 8).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hicache.core.trace import TraceHeader
from hicache.testing.adapters.sglang_trace import (
    OMITS,
    SGLangTrace,
    Span,
    node_spans,
    page_ids,
)

Prefix = tuple[int, ...]


@dataclass(frozen=True)
class Held:
    """What one node held when the tree was last read."""

    node: Any
    span: Span
    device: tuple[int, ...] | None  # device page ids, or None
    host: tuple[int, ...] | None  # host page ids, or None
    writing: int | None  # write_through_pending_id
    key: tuple[int, ...] = ()  # the node's own tokens, as read (a split changes them)
    parent: int | None = None  # the parent's id, as read


Snapshot = dict[int, Held]


@dataclass
class _Op:
    direction: str  # "d2h" or "h2d"
    ack: int
    nodes: set[int]


STACKED = ("L1", "L2")
"""The tiers sglang stacks ops in (results finding 7: a child's backup under its parent's,
finding 8: a child's load-back under its parent's)."""


class SGLangHiCacheTrace:
    """The trace of one opened two-tier cache (composes the one-tier `SGLangTrace`)."""

    def __init__(self, page_size: int, capacities: dict[str, int], engine: str, full: Any) -> None:
        self.base = SGLangTrace(page_size, capacities["L1"], engine)
        # sglang backs up (and loads back) a node while its parent's op is in flight, one ack
        # per node, acknowledged in issue order: stacked L2 and L1 (spec/tree.md).
        self.base.header = TraceHeader(
            page_size, capacities, omits=OMITS, engine=engine, stacked_tiers=STACKED
        )
        self.page_size, self.full, self.tracer = page_size, full, self.base.tracer
        self.ops: dict[int, _Op] = {}  # trace op id -> the ack and nodes it covers
        self.served: dict[int, int] = {}  # request -> the cached_len the trace gave it
        self._next_op = 1

    def lines(self) -> list[str]:
        return self.base.lines()

    # -- reading the tree -------------------------------------------------------------------

    def snapshot(self, root: Any) -> Snapshot:
        ps, out = self.page_size, Snapshot()
        for nid, (node, span) in node_spans(root).items():
            data = node.component_data[self.full]
            dev = None if data.value is None else page_ids(data.value, ps)
            host = None if data.host_value is None else page_ids(data.host_value, ps)
            key, parent = tuple(int(t) for t in node.key.raw_token_ids()), node.parent
            up = None if parent is None or parent.parent is None else int(parent.id)
            out[nid] = Held(node, span, dev, host, node.write_through_pending_id, key, up)
        return out

    # -- what changed -----------------------------------------------------------------------

    def changed(
        self,
        before: Snapshot,
        after: Snapshot,
        load: bool = False,
        split: bool = True,
    ) -> None:
        """The events of one engine call, in the spec's order: splits (new upper nodes join
        the ops in flight on their lower part), evictions (deepest first: a leaf before the
        parent it exposes), then the transfers it issued (with `load`: a load-back too)."""
        if split:
            before = self.splits(before, after)
        for tier, held in (("L1", "device"), ("L2", "host")):
            gone = [
                (h, nid)
                for nid, h in before.items()
                if getattr(h, held) is not None
                and (nid not in after or getattr(after[nid], held) is None)
            ]
            for h, nid in sorted(gone, key=lambda g: (-g[0].span[1], g[1])):
                self._emit(f"evict_{tier.lower()}", tier, nid, h.span, getattr(h, held))
        self._issued(before, after, load)

    def splits(self, before: Snapshot, after: Snapshot) -> Snapshot:
        """split for every node of `after` that is the upper part of a node of `before`
        (sglang's `_split_node`: the lower part keeps the id), emitted first in the call's
        events; the new upper nodes join the ops in flight on their lower parts (rule 4).
        A lower part the same call removed (an insert over a host-only node whose backup
        then needed its host pages) is a split too: results finding 13. Returns `before`
        as the splits left it, for the call's other events."""
        cuts = _cuts(before, after)
        for upper, lower in sorted(cuts.items(), key=lambda c: (after[c[0]].span[1], c[0])):
            at = after[upper].span[1] - after[upper].span[0]
            self.tracer.emit("split", node=lower, detail={"at": at, "upper": upper})
            for op in self.ops.values():
                if lower in op.nodes:
                    op.nodes.add(upper)
        return _cut(before, cuts, after, self.page_size)

    def _issued(self, before: Snapshot, after: Snapshot, load: bool) -> None:
        backups: dict[int, list[int]] = {}
        loads: list[int] = []
        # `before` as the call's splits left it (`splits`): a split's upper part is in it,
        # holding what the node it was cut from held, so an op the call issued on it is new.
        for nid, h in after.items():
            was = before.get(nid) or Held(h.node, h.span, None, None, None)  # new: held nothing
            if h.writing is not None and was.writing is None:
                backups.setdefault(h.writing, []).append(nid)
            if load and h.device is not None and was.device is None and h.host is not None:
                loads.append(nid)  # a host copy given device pages: a load-back
        # Parent first: sglang merges one call's pending backups into one copy, one ack for
        # all (start_writing), whatever order their pending ids were given in.
        for ack, nodes in sorted(backups.items(), key=lambda b: (_depth(b[1], after), b[0])):
            self._issue("d2h", ack, nodes, after)
        if loads:
            self._issue("h2d", -1, loads, after)  # the tree's op (module docstring)

    def _issue(self, direction: str, ack: int, nodes: list[int], after: Snapshot) -> None:
        for chain in _chains(nodes, after):
            op = self._next_op
            self._next_op += 1
            self.ops[op] = _Op(direction, ack, set(chain))
            for nid in chain:
                self._op_event(f"{direction}_issue", op, nid, after[nid])

    def bind_load(self, ack: int) -> None:
        """Name the ack of the load-back just issued (sglang makes it after the values)."""
        for op in self.ops.values():
            if op.direction == "h2d" and op.ack == -1:
                op.ack = ack

    def ended(self, writing: set[int], loading: set[int], after: Snapshot) -> None:
        """`*_complete` per node of every op whose ack is no longer outstanding (backups
        first: sglang's writing_check runs before its loading_check)."""
        for direction, live in (("d2h", writing), ("h2d", loading)):
            done = [(k, op) for k, op in self.ops.items() if op.direction == direction]
            done = [(k, op) for k, op in done if op.ack not in live]
            # Parent first: ops observed at one check end together (one merged copy's ack).
            for op_id, op in sorted(done, key=lambda d: (_depth(list(d[1].nodes), after), d[0])):
                del self.ops[op_id]
                for nid in sorted(op.nodes, key=lambda n: after[n].span[0]):
                    self._op_event(f"{direction}_complete", op_id, nid, after[nid])

    def _op_event(self, name: str, op: int, nid: int, h: Held) -> None:
        """One node's event of op `op`: no request names it (module docstring)."""
        tier = "L2" if name.startswith("d2h") else "L1"
        pages = h.host if tier == "L2" else h.device
        self.tracer.emit(
            name,
            tier=tier,
            node=nid,
            op=op,
            token_start=h.span[0],
            token_end=h.span[1],
            pages=pages,
        )

    def _emit(self, name: str, tier: str, nid: int, span: Span, pages: Any) -> None:
        self.tracer.emit(
            name, tier=tier, node=nid, token_start=span[0], token_end=span[1], pages=pages
        )

    # -- requests ---------------------------------------------------------------------------

    def begin(self, request: int, tokens: Sequence[int], l1: int, l2: int) -> None:
        self.tracer.emit(
            "begin_request",
            request=request,
            detail={"hit": [l1, l2, 0], "tokens": len(tokens), "prompt": [int(t) for t in tokens]},
        )
        self.tracer.emit("cached_len", request=request, token_end=l1)
        self.served[request] = l1

    def serve_loaded(self, request: int, node: Any, matched: int) -> None:
        """cached_len up to the node the request's load-back (its own or shared) filled,
        once observed: what sglang's prefill starts from (rule 5: after its h2d_complete)."""
        if matched > self.served[request]:
            self.tracer.emit("cached_len", request=request, node=int(node), token_end=matched)
            self.served[request] = matched

    def compute(self, request: int, root: Any, tokens: Sequence[int], row: Any, end: int) -> None:
        self.base.compute(request, root, tokens, row, self.served[request], end)

    def insert(
        self, request: int, root: Any, tokens: Sequence[int], row: Any, held: set[Prefix]
    ) -> None:
        """After sglang's insert: a node past the request's start whose pages were on the
        device before (`held`: page prefixes) had our pages discarded, any other was
        inserted (a host-only node takes our pages as its device copy); then cached_len."""
        start, ps = self.served[request], self.page_size
        self.base.publish(
            request, root, tokens, row, start, lambda end: tuple(tokens[:end]) in held
        )
        self.served[request] = max(start, len(tokens) // ps * ps)

    def end(self, request: int, tail: Span | None, slots: Any) -> None:
        self.served.pop(request, None)
        self.base.end(request, tail, slots)


def _cuts(before: Snapshot, after: Snapshot) -> dict[int, int]:
    """The splits between two reads of the tree: new upper node -> the node it was cut
    from. The lower part is a child of the new node, or, if the call removed it, a node of
    `before` that `after` lacks, under the same parent, whose tokens start with the new
    node's and run past them."""
    out: dict[int, int] = {}
    for nid, h in after.items():
        if nid in before:
            continue
        lower = next((int(c.id) for c in h.node.children.values() if int(c.id) in before), None)
        if lower is None:
            lower = next(
                (
                    old
                    for old, o in before.items()
                    if old not in after
                    and o.parent == h.parent
                    and len(o.key) > len(h.key) > 0
                    and o.key[: len(h.key)] == h.key
                ),
                None,
            )
        if lower is not None:
            out[nid] = lower
    return out


def _cut(before: Snapshot, cuts: dict[int, int], after: Snapshot, page_size: int) -> Snapshot:
    """`before` with each split of `cuts` made: the upper part holds the first pages of
    what the node held, the lower part the rest (both keep its pending backup)."""
    out = dict(before)
    for upper, lower in cuts.items():
        o, at = before[lower], after[upper].span[1] - after[upper].span[0]
        k, mid = at // page_size, o.span[0] + at
        head = None if o.device is None else o.device[:k], None if o.host is None else o.host[:k]
        tail = None if o.device is None else o.device[k:], None if o.host is None else o.host[k:]
        out[upper] = Held(
            after[upper].node, (o.span[0], mid), *head, o.writing, o.key[:at], o.parent
        )
        out[lower] = Held(o.node, (mid, o.span[1]), *tail, o.writing, o.key[at:], upper)
    return out


def _depth(nodes: list[int], after: Snapshot) -> int:
    """Where the shallowest of `nodes` starts (tokens): an ancestor's ops sort first."""
    return min(after[n].span[0] for n in nodes)


def _chains(nodes: list[int], after: Snapshot) -> list[list[int]]:
    """`nodes` cut into parent-first chains (each node the parent of the next)."""
    out: list[list[int]] = []
    for nid in sorted(nodes, key=lambda n: (after[n].span[0], n)):
        parent = after[nid].node.parent
        last = next((c for c in out if parent is not None and int(parent.id) == c[-1]), None)
        if last is None:
            out.append([nid])
        else:
            last.append(nid)
    return out


def workload(cache: Any, seed: int, steps: int, settle: bool = False) -> None:
    """Drive `cache` (a traced SGLangHiCache) through a seeded random workload: prompts from
    three shared prefixes with divergent suffixes, up to four live requests, prefills once
    ready, finishes (a request whose load-back is in flight is not ended: sglang cannot
    cancel one), ticks, late completions, and L1 and L2 evictions. sglang's own accounting
    is checked after every step (the adapter's `check()`). `settle`: every transfer in flight
    lands before a submit or a prefill, so that no backup (load-back) of a child is issued
    while its parent's is in flight: what check-trace refuses (the guard `parent(L2) ==
    RESIDENT`, `parent(L1) == RESIDENT`; the results file, "Traces and check-trace")."""
    import random

    rng, ps, next_id, served = random.Random(seed), cache.page_size, 1, set()
    for _ in range(steps):
        live, roll = sorted(cache.live()), rng.random()
        if roll < 0.25 and len(live) < 4:
            if settle:
                settle_transfers(cache)
            p, salt = rng.randrange(3), rng.randrange(3)
            extra = rng.randrange(3) * ps + rng.randint(1, ps)
            prompt = tuple(range(1000 * (p + 1), 1000 * (p + 1) + 2 * ps))
            cache.submit(next_id, prompt + tuple(range(50 * salt, 50 * salt + extra)))
            next_id += 1
        elif roll < 0.45 and live:
            rid = rng.choice(live)
            if settle and rid not in served:
                settle_transfers(cache)
            if rid not in served and cache.ready(rid) and cache.prefill(rid):
                served.add(rid)
        elif roll < 0.6 and live:
            rid = rng.choice(live)
            if cache.ready(rid):
                cache.finish(rid)
                served.discard(rid)
        elif roll < 0.72 and cache.pending_ops():
            cache.complete(rng.choice(cache.pending_ops()))
        elif roll < 0.88:
            cache.tick()
        else:
            cache.evict(rng.choice(("L1", "L2")), rng.randint(1, 3))
        found = cache.check()
        # Verify sglang's accounting after every step (a finding is the engine's, not the trace's).
        assert not found, f"sglang's accounting: {found}"


def settle_transfers(cache: Any) -> None:
    """Every transfer in flight lands and is observed, the backups an insert queued
    included (sglang copies them at the next tick's flush: `drain` ticks until none is left)."""
    cache.drain()
