"""Gather/scatter bandwidth on a CUDA GPU, against the device-copy ceiling of the same run.

    hicache bench kernels --out kernels.json

Geometry: a preset (default Qwen3-8B: 36 layers, 8 KV heads, head_dim 128, bf16, 16-token
pages, so 32 KiB rows), an L1 pool of 4,096 pages (9.7 GB), distinct random pages for 350 /
1,000 / 2,000 / 3,500 tokens (22 / 63 / 125 / 219 pages). For each page count and direction:
torch, Triton with its default launch config, and Triton with each candidate config (to tune
`default_config`). Every variant is checked for the right bytes before it is timed.

Bandwidth counts bytes read + written (twice the bytes moved), as the ceiling -- a 1 GiB
`dst.copy_(src)` -- does. Times are medians of CUDA-event timings after warm-up:

    median_ms          events around each call, synchronized per call (as the ceiling is)
    median_ms_queued   calls queued back to back: device time, without launch latency

`bench_kernels(device="cpu")` runs the same path with wall-clock timing (Triton only under
TRITON_INTERPRET=1); it exists to test this module, its numbers mean nothing.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import torch
import triton

from hicache.app.outputs import OUTPUT_FILE
from hicache.bench import BenchParser, columns, counts, no_cuda
from hicache.dataplane.geometry import KVGeometry, preset
from hicache.errors import BackendError
from hicache.kernels import triton_rows
from hicache.kernels.reference import check_operands, gather_torch, scatter_torch
from hicache.kernels.select import cuda_median_ms
from hicache.kernels.triton_rows import LaunchConfig

TOKENS_DEFAULT = (350, 1000, 2000, 3500)
POOL_PAGES_DEFAULT = 4096
CEILING_BYTES_DEFAULT = 1 << 30
POISON_BYTE = 0xA5
# Candidate launch configs swept next to the default (block bytes / warps / chunks per row).
CANDIDATE_CONFIGS: tuple[LaunchConfig, ...] = (
    LaunchConfig(2048, 1),
    LaunchConfig(4096, 2),
    LaunchConfig(4096, 4),
    LaunchConfig(8192, 4),
    LaunchConfig(8192, 8),
    LaunchConfig(16384, 4),
    LaunchConfig(16384, 8),
    LaunchConfig(8192, 4, chunks=1),
)
TORCH_DTYPES = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
    "fp8": torch.float8_e4m3fn,
}

Copy = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]
Row = dict[str, object]


def _measure(
    fn: Callable[[], None], device: torch.device, iters: int, warmup: int
) -> dict[str, float]:
    """Median milliseconds of `fn` both ways (see the module docstring)."""
    if device.type == "cuda":
        return {
            "median_ms": cuda_median_ms(fn, reps=iters, warmup=warmup, sync_each=True),
            "median_ms_queued": cuda_median_ms(fn, reps=iters, warmup=warmup),
        }
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    median = statistics.median(times)
    return {"median_ms": median, "median_ms_queued": median}


def _rates(times: dict[str, float], bytes_rw: int, ceiling: dict[str, float]) -> dict[str, float]:
    """GB/s (bytes read + written) for both timings, and each one's share of the ceiling timed
    the same way: synced against synced (`of_ceiling`), queued against queued."""
    gbps = bytes_rw / (times["median_ms"] * 1e-3) / 1e9
    gbps_queued = bytes_rw / (times["median_ms_queued"] * 1e-3) / 1e9
    return {
        **times,
        "GBps_rw": gbps,
        "GBps_rw_queued": gbps_queued,
        "of_ceiling": gbps / ceiling["GBps_rw"],
        "of_ceiling_queued": gbps_queued / ceiling["GBps_rw_queued"],
    }


def measure_ceiling(device: torch.device, nbytes: int, iters: int, warmup: int) -> dict[str, float]:
    """Device-copy bandwidth of one `nbytes` copy, counting bytes read + written, both ways
    (`GBps_rw` synced per call, `GBps_rw_queued` back to back)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)

    def copy() -> None:
        dst.copy_(src)

    times = _measure(copy, device, iters, warmup)
    gbps = {
        "GBps_rw": 2 * nbytes / (times["median_ms"] * 1e-3) / 1e9,
        "GBps_rw_queued": 2 * nbytes / (times["median_ms_queued"] * 1e-3) / 1e9,
    }
    return {"bytes": float(nbytes), **_rates(times, 2 * nbytes, gbps)}


