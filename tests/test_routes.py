"""Transfer planning (routes.py): chunk bounds, routes (direct runs and host staging), runs cut
at chunk edges, and the index slots that keep every chunk's indices 16-byte aligned. Pure
numpy: no device, no buffers."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hicache.core.pages import Pages, pages
from hicache.dataplane.routes import (
    INDEX_ALIGN,
    SMALL_ROUTE_PAGES,
    DmaPlan,
    Run,
    _route_numpy,
    _route_small,
    chunk_bounds,
    index_slots,
    is_run,
    plan_route,
    split_runs,
)


def test_chunk_bounds_cover_in_order() -> None:
    mib = 1 << 20
    assert chunk_bounds(0, mib) == []
    assert chunk_bounds(10, mib, first_bytes=mib, single_max_bytes=0) == [
        (0, 1),
        (1, 3),
        (3, 7),
        (7, 10),
    ]
    assert chunk_bounds(10, mib, first_bytes=mib, descending=True, single_max_bytes=0) == [
        (0, 3),
        (3, 7),
        (7, 9),
        (9, 10),
    ]
    assert chunk_bounds(7, mib, 3) == [(0, 3), (3, 6), (6, 7)]
    assert chunk_bounds(7, mib, 3, single_max_bytes=1 << 40) == [(0, 3), (3, 6), (6, 7)], (
        "fixed wins"
    )
    assert chunk_bounds(5, 100, first_bytes=250, single_max_bytes=0) == [
        (0, 3),
        (3, 5),
    ]  # 3 pages first
    # Small transfers are one chunk (one gather, one DMA per run); the limit is inclusive.
    assert chunk_bounds(10, mib, single_max_bytes=10 * mib) == [(0, 10)]
    assert len(chunk_bounds(11, mib, first_bytes=mib, single_max_bytes=10 * mib)) > 1
    qwen_page = 2359296
    assert chunk_bounds(22, qwen_page) == [(0, 22)], "350 Qwen3-8B tokens: one chunk"
    bounds = chunk_bounds(219, qwen_page)
    # 3,500 tokens: a first chunk of 16 MiB (8 pages; its DMA outlasts issuing the next chunk)
    assert bounds == [(0, 8), (8, 24), (24, 56), (56, 120), (120, 219)]


def sorted_runs(ids: Pages) -> list[tuple[int, int]]:
    """(first page, length) of each run of consecutive pages of sorted(ids) -- the oracle."""
    out: list[tuple[int, int]] = []
    for p in sorted(ids.tolist()):
        if out and p == out[-1][0] + out[-1][1]:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((p, 1))
    return out


@settings(max_examples=200)
@given(
    ids=st.lists(st.integers(0, 40), min_size=1, max_size=30),
    distinct=st.booleans(),
    min_pages=st.integers(0, 5),
    staged_first=st.booleans(),
)
def test_route_moves_every_pair_once_by_the_run_rule(
    ids: list[int], distinct: bool, min_pages: int, staged_first: bool
) -> None:
    l2 = pages(list(dict.fromkeys(ids)) if distinct else ids)  # H2D sources may repeat
    n, bpp = l2.size, 100
    route = plan_route(l2, bpp, min_pages * bpp, staged_first=staged_first)
    order = np.arange(n) if route.order is None else route.order
    assert sorted(order.tolist()) == list(range(n)), "a permutation of the caller's pairs"
    covered = np.zeros(n, dtype=int)
    for lo, hi, first in route.direct:  # each direct run: one slice of the pool
        assert np.array_equal(l2[order[lo:hi]], np.arange(first, first + hi - lo))
        covered[lo:hi] += 1
    covered[route.staged_lo : route.staged_hi] += 1
    assert (covered == 1).all(), "every packed position is moved exactly once"
    assert np.array_equal(route.l2_staged, l2[order[route.staged_lo : route.staged_hi]])
    assert route.staged_lo == 0 if staged_first else route.staged_hi == n
    runs = sorted_runs(l2)
    assert route.runs == len(runs)
    small = [k for _, k in runs if k < min_pages]
    assert route.staged_pages == (sum(small) if len(small) >= 2 else 0), (
        "small runs staged, two or more"
    )
    assert len(route.direct) == len(runs) - (len(small) if len(small) >= 2 else 0)
    assert route.kind == (
        "direct" if not route.staged_pages else "mixed" if route.direct else "staged"
    )


@given(
    runs=st.lists(st.integers(1, 9), min_size=1, max_size=6),
    chunks=st.lists(st.integers(1, 9), min_size=1, max_size=12),
)
def test_split_runs_cuts_runs_at_chunk_edges_only(runs: list[int], chunks: list[int]) -> None:
    direct, lo = [], 3  # positions 0..2 stand for staged pages
    for i, k in enumerate(runs):
        direct.append(Run(lo, lo + k, 100 * i))
        lo += k
    bounds, start = [], 0
    for k in chunks:
        bounds.append((start, start + k))
        start += k
    if start < lo:
        bounds.append((start, lo))
    pieces = split_runs(direct, bounds)
    assert len(pieces) == len(bounds)
    moved = {}
    for (c_lo, c_hi), here in zip(bounds, pieces):
        for p_lo, p_hi, first in here:
            assert c_lo <= p_lo < p_hi <= c_hi, "a piece stays inside its chunk"
            moved.update({pos: first + pos - p_lo for pos in range(p_lo, p_hi)})
    want = {pos: r.l2_first + pos - r.lo for r in direct for pos in range(r.lo, r.hi)}
    assert moved == want, "the pieces move exactly the runs' positions to the runs' pages"


@given(
    n=st.integers(0, 60),
    chunk_pages=st.sampled_from([None, 1, 2, 3, 5, 7]),
    descending=st.booleans(),
    shuffled=st.booleans(),
)
def test_index_slots_are_aligned_disjoint_and_filled_in_packed_order(
    n: int, chunk_pages: int | None, descending: bool, shuffled: bool
) -> None:
    """Every chunk's index slice starts at a multiple of INDEX_ALIGN (16 bytes of int64), so
    the kernels see one pointer alignment; slices are in order, disjoint, at most one gap
    entry per chunk, and hold exactly that chunk's L1 pages in packed order."""
    bounds = chunk_bounds(
        n, 100, chunk_pages, descending=descending, first_bytes=300, single_max_bytes=0
    )
    at = index_slots(bounds)
    assert len(at) == len(bounds)
    end = 0
    for (lo, hi), start in zip(bounds, at):
        assert start % INDEX_ALIGN == 0, (bounds, at)
        assert end <= start < end + INDEX_ALIGN, (
            "right after the previous slice, gap under 16 bytes"
        )
        end = start + hi - lo
    if n == 0:
        return
    rng = np.random.default_rng(n)
    l2 = pages(rng.permutation(n) if shuffled else np.arange(n))
    route = plan_route(l2, 100, 300, staged_first=True)
    plan = DmaPlan(route, bounds, split_runs(route.direct, bounds))
    assert (
        plan.index_at == at and plan.index_len == end and end <= n + len(bounds) * (INDEX_ALIGN - 1)
    )
    l1 = pages(rng.permutation(n) + 1000)
    out = np.full(plan.index_len, -1, dtype=np.int64)
    plan.fill_index(l1, out)
    in_packed_order = l1 if route.order is None else l1[route.order]
    for (lo, hi), start in zip(bounds, at):
        assert np.array_equal(out[start : start + hi - lo], in_packed_order[lo:hi])
    assert int((out == -1).sum()) == plan.index_len - n, "gaps are the only entries left unwritten"


