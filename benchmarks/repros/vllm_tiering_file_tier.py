"""Standalone repros of what hicache's oracle found in vLLM 0.33.0's tiering manager with its
file tier (benchmarks/results/2026-12-05-engine-vllm-tiering.md, the findings table). Only the
unmodified engine and its public calls: the manager built by vLLM's own
`TieringOffloadingSpec`, real file-tier threads, `drain_jobs()` to wait for them.

    VENV/bin/python benchmarks/repros/vllm_tiering_file_tier.py      # run from another cwd

Each scenario asserts what vLLM does and prints one line; all pass on vllm 0.33.0 (CPU).

    A  orphan      a block held in the CPU tier and in the file tier without its parent
                   (the parent's GPU->CPU store failed): the tiers are not closed under
                   ancestors (hash-keyed blocks; spec/invariants.md S6's exception)
    B  persistent  a second engine on the same root_dir finds and promotes the first
                   engine's blocks: the file tier outlives the process
    C  no check    a block file replaced by other bytes of the same length is promoted as is:
                   the file tier has no integrity check (hicache reads a corrupt copy as a miss)
    D  not healed  a truncated block file is not rewritten by a later store of the same block
                   (the store skips an existing path); only a read, failing short, removes it
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time

from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext, make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

CHUNK = 4096  # bytes per block (one page: the region's alignment)
END = ScheduleEndContext((), ())
KEYS = [make_offload_key(hashlib.sha256(bytes([i])).digest()[:16], 0) for i in range(8)]
_made = 0
ROOTS: list[str] = []  # every root_dir made, removed at the end


def new_root() -> str:
    ROOTS.append(tempfile.mkdtemp(prefix="vllm-repro-"))
    return ROOTS[-1]


def manager(root: str, chunks: int = 4):  # type: ignore[no-untyped-def]
    """A TieringOffloadingManager: `chunks` CPU blocks over a file tier in `root`."""
    global _made
    _made += 1
    parallel = OffloadingParallelConfig(
        rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
        data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
        is_parallelism_agnostic=True,
    )  # fmt: skip
    config = OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=4, layer_names=("l0",), group_id=0),),
        worker_kv_bytes_per_block=CHUNK,
        enable_kv_cache_events=False,
        extra_config={
            "cpu_bytes_to_use": CHUNK * chunks,
            "secondary_tiers": [{"type": "fs", "root_dir": root}],
        },
        engine_id=f"repro-{os.getpid()}-{_made}",
        model=OffloadingModelConfig(name="repro/toy", dtype="float16"),
        cache=OffloadingCacheConfig(tokens_per_hash=4, blocks_per_chunk=1),
        parallel=parallel,
    )
    return TieringOffloadingSpec(config).get_manager()


def step(m) -> None:  # type: ignore[no-untyped-def]
    """One scheduler step's end, after the file tier's jobs finished."""
    for tier in m.secondary_tiers:
        tier.drain_jobs()
    m.on_schedule_end(END)


def settled_lookup(m, key, ctx) -> LookupResult:  # type: ignore[no-untyped-def]
    """lookup() stepped until it stops asking to retry (the async file probe answered)."""
    for _ in range(200):
        result = m.lookup(key, ctx)
        if result is not LookupResult.RETRY:
            return result
        step(m)
        time.sleep(0.005)
    raise AssertionError("lookup kept answering RETRY")


def promoted(m, key, ctx) -> bytes:  # type: ignore[no-untyped-def]
    """The bytes of `key` once promoted from the file tier into a CPU chunk."""
    for _ in range(200):
        result = settled_lookup(m, key, ctx)
        if result is LookupResult.HIT:
            spec = m.prepare_load([key], ctx)
            cid = int(spec.block_ids[0])
            with m.primary_tier.get_kv_memoryview().cast("B") as flat:
                data = bytes(flat[cid * CHUNK : (cid + 1) * CHUNK])
            m.complete_load([key], ctx)
            return data
        assert result is LookupResult.HIT_PENDING, result
        step(m)
    raise AssertionError("promotion never completed")


def store(m, keys, rid: str, fill: int) -> None:  # type: ignore[no-untyped-def]
    """GPU -> CPU stores of `keys` (bytes `fill`), completed; then cascaded to the file."""
    ctx = ReqContext(rid)
    m.on_new_request(ctx)
    out = m.prepare_store(keys, ctx)
    with m.primary_tier.get_kv_memoryview().cast("B") as flat:
        for cid in out.store_spec.block_ids:
            flat[int(cid) * CHUNK : (int(cid) + 1) * CHUNK] = bytes([fill]) * CHUNK
    m.complete_store(out.keys_to_store, ctx, True)
    m.on_request_finished(ctx)
    step(m)


def orphan() -> None:
    root = new_root()
    m = manager(root)
    ctx = ReqContext("a")
    m.on_new_request(ctx)
    m.prepare_store([KEYS[0]], ctx)
    m.prepare_store([KEYS[1]], ctx)
    m.complete_store([KEYS[0]], ctx, False)  # the parent's GPU->CPU copy failed
    m.complete_store([KEYS[1]], ctx, True)
    step(m)
    files = [os.path.exists(m.secondary_tiers[0].file_mapper.get_file_name(k)) for k in KEYS[:2]]
    cpu = [m.primary_tier.lookup(k, ctx) for k in KEYS[:2]]
    assert files == [False, True] and cpu == [LookupResult.MISS, LookupResult.HIT], (files, cpu)
    print("A orphan: child block in the CPU tier and in a file, its parent in neither")
    m.on_request_finished(ctx)
    m.shutdown()


def persistent() -> None:
    root = new_root()
    first = manager(root)
    store(first, KEYS[:2], "a", 7)
    first.shutdown()
    second = manager(root)
    ctx = ReqContext("b")
    second.on_new_request(ctx)
    assert promoted(second, KEYS[0], ctx) == bytes([7]) * CHUNK
    print("B persistent: a new engine on the same root_dir promoted the old engine's block")
    second.on_request_finished(ctx)
    second.shutdown()


def no_integrity_check() -> None:
    root = new_root()
    m = manager(root, chunks=2)
    store(m, KEYS[:2], "a", 7)
    store(m, KEYS[2:4], "b", 9)  # the CPU tier (2 blocks) gives KEYS[0:2] up
    path = m.secondary_tiers[0].file_mapper.get_file_name(KEYS[0])
    with open(path, "r+b") as f:
        f.write(bytes([66]) * CHUNK)  # another writer, or bit rot: same length
    ctx = ReqContext("c")
    m.on_new_request(ctx)
    got = promoted(m, KEYS[0], ctx)
    assert got == bytes([66]) * CHUNK, set(got)
    print("C no check: the replaced file's bytes were promoted for a block stored as 7s")
    m.on_request_finished(ctx)
    m.shutdown()


def not_healed() -> None:
    root = new_root()
    m = manager(root, chunks=2)
    store(m, KEYS[:1], "a", 7)
    path = m.secondary_tiers[0].file_mapper.get_file_name(KEYS[0])
    with open(path, "r+b") as f:
        f.truncate(3)
    store(m, KEYS[2:4], "b", 9)  # KEYS[0] leaves the CPU tier
    store(m, KEYS[:1], "c", 7)  # stored again: cascaded to the file tier again
    assert os.path.getsize(path) == 3
    print("D not healed: the block was stored again, its file stays 3 bytes long")
    m.shutdown()


if __name__ == "__main__":
    try:
        orphan()
        persistent()
        no_integrity_check()
        not_healed()
    finally:
        for root in ROOTS:
            shutil.rmtree(root, ignore_errors=True)
