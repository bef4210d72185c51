"""L3 bandwidth: H2S / S2H through the mover against the raw file ceiling of the same run.

    hicache bench storage --out storage.json [--dir /path/on/the/l3/disk]
        [--io-threads 8] [--piece-bytes 4194304] [--checksum xxh3-64-low32|crc32]
        [--ceiling-threads 1 2 4 8] [--direct]

Qwen3-8B pages (2,359,296 bytes), prefixes of 350 / 1,000 / 2,000 / 3,500 tokens (22 / 63 /
125 / 219 pages of 16 tokens). For each: a consecutive set (L2 pages 0..n-1 <-> n consecutive
slots: 1 extent) and a fragmented one (n random L2 pages <-> n random slots: about n extents),
each written (H2S) and read back (S2H, every page checksum-verified) through `StorageMover`,
whose I/O calls move at most `piece_bytes` (whole pages) each.

Two ceilings are measured in the same run on the same bytes (slots of the same file, a
region of their own), straight from and into the L2 tensor:

- raw: one `os.pwrite` of the n pages' bytes, and one `os.preadv` back, on one thread;
- the multi-thread ceiling: the same bytes cut into `PIECE_BYTES` (4 MiB) pieces, moved by
  1, 2, 4 and 8 threads (`--ceiling-threads`), each taking the next piece until none is left
  -- the mover's schedule without checksums or page bookkeeping. Its best thread count is
  *the ceiling*: H2S and S2H are reported as ratios to it (`*_vs_ceiling`), and to raw.

Reads are from a warm page cache (the bytes were just written), for the mover and the
ceilings alike; nothing is fsync'ed. GB = 1e9 bytes; times are medians over `repeats`, each
from issue to the completion observed DONE. Writes to one file serialise in the kernel (its
inode lock), so the write ceiling gains little from threads; reads scale. `*_cpu_ms` is the
process's CPU time (all threads) per transfer: set beside `raw_*_cpu_ms` + `checksum_cpu_ms`
(the work that cannot be avoided) it shows overhead -- Python, lock spinning -- that wall
time on a busy machine hides. The L3 file checksums with `--checksum` (default: the fastest
this process has, `checksums.py`); `checksum` is that algorithm over the pages on one thread.

`--direct`: the L3 file is opened O_DIRECT (`L3File(direct=True)`), and the mover and both
ceilings move bytes through that descriptor, between the disk and a 4 KiB-aligned L2 -- no
page cache, so the figures are the disk's (put `--dir` on the disk to measure; a file system
that refuses O_DIRECT is an error naming the path). bytes_per_page must be a multiple of 4096.

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
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from hicache.app.outputs import OUTPUT_FILE, WORK_DIR
from hicache.bench import BenchParser, columns
from hicache.core.pages import Pages
from hicache.dataplane.checksums import ALGORITHMS, PageChecksum, available, default_algorithm
from hicache.dataplane.extents import coalesce, split
from hicache.dataplane.handles import TransferStatus
from hicache.dataplane.storage import L3File
from hicache.dataplane.storage_io import PIECE_BYTES, StorageHandle, StorageMover, aligned_pages
from hicache.errors import TransferError

QWEN3_8B_BYTES_PER_PAGE = 2_359_296  # 2 * 36 layers * 16 tokens * 8 heads * 128 * 2 bytes
PAGE_TOKENS = 16
TOKENS_DEFAULT = (350, 1000, 2000, 3500)
CEILING_THREADS = (1, 2, 4, 8)

Row = dict[str, object]


def _cpu_s() -> float:
    """CPU seconds of this process so far, all threads, user + system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _median_s(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
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


def _threaded(
    pool: ThreadPoolExecutor,
    threads: int,
    call: Callable[[int, memoryview, int], int],
    fd: int,
    view: memoryview,
    at: int,
) -> None:
    """The multi-thread ceiling: `view` in PIECE_BYTES pieces, `threads` workers each taking
    the next piece (one call, resumed if short) until none is left."""
    pieces = iter(range(0, len(view), PIECE_BYTES))
    lock = threading.Lock()

    def next_piece() -> Iterator[int]:
        while True:
            with lock:
                start = next(pieces, None)
            if start is None:
                return
            yield start

    def worker() -> None:
        for start in next_piece():
            _raw(call, fd, view[start : start + PIECE_BYTES], at + start)

    for future in [pool.submit(worker) for _ in range(threads)]:
        future.result()


def _checksum_pages(checksum: PageChecksum, view: memoryview, bytes_per_page: int) -> None:
    """The checksum of every page of `view` on this thread: the checksum work of a transfer."""
    for at in range(0, len(view), bytes_per_page):
        checksum(view[at : at + bytes_per_page])


def _checksum_gbps(checksum: PageChecksum, view: memoryview, repeats: int) -> float:
    """The checksum of one page on one thread: its share of the mover's CPU work."""
    return len(view) / _median_s(lambda: checksum(view), repeats)[0] / 1e9


def _bench_one(
    mover: StorageMover,
    l2_view: memoryview,
    n: int,
    sets: dict[str, tuple[Pages, Pages]],
    raw_slot: int,
    repeats: int,
    pool: ThreadPoolExecutor,
    ceiling_threads: Sequence[int],
) -> Row:
    """One prefix size: ceilings and the mover on both page sets, interleaved per repeat."""
    l3, bpp = mover.l3, mover.l3.bytes_per_page
    nbytes = n * bpp
    buf, at = l2_view[:nbytes], l3.offset(raw_slot)
    row: Row = {"pages": n, "tokens": n * PAGE_TOKENS, "bytes": nbytes}
    fd = l3.io_fd  # the mover's descriptor: O_DIRECT with --direct
    _timed(row, "raw_write", lambda: _raw(os.pwrite, fd, buf, at), repeats)
    _timed(row, "raw_read", lambda: _raw(_preadv, fd, buf, at), repeats)
    for t in ceiling_threads:
        for name, call in (("write", os.pwrite), ("read", _preadv)):

            def ceiling(t: int = t, call: Callable[[int, memoryview, int], int] = call) -> None:
                _threaded(pool, t, call, fd, buf, at)

            _timed(row, f"ceiling_{name}_{t}t", ceiling, repeats)
    _timed(row, "checksum", lambda: _checksum_pages(l3.page_checksum, buf, bpp), repeats)
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
    for name in ("write", "read"):
        best = max(ceiling_threads, key=lambda t: _gbps(row, f"ceiling_{name}_{t}t"))
        row[f"ceiling_{name}_threads"] = best
        row[f"ceiling_{name}_GBps"] = _gbps(row, f"ceiling_{name}_{best}t")
    for name in sets:
        for direction, raw in (("h2s", "write"), ("s2h", "read")):
            mover_gbps = _gbps(row, f"{direction}_{name}")
            row[f"{direction}_{name}_vs_raw"] = mover_gbps / _gbps(row, f"raw_{raw}")
            row[f"{direction}_{name}_vs_ceiling"] = mover_gbps / _gbps(row, f"ceiling_{raw}")
    return row


def _gbps(row: Row, key: str) -> float:
    value = row[f"{key}_GBps"]
    assert isinstance(value, float)
    return value


def bench_storage(
    tokens: Sequence[int] = TOKENS_DEFAULT,
    *,
    bytes_per_page: int = QWEN3_8B_BYTES_PER_PAGE,
    io_threads: int = 8,
    piece_bytes: int = PIECE_BYTES,
    repeats: int = 5,
    directory: str | None = None,
    seed: int = 0,
    checksum: str | None = None,
    ceiling_threads: Sequence[int] = CEILING_THREADS,
    direct: bool = False,
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
    if direct:  # O_DIRECT moves 4 KiB-aligned memory
        l2 = aligned_pages(2 * big, bytes_per_page).copy_(l2)
    pinned = torch.cuda.is_available()
    if pinned:
        l2 = l2.pin_memory()  # page-aligned
    rng = np.random.default_rng(seed)
    path = None
    if directory is not None:
        path = os.path.join(directory, f"hicache-bench-{os.getpid()}.slots")
    rows: list[Row] = []
    l3 = L3File(path, 4 * big, bytes_per_page, checksum=checksum, direct=direct)
    with (
        l3,
        StorageMover(l3, l2, io_threads=io_threads, piece_bytes=piece_bytes) as mover,
        ThreadPoolExecutor(max(ceiling_threads), thread_name_prefix="ceiling") as pool,
    ):
        l2_view = l2.numpy().data.cast("B")
        for n in counts:
            sets = {
                "consecutive": (np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64)),
                "fragmented": (
                    rng.choice(2 * big, n, replace=False).astype(np.int64),
                    big + rng.choice(2 * big, n, replace=False).astype(np.int64),
                ),
            }
            rows.append(
                _bench_one(mover, l2_view, n, sets, 3 * big, repeats, pool, ceiling_threads)
            )
        sum_gbps = _checksum_gbps(l3.page_checksum, l2_view[:bytes_per_page], max(repeats, 5))
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
        "direct": direct,
        "checksum": l3.header.checksum,
        "checksum_one_thread_GBps": sum_gbps,
        "ceiling_threads": list(ceiling_threads),
        "ceiling_piece_bytes": PIECE_BYTES,
        "corrupt_reads": counters.corrupt_reads,
        "short_io_resumed": counters.short_io_resumed,
    }
    return {"config": config, "rows": rows}