def _variants(configs: Sequence[LaunchConfig]) -> dict[str, tuple[Copy, Copy]]:
    """name -> (gather, scatter): torch, Triton default, Triton with each candidate config."""
    out: dict[str, tuple[Copy, Copy]] = {
        "torch": (gather_torch, scatter_torch),
        "triton": (triton_rows.gather_rows, triton_rows.scatter_rows),
    }
    for config in configs:
        out[f"triton {config.label}"] = _configured(config)
    return out


def _configured(config: LaunchConfig) -> tuple[Copy, Copy]:
    def gather(l1: torch.Tensor, pages: torch.Tensor, out: torch.Tensor) -> None:
        triton_rows.gather_rows(l1, pages, out, config)

    def scatter(packed: torch.Tensor, pages: torch.Tensor, l1: torch.Tensor) -> None:
        triton_rows.scatter_rows(packed, pages, l1, config)

    return gather, scatter


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def _run(
    direction: str,
    copy: Copy,
    pool: torch.Tensor,
    pages: torch.Tensor,
    payload: torch.Tensor,
    spare: torch.Tensor,
) -> tuple[bool, Callable[[], None]]:
    """Check one variant once; return (correct, the call to time).

    gather: poisoned `spare` must come back equal to `payload` (the pool's bytes).
    scatter: `payload` (fresh bytes) goes into the pool; a torch gather must read it back.
    """
    if direction == "gather":
        _bytes(spare).fill_(POISON_BYTE)
        copy(pool, pages, spare)
        return bool(torch.equal(_bytes(spare), _bytes(payload))), lambda: copy(pool, pages, spare)
    copy(payload, pages, pool)
    gather_torch(pool, pages, spare)
    return bool(torch.equal(_bytes(spare), _bytes(payload))), lambda: copy(payload, pages, pool)


def bench_case(
    pool: torch.Tensor,
    pages: torch.Tensor,
    *,
    iters: int,
    warmup: int,
    ceiling: dict[str, float],
    configs: Sequence[LaunchConfig],
) -> dict[str, dict[str, Row]]:
    """Check, then time, every variant of gather (all first) and scatter for one page list.

    The scatters overwrite the listed pool pages; their original bytes are put back at the end.
    """
    expected = torch.empty(
        (pages.numel(), *pool.shape[:2], *pool.shape[3:]), dtype=pool.dtype, device=pool.device
    )
    gather_torch(pool, pages, expected)
    incoming = torch.empty_like(expected)
    _bytes(incoming).random_(0, 256)
    spare = torch.empty_like(expected)
    bytes_rw = 2 * expected.numel() * expected.element_size()
    result: dict[str, dict[str, Row]] = {"gather": {}, "scatter": {}}
    variants = _variants(configs)
    for direction, payload in (("gather", expected), ("scatter", incoming)):
        for name, (gather, scatter) in variants.items():
            copy = gather if direction == "gather" else scatter
            try:
                correct, call = _run(direction, copy, pool, pages, payload, spare)
                times = _measure(call, pool.device, iters, warmup)
                result[direction][name] = {"correct": correct, **_rates(times, bytes_rw, ceiling)}
            except BackendError as exc:
                result[direction][name] = {"error": str(exc)}
    scatter_torch(expected, pages, pool)  # leave the pool's bytes as they were
    return result


def _default_plan(pool: torch.Tensor, pages: torch.Tensor) -> dict[str, object]:
    """The launch the default config makes for this call (what `gather(...)` runs)."""
    out = torch.empty(
        (pages.numel(), *pool.shape[:2], *pool.shape[3:]), dtype=pool.dtype, device=pool.device
    )
    layout = check_operands(pool, pages, out, scatter=False)
    config = triton_rows.default_config(layout.row_bytes)
    plan = triton_rows.plan_launch(layout, config, triton_rows.programs_target(pool.device))
    return {"config": config.label, "word_bytes": layout.word_bytes, **asdict(plan)}


def _random_pool(geometry: KVGeometry, pool_pages: int, device: torch.device) -> torch.Tensor:
    shape = (
        2,
        geometry.layers,
        pool_pages,
        geometry.page_size,
        geometry.kv_heads,
        geometry.head_dim,
    )
    pool = torch.empty(shape, dtype=TORCH_DTYPES[geometry.dtype], device=device)
    _bytes(pool).random_(0, 256)
    return pool


