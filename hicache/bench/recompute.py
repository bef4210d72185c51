"""Recompute latency: prefill with the model producer on a CUDA GPU (the cost a restore must beat).

    hicache bench recompute --out recompute.json
    hicache bench recompute --presets qwen3-8b --lengths 350 3500 --modes eager graphs

For each preset, mode and prefix length: a fresh L1 holding exactly the prefix's pages, then
`warmup` untimed `produce` calls (the first also compiles or captures: its wall time is kept as
`first_call_s`), then `repeats` timed calls. A sample is what `produce` returns: seconds from
the start of the prefix gather to the end of the L1 write, bracketed by `cuda.synchronize`.
Lengths are rounded up to whole pages (350 -> 352 tokens with 16-token pages); the JSON keeps
both. Only the last token's logits are computed, as in a serving engine's prefill.

A mode that fails on this machine (compilation, capture, memory) is recorded with its error
and the other modes still run. Eager alone is not an honest baseline below ~2,000 tokens:
there per-layer launch overhead (~60 ms for Qwen3-8B on the H200), not FLOPs, sets the time.
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch

from hicache.app.outputs import OUTPUT_FILE
from hicache.bench import BenchParser, no_cuda
from hicache.errors import ConfigError
from hicache.producers.model import MODES, ModelProducer, import_transformers

DEFAULT_PRESETS = ("qwen3-8b", "qwen3-4b")
DEFAULT_LENGTHS = (350, 1000, 2000, 3500)
DEFAULT_MODES = MODES
REPEATS = 10
WARMUP = 3


def _page_aligned(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size) * page_size


def bench_one(
    producer: ModelProducer,
    length: int,
    *,
    repeats: int,
    warmup: int,
    prefix: int = 0,
    seed: int = 0,
) -> dict[str, Any]:
    """Time `produce` of `length` new tokens after a `prefix`-token cached prefix (both rounded
    up to whole pages). Returns one result row (times in ms)."""
    g = producer.geometry
    start = _page_aligned(prefix, g.page_size)
    end = start + _page_aligned(length, g.page_size)
    gen = torch.Generator().manual_seed(seed + end)
    tokens = torch.randint(0, producer.shape.vocab, (end,), generator=gen).tolist()
    order = torch.randperm(end // g.page_size, generator=gen)
    prefix_pages, new_pages = order[: start // g.page_size], order[start // g.page_size :]
    shape = (2, g.layers, end // g.page_size, g.page_size, g.kv_heads, g.head_dim)
    l1 = torch.zeros(shape, dtype=producer.dtype, device=producer.device)
    if start:
        producer.produce(tokens, 0, start, l1, prefix_pages[:0], prefix_pages)
    first_s = time.perf_counter()
    producer.produce(tokens, start, end, l1, prefix_pages, new_pages)
    first_s = time.perf_counter() - first_s
    for _ in range(warmup - 1):
        producer.produce(tokens, start, end, l1, prefix_pages, new_pages)
    samples_ms = [
        1e3 * producer.produce(tokens, start, end, l1, prefix_pages, new_pages)
        for _ in range(repeats)
    ]
    median_ms = statistics.median(samples_ms)
    return {
        "mode": producer.mode,
        "tokens_requested": length,
        "tokens": end - start,
        "prefix_tokens": start,
        "median_ms": median_ms,
        "min_ms": min(samples_ms),
        "max_ms": max(samples_ms),
        "us_per_token": 1e3 * median_ms / (end - start),
        "first_call_s": first_s,
        "samples_ms": samples_ms,
    }


def bench_recompute(
    preset: str,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    modes: Sequence[str] = DEFAULT_MODES,
    *,
    repeats: int = REPEATS,
    warmup: int = WARMUP,
    prefix: int = 0,
    device: str = "cuda",
    seed: int = 0,
) -> dict[str, Any]:
    """Prefill latency of `preset` for each mode and length. A mode or length that fails with a
    RuntimeError (compile, capture, out of memory) becomes a row with `error`; ConfigError
    (unknown preset, no transformers, graphs without CUDA) propagates."""
    if repeats < 1 or warmup < 1:
        raise ConfigError("bench", f"repeats and warmup must be >= 1, got {repeats}, {warmup}")
    rows: list[dict[str, Any]] = []
    about: dict[str, Any] = {}
    for mode in modes:
        producer = ModelProducer(preset, device, mode=mode, seed=seed)
        about = {
            "parameters": producer.parameters,
            "dtype": producer.geometry.dtype,
            "page_size": producer.geometry.page_size,
        }
        for length in lengths:
            try:
                row = bench_one(
                    producer, length, repeats=repeats, warmup=warmup, prefix=prefix, seed=seed
                )
            except RuntimeError as e:  # torch compile/capture failures and OOM are RuntimeErrors
                error = f"{type(e).__name__}: {e}"
                row = {"mode": mode, "tokens_requested": length, "error": error}
            rows.append(row)
            print(_row_line(preset, row), file=sys.stderr, flush=True)
        del producer
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return {
        "preset": preset,
        **about,
        "device": _device_name(device),
        "repeats": repeats,
        "warmup": warmup,
        "results": rows,
    }


def _device_name(device: str) -> str:
    dev = torch.device(device)
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def _row_line(preset: str, row: dict[str, Any]) -> str:
    head = f"{preset:9} {row['mode']:8} {row['tokens_requested']:6} tokens"
    if "error" in row:
        return f"{head}: FAILED {row['error'].splitlines()[0][:160]}"
    return (
        f"{head}: median {row['median_ms']:8.2f} ms ({row['us_per_token']:.1f} us/token), "
        f"first call {row['first_call_s']:.1f} s"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry. Exit 0 after writing results; 2 with one line when there is no CUDA device
    (nothing is measured) or the configuration is unusable (e.g. transformers missing)."""
    ap = BenchParser("recompute", __doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--presets", nargs="+", default=list(DEFAULT_PRESETS))
    ap.add_argument("--lengths", nargs="+", type=int, default=list(DEFAULT_LENGTHS))
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(DEFAULT_MODES))
    ap.add_argument("--repeats", type=int, default=REPEATS)
    ap.add_argument("--warmup", type=int, default=WARMUP)
    ap.add_argument("--prefix", type=int, default=0, help="cached tokens before the new ones")
    ap.add_argument("--out", type=OUTPUT_FILE, help="write the JSON here (default: stdout)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        return no_cuda("recompute")
    try:
        tf = import_transformers()
        report = {
            "torch": torch.__version__,
            "transformers": tf.__version__,
            "runs": [
                bench_recompute(
                    p,
                    args.lengths,
                    args.modes,
                    repeats=args.repeats,
                    warmup=args.warmup,
                    prefix=args.prefix,
                )
                for p in args.presets
            ],
        }
    except ConfigError as e:
        print(f"hicache bench recompute: {e}", file=sys.stderr)
        return 2
    text = json.dumps(report, indent=1)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
