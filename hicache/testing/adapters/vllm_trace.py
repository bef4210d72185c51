"""A spec/trace.md trace of what vLLM's block pool and offloading manager did, written by the
vLLM adapter (vllm.py, `traced=True`) for `hicache check-trace`.

vLLM has no tree: a block is one page, keyed by its chained hash. The trace names each page
a node of its own (one id per token prefix: the checker releases an id when its node dies, so
the same prefix may name a later node), so a request computes and inserts page by page:

    vLLM did                                   events (spec/trace.md)
    -----------------------------------------  --------------------------------------------
    admission: the L1 hit held, L2 looked up   begin_request (hit [L1, L2, 0]), cached_len
    prepare_load -> a load job                 h2d_issue per page (op: the job's chain)
    the load's completion / failure            h2d_complete / h2d_fail per page
    a request ending (or giving its restore    h2d_cancel per page of its load in flight (the
      up) with its load in flight              job runs on; its blocks are never published)
    prefill: blocks others cached since        cached_len (node: the deepest of them)
    prefill: each page computed and cached     compute, insert, cached_len (page by page);
                                               a page L1 held already: discard, not insert
    prefill: the tail page                     compute (no node)
    prepare_store -> a store job               d2h_issue per page, one op per parent-first
                                               chain of the job's pages (vLLM stores each
                                               chunk on its own: a job may skip a page)
    the store's completion / failure           d2h_complete / d2h_fail per page
    a block's hash dropped (get_new_blocks     evict_l1 per page, deepest first
      reused it, or evict_blocks)
    a chunk the policy evicted                 evict_l2 per key prepare_store reports
    the request ends                           discard of its tail page, end_request

The header omits `pages` (vLLM's block ids are GPU pool slots the spec's pages would be, but a
load's blocks and a duplicate copy have no spec counterpart), `states`, `locks` and
`node_remove`, and declares L2 `hash_keyed_tiers` (spec/tree.md, "Hash-keyed tiers"): a chunk
evicted from L2 before the page after it, or stored while L2 lacks its parent, is judged legal
there; serving such an orphan is not. It declares `duplicate_copies` too (a second copy of a
page another request is loading): check-trace judges the trace up to the first such copy.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hicache.core.trace import ListSink, TraceEvent, TraceHeader, Tracer

OMITS = ("pages", "states", "locks", "node_remove")
Prefix = tuple[int, ...]


class VLLMTrace:
    """The trace of one opened engine: a header, then events as the adapter reports them."""

    def __init__(
        self,
        page_size: int,
        capacities: dict[str, int],
        engine: str,
        hash_keyed_tiers: tuple[str, ...] = (),
    ) -> None:
        self.page_size = page_size
        # A hash may map to several blocks: a request computing a page another's load is
        # filling caches its own copy (spec/tree.md, "Duplicate copies").
        self.header = TraceHeader(
            page_size,
            capacities,
            OMITS,
            engine=engine,
            hash_keyed_tiers=hash_keyed_tiers,
            duplicate_copies=True,
        )
        self.sink = ListSink()
        self.tracer = Tracer(self.sink)
        self.nodes: dict[Prefix, int] = {}  # each page's node id
        self.next_node = 1
        self.ops: dict[tuple[int, Prefix], int] = {}  # (job, page) -> its chain's trace op
        self.next_op = 1

    @property
    def events(self) -> list[TraceEvent]:
        return self.sink.events

    def lines(self) -> list[str]:
        """The NDJSON lines, header first (what `hicache check-trace FILE` reads)."""
        return [self.header.to_json()] + [e.to_json() for e in self.events]

    def node(self, page: Prefix) -> int:
        if page not in self.nodes:
            self.nodes[page] = self.next_node
            self.next_node += 1
        return self.nodes[page]

    def _page(self, event: str, page: Prefix, **fields: object) -> None:
        self.tracer.emit(
            event,
            node=self.node(page),
            token_start=len(page) - self.page_size,
            token_end=len(page),
            **fields,
        )

    def begin(self, request: int, tokens: Prefix, l1: int, l2: int, l3: int = 0) -> None:
        """begin_request with the admission's hit (tokens per tier), then cached_len."""
        self.tracer.emit(
            "begin_request",
            request=request,
            detail={"hit": [l1, l2, l3], "tokens": len(tokens), "prompt": list(tokens)},
        )
        self.tracer.emit("cached_len", request=request, token_end=l1)

    def transfer(self, event: str, tier: str, op: int, pages: list[Prefix], request: int) -> None:
        """One transfer event per page of job `op`, parent first (`request`: a load's; a
        store: none). A spec op is one parent-first chain, and a vLLM job may skip a page
        (a store skips a chunk L2 holds or another job fills): the issue splits the job into
        its chains, each a trace op of its own; each page's end names its chain's op."""
        if event.endswith("_issue"):
            for chain in self._chains(pages):
                for page in chain:
                    self.ops[op, page] = self.next_op
                self.next_op += 1
        ends = not event.endswith("_issue")
        by_op: dict[int, list[Prefix]] = {}
        for page in sorted(pages, key=len):
            trace_op = self.ops.pop((op, page)) if ends else self.ops[op, page]
            by_op.setdefault(trace_op, []).append(page)
        extra = {"request": request} if event.startswith("h2d") else {}
        for trace_op, chain in by_op.items():
            for page in chain:
                self._page(event, page, tier=tier, op=trace_op, **extra)

    def _chains(self, pages: list[Prefix]) -> list[list[Prefix]]:
        """`pages` as parent-first chains: a page joins the chain that ends at its parent."""
        chains: list[list[Prefix]] = []
        for page in sorted(pages, key=len):
            up = page[: -self.page_size]
            chain = next((c for c in chains if c[-1] == up), None)
            if chain is None:
                chains.append([page])
            else:
                chain.append(page)
        return chains

    def advance(self, request: int, page: Prefix) -> None:
        """cached_len moved to the end of `page` (already in L1)."""
        self.tracer.emit("cached_len", request=request, node=self.node(page), token_end=len(page))

    def computed(self, request: int, page: Prefix, held: str) -> None:
        """The request computed `page` and vLLM cached it: compute (naming the page's node
        when some tier holds it: `held` "L1" or "other"), then insert -- or, L1 holding the
        page already (vLLM then keeps a second block of the hash), the spec's discard of the
        request's copy: the page was RESIDENT either way -- then cached_len."""
        start = len(page) - self.page_size
        node = {"node": self.node(page)} if held else {}
        self.tracer.emit(
            "compute", tier="L1", request=request, token_start=start, token_end=len(page), **node
        )
        self._page("discard" if held == "L1" else "insert", page, tier="L1", request=request)
        self.tracer.emit("cached_len", request=request, token_end=len(page))

    def tail(self, request: int, start: int, end: int) -> None:
        self.tracer.emit("compute", tier="L1", request=request, token_start=start, token_end=end)

    def evicted(self, tier: str, pages: Iterable[Prefix]) -> None:
        """evict_l1 / evict_l2 per page, deepest first."""
        event = "evict_l1" if tier == "L1" else "evict_l2"
        for page in sorted(pages, key=lambda p: (-len(p), p)):
            self._page(event, page, tier=tier)

    def end(self, request: int, tail: tuple[int, int] | None) -> None:
        if tail is not None and tail[0] < tail[1]:
            self.tracer.emit(
                "discard", tier="L1", request=request, token_start=tail[0], token_end=tail[1]
            )
        self.tracer.emit("end_request", request=request)