LEGEND = (
    "legend: c = consecutive (n L2 pages <-> n consecutive slots: 1 extent), f = "
    "fragmented (random pages <-> random slots); extents = runs of consecutive slots; "
    "raw = one pwrite (write) or preadv (read) call of the same bytes, on one thread; "
    "ceiling = the best of the multi-thread table below (pwrite / preadv of the same bytes in "
    "4 MiB pieces, N threads); x ceil = the mover's GB/s over the ceiling's; GB = 1e9 bytes; "
    "CPU ms = this process's CPU time per transfer, all threads; checksum = the L3 file's "
    "checksum of the pages on one thread"
)
_GBPS_HEAD = (
    "pages",
    "extents c/f",
    "ceiling write GB/s",
    "H2S c GB/s (x ceil)",
    "H2S f GB/s (x ceil)",
    "ceiling read GB/s",
    "S2H c GB/s (x ceil)",
    "S2H f GB/s (x ceil)",
)
_CPU_HEAD = (
    "pages",
    "raw write CPU ms",
    "H2S c CPU ms",
    "H2S f CPU ms",
    "raw read CPU ms",
    "S2H c CPU ms",
    "S2H f CPU ms",
    "checksum CPU ms",
)


def _ceiling_head(threads: Sequence[int]) -> tuple[str, ...]:
    return (
        "pages",
        "write 1 call",
        *(f"write {t}t" for t in threads),
        "read 1 call",
        *(f"read {t}t" for t in threads),
    )


