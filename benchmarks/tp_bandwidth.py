"""Per-rank L1 <-> L2 bandwidth under tensor parallelism: each rank moving its own shard of a
prefix at once, as a share of the same rank's figure alone, measured in the same run.

    PYTHONPATH=. python3 benchmarks/tp_bandwidth.py [--ranks 2] [--tokens 3500]
        [--model qwen3-8b] [--repeats 20] [--share-gpu]

Each rank (hicache/distributed/processes.py, gloo for the barriers) takes GPU `rank` and its
shard of `--model`'s KV heads (kv_heads / ranks: the bytes of a sharded pool on that rank),
and moves a `--tokens` prefix between random L1 pages and consecutive pinned L2 pages with the
product's mover (DeviceHostMover, as `hicache bench transfer`'s "hicache" path), D2H and H2D
taking turns, issue to DONE, median of `--repeats`. Beside each, its ceiling: one contiguous
pinned copy of the same bytes (CUDA events).

Phases: `alone` -- one rank at a time, the others waiting at a barrier (the single-GPU
figure); `together` -- every rank at once, a barrier before each repeat. The figure of merit
is `together / alone` per rank and direction (`share_of_alone`; the goal: >= 0.9, each GPU
has its own host link, so ranks should not slow each other down), and each path's share of
its ceiling.

Needs one GPU per rank; `--share-gpu` runs every rank on GPU 0 instead (a check of the code
path on a one-GPU machine: the ranks then share one link, so `share_of_alone` near 1 / ranks
is expected, not a result). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from hicache.core.tiers import Direction
from hicache.dataplane.dma import DeviceHostMover
from hicache.dataplane.geometry import preset
from hicache.dataplane.pools import DevicePool, HostPool, page_digest
from hicache.distributed.processes import run_ranks
from hicache.distributed.wire import ProcessCollectives
from hicache.kernels import KernelSet

WARMUP = 3  # untimed moves each way before a phase (first use allocates staging buffers)
DIRECTIONS = (Direction.D2H, Direction.H2D)


def bench_rank(
    rank: int,
    size: int,
    c: ProcessCollectives,
    tokens: int,
    model: str,
    repeats: int,
    share_gpu: bool,
) -> dict[str, Any]:
    """This rank's medians (ms) per phase and direction, and its ceilings (module docstring)."""
    device = torch.device("cuda", 0 if share_gpu else rank)
    torch.cuda.set_device(device)
    full = preset(model)
    if full.kv_heads % size:
        raise ValueError(f"{model}'s {full.kv_heads} KV heads do not split over {size} ranks")
    g = replace(full, kv_heads=full.kv_heads // size)
    n = -(-tokens // g.page_size)
    l1 = DevicePool(g, 4 * n, device)
    l1.tensor.view(torch.uint8).random_(0, 256)
    l2 = HostPool(g, n, pin=True)
    mover = DeviceHostMover(l1, l2, KernelSet.create(l1.tensor, "auto"))
    rng = np.random.default_rng(rank)
    l1_src, l1_dst = np.split(
        rng.choice(l1.capacity_pages, size=2 * n, replace=False).astype(np.int64), 2
    )
    l2_ids = np.arange(n, dtype=np.int64)
    packed = torch.empty((n, *l1.tensor[:, :, 0].shape), dtype=l1.tensor.dtype, device=device)

    def move(direction: Direction) -> float:
        """Issue to DONE, seconds."""
        t0 = time.perf_counter()
        if direction is Direction.D2H:
            handle = mover.d2h(l1_src, l2_ids)
        else:
            handle = mover.h2d(l2_ids, l1_dst)
        while not handle.poll().final:
            pass
        if handle.error is not None:
            raise handle.error
        return time.perf_counter() - t0

    def ceiling(direction: Direction) -> float:
        """One contiguous pinned copy of the same bytes, device seconds (CUDA events)."""
        host = l2.tensor[:n]
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        if direction is Direction.D2H:
            host.copy_(packed, non_blocking=True)
        else:
            packed.copy_(host, non_blocking=True)
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) * 1e-3

    def phase(sync: Callable[[], object]) -> dict[str, dict[str, float]]:
        """Medians (ms) per direction of the path and its ceiling; `sync` before each move
        (a barrier: every rank starts together; a no-op: this rank runs alone)."""
        for d in DIRECTIONS:
            for _ in range(WARMUP):
                move(d)
        times: dict[str, dict[str, list[float]]] = {
            d.value: {"path": [], "ceiling": []} for d in DIRECTIONS
        }
        for _ in range(repeats):
            for d in DIRECTIONS:
                sync()
                times[d.value]["path"].append(move(d))
                sync()
                times[d.value]["ceiling"].append(ceiling(d))
        return {
            d: {k: 1e3 * statistics.median(v) for k, v in kinds.items()}
            for d, kinds in times.items()
        }

    alone: dict[str, dict[str, float]] = {}
    for turn in range(size):  # one rank moves; the others wait at the barrier
        if turn == rank:
            alone = phase(lambda: None)
        dist.barrier()
    together = phase(dist.barrier)
    move(Direction.D2H)  # each direction's bytes checked once, after the timed moves
    correct = bool(np.array_equal(page_digest(l1, l1_src), page_digest(l2, l2_ids)))
    move(Direction.H2D)
    correct &= bool(np.array_equal(page_digest(l1, l1_dst), page_digest(l2, l2_ids)))
    nbytes = n * g.bytes_per_page
    rows = {}
    for d in DIRECTIONS:
        a, t = alone[d.value], together[d.value]
        rows[d.value] = {
            "alone_ms": a["path"],
            "together_ms": t["path"],
            "alone_GBps": nbytes / a["path"] * 1e-6,
            "together_GBps": nbytes / t["path"] * 1e-6,
            "share_of_alone": a["path"] / t["path"],
            "ceiling_alone_ms": a["ceiling"],
            "ceiling_together_ms": t["ceiling"],
            "ceiling_share_of_alone": a["ceiling"] / t["ceiling"],
            "of_ceiling_alone": a["ceiling"] / a["path"],
            "of_ceiling_together": t["ceiling"] / t["path"],
        }
    return {
        "rank": rank,
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device),
        "pages": n,
        "bytes": nbytes,
        "kv_heads": g.kv_heads,
        "correct": correct,
        **rows,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--tokens", type=int, default=3500)
    p.add_argument("--model", default="qwen3-8b")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--share-gpu", action="store_true")
    a = p.parse_args()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    out: dict[str, Any] = {
        "bench": "tp_bandwidth",
        "ranks": a.ranks,
        "tokens": a.tokens,
        "model": a.model,
        "gpus": gpus,
        "share_gpu": a.share_gpu,
        "torch": torch.__version__,
    }
    if gpus == 0 or (gpus < a.ranks and not a.share_gpu):
        out["skipped"] = f"needs {a.ranks} GPUs (or --share-gpu and one), this machine has {gpus}"
        print(json.dumps(out))
        return 0
    started = time.perf_counter()
    out["per_rank"] = run_ranks(
        bench_rank,
        a.ranks,
        (a.tokens, a.model, a.repeats, a.share_gpu),
        timeout_s=1200.0,
        collective_timeout_s=300.0,
    )
    out["wall_s"] = time.perf_counter() - started
    for d in DIRECTIONS:
        out[f"{d.value}_share_of_alone_min"] = min(
            r[d.value]["share_of_alone"] for r in out["per_rank"]
        )
    print(json.dumps(out))
    return 0 if all(r["correct"] for r in out["per_rank"]) else 1


if __name__ == "__main__":
    sys.exit(main())
