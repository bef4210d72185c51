"""Fragmented D2H/H2D by the SMs: can a kernel that reads/writes pinned L2 in place beat DMAs?

    PYTHONPATH=. python3 benchmarks/zero_copy.py [--pages 22,63,219] [--out FILE]

A probe for issue 35's small-transfer cells. Today a fragmented 350-token D2H gathers L1's rows
into a packed device buffer and then DMAs each L2 page (one batched driver call); the host
issue before the first DMA and the gather are exposed (75-84% of the pinned copy). Pinned
host memory is mapped into the device's address space (UVA), so one kernel can move the rows
between L1 and their L2 pages directly: no packed buffer, no DMA, one launch. Per size, with
Qwen3-8B pages (72 rows of 32 KiB) in random order on both sides, it times (median of REPS
after warm-up, device idle):

    ceiling       one pinned copy of all the bytes (cudaMemcpyAsync: the denominator)
    sm/<P>        one kernel of P programs (0: one program per row) moving every row
    dma2d         one cudaMemcpy2DAsync per page (its 72 rows, strided in L1): DMAs that
                  read or write L1 in place, no kernel (needs cuda.bindings)

issue (host) ms, end to end ms, device ms (CUDA events), and the end-to-end ratio to the
ceiling's. Every path's bytes are checked against the source. Writes the table (and JSON
with --out).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl

LAYERS = 36
ROWS_PER_PAGE = 2 * LAYERS  # K and V of every layer
ROW_BYTES = 16 * 8 * 128 * 2  # Qwen3-8B: 16 tokens x 8 kv heads x 128 x bf16 = 32 KiB
WORD = 8  # moved as int64 words
REPS = 30


@triton.jit
def _direct(  # type: ignore[no-untyped-def]
    l1,
    l2,
    l1_pages,
    l2_pages,
    n_rows,
    rows_per_page,
    l1_capacity,
    ROW_WORDS: tl.constexpr,
    BLOCK: tl.constexpr,
    TO_HOST: tl.constexpr,
):
    """Rows (i, kl): L1 row (kl, l1_pages[i]) <-> L2 row (l2_pages[i], kl); programs stride."""
    first = tl.program_id(0).to(tl.int64)
    for r in range(first, n_rows, tl.num_programs(0)):
        i = r // rows_per_page
        kl = r - i * rows_per_page
        p1 = tl.load(l1_pages + i).to(tl.int64)
        p2 = tl.load(l2_pages + i).to(tl.int64)
        a = l1 + (kl * l1_capacity + p1) * ROW_WORDS
        b = l2 + (p2 * rows_per_page + kl) * ROW_WORDS
        for step in range(0, ROW_WORDS, BLOCK):
            offs = step + tl.arange(0, BLOCK)
            if TO_HOST:
                tl.store(b + offs, tl.load(a + offs))
            else:
                tl.store(a + offs, tl.load(b + offs))


def _issue(
    idx_host: torch.Tensor,
    idx_dev: torch.Tensor,
    p1: np.ndarray,
    p2: np.ndarray,
    grid: tuple[int],
    ops: tuple[Any, ...],
    warps: int,
) -> None:
    """Fill and upload the two index lists, launch the kernel (what a mover's issue does)."""
    n = p1.size
    a = idx_host.numpy()
    a[:n] = p1
    a[n:] = p2
    idx_dev.copy_(idx_host, non_blocking=True)
    l1, l2, rows, cap1, block, to_host = ops
    row_words = ROW_BYTES // WORD
    _direct[grid](
        l1,
        l2,
        idx_dev[:n],
        idx_dev[n:],
        rows,
        ROWS_PER_PAGE,
        cap1,
        row_words,
        block,
        to_host,
        num_warps=warps,
    )


def _copy2d_fn() -> Callable[..., None] | None:
    """cuda.bindings' cudaMemcpy2DAsync (any direction, UVA), or None without the bindings."""
    try:
        from cuda.bindings import runtime  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    kind = runtime.cudaMemcpyKind.cudaMemcpyDefault

    def copy2d(dst: int, dpitch: int, src: int, spitch: int, width: int, height: int) -> None:
        stream = runtime.cudaStream_t(torch.cuda.current_stream().cuda_stream)
        out: Any = runtime.cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, stream)
        err = out[0] if isinstance(out, tuple) else out
        assert int(err) == 0, err

    return copy2d


def _issue_2d(
    copy2d: Callable[..., None],
    l1: torch.Tensor,
    l2: torch.Tensor,
    p1: np.ndarray,
    p2: np.ndarray,
    cap1: int,
    to_host: bool,
) -> None:
    """One 2D DMA per page: its 72 rows, strided in L1 (one row per (K/V, layer), l1 pages
    apart), contiguous in its L2 page -- no kernel, no packed buffer, no index upload."""
    a, b, page = l1.data_ptr(), l2.data_ptr(), ROWS_PER_PAGE * ROW_BYTES
    for x, y in zip(p1.tolist(), p2.tolist()):
        column, slot = a + x * ROW_BYTES, b + y * page
        if to_host:
            copy2d(slot, ROW_BYTES, column, cap1 * ROW_BYTES, ROW_BYTES, ROWS_PER_PAGE)
        else:
            copy2d(column, cap1 * ROW_BYTES, slot, ROW_BYTES, ROW_BYTES, ROWS_PER_PAGE)


