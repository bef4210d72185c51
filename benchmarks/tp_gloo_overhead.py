"""What agreeing across ranks costs: time inside the collectives per admitted request, two
ranks over gloo on CPU, against one bare gloo all_gather of the same size (the ceiling).

    PYTHONPATH=. python3 benchmarks/tp_gloo_overhead.py [--ranks 2] [--requests 120]
        [--check-mode off] [--seed 0] [--bare-iters 2000] [--io-threads 4] [--restore-tokens 3500]
        [--restore-model qwen3-8b]

Each rank (hicache/distributed/processes.py) serves `hicache demo`'s workload (`--requests`,
`--seed`, the demo's default sizes, CPU) through a CacheController over TorchCollectives,
which counts the seconds spent in its `_exchange` (every agreement point: the arrival board
write, the all_gather of the header row with the values inline, a second all_gather for a
payload longer than INLINE_VALUES; waiting for the slower rank included, as a real rank
waits). Then, in the same processes, it times `--bare-iters` bare `dist.all_gather`s of
int64[n], n the mean payload the run sent (at least 1): the least one collective can cost on
this machine, so `ratio` (time per collective / bare all_gather) says how much of the cost is
the protocol (one gather and a store write make it a little over 1) and the wait for the
other rank.

Prints one JSON line: per rank and the slowest rank's figures (`collective_us_per_request`,
split into `wait_us_per_request` -- before the last rank arrived: the ranks' own work out of
step, by the arrival stamps (torchdist.py) -- and `agreement_us_per_request`, the rest: the
collectives' own cost; `collectives_per_request` and `per_request_by_point`,
`collective_us_each`, `bare_all_gather_us`, `ratio`). A collective the cache makes comes
after the rank's own work (`work_between_collectives_us`, the mean gap), not in a hot loop, so
the bare all_gather is timed that way too (`bare_after_work_us`: the same gap of busy work,
the ranks started together by a barrier): `agreement_ratio_to_bare_after_work` compares the
agreement's own cost per collective (`agreement_us_each`) with it.

With CUDA, the launcher also times one rank's share of a `--restore-tokens` L2 restore of
`--restore-model` (its KV heads split over the ranks: bytes_per_token x tokens / ranks) as
one contiguous pinned host-to-device copy, by CUDA events, median of RESTORE_REPEATS: the
fastest such restore can be (the DMA ceiling), so `agreement_share_of_restore` (and
`collective_share_of_restore`, waiting included) is the most the agreement can add to it.
Without CUDA those are null. `--check-mode
off` by default: the invariant checks after every transition would make one rank wait for
the other's checks inside a collective, which is not the agreement's cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from hicache import demo
from hicache.controller.controller import CacheController
from hicache.dataplane.geometry import preset
from hicache.distributed.processes import run_ranks
from hicache.distributed.torchdist import TorchCollectives

WARMUP_ITERS = 50  # bare all_gathers before the timed ones (connections, allocator)
RESTORE_REPEATS = 20  # timed restores (after one warm-up) whose median is reported


def restore_us(tokens: int, model: str, ranks: int) -> float | None:
    """One rank's share of a `tokens`-token restore of `model`, as one contiguous pinned H2D
    copy: median device microseconds (CUDA events); None without CUDA."""
    if not torch.cuda.is_available():
        return None
    nbytes = preset(model).bytes_per_token * tokens // ranks
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    times = []
    for i in range(RESTORE_REPEATS + 1):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        device.copy_(host, non_blocking=True)
        end.record()
        end.synchronize()
        if i:
            times.append(1e3 * float(start.elapsed_time(end)))
    return float(statistics.median(times))


def bench_rank(rank: int, size: int, c: TorchCollectives, argv: list[str],
               bare_iters: int) -> dict[str, Any]:
    """Serve the demo workload over `c`, then time bare all_gathers of the mean payload."""
    args = demo.parser().parse_args(argv)
    setup = demo.demo_setup(args)
    ctl = CacheController(setup.config, collectives=c)
    served = time.perf_counter()
    summary = demo.serve(args, setup, ctl, served, progress=False)
    gap_s = (time.perf_counter() - served - c.exchange_s) / c.exchanges  # work between two
    admissions = int(summary["admissions"])  # type: ignore[call-overload]
    n = max(1, round(c.payload_int64 / c.exchanges))
    mine = torch.zeros(n, dtype=torch.int64)
    rows = [torch.empty_like(mine) for _ in range(size)]
    for _ in range(WARMUP_ITERS):
        dist.all_gather(rows, mine)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(bare_iters):
        dist.all_gather(rows, mine)
    bare_s = (time.perf_counter() - started) / bare_iters
    # The same all_gather made as the cache makes it: after `gap_s` of this rank's own work
    # (a busy loop; the ranks start each gap together, so no rank waits for the other).
    sporadic_s = 0.0
    for _ in range(bare_iters):
        dist.barrier()
        until = time.perf_counter() + gap_s
        while time.perf_counter() < until:
            pass
        t = time.perf_counter()
        dist.all_gather(rows, mine)
        sporadic_s += time.perf_counter() - t
    sporadic_s /= bare_iters
    each_s = c.exchange_s / c.exchanges
    return {"rank": rank, "admissions": admissions, "collectives": c.exchanges,
            "payload_int64_mean": c.payload_int64 / c.exchanges,
            "collective_us_per_request": 1e6 * c.exchange_s / admissions,
            "wait_us_per_request": 1e6 * c.wait_s / admissions,
            "agreement_us_per_request": 1e6 * (c.exchange_s - c.wait_s) / admissions,
            "collectives_per_request": c.exchanges / admissions,
            "per_request_by_point": {k: v / admissions for k, v in sorted(c.by_point.items())},
            "collective_us_each": 1e6 * each_s, "bare_all_gather_us": 1e6 * bare_s,
            "bare_all_gather_int64": n, "ratio": each_s / bare_s,
            "work_between_collectives_us": 1e6 * gap_s,
            "bare_after_work_us": 1e6 * sporadic_s,
            "agreement_us_each": 1e6 * (c.exchange_s - c.wait_s) / c.exchanges,
            "agreement_ratio_to_bare_after_work": (c.exchange_s - c.wait_s) / c.exchanges / sporadic_s,
            "violations": summary["invariants"]["violations"]}  # type: ignore[index]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--requests", type=int, default=120)
    p.add_argument("--check-mode", default="off")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bare-iters", type=int, default=2000)
    p.add_argument("--io-threads", type=int, default=4)
    p.add_argument("--restore-tokens", type=int, default=3500)
    p.add_argument("--restore-model", default="qwen3-8b")
    a = p.parse_args()
    argv = ["--device", "cpu", "--requests", str(a.requests), "--seed", str(a.seed),
            "--check-mode", a.check_mode, "--io-threads", str(a.io_threads), "--quiet"]
    started = time.perf_counter()
    ranks = run_ranks(bench_rank, a.ranks, (argv, a.bare_iters), timeout_s=1800.0,
                      collective_timeout_s=60.0)
    slowest = max(ranks, key=lambda r: r["collective_us_per_request"])
    restore = restore_us(a.restore_tokens, a.restore_model, a.ranks)
    print(json.dumps({
        "bench": "tp_gloo_overhead", "ranks": a.ranks, "requests": a.requests,
        "check_mode": a.check_mode, "torch": torch.__version__,
        "wall_s": time.perf_counter() - started,
        **{k: slowest[k] for k in ("collective_us_per_request", "wait_us_per_request",
                                   "agreement_us_per_request", "collectives_per_request",
                                   "collective_us_each", "bare_all_gather_us",
                                   "bare_all_gather_int64", "ratio", "work_between_collectives_us",
                                   "bare_after_work_us", "agreement_us_each",
                                   "agreement_ratio_to_bare_after_work")},
        "restore_tokens": a.restore_tokens, "restore_model": a.restore_model,
        "restore_us": restore,
        "agreement_share_of_restore": (slowest["agreement_us_per_request"] / restore
                                       if restore else None),
        "collective_share_of_restore": (slowest["collective_us_per_request"] / restore
                                        if restore else None),
        "per_rank": ranks,
    }))


if __name__ == "__main__":
    main()
