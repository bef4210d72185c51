"""What agreeing across ranks costs: time inside the collectives per admitted request, two
ranks on one host, over each transport (gloo; shared memory), against a bare exchange of the
same transport (its ceiling) and against one rank's share of an L2 restore.

    PYTHONPATH=. python3 benchmarks/tp_agreement_overhead.py [--transport both] [--ranks 2]
        [--requests 120] [--check-mode off] [--seed 0] [--bare-iters 2000] [--io-threads 4]
        [--restore-tokens 3500] [--restore-model qwen3-8b] [--rank-threads N]

For each `--transport` (gloo, shm, or both, in that order, in one run), each rank
(hicache/distributed/processes.py) serves `hicache demo`'s workload (`--requests`, `--seed`,
the demo's default sizes, CPU) through a CacheController over that transport's collectives
(TorchCollectives, SharedMemoryCollectives), which count the seconds spent in `_exchange`
(every agreement point, waiting for the slower rank included, as a real rank waits). Then,
in the same processes, it times `--bare-iters` bare exchanges of one row (ROW_WIDTH int64:
a gloo all_gather, or one round of the block): the least one collective can cost over that
transport on this machine, so `ratio` (time per collective / bare exchange) says how much of
the cost is the protocol and the wait for the other rank.

Prints one JSON line; under `transports`, per transport, per rank and the slowest rank's
figures (`collective_us_per_request`, split into `wait_us_per_request` -- before the last
rank arrived: the ranks' own work out of step, by the rows' arrival stamps (wire.py) -- and
`agreement_us_per_request`, the rest: the collectives' own cost; `collectives_per_request`
and `per_request_by_point`, `collective_us_each`, `bare_us`, `ratio`). A collective the
cache makes comes after the rank's own work (`work_between_collectives_us`, the mean gap),
not in a hot loop, so the bare exchange is timed that way too (`bare_after_work_us`: the
same gap of busy work, the ranks started together by a barrier):
`agreement_ratio_to_bare_after_work` compares the agreement's own cost per collective
(`agreement_us_each`) with it. Where the rest goes, each part timed after the same gap:
`arrive_after_work_us`, the arrival board's write alone (a Store round trip to the
launcher, which every collective makes first), and `protocol_after_work_us`, one whole
collective of the protocol with no serving around it (checked against spec/tp.toml,
logged, the board, the header row with its values: C2's shape, 3 values);
`staggered_agreement_us`, that collective's agreement (its time less the wait for the last
rank) when rank r arrives r gaps after rank 0, as serving's ranks arrive out of step.

With CUDA, the launcher first times one rank's share of a `--restore-tokens` L2 restore of
`--restore-model` (its KV heads split over the ranks: bytes_per_token x tokens / ranks) as
one contiguous pinned host-to-device copy, by CUDA events, median of RESTORE_REPEATS: the
fastest such restore can be (the DMA ceiling), so `agreement_share_of_restore` (and
`collective_share_of_restore`, waiting included) is the most the agreement can add to it
(the goal: at most 5%). Without CUDA those are null. `--check-mode off` by default: the
invariant checks after every transition would make one rank wait for the other's checks
inside a collective, which is not the agreement's cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from hicache.app import demo, demo_serve
from hicache.controller.controller import CacheController
from hicache.dataplane.geometry import preset
from hicache.distributed.processes import RANK_THREADS, TRANSPORTS, run_ranks
from hicache.distributed.shm import SharedMemoryCollectives
from hicache.distributed.wire import ROW_WIDTH, ProcessCollectives, last_key

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


def bench_rank(
    rank: int, size: int, c: ProcessCollectives, argv: list[str], bare_iters: int
) -> dict[str, Any]:
    """Serve the demo workload over `c`, then time `c`'s transport bare: hot, and after work."""
    args = demo.parser().parse_args(argv)
    setup = demo_serve.demo_setup(args)
    ctl = CacheController(setup.config, collectives=c)
    served = time.perf_counter()
    summary = demo_serve.serve(args, setup, ctl, served, progress=False)
    gap_s = (time.perf_counter() - served - c.exchange_s) / c.exchanges  # work between two
    admissions = int(summary["admissions"])  # type: ignore[call-overload]
    bare = bare_exchange(c, size)
    for _ in range(WARMUP_ITERS):
        bare()
    dist.barrier()
    started = time.perf_counter()
    for _ in range(bare_iters):
        bare()
    bare_s = (time.perf_counter() - started) / bare_iters
    # The same exchange made as the cache makes it: after `gap_s` of this rank's own work
    # (a busy loop; the ranks start each gap together, so no rank waits for the other).
    sporadic_s = after_work_s(bare, bare_iters, gap_s)
    # Where a collective's cost beyond the bare exchange goes, each part timed the same way:
    # the arrival board's write alone (a Store round trip to the launcher), and one whole
    # collective of the protocol (checked, logged, board, header row, values: C2's shape).
    arrive_s = after_work_s(lambda: c.board.set(last_key(rank), "0 bench"), bare_iters, gap_s)
    served_counters = (c.exchanges, c.exchange_s, c.wait_s, c.payload_int64, c.by_point.copy())
    protocol_s = after_work_s(lambda: c.all_reduce_min("reserve", (1, 1, 1)), bare_iters, gap_s)
    staggered_s = staggered_agreement_s(c, bare_iters, gap_s)
    c.exchanges, c.exchange_s, c.wait_s, c.payload_int64, c.by_point = served_counters
    each_s = c.exchange_s / c.exchanges
    return {
        "rank": rank,
        "admissions": admissions,
        "collectives": c.exchanges,
        "payload_int64_mean": c.payload_int64 / c.exchanges,
        "collective_us_per_request": 1e6 * c.exchange_s / admissions,
        "wait_us_per_request": 1e6 * c.wait_s / admissions,
        "agreement_us_per_request": 1e6 * (c.exchange_s - c.wait_s) / admissions,
        "collectives_per_request": c.exchanges / admissions,
        "per_request_by_point": {k: v / admissions for k, v in sorted(c.by_point.items())},
        "collective_us_each": 1e6 * each_s,
        "bare_us": 1e6 * bare_s,
        "bare_int64": ROW_WIDTH,
        "ratio": each_s / bare_s,
        "work_between_collectives_us": 1e6 * gap_s,
        "bare_after_work_us": 1e6 * sporadic_s,
        "agreement_us_each": 1e6 * (c.exchange_s - c.wait_s) / c.exchanges,
        "agreement_ratio_to_bare_after_work": (c.exchange_s - c.wait_s) / c.exchanges / sporadic_s,
        "arrive_after_work_us": 1e6 * arrive_s,
        "protocol_after_work_us": 1e6 * protocol_s,
        "staggered_agreement_us": 1e6 * staggered_s,
        "violations": summary["invariants"]["violations"],
    }  # type: ignore[index]


