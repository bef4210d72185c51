"""Candidates for the L3 page checksum, timed as the mover calls them: one 2.25 MiB page
(Qwen3-8B, 2,359,296 bytes) per call, on a writable memoryview of an L2-like numpy array.

    python3 benchmarks/l3_checksums.py [--rounds 9] [--threads 1 2 4 8]

GB/s (1e9 bytes) over `threads` threads each checksumming 48 pages (16 distinct, 36 MiB: not
one CPU cache), best and median of `rounds`, candidates interleaved per round so a busy
machine slows each alike. A candidate whose package is missing, or that refuses a writable
memoryview (it would need a copy of every page), is reported and skipped. Threads scale only
for a function that releases the GIL. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import threading
import time
import zlib
from collections.abc import Callable

import numpy as np

PAGE = 2_359_296
Fn = Callable[[memoryview], int]


def candidates() -> dict[str, Fn | str]:
    """name -> function, or why it is not timed."""
    out: dict[str, Fn | str] = {"zlib.crc32": zlib.crc32}
    for name, module, attr in (
        ("xxhash.xxh3_64", "xxhash", "xxh3_64_intdigest"),
        ("xxhash.xxh64", "xxhash", "xxh64_intdigest"),
        ("google_crc32c.value", "google_crc32c", "value"),
        ("crc32c.crc32c", "crc32c", "crc32c"),
    ):
        try:
            out[name] = getattr(importlib.import_module(module), attr)
        except ImportError:
            out[name] = f"not installed (pip install {module.replace('_', '-')})"
    return out


def gbps(fn: Fn, pages: list[memoryview], threads: int) -> float:
    per = 48

    def work() -> None:
        for k in range(per):
            fn(pages[k % len(pages)])

    ts = [threading.Thread(target=work) for _ in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return threads * per * PAGE / (time.perf_counter() - t0) / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    l2 = np.random.default_rng(0).integers(0, 256, (16, PAGE), dtype=np.uint8)
    pages = [memoryview(l2[i]).cast("B") for i in range(16)]
    timed: dict[str, Fn] = {}
    for name, fn in candidates().items():
        if isinstance(fn, str):
            print(f"- {name}: {fn}")
            continue
        try:
            fn(pages[0])
        except TypeError as e:
            print(f"- {name}: refuses a writable memoryview ({e})")
            continue
        timed[name] = fn
    runs: dict[tuple[str, int], list[float]] = {(n, t): [] for n in timed for t in args.threads}
    for _ in range(args.rounds):
        for (name, threads), got in runs.items():
            got.append(gbps(timed[name], pages, threads))
    head = " | ".join(f"{t} thr best / median" for t in args.threads)
    print(f"\n| function | {head} |")
    print("| --- |" + " --- |" * len(args.threads))
    for name in timed:
        cells = " | ".join(
            f"{max(runs[name, t]):.2f} / {statistics.median(runs[name, t]):.2f}"
            for t in args.threads
        )
        print(f"| {name} | {cells} |")
    print(f"\npython {sys.version.split()[0]}, numpy {np.__version__}, GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