def median3(fn: Callable[[], tuple[float, float, float]]) -> tuple[float, float, float]:
    for _ in range(3):
        fn()
    runs = [fn() for _ in range(REPS)]
    return tuple(statistics.median(r[k] for r in runs) for k in range(3))  # type: ignore[return-value]


def probe(
    n: int, rng: np.random.Generator, block: int, warps: int, sweep: list[int]
) -> list[dict[str, Any]]:
    dev = torch.device("cuda")
    cap1, cap2 = 2 * n + 8, 2 * n + 8
    row_words = ROW_BYTES // WORD
    l1 = torch.randint(
        -(2**62), 2**62, (ROWS_PER_PAGE, cap1, row_words), dtype=torch.int64, device=dev
    )
    l2 = torch.empty((cap2, ROWS_PER_PAGE, row_words), dtype=torch.int64).pin_memory()
    l2.copy_(torch.randint(-(2**62), 2**62, l2.shape, dtype=torch.int64))
    p1 = rng.permutation(cap1)[:n].astype(np.int64)
    p2 = rng.permutation(cap2)[:n].astype(np.int64)
    idx_host = torch.empty(2 * n, dtype=torch.int64).pin_memory()
    idx_dev = torch.empty(2 * n, dtype=torch.int64, device=dev)
    nbytes = n * ROWS_PER_PAGE * ROW_BYTES
    big_dev = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    big_host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    stream = torch.cuda.Stream(dev)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rows = n * ROWS_PER_PAGE
    out: list[dict[str, Any]] = []

    def timed(issue: Callable[[], None]) -> Callable[[], tuple[float, float, float]]:
        def run() -> tuple[float, float, float]:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.cuda.stream(stream):
                start.record()
                issue()
                end.record()
            t1 = time.perf_counter()
            end.synchronize()
            t2 = time.perf_counter()
            return (t1 - t0) * 1e3, (t2 - t0) * 1e3, start.elapsed_time(end)

        return run

    for direction in ("D2H", "H2D"):
        to_host = direction == "D2H"
        src, dst = (big_dev, big_host) if to_host else (big_host, big_dev)
        ceiling = median3(timed(functools.partial(dst.copy_, src, non_blocking=True)))
        out.append(
            dict(
                pages=n,
                dir=direction,
                path="ceiling",
                issue=ceiling[0],
                e2e=ceiling[1],
                device=ceiling[2],
                of_ceiling=1.0,
                ok=True,
            )
        )
        copy2d = _copy2d_fn()
        paths: list[int | str] = [*sweep, "dma2d"] if copy2d is not None else list(sweep)
        for programs in paths:
            grid = (rows if programs in (0, "dma2d") else min(int(programs), rows),)
            if to_host:  # the target rows cleared first: a path that moves nothing fails
                l2[torch.from_numpy(p2)] = 0
            else:
                l1[:, torch.from_numpy(p1).to(dev)] = 0
            issue = functools.partial(
                _issue, idx_host, idx_dev, p1, p2, grid, (l1, l2, rows, cap1, block, to_host), warps
            )
            if programs == "dma2d":
                assert copy2d is not None
                issue = functools.partial(_issue_2d, copy2d, l1, l2, p1, p2, cap1, to_host)
            r = median3(timed(issue))
            torch.cuda.synchronize()
            got = l2[torch.from_numpy(p2)]  # [n, 72, words]
            want = l1[:, torch.from_numpy(p1).to(dev)].permute(1, 0, 2).cpu()
            ok = bool(torch.equal(got, want))
            out.append(
                dict(
                    pages=n,
                    dir=direction,
                    path="dma2d per page"
                    if programs == "dma2d"
                    else f"sm/{programs} b{block} w{warps}",
                    issue=r[0],
                    e2e=r[1],
                    device=r[2],
                    of_ceiling=ceiling[1] / r[1],
                    ok=ok,
                )
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", default="22,63,219")
    ap.add_argument("--programs", default="0,132,264,528,1056", help="0: one per row")
    ap.add_argument("--configs", default="1024x4,2048x8,4096x8", help="BLOCK words x warps")
    ap.add_argument("--out")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    for n in (int(x) for x in args.pages.split(",")):
        for config in args.configs.split(","):
            block, warps = (int(x) for x in config.split("x"))
            rows += probe(n, rng, block, warps, [int(p) for p in args.programs.split(",")])
    print("| pages | dir | path | issue ms | e2e ms | device ms | of ceiling (e2e) | bytes ok |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        cells = (r["pages"], r["dir"], r["path"], f"{r['issue']:.3f}", f"{r['e2e']:.3f}")
        more = (f"{r['device']:.3f}", f"{r['of_ceiling']:.1%}", r["ok"])
        print("| " + " | ".join(map(str, (*cells, *more))) + " |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