def after_work_s(
    exchange: Callable[[], object], iters: int, gap_s: float, lag_s: float = 0.0
) -> float:
    """Mean seconds of `exchange` made `iters` times, each after `gap_s` of busy work that
    every rank starts together (a barrier), as the cache makes its collectives; rank r works
    r x `lag_s` longer (0: the ranks arrive in step)."""
    spent = 0.0
    for _ in range(iters):
        dist.barrier()
        until = time.perf_counter() + gap_s + lag_s * dist.get_rank()
        while time.perf_counter() < until:
            pass
        t = time.perf_counter()
        exchange()
        spent += time.perf_counter() - t
    return spent / iters


def staggered_agreement_s(c: ProcessCollectives, iters: int, gap_s: float) -> float:
    """Mean agreement seconds of one protocol collective (C2's shape) when rank r arrives
    r x `gap_s` after rank 0, as serving's ranks arrive out of step: its time minus the wait
    for the last rank (the rows' arrival stamps), as `agreement_us_each` is counted. On an
    early rank that includes waking up once the last one comes."""
    exchange_s, wait_s = c.exchange_s, c.wait_s
    after_work_s(lambda: c.all_reduce_min("reserve", (1, 1, 1)), iters, gap_s, lag_s=gap_s)
    return ((c.exchange_s - exchange_s) - (c.wait_s - wait_s)) / iters


def bare_exchange(c: ProcessCollectives, size: int) -> Callable[[], object]:
    """One bare exchange of a ROW_WIDTH row over `c`'s transport: a gloo all_gather, or one
    round of the shared-memory block (`bare_round`)."""
    if isinstance(c, SharedMemoryCollectives):
        row = [0] * ROW_WIDTH
        return lambda: c.bare_round(row)
    mine = torch.zeros(ROW_WIDTH, dtype=torch.int64)
    rows = [torch.empty_like(mine) for _ in range(size)]
    return lambda: dist.all_gather(rows, mine)


SUMMARY = (
    "collective_us_per_request",
    "wait_us_per_request",
    "agreement_us_per_request",
    "collectives_per_request",
    "collective_us_each",
    "bare_us",
    "ratio",
    "work_between_collectives_us",
    "bare_after_work_us",
    "agreement_us_each",
    "agreement_ratio_to_bare_after_work",
    "arrive_after_work_us",
    "protocol_after_work_us",
    "staggered_agreement_us",
)


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
    p.add_argument("--transport", choices=(*TRANSPORTS, "both"), default="both")
    p.add_argument(
        "--rank-threads",
        type=int,
        default=RANK_THREADS,
        help=f"each rank's torch intra-op threads (default {RANK_THREADS}: processes.py)",
    )
    a = p.parse_args()
    argv = [
        "--device",
        "cpu",
        "--requests",
        str(a.requests),
        "--seed",
        str(a.seed),
        "--check-mode",
        a.check_mode,
        "--io-threads",
        str(a.io_threads),
        "--quiet",
    ]
    started = time.perf_counter()
    restore = restore_us(a.restore_tokens, a.restore_model, a.ranks)
    out: dict[str, Any] = {
        "bench": "tp_agreement_overhead",
        "ranks": a.ranks,
        "requests": a.requests,
        "check_mode": a.check_mode,
        "torch": torch.__version__,
        "restore_tokens": a.restore_tokens,
        "restore_model": a.restore_model,
        "restore_us": restore,
        "rank_threads": a.rank_threads,
        "transports": {},
    }
    for transport in TRANSPORTS if a.transport == "both" else (a.transport,):
        ranks = run_ranks(
            bench_rank,
            a.ranks,
            (argv, a.bare_iters),
            timeout_s=1800.0,
            collective_timeout_s=60.0,
            transport=transport,
            threads=a.rank_threads,
        )
        slowest = max(ranks, key=lambda r: r["collective_us_per_request"])
        out["transports"][transport] = {
            **{k: slowest[k] for k in SUMMARY},
            "agreement_share_of_restore": (
                slowest["agreement_us_per_request"] / restore if restore else None
            ),
            "collective_share_of_restore": (
                slowest["collective_us_per_request"] / restore if restore else None
            ),
            "per_rank": ranks,
        }
    out["wall_s"] = time.perf_counter() - started
    print(json.dumps(out))


if __name__ == "__main__":
    main()