def workload(
    engine: Any,
    seed: int,
    steps: int,
    settle: bool = False,
    checked: bool = True,
    flush_l2: bool = False,
) -> None:
    """Drive `engine` (a traced vLLM adapter) through a seeded random workload: prompts from
    three shared prefixes with divergent suffixes and tails, up to four live requests,
    prefills, finishes, ticks ending jobs (one in eight failing) and evictions of either
    tier. `settle`: every store ends at once, no job fails and L2 is never pressed (a
    large L2 is the caller's) -- so no chunk is stored while its parent's store is in flight,
    none is evicted before the page after it, and the trace shows none of vLLM's hash-keyed
    differences; loads still end only when a tick says. vLLM's own
    accounting is checked after every step (the adapter's `check()`; `checked=False`
    leaves the trace alone to judge). `flush_l2` (settled): one pressure step in three ends
    every live request, drains, and empties L1 and then L2 (every chunk in one batch,
    deepest first): a lower tier then serves what they held, no page leaves L2 before the
    page after it, and a promotion starts at page 0 (vLLM promotes only the pages past the
    L1 hit, so a promotion under an L1-only parent leaves L2 without ancestors)."""
    import random

    rng, ps, next_id, served = random.Random(seed), engine.page_size, 1, set()
    for _ in range(steps):
        live, roll = sorted(engine.live()), rng.random()
        if roll < 0.3 and len(live) < 4:
            p, salt = rng.randrange(3), rng.randrange(3)
            extra = rng.randrange(4) * ps + rng.randint(1, ps)
            engine.submit(
                next_id,
                tuple(range(1000 * (p + 1), 1000 * (p + 1) + 2 * ps))
                + tuple(range(50 * salt, 50 * salt + extra)),
            )
            next_id += 1
        elif roll < 0.55 and live:
            rid = rng.choice(live)
            if rid not in served and engine.ready(rid) and engine.prefill(rid):
                served.add(rid)
        elif roll < 0.7 and live:
            rid = rng.choice(live)
            engine.finish(rid)
            served.discard(rid)
        elif roll < 0.85:
            for op in engine.pending_ops()[: rng.randint(0, 2)]:
                if settle or rng.random() < 0.875:
                    engine.complete(op)
                else:
                    engine.fail(op, "error")
            engine.tick()
        elif flush_l2 and rng.random() < 1 / 3:
            for rid in live:
                engine.finish(rid)
            served.clear()
            engine.drain()
            engine.evict("L1", engine.l1_pages)
            engine.evict("L2", engine.l2_pages)
        else:
            engine.evict("L1" if settle else rng.choice(engine.tiers), rng.randint(1, 3))
        for _ in range(3 if settle else 0):  # stores end at once (a tier's file jobs too,
            for op in engine.settled_ops():  # which a store's end may start)
                engine.complete(op)
            engine.tick()  # loads end when a tick says
            if not engine.settled_ops():
                break
        engine.changes()
        found = engine.check() if checked else []
        # Verify vLLM's accounting after every step (a finding is the engine's, not the trace's).
        assert not found, f"vLLM's accounting: {found}"
