"""vLLM's own accounting, recounted after every step (`VLLMOffloading.check`, vllm_views.py).

    part        finding when
    ----------  ------------------------------------------------------------------------------
    BlockPool   a block's ref_cnt is not the number of its holders (live requests, and loads
                whose request is gone); the free queue is not exactly the blocks of ref_cnt 0;
                a hashed block is not what get_cached_block finds for its hash (none found)
    manager     a chunk's ref_cnt is not the number of loads in flight reading it; a chunk is
                not ready (ref_cnt -1) without a store in flight, or ready with one; the
                manager's evictable or write-pending count differs from the recount; its free
                chunks plus those it holds are not num_chunks; a key being loaded is evictable;
                take_events() announced a key stored that is not held ready, or the reverse

The manager's counters (`_num_evictable_cache_chunks`, `_num_write_pending_chunks`,
`_get_num_free_chunks`) and its policy's `get` are read, never written: vLLM exposes them
only as metrics gauges (get_stats), which round them into fractions.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Protocol

from hicache.testing.adapters.vllm_state import Job, Prefix, Request


class Views(Protocol):
    """What the recount reads of the adapter's views (`vllm_views.Views` has it): its own
    records, and vLLM's objects behind them."""

    pool: Any  # BlockPool
    requests: dict[int, Request]
    jobs: dict[int, Job]
    l2_pages: int
    l2_keys: dict[Any, Prefix]
    l2_announced: dict[bytes, bool]
    prefix_of: dict[bytes, Prefix]

    def _cpu(self) -> Any: ...

    def _more_l2_transfers(self, reads: Counter[Any], writes: set[Any]) -> None: ...


def pool_findings(a: Views) -> list[str]:
    """The block pool's ref counts, free queue and hash map against a recount."""
    holders: Counter[int] = Counter()
    for r in a.requests.values():
        holders.update(b.block_id for b in r.blocks)
    for job in a.jobs.values():
        if not job.store and (job.orphan or job.rid not in a.requests):
            holders.update(b.block_id for b in job.blocks)
    found = []
    blocks = [b for b in a.pool.blocks if not b.is_null]
    for b in blocks:
        if b.ref_cnt != holders[b.block_id]:
            found.append(
                f"L1 block {b.block_id}: ref_cnt {b.ref_cnt}, {holders[b.block_id]} holders"
            )
    free = {b.block_id for b in a.pool.free_block_queue.get_all_free_blocks()}
    idle = {b.block_id for b in blocks if b.ref_cnt == 0}
    if free != idle or a.pool.get_num_free_blocks() != len(idle):
        found.append(
            f"L1 free queue {sorted(free)} (count {a.pool.get_num_free_blocks()}), "
            f"blocks of ref_cnt 0 {sorted(idle)}"
        )
    for b in blocks:
        if b.block_hash is not None:
            got = a.pool.get_cached_block(bytes(b.block_hash)[:-4], [0])
            if not got:
                found.append(f"L1 block {b.block_id} hashed but its hash finds no block")
    return found


def manager_findings(a: Views) -> list[str]:
    """The CPU offloading manager's chunks against the jobs in flight."""
    m, found = a._cpu(), []
    loads: Counter[Any] = Counter()
    stores: set[Any] = set()
    for job in a.jobs.values():
        if job.store:
            stores.update(job.keys)
        else:
            loads.update(job.keys)
    a._more_l2_transfers(loads, stores)
    chunks = {k: m._policy.get(k) for k in a.l2_keys}
    chunks = {k: c for k, c in chunks.items() if c is not None}
    evictable = pending = 0
    for key, c in chunks.items():
        name = f"L2 chunk {c.chunk_id} ({len(a.l2_keys[key])}-token prefix)"
        if c.ref_cnt == -1:
            pending += 1
            if key not in stores:
                found.append(f"{name} not ready with no store in flight")
        elif key in stores:
            found.append(f"{name} ready while its store is in flight")
        elif c.ref_cnt != loads[key]:
            found.append(f"{name}: ref_cnt {c.ref_cnt}, {loads[key]} loads in flight")
        evictable += c.ref_cnt == 0
    for key in loads:
        if key not in chunks or chunks[key].ref_cnt <= 0:
            found.append(f"a key being loaded is not pinned in L2 ({len(a.l2_keys.get(key, ()))})")
    if m._num_evictable_cache_chunks != evictable or m._num_write_pending_chunks != pending:
        found.append(
            f"L2 counts: evictable {m._num_evictable_cache_chunks}, write pending "
            f"{m._num_write_pending_chunks}; recounted {evictable}, {pending}"
        )
    found += _event_findings(a, chunks)
    if m._get_num_free_chunks() + len(chunks) != a.l2_pages:
        found.append(
            f"L2 chunks: {m._get_num_free_chunks()} free + {len(chunks)} held != {a.l2_pages}"
        )
    return found


def _event_findings(a: Views, chunks: dict[Any, Any]) -> list[str]:
    """The manager's take_events() stream against its state: a key last announced stored
    is held ready, and a key held ready was announced stored last (a store in flight has
    no event yet; a removal follows an eviction or a failed store)."""
    found = []
    ready = {bytes(k) for k, c in chunks.items() if c.ref_cnt >= 0}
    announced = {k for k, stored in a.l2_announced.items() if stored}
    for key in sorted(ready ^ announced)[:3]:
        page = len(a.prefix_of.get(key, ()))
        said = "stored" if key in announced else "removed or never stored"
        found.append(
            f"L2 events: a {page}-token prefix's key was last announced {said}, "
            f"but the manager {'holds it ready' if key in ready else 'does not hold it ready'}"
        )
    return found