def _ceiling_cells(r: dict[str, Any], threads: Sequence[int]) -> list[str]:
    return [
        f"{r['pages']:,}",
        f"{r['raw_write_GBps']:.2f}",
        *(f"{r[f'ceiling_write_{t}t_GBps']:.2f}" for t in threads),
        f"{r['raw_read_GBps']:.2f}",
        *(f"{r[f'ceiling_read_{t}t_GBps']:.2f}" for t in threads),
    ]


def _gbps_cells(r: dict[str, Any]) -> list[str]:
    def rated(key: str) -> str:
        return f"{r[key + '_GBps']:.2f} ({r[key + '_vs_ceiling']:.2f}x)"

    return [
        f"{r['pages']:,}",
        f"{r['extents_consecutive']}/{r['extents_fragmented']}",
        f"{r['ceiling_write_GBps']:.2f} ({r['ceiling_write_threads']}t)",
        rated("h2s_consecutive"),
        rated("h2s_fragmented"),
        f"{r['ceiling_read_GBps']:.2f} ({r['ceiling_read_threads']}t)",
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
        "checksum",
    )
    return [f"{r['pages']:,}", *(f"{r[k + '_cpu_ms']:.1f}" for k in keys)]


def _table(result: dict[str, Any]) -> str:
    c, rows = result["config"], result["rows"]
    threads = c["ceiling_threads"]
    about = (
        f"L3 file {c['l3_path']}; {c['bytes_per_page']:,} bytes/page; {c['io_threads']} I/O "
        f"threads; I/O calls of at most {c['piece_bytes']:,} bytes ({c['piece_pages']} "
        f"pages); median of {c['repeats']}; L2 pinned: {'yes' if c['l2_pinned'] else 'no'}; "
        f"O_DIRECT: {'yes' if c['direct'] else 'no (page cache)'}; "
        f"checksum {c['checksum']}, on one thread {c['checksum_one_thread_GBps']:.2f} GB/s; "
        f"corrupt reads {c['corrupt_reads']}, short I/O resumed {c['short_io_resumed']}"
    )
    return "\n".join(
        [
            about,
            LEGEND,
            *columns(_GBPS_HEAD, [_gbps_cells(r) for r in rows]),
            "",
            "ceiling: GB/s of pwrite (write) / preadv (read) of the same bytes of the same file: "
            f"one call, then {c['ceiling_piece_bytes']:,}-byte pieces on N threads",
            *columns(_ceiling_head(threads), [_ceiling_cells(r, threads) for r in rows]),
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
        "--checksum",
        choices=ALGORITHMS,
        default=None,
        help=f"the L3 file's slot checksum (default: the fastest here, {default_algorithm()})",
    )
    parser.add_argument(
        "--ceiling-threads",
        type=int,
        nargs="+",
        default=list(CEILING_THREADS),
        help="thread counts of the multi-thread pwrite/preadv ceiling",
    )
    parser.add_argument(
        "--direct",
        action="store_true",
        help="open the L3 file O_DIRECT (bypass the page cache; bytes-per-page a multiple of 4096)",
    )
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
        ("--ceiling-threads", min(args.ceiling_threads), 1),
        ("--piece-bytes", args.piece_bytes, args.bytes_per_page),
    ):
        if value < least:  # else a ConfigError or a traceback naming no option, mid-run
            parser.error(f"argument {option}: at least {least}, got {value}")
    if args.direct and args.bytes_per_page % 4096:
        parser.error("argument --direct: --bytes-per-page must be a multiple of 4096")
    if args.checksum is not None and not available(args.checksum):
        parser.error(f"argument --checksum: {args.checksum} needs the xxhash package here")
    result = bench_storage(
        args.tokens,
        bytes_per_page=args.bytes_per_page,
        io_threads=args.io_threads,
        piece_bytes=args.piece_bytes,
        repeats=args.repeats,
        directory=args.dir,
        checksum=args.checksum,
        ceiling_threads=args.ceiling_threads,
        direct=args.direct,
    )
    print(_table(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
