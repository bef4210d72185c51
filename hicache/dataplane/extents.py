"""Coalescing a page mapping into extents: runs that one I/O call can move.

An extent `(src_start, dst_start, count)` moves src_start+i -> dst_start+i for i < count.
Two pairs may share an extent only when their sources AND their destinations are both
consecutive (bug class B13: merging because one side alone is consecutive moves bytes to
the wrong place).

    pairs (src -> dst)   5->9  6->10  7->3  8->4  2->11  4->12
    extents (by dst)     (7, 3, 2)  (5, 9, 2)  (2, 11, 1)  (4, 12, 1)

    5,6 -> 9,10 and 7,8 -> 3,4: both sides consecutive, merged.
    6->10, 7->3: only the sources are consecutive -- not merged.
    6->10, 2->11 and 2->11, 4->12: only the destinations are consecutive -- not merged.

The mapping is a set of pairs, so the order the caller lists them in does not matter: pairs
on one diagonal (equal src - dst) whose sources are consecutive integers form one extent,
however they were listed. That gives the minimal number of extents the rule allows: a pair
starts a new extent exactly when (src - 1, dst - 1) is not also in the mapping.

`split` then cuts extents into pieces of bounded length, so that no single I/O call (and the
checksum work that follows it) is too long to share among threads:

    extent (10, 40, 7), at most 3 pages  ->  (10, 40, 3) (13, 43, 3) (16, 46, 1)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hicache.core.pages import Pages


@dataclass(frozen=True, slots=True)
class Extent:
    """Pages src_start .. src_start+count-1 map to dst_start .. dst_start+count-1."""

    src_start: int
    dst_start: int
    count: int


def coalesce(src: Pages, dst: Pages) -> list[Extent]:
    """The minimal list of extents that reproduces the mapping src[i] -> dst[i] exactly.

    Destinations must be distinct (two writes into one page race); sources may repeat (one
    page copied to two places). Extents come out ordered by `dst_start`. Cost: one sort,
    O(n log n), no Python loop over pages.
    """
    src = np.asarray(src, dtype=np.int64).reshape(-1)
    dst = np.asarray(dst, dtype=np.int64).reshape(-1)
    if src.shape != dst.shape:
        raise ValueError(f"coalesce: {src.size} sources but {dst.size} destinations")
    if dst.size == 0:
        return []
    # Sort by destination: each diagonal's pairs then sit in dst (= src) order, and a run is
    # consecutive in both sides exactly when neighbours differ by 1 on both.
    order = np.argsort(dst, kind="stable")
    s, d = src[order], dst[order]
    step_d = np.diff(d)
    if step_d.size and int(step_d.min()) == 0:
        raise ValueError(f"coalesce: destinations must be distinct, got {dst.tolist()}")
    # Because destinations are distinct and sorted, a pair's diagonal predecessor
    # (src-1, dst-1), if present, is its immediate neighbour in this order.
    joins = (step_d == 1) & (np.diff(s) == 1)
    starts = np.flatnonzero(np.concatenate(([True], ~joins)))
    counts = np.diff(np.append(starts, d.size))
    extents = [Extent(int(s[i]), int(d[i]), int(c)) for i, c in zip(starts, counts)]
    # Verify the extents cover every pair once: a miscount would skip or repeat pages.
    assert sum(e.count for e in extents) == dst.size
    return extents


def split(extents: Sequence[Extent], max_pages: int) -> list[Extent]:
    """Each extent cut, in order, into consecutive pieces of at most `max_pages` pages.

    A piece is a sub-run of one extent, so it is consecutive on both sides as its extent is
    (B13 holds for pieces too) and whole pages by construction; the pieces of an extent tile it
    exactly, so every (src, dst) pair lands in exactly one piece. Order is kept: pieces of
    `coalesce` output are still ordered by `dst_start`.
    """
    if not isinstance(max_pages, int) or max_pages < 1:
        raise ValueError(f"split: max_pages must be a positive integer, got {max_pages!r}")
    pieces = [
        Extent(e.src_start + first, e.dst_start + first, min(max_pages, e.count - first))
        for e in extents
        for first in range(0, e.count, max_pages)
    ]
    # Verify the pieces cover every page once: a slip here would skip or repeat a page's I/O.
    assert sum(p.count for p in pieces) == sum(e.count for e in extents)
    return pieces
