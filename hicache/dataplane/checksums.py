"""The L3 page checksum: which algorithms there are, and which one a new L3 file uses.

    name            what                                        needs             GB/s, 1 thread
    xxh3-64-low32   XXH3-64 (seed 0) of the page, low 32 bits   `xxhash` (PyPI)   ~15-28
    crc32           zlib's CRC-32 of the page                   standard library  ~1-3

(GB/s on this project's 2-core dev box, busy; benchmarks/results/2026-12-06-l3-checksum.md.)
Every algorithm releases the GIL on a page, so the I/O threads checksum in parallel.

A new L3 file uses `default_algorithm()`: XXH3 when `xxhash` is installed (it comes with the
`data` and `gpu` extras), else zlib's crc32 -- the data plane runs without `xxhash`, at the
old speed. The file's header names the algorithm (`l3format.py`), so a file is only ever read
with the algorithm its pages were checksummed with: a file of another algorithm is refused
(`storage.py`), never misread.

Why 32 bits of XXH3 and not 64: slot metadata is 4 bytes a slot, and rank 0 hands its
checksums to the other ranks in int64 collectives (spec/tp.md, C6b) where 64 unsigned bits
do not fit. A 32-bit slice of a 64-bit hash misses a random change with probability 2^-32,
as crc32 does any change beyond its guaranteed class (bursts of up to 32 bits); the failures
a page cache or disk hands back -- torn or stale 4 KiB blocks, zeroed sectors -- are far
outside that class, and single-bit flips are the drive's ECC's to catch.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

from hicache.errors import ConfigError

CRC32 = "crc32"
XXH3_LOW32 = "xxh3-64-low32"
ALGORITHMS = (XXH3_LOW32, CRC32)  # fastest first: `default_algorithm` picks the first available
NAME_BYTES = 16  # the header's field: an ASCII name, NUL-padded

PageChecksum = Callable[[memoryview], int]  # a page's bytes -> an unsigned 32-bit int


def _xxh3_low32() -> PageChecksum | None:
    try:
        from xxhash import xxh3_64_intdigest
    except ImportError:
        return None

    def xxh3_low32(data: memoryview) -> int:
        return int(xxh3_64_intdigest(data)) & 0xFFFF_FFFF

    return xxh3_low32


def _crc32(data: memoryview) -> int:
    return zlib.crc32(data)


_FUNCTIONS: dict[str, PageChecksum | None] = {XXH3_LOW32: _xxh3_low32(), CRC32: _crc32}
_NEEDS = {XXH3_LOW32: "the xxhash package (pip install 'hicache[data]', or xxhash)"}


def available(name: str) -> bool:
    """Can this process compute checksum `name`?"""
    return _FUNCTIONS.get(name) is not None


def default_algorithm() -> str:
    """The fastest algorithm this process can compute: what a new L3 file uses."""
    return next(name for name in ALGORITHMS if available(name))


def checksum_function(name: str) -> PageChecksum:
    """The page checksum called `name`. ConfigError (field `l3.checksum`) naming what is
    missing when this process cannot compute it, or when no such algorithm exists."""
    fn = _FUNCTIONS.get(name)
    if fn is not None:
        return fn
    if name in _NEEDS:
        raise ConfigError("l3.checksum", f"{name!r} needs {_NEEDS[name]}; it is not installed")
    raise ConfigError("l3.checksum", f"one of {', '.join(ALGORITHMS)}, got {name!r}")
