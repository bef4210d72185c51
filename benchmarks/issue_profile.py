"""Where an issuing call's host time goes, on a CUDA GPU: per primitive, then per issue.

    PYTHONPATH=. python3 benchmarks/issue_profile.py [--out DIR]

Part 1 times, in host microseconds (median of 200 calls, device kept busy so nothing waits),
each primitive `DeviceHostMover` issues with: events, stream switches and waits, small
uploads, one-page DMAs, and the Triton gather through Triton's dispatch (`kernel[grid]`),
through `CompiledCache` (the compiled kernel directly) and through `gather_rows` (checks
included). Part 2 runs cProfile over 200 consecutive-page D2H and H2D issues of 22 and 219
pages (Qwen3-8B geometry), and fragmented D2H issues (the mapped route where it is on), and
prints the top entries by own time. Part 3 times an issue's
phases without a profiler: each of the mover's steps wrapped in a clock, host microseconds
per issue (median), what is left outside them, and two polls: one while the device copies
and the one that sees it done (its bookkeeping lies between the copy's end and the caller
seeing DONE). A diagnostic, not a benchmark: no
ceilings, nothing to compare across machines.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from hicache.dataplane.dma import DeviceHostMover
from hicache.dataplane.geometry import preset
from hicache.dataplane.handles import TransferHandle
from hicache.dataplane.pools import DevicePool, HostPool
from hicache.kernels import KernelSet, triton_rows
from hicache.kernels.reference import check_operands, word_view

REPS = 200


def host_us(fn: Callable[[], object], reps: int = REPS) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def primitives(mover: DeviceHostMover) -> dict[str, float]:
    dev = mover.l1.device
    s1, s2 = torch.cuda.Stream(dev), torch.cuda.Stream(dev)  # type: ignore[no-untyped-call]
    busy = torch.empty(1 << 28, dtype=torch.uint8, device=dev)
    with torch.cuda.stream(s2):  # keep the device busy: no call below can finish early
        for _ in range(50):
            busy.add_(1)
    ev = torch.cuda.Event()  # type: ignore[no-untyped-call]
    ev.record(s1)
    host_idx = torch.zeros(8192, dtype=torch.int64).pin_memory()
    dev_idx = torch.zeros(8192, dtype=torch.int64, device=dev)
    l1, l2 = mover.l1.tensor, mover.l2.tensor
    pages = torch.randperm(l1.shape[2], device=dev)[:219]
    out = torch.empty((219, *l1.shape[:2], *l1.shape[3:]), dtype=l1.dtype, device=dev)
    layout = check_operands(l1, pages, out, scatter=False)
    plan, constants = triton_rows._plan_for(layout, None, dev)
    args = (
        word_view(l1, layout),
        word_view(out, layout),
        pages,
        1,
        layout.rows_per_page,
        layout.l1_pages,
        *constants,
        True,
    )
    jitted = triton_rows._kernel()
    key = triton_rows._specialization(args, plan.num_warps, dev)
    cache = triton_rows._compiled()
    one_page_dev, one_page_host = out[:1], l2[:1]

    def switch() -> None:
        with torch.cuda.stream(s1):
            pass

    caller = torch.cuda.current_stream(dev)
    graph, l2_pages = torch.cuda.CUDAGraph(), torch.arange(64, device=dev)
    mover.kernels.copy_mapped(l1, pages[:22], l2, l2_pages[22:44], to_pool=True)  # compiled
    torch.cuda.synchronize(dev)
    with torch.cuda.graph(graph):
        dev_idx[:64].copy_(host_idx[:64], non_blocking=True)
        mover.kernels.copy_mapped(l1, pages[:22], l2, l2_pages[22:44], to_pool=True)

    def replay() -> None:
        graph.replay()

    def set_twice() -> None:
        torch.cuda.set_stream(s1)
        torch.cuda.set_stream(caller)

    result = {
        "event()": host_us(lambda: torch.cuda.Event()),  # type: ignore[no-untyped-call]
        "event(timing)": host_us(lambda: torch.cuda.Event(enable_timing=True)),  # type: ignore[no-untyped-call]
        "event.record": host_us(lambda: ev.record(s1)),
        "event.query": host_us(lambda: ev.query()),  # type: ignore[no-untyped-call]
        "with torch.cuda.stream": host_us(switch),
        "set_stream there and back": host_us(set_twice),
        "stream.wait_event": host_us(lambda: s1.wait_event(ev)),
        "stream.wait_stream": host_us(lambda: s1.wait_stream(s2)),
        "current_stream()": host_us(torch.cuda.current_stream),
        "upload 64 KiB index": host_us(lambda: dev_idx.copy_(host_idx, non_blocking=True)),
        "upload 2 KiB index": host_us(
            lambda: dev_idx[:256].copy_(host_idx[:256], non_blocking=True)
        ),
        "D2H one page": host_us(lambda: one_page_host.copy_(one_page_dev, non_blocking=True)),
        "check_operands": host_us(lambda: check_operands(l1, pages, out, scatter=False)),
        "triton kernel[grid]": host_us(lambda: jitted[plan.grid](*args, num_warps=plan.num_warps)),
        "CompiledCache.launch": host_us(
            lambda: cache.launch(key, plan.grid, args, {"num_warps": plan.num_warps})
        ),
        "gather_rows": host_us(lambda: triton_rows.gather_rows(l1, pages, out)),
        "gather_rows(stream=)": host_us(lambda: triton_rows.gather_rows(l1, pages, out, stream=s1)),
        "KernelSet.gather": host_us(lambda: mover.kernels.gather(l1, pages, out)),
        "KernelSet.copy_mapped 22 pages": host_us(
            lambda: mover.kernels.copy_mapped(l1, pages[:22], l2, l2_pages[22:44], to_pool=True)
        ),
        "CUDAGraph.replay (upload + copy_mapped)": host_us(replay),
    }
    torch.cuda.synchronize(dev)
    return result


def profile_issues(mover: DeviceHostMover, n: int) -> tuple[dict[str, float], str]:
    src = np.arange(n, dtype=np.int64)
    dst = np.arange(n, dtype=np.int64)
    scattered = np.random.default_rng(0).permutation(mover.l2.capacity_pages)[:n]
    times: dict[str, float] = {}
    text = io.StringIO()
    issues: dict[str, Callable[[], TransferHandle]] = {
        "d2h": lambda: mover.d2h(src, dst),
        "h2d": lambda: mover.h2d(dst, src),
        "d2h fragmented": lambda: mover.d2h(src, scattered.astype(np.int64)),  # mapped if on
    }
    for name, issue in issues.items():
        for _ in range(5):
            issue().wait()
        handles = []
        profiler = cProfile.Profile()
        spans = []
        for i in range(60):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            if i >= 30:
                profiler.enable()
            handles.append(issue())
            if i >= 30:
                profiler.disable()
            spans.append(time.perf_counter() - t0)
            handles[-1].wait()
        times[f"{name} {n} pages issue us (no profiler)"] = statistics.median(spans[:30]) * 1e6
        stats = pstats.Stats(profiler, stream=text)
        text.write(f"\n==== {name}, {n} pages: 30 profiled issues ====\n")
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(40)
    return times, text.getvalue()


PHASES = {  # (owner attribute path, method): the steps an issue is made of
    "plan": ("", "plan"),
    "borrow": ("", "_borrow"),
    "enqueue_d2h": ("", "_enqueue_d2h"),
    "enqueue_h2d": ("", "_enqueue_h2d"),
    "mapped plan": ("", "_mapped_plan"),  # a D2H's route choice (None: by DMA)
    "enqueue_mapped": ("", "_enqueue_mapped"),  # a fragmented D2H on the mapped route
    "copy_mapped": ("kernels", "copy_mapped"),
    "gather": ("kernels", "gather"),
    "scatter": ("kernels", "scatter"),
    "copy_runs": ("copies", "copy_runs"),
    "graph replay": ("graphs", "run"),  # a one-chunk D2H's upload + gather (issuegraphs.py)
    "stream current": ("_streams", "current"),
    "stream mark": ("_streams", "mark"),
    "stream timer": ("_streams", "timer"),
    "stream relay": ("_streams", "relay"),
    "stream wait": ("_streams", "wait"),
    "stream wait_for": ("_streams", "wait_for"),
    "stream use": ("_streams", "use"),
}


def phases(mover: DeviceHostMover, n: int, fragmented: bool) -> dict[str, float]:
    """Host microseconds per issue of each phase (median over 100 issues, device idle)."""
    spent: dict[str, float] = {}

    def clocked(name: str, fn: Callable[..., object]) -> Callable[..., object]:
        def run(*args: object, **kwargs: object) -> object:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0

        return run

    owners: list[tuple[object, str]] = []
    for name, (path, method) in PHASES.items():
        owner = getattr(mover, path) if path else mover
        # object.__setattr__: a frozen KernelSet takes an instance attribute this way too
        object.__setattr__(owner, method, clocked(name, getattr(owner, method)))
        owners.append((owner, method))
    rng = np.random.default_rng(0)
    l1 = np.arange(n, dtype=np.int64)
    l2 = rng.permutation(mover.l2.capacity_pages)[:n].astype(np.int64) if fragmented else l1
    per: dict[str, list[float]] = {}
    try:
        for direction in ("d2h", "h2d"):
            issue: Callable[[], TransferHandle] = (
                (lambda: mover.d2h(l1, l2)) if direction == "d2h" else (lambda: mover.h2d(l2, l1))
            )
            for i in range(110):
                torch.cuda.synchronize()
                spent.clear()
                t0 = time.perf_counter()
                handle = issue()
                total = time.perf_counter() - t0
                t1 = time.perf_counter()
                handle.poll()  # the device is still copying: PENDING (an event query)
                first = time.perf_counter() - t1
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                final = handle.poll()  # DONE: the completion's bookkeeping, exposed end to end
                completing = time.perf_counter() - t2
                assert final.final, final
                if i < 10:
                    continue
                steps = ("enqueue_d2h", "enqueue_h2d", "enqueue_mapped", "plan", "mapped plan")
                outer = total - sum(spent.get(k, 0.0) for k in (*steps, "borrow"))
                rows = {**spent, "issue (all)": total, "issue outside plan/borrow/enqueue": outer}
                rows |= {"poll while copying": first, "poll that completes": completing}
                for name, s in rows.items():
                    per.setdefault(f"{direction} {name}", []).append(s)
    finally:
        for owner, method in owners:
            object.__delattr__(owner, method)  # the class's method (or field) again
    return {k: statistics.median(v) * 1e6 for k, v in per.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", help="directory for issue_profile.json and .txt")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("issue_profile: no CUDA device; nothing measured")
        return 2
    g = preset("qwen3-8b")
    l1 = DevicePool(g, 1024, "cuda")
    l2 = HostPool(g, 512, pin=True)
    mover = DeviceHostMover(l1, l2, KernelSet.create(l1.tensor, "triton"))
    result: dict[str, float] = primitives(mover)
    texts = []
    for n in (22, 219):
        times, text = profile_issues(mover, n)
        result.update(times)
        texts.append(text)
    for n in (22, 219):
        for fragmented in (False, True):
            layout = "fragmented" if fragmented else "consecutive"
            for name, us in phases(mover, n, fragmented).items():
                result[f"phase {n} pages {layout}: {name}"] = us
    print(f"mapped D2H: {mover.mapped_reason}")
    for name, us in result.items():
        print(f"{name:<60} {us:9.1f} us")
    print("".join(texts))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(f"{args.out}/issue_profile.json", "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
        with open(f"{args.out}/issue_profile.txt", "w", encoding="utf-8") as f:
            f.write("".join(texts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
