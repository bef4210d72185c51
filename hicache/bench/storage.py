"""L3 bandwidth: H2S / S2H through the mover against the raw file ceiling of the same run.

    hicache bench storage --out storage.json [--dir /path/on/the/l3/disk]
        [--io-threads 8] [--piece-bytes 4194304]

Qwen3-8B pages (2,359,296 bytes), prefixes of 350 / 1,000 / 2,000 / 3,500 tokens (22 / 63 /
125 / 219 pages of 16 tokens). For each: a consecutive set (L2 pages 0..n-1 <-> n consecutive
slots: 1 extent) and a fragmented one (n random L2 pages <-> n random slots: about n extents),
each written (H2S) and read back (S2H, every page checksum-verified) through `StorageMover`,
whose I/O calls move at most `piece_bytes` (whole pages) each.

The ceiling is measured in the same run on the same bytes: one `os.pwrite` of the n pages'
bytes straight from the L2 tensor, and one `os.preadv` back into it, on one thread -- what
the file pwrite/preadv ceiling. Reads are from a warm page cache (the bytes were just
written), for the mover and the ceiling alike; nothing is fsync'ed. GB = 1e9 bytes; times
are medians over `repeats`, each from issue to the completion observed DONE. The mover may
beat the ceiling on reads (they run on `io_threads` threads; the ceiling is one call), not on
writes (writes to one file serialise in the kernel). `*_cpu_ms` is the process's CPU time
(all threads) per transfer: set beside `raw_*_cpu_ms` + `crc32_cpu_ms` (the work that cannot
be avoided) it shows overhead -- Python, lock spinning -- that wall time on a busy machine
hides.

Every read lands in the pages its bytes came from, so the L2 contents never change and each
S2H's checksum check is also a correctness check of the run. On CUDA machines the L2 tensor
is pinned (as in the engine); on CPU it is not, which does not change file I/O.
"""

from __future__ import annotations

import json
import math
import os
import platform
import resource
import statistics
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from hicache.bench import BenchParser, columns
from hicache.dataplane.extents import coalesce, split
from hicache.dataplane.handles import TransferStatus
from hicache.dataplane.storage import L3File
from hicache.dataplane.storage_io import PIECE_BYTES, StorageHandle, StorageMover
from hicache.errors import TransferError
from hicache.outputs import OUTPUT_FILE, WORK_DIR
from hicache.pages import Pages

QWEN3_8B_BYTES_PER_PAGE = 2_359_296  # 2 * 36 layers * 16 tokens * 8 heads * 128 * 2 bytes
PAGE_TOKENS = 16
TOKENS_DEFAULT = (350, 1000, 2000, 3500)

Row = dict[str, object]


