"""vLLM's KV offloading (`vllm==0.33.0`, installed unmodified) as a `CacheUnderTest`: the GPU
prefix cache over the CPU offloading manager, two tiers judged by the fuzz machine.

Install (hicache with the CPU torch, then vLLM with `--no-deps`, which keeps vLLM's CUDA
requirements out):

    python3 -m venv VENV && VENV/bin/pip install torch==2.13.0 -e '.[test]'
    VENV/bin/pip install --no-deps -r benchmarks/results/2026-12-05-engine-vllm.txt

(the `engine-vllm` extra in pyproject.toml names vLLM's own packages; the file is the whole
environment). Then:

    cd /tmp && PYTHONPATH=REPO VENV/bin/python -m hicache fuzz --seed 1 --steps 2000 \\
        --adapter hicache.testing.adapters.vllm:vllm_cpu_lru_adapter     # or _arc_

What is driven, all pure Python and unmodified:

    tier  vLLM object
    ----  ------------------------------------------------------------------------------
    L1    vllm.v1.core.block_pool.BlockPool with prefix caching (the GPU blocks' metadata:
          free queue, ref counts, hash map; `capacity + 1` blocks, one is vLLM's null block)
    L2    vllm.v1.kv_offload.cpu.manager.CPUOffloadingManager, policy "lru" or "arc"
          (`_new_manager`: the hook a subclass overrides, e.g. with a tiering manager)

Blocks are keyed as vLLM keys them: a prompt's k-th page (`tokens[:k * page_size]`, one GPU
block, one offloaded chunk: block_size = page_size, blocks_per_chunk = 1, one KV cache group)
is the chained `hash_block_tokens` of its tokens (sha256, vLLM's default) and the offload key
`make_offload_key(hash, 0)`; the adapter keeps the prefix of each hash to name pages. The
calls are those of vLLM's scheduler (KVCacheManager) and its scheduler-side offloading
connector (offloading/scheduler.py), in their order:

    CacheUnderTest  vLLM calls
    --------------  -------------------------------------------------------------------------
    submit          on_new_request; the L1 hit: get_cached_block page by page over the first
                    len - 1 tokens (get_computed_blocks), held: BlockPool.touch; then the
                    connector's get_num_new_matched_tokens: lookup() from the L1 hit on over
                    the prompt's whole pages (a HIT_PENDING, or a key another request is
                    loading, defers the request); a hit: get_new_blocks for its pages and
                    prepare_load (update_state_after_alloc) -> a load job; on_schedule_end
    tick            the worker's finished jobs, in issue order: complete_store (success
                    False for a failed job) / complete_load; a finished load's blocks are
                    cached (cache_full_blocks); deferred lookups and refused stores retried
    prefill         the prefix cache matched again past the blocks held (a request is
                    scheduled after others inserted); get_new_blocks for the rest, tail page
                    included (refused when free blocks, evictable ones counted, are short);
                    cache_full_blocks; build_connector_meta's prepare_store of the chunks from
                    next_stored_chunk_idx on -> a store job (None: offered again next step)
    finish          a refused store offered once more; free_blocks(reversed(blocks));
                    on_request_finished
    ready           no load in flight and no deferred lookup; a request not served yet is
                    looked up again, as it would be scheduled now (deferred: not ready)
    evict(L1, n)    evict_blocks of the first n cached blocks of the free queue (its LRU end),
                    the stores still reading them flushed first (pressure is an allocation)
    evict(L2, n)    pressure from outside: prepare_store of n fresh keys (as many as the free
                    chunks first), so the policy evicts n chunks, then complete_store(success=
                    False) of those keys
    check()         BlockPool: ref counts = holders, the free queue = the blocks of ref 0,
                    every hashed block found by its hash; the manager: chunk ref counts = loads
                    in flight, not-ready chunks = stores in flight, the evictable and
                    write-pending counts recounted, free + held chunks = num_chunks, and its
                    take_events() stream (stored / removed) agreeing with its lookups

The adapter is split by concern: vllm_jobs.py plays the transfers (the worker side needs
CUDA), vllm_views.py shows the tiers and checks the accounting (vllm_check.py), vllm_state.py
holds the records, vllm_trace.py writes the trace. With `traced=True` the adapter keeps, per
opened engine, a spec/trace.md trace of what vLLM did (`traces`), for `hicache check-trace`;
`trace()` stays [] so that the fuzz's self-check does not judge it (vLLM's hash-keyed
differences below make most such traces fail the spec's S6 guards: that is the finding).

Bytes: each GPU block and each CPU chunk holds a digest (the CRC of the token prefix whose KV
it holds, written when a block is computed); a store copies a block's digest to its chunk
when the job ends, a load the chunk's to its block. `served_digests` are the blocks' a
request is served from, so a block served stale or from the wrong chunk shows.

Where vLLM differs from the spec, and what the adapter makes of it (results:
benchmarks/results/2026-12-05-engine-vllm.md):

- hash-keyed blocks: L2 may hold a page without the page before it (the connector stores only
  the chunks past a load's hit, so an L1-hit chunk may never reach L2, and the policies evict
  by recency, not leaves first). L2 is declared `hash_keyed_tiers` (spec/tree.md, "Hash-keyed
  tiers"), in the fuzz and in the traces: it is shown as vLLM holds it, orphans included, and
  the hit there is the leading run; pages held without their parent are counted
  (`stats["l2_orphan_pages"]`).
- duplicate copies: vLLM may hold two blocks of one hash (a request computing a page another
  request is loading caches its own; a page-aligned prompt's last page is loaded from L2 again
  though L1 holds it, past the L1 hit's len - 1 cap). The adapter sets `duplicate_copies`
  (spec/tree.md): a page is RESIDENT while any copy is.
- a request waiting for its lookup holds nothing in vLLM; the protocol's admission holds its
  L1 hit, so the adapter holds it (touch) from `submit`.
- giving up a restore (`cancel_restore`) has no vLLM call: the request reads no cache from
  then on (vLLM's Request.skip_reading_prefix_cache) and its load runs on unpublished; nor
  does ending a request free a load's blocks before the job ends in the adapter (vLLM frees
  them and flushes the job when a block is reused). The adapter keeps a given-up load's
  blocks with the job until it ends, then frees them unpublished. A store's source block
  reused before the store ended is flushed first (the job ends as told, or succeeds), as
  vLLM's jobs_to_flush does.
- failed transfers: vLLM 0.33.0's worker asserts every transfer succeeds ("we currently do
  not support job failures"). The manager takes complete_store(success=False); a failed load
  has no call: the adapter calls complete_load (unpinning), frees the blocks unpublished, and
  the request computes those pages (vLLM's recompute policy for load errors).
- write policy: the connector stores every computed chunk as it is computed: write_through
  alone; other write policies and three-tier shapes raise UnsupportedConfig.
"""