def bench_kernels(
    *,
    preset_name: str = "qwen3-8b",
    pool_pages: int = POOL_PAGES_DEFAULT,
    tokens: Sequence[int] = TOKENS_DEFAULT,
    iters: int = 50,
    warmup: int = 5,
    ceiling_bytes: int = CEILING_BYTES_DEFAULT,
    device: str = "cuda",
    configs: Sequence[LaunchConfig] = CANDIDATE_CONFIGS,
    seed: int = 0,
) -> dict[str, object]:
    """Measure the ceiling, then every variant for each token count; a JSON-ready dict.

    Each row has `GBps_rw` and `of_ceiling` (fraction of this run's device-copy GB/s, both
    synced per call), and `GBps_rw_queued` / `of_ceiling_queued` (both timed back to back).
    """
    dev = torch.device(device)
    geometry = preset(preset_name)
    ceiling = measure_ceiling(dev, ceiling_bytes, iters, warmup)
    pool = _random_pool(geometry, pool_pages, dev)
    generator = torch.Generator().manual_seed(seed)
    cases: list[dict[str, object]] = []
    for count in tokens:
        n = -(-count // geometry.page_size)
        if not 1 <= n <= pool_pages:
            raise ValueError(f"tokens: {count} tokens make {n} pages; the pool has {pool_pages}")
        pages = torch.randperm(pool_pages, generator=generator)[:n].to(dev)
        rows = bench_case(pool, pages, iters=iters, warmup=warmup, ceiling=ceiling, configs=configs)
        cases.append(
            {
                "tokens": count,
                "pages": n,
                "bytes_moved": n * geometry.bytes_per_page,
                "default_plan": _default_plan(pool, pages),
                **rows,
            }
        )
    return {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "geometry": asdict(geometry),
        "pool_pages": pool_pages,
        "iters": iters,
        "warmup": warmup,
        "ceiling": ceiling,
        "cases": cases,
    }


LEGEND = (
    "legend: GB/s = bytes read + written per second (GB = 1e9 bytes); synced: each call "
    "timed alone, launch latency included; queued: calls back to back (device time); "
    "% ceiling: of the device copy timed the same way; bytes ok: the variant moved the "
    "right bytes; variant triton B/w/c: block bytes / warps / chunks per row"
)
_HEAD = (
    "tokens",
    "pages",
    "direction",
    "variant",
    "GB/s synced",
    "% ceiling",
    "GB/s queued",
    "% ceiling",
    "bytes ok",
)


def format_table(result: dict[str, Any]) -> str:
    """One line per (tokens, direction, variant): GB/s (read + written) and share of ceiling."""
    ceiling = result["ceiling"]
    rows: list[list[str]] = []
    for case in result["cases"]:
        for direction in ("gather", "scatter"):
            for name, row in case[direction].items():
                head = [f"{case['tokens']:,}", f"{case['pages']:,}", direction, name]
                if "error" in row:
                    rows.append(head + [f"error: {row['error']}", "", "", "", ""])
                    continue
                rows.append(
                    head
                    + [
                        f"{row['GBps_rw']:,.0f}",
                        f"{row['of_ceiling']:.1%}",
                        f"{row['GBps_rw_queued']:,.0f}",
                        f"{row['of_ceiling_queued']:.1%}",
                        str(row["correct"]),
                    ]
                )
    return "\n".join(
        [
            f"{result['device']}: device copy {ceiling['GBps_rw']:,.0f} GB/s synced, "
            f"{ceiling['GBps_rw_queued']:,.0f} GB/s queued (read + written)",
            LEGEND,
            *columns(_HEAD, rows),
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry; 0 on success, 2 when there is no CUDA device (nothing is measured)."""
    parser = BenchParser("kernels", __doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=OUTPUT_FILE, help="write the JSON result to this path")
    parser.add_argument("--preset", default="qwen3-8b", help="KV geometry preset")
    parser.add_argument("--pool-pages", type=int, default=POOL_PAGES_DEFAULT)
    parser.add_argument(
        "--tokens",
        type=counts,
        default=",".join(map(str, TOKENS_DEFAULT)),
        help="comma-separated prefix lengths in tokens",
    )
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        return no_cuda("kernels")
    result = bench_kernels(
        preset_name=args.preset,
        pool_pages=args.pool_pages,
        tokens=list(args.tokens),
        iters=args.iters,
        warmup=args.warmup,
    )
    print(format_table(result))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
