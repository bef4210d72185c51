"""Where an S2H thread's time goes: the read, the checksum, and the checksum's memory.

    PYTHONPATH=. python3 benchmarks/s2h_hash_probe.py [--pages 200] [--threads 1 8 16]
        [--chunk-kib 128 256 576 1152] [--out FILE.json]

An S2H thread reads a page from the L3 file (`preadv`, from the page cache here) into L2,
then checksums it (`storage_io.py`). On one H100 host the checksum ran 9.6 GB/s on one
thread and S2H reached 0.45-0.78 of the read ceiling. This probe times, on N threads at
once (each its own pages of one file, 2,359,296-byte pages: Qwen3-8B's), GB/s of:

    read          preadv of whole pages
    hash-hot      XXH3 of a page hashed just before (in cache)
    hash-cold     XXH3 of pages in turn over a buffer larger than the caches
    read+hash     preadv a page, then XXH3 of it (what S2H does now)
    streamed-Nk   preadv N KiB, XXH3 update of them, next part (incremental hash: the bytes
                  are hashed while still in the core's cache), for each --chunk-kib

and checks, outside the timed runs, that the streamed digest equals the one-shot digest (an
earlier version checked inside the timed loop: a second, cold hash of every page made
"streamed" look slower than it is). A diagnostic: it says whether hashing while the bytes
are cached would lift S2H on this host.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

PAGE = 2_359_296  # Qwen3-8B, 16 tokens a page


def _run(threads: int, work: Callable[[int], int]) -> float:
    """GB/s of `work(thread)` (bytes it moved) on `threads` threads started together."""
    moved = [0] * threads
    go = threading.Barrier(threads + 1)

    def body(t: int) -> None:
        go.wait()
        moved[t] = work(t)

    pool = [threading.Thread(target=body, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    go.wait()
    t0 = time.perf_counter()
    for th in pool:
        th.join()
    return sum(moved) / (time.perf_counter() - t0) / 1e9


def probe(pages: int, threads: int, chunks: list[int], fd: int) -> dict[str, float]:
    per = pages // threads
    bufs = [bytearray(per * PAGE) for _ in range(threads)]
    views = [memoryview(b).cast("B") for b in bufs]

    def page(t: int, i: int) -> memoryview:
        return views[t][i * PAGE : (i + 1) * PAGE]

    def read(t: int) -> int:
        for i in range(per):
            os.preadv(fd, [page(t, i)], (t * per + i) * PAGE)
        return per * PAGE

    def hash_hot(t: int) -> int:
        for _ in range(per):
            xxhash.xxh3_64_intdigest(page(t, 0))
        return per * PAGE

    def hash_cold(t: int) -> int:
        for i in range(per):
            xxhash.xxh3_64_intdigest(page(t, i))
        return per * PAGE

    def read_hash(t: int) -> int:
        for i in range(per):
            os.preadv(fd, [page(t, i)], (t * per + i) * PAGE)
            xxhash.xxh3_64_intdigest(page(t, i))
        return per * PAGE

    def streamed(chunk: int) -> Callable[[int], int]:
        def work(t: int) -> int:
            for i in range(per):
                h, view, at = xxhash.xxh3_64(), page(t, i), (t * per + i) * PAGE
                for lo in range(0, PAGE, chunk):
                    part = view[lo : lo + chunk]
                    os.preadv(fd, [part], at + lo)
                    h.update(part)
                digests[t] = h.intdigest()
            return per * PAGE

        return work

    digests = [0] * threads
    out = {}
    works: list[tuple[str, Callable[[int], int]]] = [("read", read), ("hash-hot", hash_hot)]
    works += [("hash-cold", hash_cold)]
    works += [("read+hash", read_hash)]
    works += [(f"streamed-{c >> 10}k", streamed(c)) for c in chunks]
    for name, work in works:
        out[name] = max(_run(threads, work) for _ in range(3))
        if name.startswith("streamed"):  # checked outside the timed runs
            last = [page(t, per - 1) for t in range(threads)]
            assert digests == [xxhash.xxh3_64_intdigest(v) for v in last], "streamed digest differs"
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pages", type=int, default=256)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 8, 16])
    p.add_argument("--chunk-kib", type=int, nargs="+", default=[128, 256, 576, 1152])
    p.add_argument("--out")
    a = p.parse_args()
    result: dict[str, Any] = {
        "page_bytes": PAGE,
        "pages": a.pages,
        "chunks": [c << 10 for c in a.chunk_kib],
    }
    with tempfile.NamedTemporaryFile(dir=os.environ.get("TMPDIR")) as f:
        block = np.random.default_rng(0).integers(0, 256, PAGE, dtype=np.uint8).tobytes()
        for _ in range(a.pages):
            f.write(block)
        f.flush()
        fd = os.open(f.name, os.O_RDONLY)
        os.preadv(fd, [bytearray(a.pages * PAGE)], 0)  # the file in the page cache
        for threads in a.threads:
            row = probe(a.pages, threads, [c << 10 for c in a.chunk_kib], fd)
            result[str(threads)] = row
            print(f"{threads:>2} threads: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()))
        os.close(fd)
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