from __future__ import annotations

import random
import zlib
from collections import Counter
from collections.abc import Sequence
from typing import Any

from hicache.choices import WritePolicy
from hicache.core.trace import TraceEvent, TraceHeader
from hicache.errors import HiCacheError
from hicache.testing.adapters.vllm_import import import_vllm
from hicache.testing.adapters.vllm_jobs import JobPlayer
from hicache.testing.adapters.vllm_state import (
    Hashes,
    Job,
    PageViews,
    Prefix,
    Request,
)
from hicache.testing.adapters.vllm_trace import VLLMTrace
from hicache.testing.adapters.vllm_views import Views
from hicache.testing.factory import EngineConfig, UnsupportedConfig
from hicache.testing.protocol import Admission, FaultSchedule, PageChange

TIERS = ("L1", "L2")
POLICIES = ("lru", "arc")


class VLLMOffloading(Views, JobPlayer):
    """`CacheUnderTest` over vLLM's BlockPool and an offloading manager (module docstring)."""

    tiers: tuple[str, ...] = TIERS
    duplicate_copies = True  # a hash may map to several blocks (spec/tree.md)
    hash_keyed_tiers: tuple[str, ...] = ("L2",)  # chunks keyed by block hash (spec/tree.md)

    def __init__(
        self,
        l1_pages: int,
        l2_pages: int,
        page_size: int = 4,
        policy: str = "lru",
        traced: bool = False,
    ) -> None:
        self.v = import_vllm()
        self.traced = traced  # keep a spec/trace.md trace per opened engine (`traces`)
        self.traces: list[VLLMTrace] = []
        self.l1_pages, self.l2_pages, self.page_size, self.policy = (
            l1_pages,
            l2_pages,
            page_size,
            policy,
        )
        self.schedule = FaultSchedule()
        self.rng = random.Random(0)
        self.fired: Counter[str] = Counter()
        self.stats: Counter[str] = Counter()
        self.views = PageViews(self.tiers)
        self.prefix_of: dict[bytes, Prefix] = {}  # block hash or offload key -> its prefix
        self._observer = self.v["ReqContext"](req_id="hicache-observer")
        self.restart()

    # -- the engine's parts (hooks) ------------------------------------------------------------

    def _new_manager(self) -> Any:
        """The offloading manager of L2 (a subclass returns another OffloadingManager)."""
        return self.v["CPUOffloadingManager"](
            num_chunks=self.l2_pages, cache_policy=self.policy, enable_events=True
        )

    def _cpu(self) -> Any:
        """The CPU offloading manager holding L2 (a subclass's manager may wrap it; the
        adapter's own looks at L2 must not reach past it)."""
        return self.manager

    def restart(self) -> None:
        """A fresh block pool and manager: the process started again, empty."""
        self.pool = self.v["BlockPool"](self.l1_pages + 1, True, self.page_size)
        self.manager = self._new_manager()
        self.requests: dict[int, Request] = {}
        self.jobs: dict[int, Job] = {}  # in flight, in issue order
        self.next_op = 1
        self.l1_bytes: dict[int, int] = {}  # GPU block id -> digest of what it holds
        self.l2_bytes: dict[int, int] = {}  # manager chunk id -> digest
        self.l2_keys: dict[Any, Prefix] = {}  # keys the manager was given to store
        self.being_loaded: Counter[Any] = Counter()  # _chunks_being_loaded (loads may share)
        self._aim: tuple[str, str] | None = None
        self._changes: list[PageChange] = []
        self._orphans: set[Prefix] = set()  # L2 pages seen held without their parent
        self.l2_announced: dict[bytes, bool] = {}  # key -> stored (True) / removed, per events
        self.views.clear()
        if self.traced:
            self.traces.append(self._new_trace())

    def trace(self) -> list[TraceEvent]:
        """Every opened engine's trace in order, each from seq 1 ([] untraced): what the fuzz
        machine counts for `--report` and check-trace judges (hicache/testing/selfcheck.py)."""
        return [e for t in self.traces for e in t.events]

    def trace_header(self) -> TraceHeader:
        """The header of the engine now open (every engine of a run has the same)."""
        return self._new_trace().header

    def _new_trace(self) -> VLLMTrace:
        """The trace of the engine just opened (a subclass's writer may know more tiers)."""
        engine = f"vllm {self.v['version']} BlockPool + {type(self.manager).__name__}"
        caps = {"L1": self.l1_pages, "L2": self.l2_pages}
        keyed = tuple(t for t in self.hash_keyed_tiers if t in caps)
        return VLLMTrace(self.page_size, caps, engine, keyed)

    def close(self) -> None:
        self.requests.clear()
        self.jobs.clear()

    # -- naming pages ------------------------------------------------------------------------

    def _hash_pages(self, tokens: Prefix) -> tuple[list[Any], list[Any]]:
        """The block hash and offload key of each whole page of `tokens`."""
        ps, parent, hashes, keys = self.page_size, None, [], []
        for end in range(ps, len(tokens) + 1, ps):
            parent = self.v["hash_block_tokens"](self.v["hash_fn"], parent, tokens[end - ps : end])
            key = self.v["make_offload_key"](parent, 0)
            self.prefix_of.setdefault(bytes(parent), tokens[:end])
            self.prefix_of.setdefault(bytes(key), tokens[:end])
            hashes.append(parent)
            keys.append(key)
        return hashes, keys

    def _digest(self, prefix: Prefix) -> int:
        return zlib.crc32(repr(prefix).encode())

    # -- requests ----------------------------------------------------------------------------

    def _live(self, rid: int) -> Request:
        r = self.requests.get(rid)
        if r is None:
            raise HiCacheError(f"request {rid} is not live (never submitted, or ended)")
        return r

    def submit(self, request_id: int, tokens: Sequence[int]) -> Admission:
        if request_id in self.requests:
            raise HiCacheError(f"request {request_id} is already live; finish it first")
        if not tokens:
            raise HiCacheError("a prompt needs at least one token")
        if -(-len(tokens) // self.page_size) > self.l1_pages:
            raise HiCacheError(f"{len(tokens)} tokens need more than L1's {self.l1_pages} pages")
        prompt = tuple(tokens)
        hashes, keys = self._hash_pages(prompt)
        ctx = self.v["ReqContext"](req_id=str(request_id))
        for i, key in enumerate(keys):
            ctx.set_offload_key_position(key, (i + 1) * self.page_size)
        self.manager.on_new_request(ctx)
        limit = (len(prompt) - 1) // self.page_size
        hit = self._cached_run(hashes[:limit], 0)
        l2_hit = self._l2_run(keys[:limit])
        self.pool.touch(hit)
        r = Request(prompt, ctx, hashes, keys, list(hit), len(hit) * self.page_size)
        self.requests[request_id] = r
        if self._trace is not None:
            self._trace.begin(request_id, prompt, r.cached_len, l2_hit * self.page_size)
        self._lookup_and_load(request_id, r)
        self._end_step()
        return Admission({"L1": r.cached_len, "L2": l2_hit * self.page_size}, r.cached_len)

    def _cached_run(self, hashes: Sequence[Any], start: int) -> list[Any]:
        """The cached blocks of hashes[start:], page by page until a miss."""
        out = []
        for h in hashes[start:]:
            got = self.pool.get_cached_block(h, [0])
            if not got:
                break
            out.append(got[0])
        return out

    def _l2_run(self, keys: Sequence[Any]) -> int:
        """Leading pages of `keys` the manager answers HIT for (ready to load)."""
        n, hit = 0, self.v["LookupResult"].HIT
        while n < len(keys) and self._cpu().lookup(keys[n], self._observer) is hit:
            n += 1
        return n

    def _lookup(self, r: Request) -> tuple[list[Any], list[Any], bool]:
        """What scheduling the request now would find, changing nothing: the blocks the
        prefix cache adds past those it holds, then the connector's lookup from there (the
        keys it would load, and whether it defers: a HIT_PENDING or RETRY in the run, or a
        key another request is loading, `_chunks_being_loaded`)."""
        lr = self.v["LookupResult"]
        more = []
        if r.load is None and not r.prefilled:
            more = self._cached_run(
                r.hashes[: (len(r.tokens) - 1) // self.page_size], len(r.blocks)
            )
        start, hits, defer = len(r.blocks) + len(more), 0, False
        for key in r.keys[start:]:
            got = self.manager.lookup(key, r.ctx)
            if got is lr.MISS:
                break
            hits += got is not lr.RETRY
            defer |= got is not lr.HIT
        keys = r.keys[start : start + hits]
        return more, keys, defer or any(self.being_loaded[k] for k in keys)

    def _lookup_and_load(self, rid: int, r: Request) -> None:
        """get_num_new_matched_tokens, then (a hit) update_state_after_alloc's load."""
        if r.skip_reading:
            r.waiting = False
            return
        more, keys, defer = self._lookup(r)
        self.pool.touch(more)
        r.blocks += more
        r.waiting = defer
        if defer:
            self.stats["lookup_deferred"] += 1
            return
        if not keys:
            return
        if self._refused("L1") or len(keys) > self.pool.get_num_free_blocks():
            r.waiting = True  # allocate_slots fails: the request waits for room
            self.stats["load_waits_for_l1"] += 1
            return
        start = len(r.blocks)
        blocks = self._alloc(len(keys))
        spec = self.manager.prepare_load(keys, r.ctx)
        pages = list(range(start, start + len(keys)))
        r.load = self._issue(False, rid, r, keys, pages, blocks, list(spec.block_ids))
        r.load_start, r.blocks = start, r.blocks + blocks
        r.next_stored = start + len(keys)  # CHUNK_LEVEL: the hit's chunks are not offered
        self.being_loaded.update(keys)

    def ready(self, request_id: int) -> bool:
        """No load in flight and no deferred lookup; a request not served yet is looked up
        again as the scheduler would schedule it now, and waits (deferred) when a page it
        would load is being loaded or stored by another request's job."""
        r = self._live(request_id)
        if r.load is None and not r.waiting and not r.prefilled and not r.skip_reading:
            r.waiting = self._lookup(r)[2]
            self.stats["deferred_at_schedule"] += r.waiting
        return not r.waiting and r.load is None

    def prefill(self, request_id: int) -> bool:
        r = self._live(request_id)
        if r.prefilled:
            raise HiCacheError(f"request {request_id} is served already; finish it")
        if not self.ready(request_id):
            raise HiCacheError(f"request {request_id} is still restoring; tick until ready")
        ps, limit = self.page_size, (len(r.tokens) - 1) // self.page_size
        more = self._cached_run(r.hashes[:limit], len(r.blocks))
        need = -(-len(r.tokens) // ps) - len(r.blocks) - len(more)
        if need > self.pool.get_num_free_blocks() - sum(b.ref_cnt == 0 for b in more):
            self.stats["prefill_refused"] += 1
            return False
        self.pool.touch(more)
        cached = len(r.blocks) + len(more)
        if self._trace is not None and cached * ps > r.cached_len:
            self._trace.advance(request_id, self._page(r, cached - 1))
        r.blocks += more + self._alloc(need)
        # What holds the pages it computes, read after get_new_blocks: the allocation may
        # evict one of them (a cached block nobody holds, the prompt's last page past the
        # len - 1 cap), which is then computed anew, an insert, not a second copy.
        held = self._held(r, cached) if self._trace is not None else {}
        for page in range(cached, len(r.keys)):
            self.l1_bytes[r.blocks[page].block_id] = self._digest(r.tokens[: (page + 1) * ps])
        self.pool.cache_full_blocks(Hashes(r.hashes), r.blocks, cached, len(r.keys), ps, 0)
        if self._trace is not None:
            for page in range(cached, len(r.keys)):
                self._trace.computed(request_id, self._page(r, page), held.get(page, ""))
            if len(r.tokens) % ps:
                self._trace.tail(request_id, len(r.keys) * ps, (len(r.keys) + 1) * ps)
        r.cached_len, r.prefilled = len(r.keys) * ps, True
        self._note()
        self._store(request_id, r)
        self._end_step()
        return True

    def _store(self, rid: int, r: Request) -> None:
        """build_connector_meta's prepare_store of the chunks from next_stored_chunk_idx."""
        keys = r.keys[r.next_stored :]
        if not keys:
            return
        out = self.manager.prepare_store(keys, r.ctx)
        r.store_refused = out is None
        if out is None:
            self.stats["store_refused"] += 1  # "cannot store chunks": offered next step
            return
        self.stats["l2_evicted_by_store"] += len(out.evicted_keys)
        self._trace_l2_evicted(out.evicted_keys)
        self._note()
        stored = set(out.keys_to_store)
        pages = [i for i in range(r.next_stored, len(r.keys)) if r.keys[i] in stored]
        r.next_stored = len(r.keys)
        if not pages:
            return
        for page in pages:
            self.l2_keys[r.keys[page]] = r.tokens[: (page + 1) * self.page_size]
        blocks = [r.blocks[i] for i in pages]
        chunks = list(out.store_spec.block_ids)
        self._issue(True, rid, r, [r.keys[i] for i in pages], pages, blocks, chunks)

    def _issue(
        self, store: bool, rid: int, r: Request, keys: list[Any], pages: list[int],
        blocks: list[Any], chunks: list[int],
    ) -> Job:  # fmt: skip
        # Verify the job is whole: one chunk per key (the LoadStoreSpec), one block per key.
        assert len(keys) == len(chunks) == len(blocks) == len(pages), (keys, chunks, blocks)
        job = Job(self.next_op, store, rid, r.ctx, keys, pages, blocks, chunks)
        self.next_op += 1
        into = "L2" if store else "L1"
        if self._aim is not None and self._aim[1] == into and self._aim[0] != "refuse":
            job.aimed, self._aim = self._aim[0], None
        self.jobs[job.op] = job
        if not store:  # a page-aligned prompt's last page is looked up past the L1 hit's cap
            job.again = frozenset(self._job_pages(job)) & self._cached()
            self.stats["l1_pages_loaded_again"] += len(job.again)
        if self._trace is not None:
            event, tier = ("d2h_issue", "L2") if store else ("h2d_issue", "L1")
            self._trace.transfer(event, tier, job.op, self._job_pages(job), rid)
        self._note()
        return job

    def finish(self, request_id: int) -> None:
        r = self._live(request_id)
        del self.requests[request_id]
        held = r.blocks
        if r.load is not None:  # ends with its load in flight: the job keeps its blocks
            r.load.orphan, held = True, r.blocks[: r.load_start]
            self._trace_cancel(r.load)
            self.stats["ended_with_load_in_flight"] += 1
        if r.prefilled and r.store_refused:
            self._store(request_id, r)  # the finished request's last store
        self.stats["ended_with_store_in_flight"] += any(
            j.store and j.rid == request_id for j in self.jobs.values()
        )
        self.pool.free_blocks(reversed(held))
        self.manager.on_request_finished(r.ctx)
        if self._trace is not None:
            ps = self.page_size
            tail = (len(r.keys) * ps, -(-len(r.tokens) // ps) * ps) if r.prefilled else None
            self._trace.end(request_id, tail)
        self._end_step()

    def cancel_restore(self, request_id: int) -> None:
        r = self._live(request_id)
        if r.load is not None:
            r.load.orphan = True
            self._trace_cancel(r.load)
            r.blocks, r.load = r.blocks[: r.load_start], None
            self.stats["restores_given_up"] += 1
        r.waiting, r.skip_reading = False, True  # computes the rest: no more lookups
        self._note()


class VLLMServedBeforeLoad(VLLMOffloading):
    """The adapter with one bug put in on purpose: the connector reports a request's load
    finished as soon as it is issued (as a get_finished that does not wait for the worker),
    so the request is scheduled -- and served the loaded pages -- while the bytes are still
    in flight. A test (and the results page) shows the machine catching it."""

    def ready(self, request_id: int) -> bool:
        return not self._live(request_id).waiting


def served_before_load_adapter(config: EngineConfig) -> VLLMOffloading:
    """`vllm_cpu_lru_adapter` with the early schedule put in (VLLMServedBeforeLoad)."""
    vllm_cpu_adapter(config)  # the same shapes
    caps = config.capacities
    return VLLMServedBeforeLoad(caps["L1"], caps["L2"], config.page_size, "lru")


def vllm_cpu_adapter(
    config: EngineConfig, policy: str = "lru", traced: bool = False
) -> VLLMOffloading:
    """vLLM's prefix cache over its CPU offloading manager under `policy` ("lru", "arc") for
    a two-tier write-through configuration; UnsupportedConfig for any other. vLLM is
    imported on the first call (EngineUnavailable, with the install line, without it)."""
    if config.tiers != TIERS or config.write_policy is not WritePolicy.WRITE_THROUGH:
        raise UnsupportedConfig(
            f"vLLM's CPU offloading has tiers {TIERS} and stores as it computes "
            f"(write_through); asked for {config.tiers}, {config.write_policy}"
        )
    if policy not in POLICIES:
        raise UnsupportedConfig(f"eviction policy {policy!r}: vLLM has {POLICIES}")
    caps = config.capacities
    return VLLMOffloading(caps["L1"], caps["L2"], config.page_size, policy, traced)


def vllm_cpu_lru_adapter(config: EngineConfig) -> VLLMOffloading:
    """`hicache fuzz --adapter hicache.testing.adapters.vllm:vllm_cpu_lru_adapter`."""
    return vllm_cpu_adapter(config, "lru")


def vllm_cpu_arc_adapter(config: EngineConfig) -> VLLMOffloading:
    """`hicache fuzz --adapter hicache.testing.adapters.vllm:vllm_cpu_arc_adapter`."""
    return vllm_cpu_adapter(config, "arc")


def vllm_cpu_lru_traced_adapter(config: EngineConfig) -> VLLMOffloading:
    """`vllm_cpu_lru_adapter` that traces what vLLM did: `hicache fuzz --report` counts its
    transitions and check-trace judges every run's trace (hicache/testing/selfcheck.py)."""
    return vllm_cpu_adapter(config, "lru", traced=True)


def vllm_cpu_arc_traced_adapter(config: EngineConfig) -> VLLMOffloading:
    """`vllm_cpu_arc_adapter`, traced (`vllm_cpu_lru_traced_adapter`)."""
    return vllm_cpu_adapter(config, "arc", traced=True)
