"""SGLang's `RadixCache`, installed from the package registry and unmodified, as a
`CacheUnderTest`: a real engine's prefix cache judged by the fuzz machine.

Install (hicache with the CPU torch in a virtual environment, then sglang):

    python3 -m venv VENV && VENV/bin/pip install torch==2.13.0 -e '.[test]'
    VENV/bin/pip install --no-deps -r benchmarks/results/2026-12-01-engine-sglang.txt

(the `engine-sglang` extra in pyproject.toml names sglang's own packages; the file is the
whole environment). `--no-deps` matters:
sglang's own requirements pull CUDA kernels and a torch of another version. Then:

    PYTHONPATH=$PWD VENV/bin/python -m hicache fuzz --seed 1 --steps 2000 \\
        --adapter hicache.testing.adapters.sglang:sglang_adapter

What is driven: `sglang.srt.mem_cache.radix_cache.RadixCache` over sglang's own
`PagedTokenToKVPoolAllocator` (the KV slots of L1, `capacity` pages; no KV tensors: the
allocator hands out slot indices only). The calls are the ones sglang's scheduler makes:

    CacheUnderTest   RadixCache / allocator calls (as the scheduler makes them)
    ---------------  ------------------------------------------------------------------------
    submit           with `input_limit`: refuse a prompt of at least max_req_input_len
                     tokens (the scheduler's validate_input_length, below); then
                     match_prefix(prompt[:len-1]) + inc_lock_ref(last node)
                     (Req._compute_max_prefix_len: the last token is always computed)
    prefill          `rematch`: match_prefix again and move the lock (a request scheduled
                     after others inserted); else keep the admission's match (a request
                     batched with them); when the allocator is short, evict(the shortfall) if
                     free + evictable_size() covers it, else refuse (False, no slot taken);
                     alloc(the prompt's pages past the match, tail page included);
                     insert(the prompt's whole pages) and free the slots of pages another
                     request inserted meanwhile (as RadixCache._insert_cache does); lock
                     the node ending at the whole pages (as RadixCache.checkpoint does)
    finish           free the request's tail page (never in the tree) + dec_lock_ref
    evict(L1, n)     evict(EvictParams(num_tokens=n * page_size))
    changes()        the page-level difference of the tree since the last call, an eviction's
                     apart and first: the tree is walked (every node's pages, named by
                     their token prefix) before and after each evict
    check()          the engine's own accounting: evictable_size() + protected_size() is
                     the tree's size, every slot is free, in the tree or a live tail, and
                     every node's lock_ref counts the live requests locked below it

A call naming a request that is not live raises HiCacheError (a refusal, nothing changed),
as the protocol asks; sglang's scheduler never makes such a call.

The input limit (`input_limit=True`; the conformance vectors' factory sets it): sglang's
scheduler aborts at admission a prompt of `max_req_input_len` tokens or more
(managers/utils.py `validate_input_length`, called from `handle_generate_request`), where
`max_req_input_len = min(context_len - 1, kv_capacity - 1) - 5` (managers/tp_worker.py
`get_worker_info`); with a context longer than the pool that is `capacity * page_size - 6`.
The fuzz machine expects every admission to be accepted (it judges the refusal at prefill
instead): `hicache fuzz` draws L1 of at least 8 pages (hicache/testing/draws.py), where no
prompt it draws reaches the limit; `machine_adapter` and `token_adapter`, for `make_machine`
with `setups` (L1 from 4 pages), leave the limit off.

The engine has one tier ("L1") and no transfers, so `tick`, `complete`, `fail`, `aim`,
`drain`, `set_faults` and `damage_storage` have nothing to do; `served_digests` is None (no
bytes) and `trace()` is [] (the machine's differential check is its judge). With
`traced=True` (and `rematch=False`) the adapter also keeps, per opened cache, a spec/trace.md
trace of what sglang did (`traces`; sglang_trace.py), for `hicache check-trace`.

Where the engine differs from the spec, and what the adapter makes of it:

- match length: sglang matches at most `len - 1` tokens, page aligned -- as the spec does;
  nothing to map.
- eviction by tokens: `evict(num_tokens)` drops whole unlocked leaves until at least that
  many tokens are gone, so it may free more pages than asked -- as the spec's `evict` does
  (a node's value goes whole); the adapter asks for pages x page_size tokens.
- the tail page: sglang allocates the partial last page with the request and frees it when
  the request ends, never inserting it; the spec's tail page is the same (spec/tree.md,
  "Whole pages only; the tail page").
- capacity: sglang's allocator counts the tail pages of served requests too, as the spec's
  L1 does; the machine's reference model does not judge room, only what `prefill` reports
  (True and served, or False and nothing changed); a trace's replay does judge it.

- a prefill refused for room: sglang evicts nothing (`_make_room`), hicache's controller
  evicts what it can first; spec/restore.md allows both, the conformance vectors fix the
  latter, so the L1 eviction cases fail there (the one divergence they find).

What the oracle said: benchmarks/results/2026-12-01-engine-sglang.md.

Importing sglang on a CPU machine needs a stub for torchvision: sglang_import.py says why.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hicache.errors import HiCacheError
from hicache.testing.adapters.notransfers import WithoutTransfers
from hicache.testing.adapters.sglang_import import (
    import_radix_cache,
    sglang_version,
)
from hicache.testing.adapters.sglang_trace import SGLangTrace, node_spans
from hicache.testing.factory import EngineConfig, UnsupportedConfig
from hicache.testing.protocol import Admission, PageChange

Prefix = tuple[int, ...]
TIERS = ("L1",)
DECODE_RESERVE_TOKENS = 6
"""Tokens of the pool sglang keeps from a prompt: `max_req_len = kv_capacity - 1`, then
`max_req_input_len = max_req_len - 5` (managers/tp_worker.py, `get_worker_info`)."""


# -- the adapter ----------------------------------------------------------------------------


@dataclass
class _Request:
    """A live request: its prompt, the tree node it holds locked, what it is served from,
    and the slots it owns outside the tree (its tail page, after prefill)."""

    tokens: tuple[int, ...]
    node: Any
    cached_len: int
    private: Any = None  # torch.Tensor of slot indices, or None
    prefilled: bool = False


@dataclass
class SGLangRadixCache(WithoutTransfers):
    """`CacheUnderTest` over sglang's RadixCache (see the module docstring)."""

    capacity: int = 8  # L1 pages (the allocator's KV slots / page_size)
    page_size: int = 4
    rematch: bool = True  # prefill matches again (see the module docstring)
    traced: bool = False  # keep a spec/trace.md trace per opened cache (`traces`)
    input_limit: bool = False  # refuse a prompt sglang's scheduler aborts at admission
    tiers: tuple[str, ...] = TIERS
    requests: dict[int, _Request] = field(default_factory=dict)
    stats: Counter[str] = field(default_factory=Counter)
    """What the engine was made to do: prefills served / refused / that evicted to make
    room, duplicate pages freed after an insert, outside evictions and the pages they freed
    beyond those asked for."""

    def __post_init__(self) -> None:
        if self.traced and self.rematch:
            raise HiCacheError(
                "a trace needs rematch=False: a second match at prefill has no "
                "event in spec/trace.md (sglang_trace.py)"
            )
        self.sg = import_radix_cache()
        self.traces: list[SGLangTrace] = []
        self._pages: set[Prefix] = set()  # the tree's pages when last compared (`_diff`)
        self._diffs: list[PageChange] = []  # compared inside a call, not yet reported
        self._open()

    def _open(self) -> None:
        self.allocator = self.sg["Allocator"](
            size=self.capacity * self.page_size,
            page_size=self.page_size,
            dtype=None,
            device="cpu",
            kvcache=None,
            need_sort=False,
        )
        self.tree = self.sg["RadixCache"](
            self.sg["CacheInitParams"](
                disable=False,
                req_to_token_pool=None,
                token_to_kv_pool_allocator=self.allocator,
                page_size=self.page_size,
            )
        )
        if self.traced:
            engine = f"sglang {sglang_version()} RadixCache (hicache/testing/adapters/sglang.py)"
            self.traces.append(SGLangTrace(self.page_size, self.capacity, engine))

    @property
    def _trace(self) -> SGLangTrace | None:
        return self.traces[-1] if self.traced else None

    def _evict(self, tokens: int) -> Any:
        """sglang's evict, traced (evict_l1 per node it dropped)."""
        before = node_spans(self.tree.root_node) if self.traced else {}
        self._diffs += self._diff()  # so that the eviction's pages are reported apart, in order
        freed = self.tree.evict(self.sg["EvictParams"](num_tokens=tokens))
        self._diffs += self._diff()
        if self._trace is not None:
            self._trace.evicted(before, node_spans(self.tree.root_node))
        return freed

    def _key(self, tokens: Sequence[int]) -> Any:
        return self.sg["RadixKey"](array("q", tokens))

    def _match(self, tokens: Sequence[int]) -> Any:
        return self.tree.match_prefix(self.sg["MatchPrefixParams"](key=self._key(tokens)))

    def _relock(self, r: _Request, node: Any) -> None:
        self.tree.inc_lock_ref(node)
        self.tree.dec_lock_ref(r.node)
        r.node = node

    # -- requests -----------------------------------------------------------------------------

    def submit(self, request_id: int, tokens: Sequence[int]) -> Admission:
        if request_id in self.requests:
            raise HiCacheError(f"request {request_id} is already live; finish it first")
        if not tokens:
            raise HiCacheError("a prompt needs at least one token")
        limit = self.capacity * self.page_size - DECODE_RESERVE_TOKENS
        if self.input_limit and len(tokens) >= limit:
            raise HiCacheError(
                f"request {request_id}: input length ({len(tokens)} tokens) exceeds the "
                f"maximum allowed length ({limit} tokens, sglang's max_req_input_len for "
                f"{self.capacity} pages of {self.page_size}); shorten the prompt"
            )
        before = node_spans(self.tree.root_node) if self.traced else {}
        got = self._match(tokens[: len(tokens) - 1])
        self.tree.inc_lock_ref(got.last_device_node)
        hit = int(got.device_prefix_len)
        self.requests[request_id] = _Request(tuple(tokens), got.last_device_node, hit)
        if self._trace is not None:
            self._trace.splits(before, node_spans(self.tree.root_node))
            self._trace.begin(request_id, tokens, hit)
        return Admission({"L1": hit}, hit)

    def prefill(self, request_id: int) -> bool:
        import torch

        r = self._live(request_id)
        if r.prefilled:
            raise HiCacheError(f"request {request_id} is served already; finish it")
        ps, tokens = self.page_size, r.tokens
        if self.rematch:
            self._relock(r, self._match(tokens[: len(tokens) - 1]).last_device_node)
        matched = len(self.tree.path_device_indices(r.node))
        need = -(-len(tokens) // ps) * ps - matched  # slots past the match, tail page included
        short = need - int(self.allocator.available_size())
        if not self._make_room(short):
            self.stats["prefill_refused"] += 1
            return False
        fresh = self.allocator.alloc(need)
        # Verify the evictable size covered the shortfall (the scheduler relies on it too).
        assert fresh is not None, f"alloc({need}) failed after evicting {short} tokens"
        row = torch.cat([self.tree.path_device_indices(r.node), fresh])
        aligned = len(tokens) // ps * ps
        before = {}
        if self._trace is not None:
            self._trace.compute(
                request_id, self.tree.root_node, tokens, row, matched, matched + need
            )
            before = node_spans(self.tree.root_node)
        done = self.tree.insert(
            self.sg["InsertParams"](key=self._key(tokens[:aligned]), value=row[:aligned])
        )
        if self._trace is not None:
            self._trace.splits(before, node_spans(self.tree.root_node))
            self._trace.insert(
                request_id, self.tree.root_node, tokens, row, matched, int(done.prefix_len)
            )
        # Pages another request inserted since the match: ours are duplicates, freed.
        self.allocator.free_segment(row[matched : int(done.prefix_len)], start_pos=matched)
        self.stats["duplicate_pages_freed"] += (int(done.prefix_len) - matched) // ps
        self._lock_served(r, self._match(tokens[:aligned]).last_device_node)
        r.private, r.cached_len, r.prefilled = row[aligned:], aligned, True
        self.stats["prefill_served"] += 1
        return True

    def _make_room(self, short: int) -> bool:
        """Evict `short` tokens' worth of unlocked leaves, or refuse (False) without
        evicting anything when `free + evictable_size()` does not cover the prompt: the
        scheduler's PrefillAdder admits a request only when its tokens fit in
        `rem_total_tokens` (available + evictable), and evicts at allocation."""
        if short <= 0:
            return True
        if short > int(self.tree.evictable_size()):
            return False
        self._evict(short)
        self.stats["prefill_made_room"] += 1
        return True

    def _live(self, request_id: int) -> _Request:
        """The live request, or HiCacheError (the call is refused, nothing changed)."""
        r = self.requests.get(request_id)
        if r is None:
            raise HiCacheError(
                f"request {request_id} is not live (never submitted, or finished); submit it first"
            )
        return r

    def _lock_served(self, r: _Request, node: Any) -> None:
        """Move the request's lock to the node ending at its whole pages (checkpoint's
        `unlock(req.lock); req.lock = lock(new_last_node)`)."""
        self._relock(r, node)

    def finish(self, request_id: int) -> None:
        r = self._live(request_id)
        del self.requests[request_id]
        if r.private is not None and r.private.numel():
            self.allocator.free_segment(r.private, start_pos=r.cached_len)
        self.tree.dec_lock_ref(r.node)
        if self._trace is not None:
            tail = (r.cached_len, r.cached_len + int(r.private.numel())) if r.prefilled else None
            self._trace.end(request_id, tail, r.private)

    def evict(self, tier: str, n_pages: int) -> None:
        if tier not in self.tiers:
            raise HiCacheError(f"tier {tier!r}: this engine has only {self.tiers}")
        freed = self._evict(n_pages * self.page_size)
        self.stats["evict_calls"] += 1
        self.stats["evict_pages_beyond_asked"] += max(
            0, freed.num_tokens_evicted // self.page_size - n_pages
        )

    def restart(self) -> None:
        """A fresh tree and allocator: the process started again."""
        self.requests.clear()
        self._pages.clear()
        self._diffs.clear()
        self._open()

    def close(self) -> None:
        self.requests.clear()

    # -- observation -------------------------------------------------------------------------

    def live(self) -> set[int]:
        return set(self.requests)

    def cached_len(self, request_id: int) -> int:
        return self._live(request_id).cached_len

    def served_digests(self, request_id: int) -> list[int] | None:
        return None

    def _walk(self) -> list[tuple[Prefix, Any]]:
        return walk_nodes(self.tree.root_node)

    def tree_pages(self) -> set[Prefix]:
        """The tree's pages, each named by its token prefix."""
        ps, pages = self.page_size, set[Prefix]()
        for ends, node in self._walk():
            start = len(ends) - len(node.key)
            pages.update(ends[:k] for k in range(start + ps, len(ends) + 1, ps))
        return pages

    def changes(self) -> list[PageChange]:
        """The tree's page differences, in order: each eviction's apart (a prefill that evicts
        a node and inserts some of its pages again reports both, as protocol.py asks)."""
        out, self._diffs = self._diffs + self._diff(), []
        return out

    def _diff(self) -> list[PageChange]:
        """The pages the tree lost and gained since it was last compared."""
        now = self.tree_pages()
        gone = sorted(self._pages - now, key=lambda p: (-len(p), p))
        new = sorted(now - self._pages, key=lambda p: (len(p), p))
        self._pages = now
        return [PageChange("L1", p, "ABSENT") for p in gone] + [
            PageChange("L1", p, "RESIDENT") for p in new
        ]

    def check(self) -> list[str]:
        """sglang's accounting against a recount from the tree (module docstring)."""
        nodes = self._walk()
        found, size = [], sum(len(n.key) for _, n in nodes)
        counted = int(self.tree.evictable_size()) + int(self.tree.protected_size())
        if counted != size:
            found.append(f"evictable_size + protected_size = {counted}, tree holds {size} tokens")
        tails = sum(int(r.private.numel()) for r in self.requests.values() if r.private is not None)
        free = int(self.allocator.available_size())
        if free + size + tails != self.capacity * self.page_size:
            found.append(
                f"slots: {free} free + {size} in the tree + {tails} in tails "
                f"!= {self.capacity * self.page_size}"
            )
        locks = {id(n): 0 for _, n in nodes}
        for r in self.requests.values():
            node = r.node
            while node is not self.tree.root_node:
                locks[id(node)] = locks.get(id(node), 0) + 1
                node = node.parent
        for ends, n in nodes:
            if n.lock_ref != locks[id(n)]:
                found.append(
                    f"node ending at token {len(ends)}: lock_ref {n.lock_ref}, "
                    f"{locks[id(n)]} live requests locked below it"
                )
        return found


def walk_nodes(root: Any) -> list[tuple[Prefix, Any]]:
    """Every node below `root` (a node with `children` and a RadixKey `key`: RadixCache's,
    UnifiedRadixCache's Python TreeCore's) with the token prefix ending where it ends."""
    out, stack = [], [((), root)]
    while stack:
        prefix, node = stack.pop()
        for child in node.children.values():
            ends = prefix + tuple(child.key.raw_token_ids())
            out.append((ends, child))
            stack.append((ends, child))
    return out


class SGLangStaleLock(SGLangRadixCache):
    """The adapter with one bug put in on purpose: after inserting, the request keeps its
    lock on the prefix it matched instead of moving it to the node it inserted -- so the
    pages it is served from may be evicted under it. A test (and the results page) shows
    what the machine says when an engine driven through sglang gets its locking wrong."""

    def _lock_served(self, r: _Request, node: Any) -> None: ...


@dataclass(frozen=True)
class Setup:
    """What the machine draws for one run: L1's pages, and whether prefill matches again."""

    capacity: int = 8
    rematch: bool = True


def sglang_adapter(config: EngineConfig) -> SGLangRadixCache:
    """The factory of both `hicache fuzz --adapter` and `hicache vectors run --adapter`
    (hicache/testing/factory.py): SGLang's RadixCache for a one-tier configuration, its pool
    `capacities["L1"]` pages, matching again at prefill and refusing at admission what
    sglang's scheduler aborts (its input limit), as a server does. sglang is imported on the
    first call; without it the call raises EngineUnavailable saying how to install it."""
    return SGLangRadixCache(
        capacity=_one_tier(config), page_size=config.page_size, rematch=True, input_limit=True
    )


def stale_lock_adapter(config: EngineConfig) -> SGLangRadixCache:
    """`sglang_adapter` with the stale lock put in (SGLangStaleLock)."""
    return SGLangStaleLock(
        capacity=_one_tier(config), page_size=config.page_size, rematch=True, input_limit=True
    )


def _one_tier(config: EngineConfig) -> int:
    if config.tiers != TIERS:
        raise UnsupportedConfig(f"SGLang's RadixCache has one tier (L1); asked for {config.tiers}")
    return config.capacities["L1"]


def machine_adapter(setup: Setup) -> SGLangRadixCache:
    """For `make_machine` with `setups` (a `Setup` drawn: prefill matching again or not)."""
    return SGLangRadixCache(capacity=setup.capacity, rematch=setup.rematch)


def token_adapter(setup: Setup) -> SGLangRadixCache:
    """sglang's default page size, 1 token (`make_machine(..., page_size=1)` with `setups`
    draws prompts to match; `hicache fuzz` draws pages of 4 tokens: `sglang_adapter`)."""
    return SGLangRadixCache(capacity=setup.capacity, page_size=1, rematch=setup.rematch)


def setups(plane: str) -> Any:
    """Setups `make_machine` draws with `machine_adapter` or `token_adapter`: L1 from tighter
    than one long prompt (6 pages) to room for two, and prefill matching again or not (the
    plane does not apply). Imports sglang first (EngineUnavailable without it)."""
    from hypothesis import strategies as st

    import_radix_cache()
    return st.builds(Setup, capacity=st.integers(4, 12), rematch=st.booleans())