def _cpu_s() -> float:
    """CPU seconds of this process so far, all threads, user + system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _median_s(fn: Callable[[], None], repeats: int) -> tuple[float, float]:
    """(wall, CPU) seconds of one call, medians over `repeats` after one warm-up call."""
    fn()  # warm-up: first touch of page-cache pages and pool threads is not the steady state
    walls, cpus = [], []
    for _ in range(repeats):
        c0, t0 = _cpu_s(), time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(_cpu_s() - c0)
    return statistics.median(walls), statistics.median(cpus)


def _timed(row: Row, key: str, fn: Callable[[], None], repeats: int) -> None:
    """row[key + '_ms'] (wall) and row[key + '_cpu_ms'], medians."""
    wall_s, cpu_s = _median_s(fn, repeats)
    row[f"{key}_ms"], row[f"{key}_cpu_ms"] = 1e3 * wall_s, 1e3 * cpu_s


def _finish(handle: StorageHandle) -> None:
    if handle.wait() is not TransferStatus.DONE:
        raise TransferError(f"benchmark transfer {handle.direction} failed: {handle.error}")


def _raw(call: Callable[[int, memoryview, int], int], fd: int, view: memoryview, at: int) -> None:
    """One call for the whole buffer; resumed only if the OS returns short (> 2 GiB)."""
    done = 0
    while done < len(view):
        moved = call(fd, view[done:], at + done)
        if moved <= 0:
            raise TransferError(f"raw ceiling I/O moved {moved} bytes at {at + done}")
        done += moved


def _preadv(fd: int, view: memoryview, at: int) -> int:
    return os.preadv(fd, [view], at)


def _checksum_pages(view: memoryview, bytes_per_page: int) -> None:
    """crc32 of every page of `view` on this thread: the checksum work of one transfer."""
    for at in range(0, len(view), bytes_per_page):
        zlib.crc32(view[at : at + bytes_per_page])


def _checksum_gbps(view: memoryview, repeats: int) -> float:
    """crc32 of one page on one thread: the checksum's share of the mover's CPU work."""

    def crc() -> None:
        zlib.crc32(view)

    return len(view) / _median_s(crc, repeats)[0] / 1e9


def _bench_one(
    mover: StorageMover,
    l2_view: memoryview,
    n: int,
    sets: dict[str, tuple[Pages, Pages]],
    raw_slot: int,
    repeats: int,
) -> Row:
    """One prefix size: ceilings and the mover on both page sets, interleaved per repeat."""
    l3, bpp = mover.l3, mover.l3.bytes_per_page
    nbytes = n * bpp
    buf, at = l2_view[:nbytes], l3.offset(raw_slot)
    row: Row = {"pages": n, "tokens": n * PAGE_TOKENS, "bytes": nbytes}
    _timed(row, "raw_write", lambda: _raw(os.pwrite, l3.fd, buf, at), repeats)
    _timed(row, "raw_read", lambda: _raw(_preadv, l3.fd, buf, at), repeats)
    _timed(row, "crc32", lambda: _checksum_pages(buf, bpp), repeats)
    for name, (pages_, slots) in sets.items():
        extents = coalesce(pages_, slots)
        row[f"extents_{name}"] = len(extents)
        row[f"pieces_{name}"] = len(split(extents, mover.piece_pages))

        # Defaults bind this set: _timed calls them at once, but a closure would read the loop.
        def h2s(pages_: Pages = pages_, slots: Pages = slots) -> None:
            _finish(mover.h2s(pages_, slots))

        def s2h(pages_: Pages = pages_, slots: Pages = slots) -> None:
            _finish(mover.s2h(slots, pages_))

        _timed(row, f"h2s_{name}", h2s, repeats)
        _timed(row, f"s2h_{name}", s2h, repeats)
    for key in [k for k in row if k.endswith("_ms") and not k.endswith("_cpu_ms")]:
        ms = row[key]
        assert isinstance(ms, float)
        row[key.replace("_ms", "_GBps")] = nbytes / (ms / 1e3) / 1e9
    for name in sets:
        for direction, raw in (("h2s", "raw_write"), ("s2h", "raw_read")):
            mover_gbps, raw_gbps = row[f"{direction}_{name}_GBps"], row[f"{raw}_GBps"]
            assert isinstance(mover_gbps, float) and isinstance(raw_gbps, float)
            row[f"{direction}_{name}_vs_raw"] = mover_gbps / raw_gbps
    return row


def bench_storage(
    tokens: Sequence[int] = TOKENS_DEFAULT,
    *,
    bytes_per_page: int = QWEN3_8B_BYTES_PER_PAGE,
    io_threads: int = 8,
    piece_bytes: int = PIECE_BYTES,
    repeats: int = 5,
    directory: str | None = None,
    seed: int = 0,
) -> dict[str, object]:
    """Run the benchmark; returns {"config": ..., "rows": [one per prefix size]}.

    File layout (slots): [0, N) consecutive sets, [N, 3N) fragmented sets, [3N, 4N) the raw
    ceiling, N = the largest page count. L2 holds 2N pages.
    """
    counts = [math.ceil(t / PAGE_TOKENS) for t in tokens]
    big = max(counts)
    l2 = torch.randint(
        0,
        256,
        (2 * big, bytes_per_page),
        dtype=torch.uint8,
        generator=torch.Generator().manual_seed(seed),
    )
    pinned = torch.cuda.is_available()
    if pinned:
        l2 = l2.pin_memory()
    rng = np.random.default_rng(seed)
    path = None
    if directory is not None:
        path = os.path.join(directory, f"hicache-bench-{os.getpid()}.slots")
    rows: list[Row] = []
    l3 = L3File(path, 4 * big, bytes_per_page)
    with l3, StorageMover(l3, l2, io_threads=io_threads, piece_bytes=piece_bytes) as mover:
        l2_view = l2.numpy().data.cast("B")
        for n in counts:
            sets = {
                "consecutive": (np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64)),
                "fragmented": (
                    rng.choice(2 * big, n, replace=False).astype(np.int64),
                    big + rng.choice(2 * big, n, replace=False).astype(np.int64),
                ),
            }
            rows.append(_bench_one(mover, l2_view, n, sets, 3 * big, repeats))
        crc_gbps = _checksum_gbps(l2_view[:bytes_per_page], max(repeats, 5))
        counters = mover.counters
        l3_path = l3.path
    if path is not None:
        os.unlink(path)
    config: dict[str, object] = {
        "bytes_per_page": bytes_per_page,
        "io_threads": io_threads,
        "piece_bytes": piece_bytes,
        "piece_pages": max(1, piece_bytes // bytes_per_page),
        "repeats": repeats,
        "l2_pinned": pinned,
        "l3_path": l3_path,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "crc32_one_thread_GBps": crc_gbps,
        "corrupt_reads": counters.corrupt_reads,
        "short_io_resumed": counters.short_io_resumed,
    }
    return {"config": config, "rows": rows}


LEGEND = (
    "legend: c = consecutive (n L2 pages <-> n consecutive slots: 1 extent), f = "
    "fragmented (random pages <-> random slots); extents = runs of consecutive slots; "
    "raw = one pwrite (write) or preadv (read) of the same bytes, the ceiling; x raw = "
    "the mover's GB/s over raw's; GB = 1e9 bytes; CPU ms = this process's CPU time per "
    "transfer, all threads; crc32 = checksumming the pages on one thread"
)
_GBPS_HEAD = (
    "pages",
    "extents c/f",
    "raw write GB/s",
    "H2S c GB/s (x raw)",
    "H2S f GB/s (x raw)",
    "raw read GB/s",
    "S2H c GB/s (x raw)",
    "S2H f GB/s (x raw)",
)
_CPU_HEAD = (
    "pages",
    "raw write CPU ms",
    "H2S c CPU ms",
    "H2S f CPU ms",
    "raw read CPU ms",
    "S2H c CPU ms",
    "S2H f CPU ms",
    "crc32 CPU ms",
)


def _gbps_cells(r: dict[str, Any]) -> list[str]:
    def rated(key: str) -> str:
        return f"{r[key + '_GBps']:.2f} ({r[key + '_vs_raw']:.2f}x)"

    return [
        f"{r['pages']:,}",
        f"{r['extents_consecutive']}/{r['extents_fragmented']}",
        f"{r['raw_write_GBps']:.2f}",
        rated("h2s_consecutive"),
        rated("h2s_fragmented"),
        f"{r['raw_read_GBps']:.2f}",
        rated("s2h_consecutive"),
        rated("s2h_fragmented"),
    ]


def _cpu_cells(r: dict[str, Any]) -> list[str]:
    keys = (
        "raw_write",
        "h2s_consecutive",
        "h2s_fragmented",
        "raw_read",
        "s2h_consecutive",
        "s2h_fragmented",
        "crc32",
    )
    return [f"{r['pages']:,}", *(f"{r[k + '_cpu_ms']:.1f}" for k in keys)]


def _table(result: dict[str, Any]) -> str:
    c, rows = result["config"], result["rows"]
    about = (
        f"L3 file {c['l3_path']}; {c['bytes_per_page']:,} bytes/page; {c['io_threads']} I/O "
        f"threads; I/O calls of at most {c['piece_bytes']:,} bytes ({c['piece_pages']} "
        f"pages); median of {c['repeats']}; L2 pinned: {'yes' if c['l2_pinned'] else 'no'}; "
        f"crc32 on one thread {c['crc32_one_thread_GBps']:.2f} GB/s; corrupt reads "
        f"{c['corrupt_reads']}, short I/O resumed {c['short_io_resumed']}"
    )
    return "\n".join(
        [
            about,
            LEGEND,
            *columns(_GBPS_HEAD, [_gbps_cells(r) for r in rows]),
            "",
            *columns(_CPU_HEAD, [_cpu_cells(r) for r in rows]),
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = BenchParser("storage", (__doc__ or "").split("\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS_DEFAULT))
    parser.add_argument("--bytes-per-page", type=int, default=QWEN3_8B_BYTES_PER_PAGE)
    parser.add_argument("--io-threads", type=int, default=8)
    parser.add_argument(
        "--piece-bytes",
        type=int,
        default=PIECE_BYTES,
        help="most bytes one mover I/O call moves (whole pages, at least one)",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--dir", type=WORK_DIR, help="directory for the L3 file (default: the temp dir)"
    )
    parser.add_argument("--out", type=OUTPUT_FILE, help="write the JSON result to this path")
    args = parser.parse_args(argv)
    for option, value, least in (
        ("--tokens", min(args.tokens), 1),
        ("--bytes-per-page", args.bytes_per_page, 1),
        ("--repeats", args.repeats, 1),
        ("--io-threads", args.io_threads, 0),
        ("--piece-bytes", args.piece_bytes, args.bytes_per_page),
    ):
        if value < least:  # else a ConfigError or a traceback naming no option, mid-run
            parser.error(f"argument {option}: at least {least}, got {value}")
    result = bench_storage(
        args.tokens,
        bytes_per_page=args.bytes_per_page,
        io_threads=args.io_threads,
        piece_bytes=args.piece_bytes,
        repeats=args.repeats,
        directory=args.dir,
    )
    print(_table(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