def test_seven_chunks_of_three_use_aligned_slots() -> None:
    """The GPU failure's shape: 20 pages in chunks of 3 start at odd int64 offsets (24, 72,
    120 bytes) unless padded; padded, slots are 0, 4, 8, ... (one gap entry per chunk)."""
    bounds = chunk_bounds(20, 1 << 18, 3)
    assert bounds == [(0, 3), (3, 6), (6, 9), (9, 12), (12, 15), (15, 18), (18, 20)]
    assert index_slots(bounds) == [0, 4, 8, 12, 16, 20, 24]
    assert index_slots(chunk_bounds(20, 1 << 18, 4)) == [0, 4, 8, 12, 16], "aligned chunks: no gaps"


@st.composite
def run_layouts(draw: st.DrawFn, max_pages: int) -> list[int]:
    """L2 pages made of runs (gap, length) in a random order, some repeated: short and long
    runs side by side, so that none, one, or several runs fall under the staging limit."""
    runs = draw(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 8)), min_size=1))
    ids: list[int] = []
    at = draw(st.integers(0, 50))
    for gap, length in runs:
        ids.extend(range(at, at + length))
        at += length + gap
    ids = ids[:max_pages]
    repeats = draw(st.lists(st.sampled_from(ids), max_size=3))
    return draw(st.permutations(ids + repeats))


@settings(max_examples=300)
@given(
    ids=run_layouts(SMALL_ROUTE_PAGES + 40),
    min_pages=st.integers(0, 5),
    staged_first=st.booleans(),
)
def test_the_list_route_and_the_numpy_route_are_the_same(
    ids: list[int], min_pages: int, staged_first: bool
) -> None:
    """Short routes are planned on Python lists, long ones in numpy (`plan_route` picks by
    SMALL_ROUTE_PAGES): on any input, either gives exactly the other's route."""
    l2 = pages(ids)
    if l2.size < 2:
        return
    args = (l2, 100, min_pages * 100)
    small = _route_small(*args, staged_first=staged_first)
    big = _route_numpy(*args, staged_first=staged_first)
    assert small.order is not None and big.order is not None
    assert np.array_equal(small.order, big.order), "the same packed order"
    assert small.direct == big.direct, "the same direct runs"
    assert (small.staged_lo, small.staged_hi, small.runs) == (
        big.staged_lo,
        big.staged_hi,
        big.runs,
    )
    assert np.array_equal(small.l2_staged, big.l2_staged)
    assert small.order.dtype == big.order.dtype == small.l2_staged.dtype == np.int64


@given(
    n=st.integers(1, SMALL_ROUTE_PAGES + 40),
    first=st.integers(0, 1000),
    swap=st.integers(-1, SMALL_ROUTE_PAGES + 40),
    step=st.sampled_from([1, 1, 2, -1]),
)
def test_is_run_means_one_increasing_slice(n: int, first: int, swap: int, step: int) -> None:
    """`is_run` (a list compare up to SMALL_ROUTE_PAGES, numpy above) is True exactly when
    the pages are first, first + 1, ...: a swap, a gap or a descent is no run."""
    ids = list(range(first, first + step * n, step))
    if 0 <= swap < n - 1:
        ids[swap], ids[swap + 1] = ids[swap + 1], ids[swap]
    want = all(b == a + 1 for a, b in itertools.pairwise(ids))
    assert is_run(pages(ids)) == want, ids


def test_one_chunk_keeps_every_run_whole() -> None:
    """A one-chunk transfer (every short one) is not cut: its pieces are its runs."""
    runs = [Run(0, 2, 10), Run(2, 3, 40), Run(3, 7, 20)]
    assert split_runs(runs, [(0, 7)]) == [runs]
    assert split_runs(runs, [(0, 3), (3, 7)]) == [runs[:2], runs[2:]]
