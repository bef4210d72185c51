"""What a captured CUDA graph would give the small transfers: issue cost and end to end.

    PYTHONPATH=. python3 benchmarks/graph_issue.py [--tokens 350 1000] [--repeats 30]
        [--out FILE.json]

At 350 tokens of Qwen3-8B (22 pages, ~52 MB, ~1 ms of DMA) the mover reaches 80-83% of one
pinned copy: the DMA cannot start before the issuing call has planned, borrowed, uploaded
the indices and launched the gather (0.2-0.5 ms of host time). This probe times the same
work issued five ways, for L2 pages in one run and L1 pages in random order:

    path        D2H (L1 -> L2)                                H2D (L2 -> L1)
    ----------  --------------------------------------------  -------------------------------
    ceiling     one pinned copy of the same bytes             the same, the other way
    hicache     DeviceHostMover.d2h (the default mover)       DeviceHostMover.h2d
    lean        index upload, gather, one DMA into L2: the    one DMA from L2, index upload,
                mover's device work with none of its host     scatter
                bookkeeping
    graph       upload + gather captured once per shape;      the DMA, then upload + scatter
                per call: indices into the pinned buffer,     replayed
                replay, then the DMA
    graph+dma   the DMA captured too, to a fixed L2 target:   the DMA captured too
                the floor of a graph whose DMA node is
                patched per call (cuGraphExecMemcpyNodeSetParams)

Each path runs from an idle device, round-robin (hicache.bench.timing), and is checked: its
target pages are poisoned first and must hold the source's bytes after its first run.
Prints a table; `--out` writes the rows as JSON. A probe, not a mover: the graph paths hold
one index buffer and one packed buffer per shape, and serialise on them.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from hicache.bench.timing import Poll, Settings, e2e_ms_interleaved, enqueued
from hicache.dataplane.dma import DeviceHostMover
from hicache.dataplane.geometry import preset
from hicache.dataplane.pools import DevicePool, HostPool, page_digest
from hicache.kernels import KernelSet

L1_PAGES = 1024
POISON = 0xA5


def _timed_start(start: Callable[[], Poll], issue_s: list[float]) -> Callable[[], Poll]:
    def timed() -> Poll:
        t0 = time.perf_counter()
        poll = start()
        issue_s.append(time.perf_counter() - t0)
        return poll

    return timed


def _event_poll() -> Poll:
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
    event.record()
    return lambda: bool(event.query())  # type: ignore[no-untyped-call]


class Probe:
    """Pools, a mover and the per-shape buffers and graphs of one page count."""

    def __init__(self, n: int, rng: np.random.Generator) -> None:
        g = preset("qwen3-8b")
        self.n, self.g = n, g
        self.l1 = DevicePool(g, L1_PAGES, "cuda")
        self.l1.tensor.view(torch.uint8).random_(0, 256)
        self.l2 = HostPool(g, 2 * n + 8, pin=True)
        self.kernels = KernelSet.create(self.l1.tensor, "auto")
        self.mover = DeviceHostMover(self.l1, self.l2, self.kernels)
        self.l1_ids = rng.choice(L1_PAGES, size=n, replace=False).astype(np.int64)
        self.l2_ids = np.arange(n, dtype=np.int64)
        shape = (n, 2, g.layers, g.page_size, g.kv_heads, g.head_dim)
        self.packed = torch.empty(shape, dtype=self.l1.tensor.dtype, device="cuda")
        self.idx_host = torch.zeros(n, dtype=torch.int64).pin_memory()
        self.idx_dev = torch.zeros(n, dtype=torch.int64, device="cuda")
        self.l2_run = self.l2.tensor[:n]  # the L2 pages [0, n): one run

    def fill_indices(self) -> None:
        self.idx_host.numpy()[:] = self.l1_ids

    # -- D2H --------------------------------------------------------------------------------

    def d2h_lean(self) -> None:
        self.fill_indices()
        self.idx_dev.copy_(self.idx_host, non_blocking=True)
        self.kernels.gather(self.l1.tensor, self.idx_dev, self.packed)
        self.l2_run.copy_(self.packed, non_blocking=True)

    def capture(self, work: Callable[[], None]) -> torch.cuda.CUDAGraph:
        work()  # compiled and loaded before the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            work()
        torch.cuda.synchronize()
        return graph

    def d2h_starts(self) -> dict[str, Callable[[], Poll]]:
        l1, packed = self.l1.tensor, self.packed

        def gather_only() -> None:
            self.idx_dev.copy_(self.idx_host, non_blocking=True)
            self.kernels.gather(l1, self.idx_dev, packed)

        def with_dma() -> None:
            gather_only()
            self.l2_run.copy_(packed, non_blocking=True)

        self.fill_indices()
        g_gather, g_all = self.capture(gather_only), self.capture(with_dma)

        def graph() -> None:
            self.fill_indices()
            g_gather.replay()
            self.l2_run.copy_(packed, non_blocking=True)

        def graph_dma() -> None:
            self.fill_indices()
            g_all.replay()

        def ceiling() -> None:
            self.l2_run.copy_(packed, non_blocking=True)

        def hicache() -> Poll:
            handle = self.mover.d2h(self.l1_ids, self.l2_ids)
            return lambda: handle.poll().final

        return {
            "ceiling": enqueued(ceiling, l1.device),
            "hicache": hicache,
            "lean": enqueued(self.d2h_lean, l1.device),
            "graph": enqueued(graph, l1.device),
            "graph+dma": enqueued(graph_dma, l1.device),
        }

    # -- H2D --------------------------------------------------------------------------------

    def h2d_starts(self) -> dict[str, Callable[[], Poll]]:
        l1, packed = self.l1.tensor, self.packed

        def scatter_only() -> None:
            self.idx_dev.copy_(self.idx_host, non_blocking=True)
            self.kernels.scatter(packed, self.idx_dev, l1)

        def with_dma() -> None:
            packed.copy_(self.l2_run, non_blocking=True)
            scatter_only()

        def lean() -> None:
            packed.copy_(self.l2_run, non_blocking=True)
            self.fill_indices()
            scatter_only()

        self.fill_indices()
        g_scatter, g_all = self.capture(scatter_only), self.capture(with_dma)

        def graph() -> None:
            packed.copy_(self.l2_run, non_blocking=True)
            self.fill_indices()
            g_scatter.replay()

        def graph_dma() -> None:
            self.fill_indices()
            g_all.replay()

        def ceiling() -> None:
            packed.copy_(self.l2_run, non_blocking=True)

        def hicache() -> Poll:
            handle = self.mover.h2d(self.l2_ids, self.l1_ids)
            return lambda: handle.poll().final

        return {
            "ceiling": enqueued(ceiling, l1.device),
            "hicache": hicache,
            "lean": enqueued(lean, l1.device),
            "graph": enqueued(graph, l1.device),
            "graph+dma": enqueued(graph_dma, l1.device),
        }

    # -- checks -----------------------------------------------------------------------------

    def poison(self, direction: str) -> None:
        if direction == "D2H":
            self.l2_run.view(torch.uint8).fill_(POISON)
        else:
            idx = torch.from_numpy(self.l1_ids).cuda()
            self.l1.tensor.view(torch.uint8)[:, :, idx] = POISON
        torch.cuda.synchronize()

    def same_bytes(self) -> bool:
        torch.cuda.synchronize()
        return bool(
            np.array_equal(page_digest(self.l1, self.l1_ids), page_digest(self.l2, self.l2_ids))
        )


def measure(n: int, repeats: int, warmup: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    probe = Probe(n, rng)
    settings = Settings(
        geometry=probe.g,
        preset_name="qwen3-8b",
        tokens=(n * probe.g.page_size,),
        repeats=repeats,
        warmup=warmup,
        device=torch.device("cuda"),
        quick=False,
    )
    rows: list[dict[str, Any]] = []
    for direction in ("D2H", "H2D"):
        starts = probe.d2h_starts() if direction == "D2H" else probe.h2d_starts()
        correct: dict[str, bool | None] = {}
        for name, start in starts.items():
            if name == "ceiling":
                correct[name] = None  # it copies the packed buffer, not the pages
                continue
            probe.poison(direction)
            poll = start()
            while not poll():
                pass
            correct[name] = probe.same_bytes()
        issue: dict[str, list[float]] = {name: [] for name in starts}
        timed = {name: _timed_start(s, issue[name]) for name, s in starts.items()}
        ms = e2e_ms_interleaved(timed, settings)
        for name in starts:
            rows.append(
                {
                    "pages": n,
                    "dir": direction,
                    "path": name,
                    "ms": ms[name],
                    "of_ceiling": ms["ceiling"] / ms[name],
                    "issue_ms": statistics.median(issue[name][warmup:]) * 1e3,
                    "bytes_ok": correct[name],
                }
            )
    probe.mover.close()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[350, 1000])
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("graph_issue.py needs a CUDA GPU")
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []
    page_size = preset("qwen3-8b").page_size
    for tokens in args.tokens:
        rows += measure(math.ceil(tokens / page_size), args.repeats, args.warmup, rng)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, median of {args.repeats}")
    print("| pages | dir | path | ms | of ceiling | issue ms | bytes ok |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['pages']} | {r['dir']} | {r['path']} | {r['ms']:.3f} | "
            f"{r['of_ceiling']:.1%} | {r['issue_ms']:.3f} | {r['bytes_ok']} |"
        )
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
