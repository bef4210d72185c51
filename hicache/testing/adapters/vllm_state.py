"""The vLLM adapters' bookkeeping: what the scheduler-side connector keeps per request and
per transfer job, and the page views the reference model is shown (vllm.py drives them).

    record     vLLM's counterpart (offloading/scheduler.py unless said)
    ---------  -------------------------------------------------------------------------
    Job        TransferJob + TransferJobStatus: one prepare_store / prepare_load result,
               its keys, its GPU blocks (a store's sources, a load's destinations) and the
               manager's chunk ids (the CPULoadStoreSpec's block_ids, same order)
    Request    RequestOffloadState: the request's block hashes (Request.block_hashes) and
               offload keys, the GPU blocks it holds (KVCacheManager's req_to_blocks), its
               load in flight, next_stored_chunk_idx, a deferred lookup
    PageViews  nothing in vLLM: the pages of each tier by token prefix, diffed into the
               protocol's `PageChange`s (protocol.py)

A tier's view maps a page (its token prefix) to RESIDENT or PENDING; `diff` reports what
changed since the last call: pages gone first (longest first), then pages that came or
changed (shortest first); a step the protocol has no arrow for (RESIDENT -> PENDING: a page
evicted and loaded again inside one call) goes through ABSENT.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hicache.testing.protocol import PENDING, PageChange

ABSENT, RESIDENT = "ABSENT", "RESIDENT"
Prefix = tuple[int, ...]
View = dict[Prefix, str]


@dataclass(eq=False)
class Job:
    """One transfer the connector issued and the adapter plays (the worker side needs CUDA).
    `outcome`: None while the machine has not said; True (complete) or False (fail), applied
    on the next tick. `aimed`: a fault aimed at it ("crash", or a failure kind). `orphan`:
    its request ended or gave the restore up while it ran (a load's blocks are then freed,
    never published, once it ends)."""

    op: int
    store: bool  # True: L1 -> L2 (prepare_store); False: L2 -> L1 (prepare_load)
    rid: int
    ctx: Any  # the request's ReqContext
    keys: list[Any]  # OffloadKeys, in page order
    pages: list[int]  # the request's page index of each key
    blocks: list[Any]  # KVCacheBlocks: the store's sources, the load's destinations
    chunks: list[int]  # the manager's chunk ids, one per key
    outcome: bool | None = None
    aimed: str | None = None
    orphan: bool = False
    again: frozenset[Prefix] = frozenset()  # a load's pages L1 held already at its issue


@dataclass(eq=False)
class Request:
    """A live request as the connector and the KV cache manager know it."""

    tokens: Prefix
    ctx: Any  # ReqContext
    hashes: list[Any]  # BlockHash of each whole page (Request.block_hashes)
    keys: list[Any]  # OffloadKey of each whole page (group 0)
    blocks: list[Any] = field(default_factory=list)  # GPU blocks held, page order
    cached_len: int = 0
    load: Job | None = None  # the load in flight (its blocks are blocks[load_start:])
    load_start: int = 0
    waiting: bool = False  # the lookup was deferred: retried every step
    prefilled: bool = False
    next_stored: int = 0  # next_stored_chunk_idx
    store_refused: bool = False  # prepare_store returned None: offered again next step
    skip_reading: bool = False  # gave its restore up: no more lookups (vLLM's
    # Request.skip_reading_prefix_cache, as a request that reads no cache is scheduled)

    def held_pages(self) -> int:
        """Leading blocks that hold a published page (hashed): hits, finished loads."""
        n = 0
        while n < len(self.blocks) and self.blocks[n].block_hash is not None:
            n += 1
        return n


class Hashes:
    """What BlockPool.cache_full_blocks reads of a vLLM Request: its block hashes."""

    def __init__(self, hashes: list[Any]) -> None:
        self.block_hashes = hashes


class PageViews:
    """Per tier, the pages as last reported; `diff` reports a tier's new view."""

    def __init__(self, tiers: tuple[str, ...]) -> None:
        self.shown: dict[str, View] = {t: {} for t in tiers}

    def clear(self) -> None:
        for view in self.shown.values():
            view.clear()

    def diff(self, tier: str, now: View) -> list[PageChange]:
        """The page changes from the shown view of `tier` to `now` (then shown)."""
        was = self.shown[tier]
        out = [
            PageChange(tier, p, ABSENT)
            for p in sorted(set(was) - set(now), key=lambda p: (-len(p), p))
        ]
        for p in sorted(now, key=lambda p: (len(p), p)):
            old, new = was.get(p, ABSENT), now[p]
            if old == new:
                continue
            if (old, new) == (RESIDENT, PENDING):  # evicted, then filled again
                out.append(PageChange(tier, p, ABSENT))
            out.append(PageChange(tier, p, new))
        self.shown[tier] = dict(now)
        return out


def closed(pages: View, page_size: int) -> tuple[View, set[Prefix]]:
    """`pages` cut to what is reachable from a prompt's start: a page stays when the page
    before it stays RESIDENT (or both are PENDING: one store fills a chain). Returns the
    view and the pages cut (held without their parent: hash-keyed blocks)."""
    out: View = {}
    for p in sorted(pages, key=len):
        up = out.get(p[:-page_size]) if len(p) > page_size else RESIDENT
        if up == RESIDENT or (up == PENDING and pages[p] == PENDING):
            out[p] = pages[p]
    return out, set(pages) - set(out)
