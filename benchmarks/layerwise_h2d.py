"""Layer-wise H2D against the whole-transfer H2D and one pinned copy, on a GPU.

    PYTHONPATH=. python3 benchmarks/layerwise_h2d.py [--preset qwen3-8b] [--tokens 350 1000 3500]
                                                    [--repeats 20] [--out FILE.json]

For each size, consecutive L2 pages into consecutive L1 pages (what a fresh restore gets):

    ceiling     one `copy_` of the same bytes from one pinned buffer (the same run)
    dma         `DeviceHostMover.h2d`: DMA per run into a workspace, then the scatter kernel
    layerwise   `LayerwiseMover.issue`: 2 x layers 2D DMAs straight into L1, an event per layer

Device time is between CUDA events around each transfer (median of `--repeats`); `issue_ms`
is the host time of the issuing call; `layer0_ms` is when layer 0 had landed, from the
transfer's start (what a layer-wise prefill waits before its first layer can run). Each
figure is also a ratio to the ceiling measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np
import torch

from hicache.dataplane.dma import DeviceHostMover
from hicache.dataplane.geometry import preset
from hicache.dataplane.layerwise import LayerwiseMover
from hicache.dataplane.pools import DevicePool, HostPool
from hicache.kernels import KernelSet


def _timed(fn: Any, repeats: int) -> tuple[float, float]:
    """Median device ms (events around `fn()`) and median host ms of the `fn()` call."""
    device, host = [], []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        torch.cuda.synchronize()
        start.record()
        t0 = time.perf_counter()
        handle = fn()
        host.append((time.perf_counter() - t0) * 1e3)
        if handle is not None:
            handle.wait(10.0)
        end.record()
        torch.cuda.synchronize()
        device.append(start.elapsed_time(end))
    return statistics.median(device), statistics.median(host)


def measure(name: str, tokens: int, repeats: int) -> dict[str, Any]:
    g = preset(name)
    n = -(-tokens // g.page_size)
    dev = torch.device("cuda")
    l1, l2 = DevicePool(g, n + 8, dev), HostPool(g, n + 8, pin=True)
    kernels = KernelSet.create(l1.tensor, requested="auto")
    dma = DeviceHostMover(l1, l2, kernels)
    lw = LayerwiseMover(l1, l2, faults=None)
    src, dst = np.arange(n, dtype=np.int64), np.arange(4, 4 + n, dtype=np.int64)
    nbytes = n * g.bytes_per_page
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    target = torch.empty(nbytes, dtype=torch.uint8, device=dev)

    def one_copy() -> None:
        target.copy_(pinned, non_blocking=True)

    ceiling_ms, _ = _timed(one_copy, repeats)
    dma_ms, dma_issue = _timed(lambda: dma.h2d(src, dst), repeats)
    row: dict[str, Any] = {
        "preset": name,
        "tokens": tokens,
        "pages": n,
        "bytes": nbytes,
        "ceiling_ms": ceiling_ms,
        "ceiling_gbps": nbytes / ceiling_ms / 1e6,
        "dma_ms": dma_ms,
        "dma_issue_ms": dma_issue,
        "dma_of_ceiling": ceiling_ms / dma_ms,
        "layerwise": lw.reason,
    }
    if lw._copy2d is None:
        return row
    lw_ms, lw_issue = _timed(lambda: lw.issue(src, dst, None), repeats)
    firsts = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        handle = lw.issue(src, dst, None)
        assert handle is not None and handle._start is not None
        handle.wait(10.0)
        torch.cuda.synchronize()
        firsts.append(handle._start.elapsed_time(handle.gate._events[0]))  # type: ignore[union-attr]
    row.update(
        layerwise_ms=lw_ms,
        layerwise_issue_ms=lw_issue,
        layerwise_of_ceiling=ceiling_ms / lw_ms,
        layer0_ms=statistics.median(firsts),
    )
    # Verify the bytes: every page of L1 holds its L2 page after a layer-wise H2D.
    l2.tensor[:n].copy_(torch.randn(l2.tensor[:n].shape).to(l2.tensor.dtype))
    handle = lw.issue(src, dst, None)
    assert handle is not None and handle.wait(10.0).final
    got = l1.tensor[:, :, 4 : 4 + n].permute(2, 0, 1, 3, 4, 5).cpu()
    row["bytes_equal"] = bool(torch.equal(got, l2.tensor[:n]))
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--preset", default="qwen3-8b")
    p.add_argument("--tokens", nargs="+", type=int, default=[350, 1000, 3500])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("layerwise_h2d: no CUDA device; nothing measured")
        return 0
    rows = [measure(args.preset, t, args.repeats) for t in args.tokens]
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    print(
        "| tokens | ceiling ms (GB/s) | DMA+scatter ms (of ceiling) | layer-wise ms (of ceiling) "
        "| layer 0 landed ms | issue ms (DMA / layer-wise) | bytes equal |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['tokens']} | {r['ceiling_ms']:.3f} ({r['ceiling_gbps']:.1f}) | "
            f"{r['dma_ms']:.3f} ({r['dma_of_ceiling']:.1%}) | "
            f"{r.get('layerwise_ms', float('nan')):.3f} "
            f"({r.get('layerwise_of_ceiling', float('nan')):.1%}) | "
            f"{r.get('layer0_ms', float('nan')):.3f} | {r['dma_issue_ms']:.3f} / "
            f"{r.get('layerwise_issue_ms', float('nan')):.3f} | {r.get('bytes_equal')} |"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
