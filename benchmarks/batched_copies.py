"""Fragmented D2H/H2D as one batched call: is `cuMemcpyBatchAsync` the way to the ceiling?

    PYTHONPATH=. python3 benchmarks/batched_copies.py [--pages 22,63] [--out FILE]

A probe for the small-transfer path (issue: 350-token fragmented transfers reach 57-73% of
the pinned copy, with 22 per-run DMAs costing ~0.45 ms of issue time). Per size, with
Qwen3-8B pages (2,359,296 bytes) between a device pool and a pinned host pool, pages in a
random order on both sides, it times (median of REPS after warm-up, device kept idle):

    ceiling      one pinned copy of all the bytes (the denominator)
    per-page     one `copy_(non_blocking=True)` per page (what the direct route issues)
    batched      one `cuMemcpyBatchAsync` over every page (cuda.bindings; skipped when the
                 driver or bindings lack it, with the reason)

and reports issue (host) ms, end-to-end ms, and each as a ratio to the ceiling. Every path's
bytes are checked against the source. A diagnostic: the numbers decide whether the DMA
mover gains a batched route.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

PAGE_BYTES = 2_359_296  # Qwen3-8B: 36 layers x K/V x 16 tokens x 8 heads x 128 x bf16
REPS = 30


def timed(fn: Callable[[], None], stream: torch.cuda.Stream) -> tuple[float, float]:
    """(issue ms, end-to-end ms) of one call of `fn` on an idle device."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    t1 = time.perf_counter()
    stream.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t0) * 1e3


def median_of(fn: Callable[[], None], stream: torch.cuda.Stream) -> tuple[float, float]:
    for _ in range(3):
        timed(fn, stream)
    runs = [timed(fn, stream) for _ in range(REPS)]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def batch_api() -> tuple[Callable[..., Any] | None, str]:
    """A `(dst_ptrs, src_ptrs, sizes, stream_handle) -> None` batched copy, or the reason."""
    try:
        from cuda.bindings import driver  # type: ignore[import-not-found]
    except ImportError as e:
        return None, f"cuda.bindings not importable: {e}"
    fn = getattr(driver, "cuMemcpyBatchAsync", None)
    if fn is None:
        return None, "cuda.bindings.driver has no cuMemcpyBatchAsync"
    import cuda.bindings  # type: ignore[import-not-found]

    version = getattr(cuda.bindings, "__version__", "?")
    attr = driver.CUmemcpyAttributes()
    attr.srcAccessOrder = driver.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
    attr.flags = 0  # not CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE

    def call(dsts: list[int], srcs: list[int], sizes: list[int], stream: int) -> None:
        n = len(dsts)
        try:
            out = fn(dsts, srcs, sizes, n, [attr], [0], 1, driver.CUstream(stream))
        except TypeError:  # bindings that take only CUdeviceptr objects
            d = [driver.CUdeviceptr(p) for p in dsts]
            s = [driver.CUdeviceptr(p) for p in srcs]
            out = fn(d, s, sizes, n, [attr], [0], 1, driver.CUstream(stream))
        err = out[0] if isinstance(out, tuple) else out
        if int(err) != 0:
            raise RuntimeError(f"cuMemcpyBatchAsync: {err!r}")

    return call, f"cuda.bindings {version}"


Row = dict[str, object]


def row(pages: int, direction: str, path: str, issue: float, e2e: float, ceiling: float) -> Row:
    return {
        "pages": pages,
        "direction": direction,
        "path": path,
        "issue_ms": round(issue, 4),
        "ms": round(e2e, 4),
        "GB/s": round(pages * PAGE_BYTES / e2e / 1e6, 2),
        "of_ceiling": round(ceiling / e2e, 4),
    }


def one_direction(
    direction: str,
    pools: tuple[torch.Tensor, torch.Tensor],
    flats: tuple[torch.Tensor, torch.Tensor],
    ids: tuple[np.ndarray, np.ndarray],
    batch: Callable[..., Any] | None,
    stream: torch.cuda.Stream,
) -> list[Row]:
    """The ceiling, per-page copies and one batched call of `ids` pages, source -> target."""
    (src, dst), (fsrc, fdst), (src_ids, dst_ids) = pools, flats, ids
    n = len(src_ids)

    def ceiling_copy() -> None:
        with torch.cuda.stream(stream):
            fdst.copy_(fsrc, non_blocking=True)

    def per_page() -> None:
        with torch.cuda.stream(stream):
            for s, d in zip(src_ids.tolist(), dst_ids.tolist()):
                dst[d].copy_(src[s], non_blocking=True)

    def bytes_ok() -> bool:
        got = dst[torch.from_numpy(dst_ids).to(dst.device)].cpu()
        return torch.equal(got, src[torch.from_numpy(src_ids).to(src.device)].cpu())

    _, ceiling = median_of(ceiling_copy, stream)
    rows = [row(n, direction, "ceiling: one pinned copy", 0.0, ceiling, ceiling)]
    dst.zero_()
    issue, e2e = median_of(per_page, stream)
    rows.append(row(n, direction, f"per-page copy_ (bytes ok {bytes_ok()})", issue, e2e, ceiling))
    if batch is not None:
        sp = [src[s].data_ptr() for s in src_ids.tolist()]
        dp = [dst[d].data_ptr() for d in dst_ids.tolist()]
        sizes = [PAGE_BYTES] * n
        dst.zero_()
        issue, e2e = median_of(lambda: batch(dp, sp, sizes, stream.cuda_stream), stream)
        path = f"cuMemcpyBatchAsync (bytes ok {bytes_ok()})"
        rows.append(row(n, direction, path, issue, e2e, ceiling))
    return rows


def probe(pages: int, rng: np.random.Generator, batch: Callable[..., Any] | None) -> list[Row]:
    dev = torch.cuda.current_device()
    cap = 4 * pages
    l1 = torch.randint(0, 256, (cap, PAGE_BYTES), dtype=torch.uint8, device=dev)
    l2 = torch.zeros((cap, PAGE_BYTES), dtype=torch.uint8, pin_memory=True)
    flat_dev = torch.empty(pages * PAGE_BYTES, dtype=torch.uint8, device=dev)
    flat_host = torch.empty(pages * PAGE_BYTES, dtype=torch.uint8, pin_memory=True)
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    l1_ids, l2_ids = rng.permutation(cap)[:pages], rng.permutation(cap)[:pages]
    d2h = one_direction("D2H", (l1, l2), (flat_dev, flat_host), (l1_ids, l2_ids), batch, stream)
    h2d = one_direction("H2D", (l2, l1), (flat_host, flat_dev), (l2_ids, l1_ids), batch, stream)
    return d2h + h2d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", default="22,63,219")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    batch, why = batch_api()
    print(torch.cuda.get_device_name(), torch.__version__, "batched:", why)
    rows: list[Row] = []
    rng = np.random.default_rng(7)
    for n in (int(x) for x in args.pages.split(",")):
        try:
            rows += probe(n, rng, batch)
        except Exception as e:  # report, go on: a probe
            print(f"{n} pages: {type(e).__name__}: {e}")
            batch = None
            rows += probe(n, rng, None)
    print("| pages | dir | path | issue ms | ms | GB/s | of ceiling |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['pages']} | {r['direction']} | {r['path']} | {r['issue_ms']} | {r['ms']} "
            f"| {r['GB/s']} | {r['of_ceiling']:.1%} |"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "batched": why, "rows": rows}, f)


if __name__ == "__main__":
    main()
