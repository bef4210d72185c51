"""Extent coalescing: exact, minimal, and never merging on one consecutive side (B13); splitting
extents into bounded I/O pieces: every page in exactly one piece, pieces inside their extent."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hicache.core.pages import pages
from hicache.dataplane.extents import Extent, coalesce, split


def expand(extents: list[Extent]) -> list[tuple[int, int]]:
    return [(e.src_start + i, e.dst_start + i) for e in extents for i in range(e.count)]


def minimal_count(pairs: set[tuple[int, int]]) -> int:
    """Independent oracle: a pair starts an extent iff its diagonal predecessor is absent."""
    return sum((s - 1, d - 1) not in pairs for s, d in pairs)


@st.composite
def mappings(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    """Runs of (src, dst) pairs, some consecutive on both sides, some on one, shuffled; each
    destination used once (as in every real transfer)."""
    runs = draw(
        st.lists(
            st.tuples(
                st.integers(0, 40),
                st.integers(0, 40),
                st.integers(1, 6),
                st.sampled_from(["both", "src", "dst"]),
            ),
            max_size=8,
        )
    )
    src: list[int] = []
    dst: list[int] = []
    for s0, d0, n, kind in runs:
        for i in range(n):
            s = s0 + i if kind in ("both", "src") else s0 + 2 * i
            d = d0 + i if kind in ("both", "dst") else d0 + 3 * i
            if d not in dst:
                src.append(s)
                dst.append(d)
    order = draw(st.permutations(range(len(src))))
    return [src[i] for i in order], [dst[i] for i in order]


@given(mappings())
def test_coalesce_is_exact_and_minimal(m: tuple[list[int], list[int]]) -> None:
    src, dst = m
    extents = coalesce(pages(src), pages(dst))
    got = expand(extents)
    # Every pair exactly once, no pair invented.
    assert sorted(got) == sorted(zip(src, dst))
    assert len(got) == len(set(got))
    assert len(extents) == minimal_count(set(zip(src, dst)))
    assert all(e.count >= 1 for e in extents)
    assert [e.dst_start for e in extents] == sorted(e.dst_start for e in extents)


def test_docstring_example() -> None:
    extents = coalesce(pages([5, 6, 7, 8, 2, 4]), pages([9, 10, 3, 4, 11, 12]))
    assert extents == [Extent(7, 3, 2), Extent(5, 9, 2), Extent(2, 11, 1), Extent(4, 12, 1)]


def test_one_consecutive_side_never_merges() -> None:
    # Sources consecutive, destinations not (and the reverse): one extent per page (B13).
    assert len(coalesce(pages([0, 1, 2, 3]), pages([7, 2, 9, 4]))) == 4
    assert len(coalesce(pages([7, 2, 9, 4]), pages([0, 1, 2, 3]))) == 4
    # Both consecutive but in opposite directions is not a run either.
    assert len(coalesce(pages([3, 2, 1, 0]), pages([0, 1, 2, 3]))) == 4


def test_both_consecutive_is_one_extent_whatever_the_listing_order() -> None:
    assert coalesce(pages([10, 11, 12]), pages([4, 5, 6])) == [Extent(10, 4, 3)]
    assert coalesce(pages([12, 10, 11]), pages([6, 4, 5])) == [Extent(10, 4, 3)]


def test_repeated_sources_are_kept() -> None:
    assert coalesce(pages([3, 3]), pages([0, 1])) == [Extent(3, 0, 1), Extent(3, 1, 1)]


def test_empty_and_invalid_input() -> None:
    assert coalesce(pages([]), pages([])) == []
    with pytest.raises(ValueError, match="destinations must be distinct"):
        coalesce(pages([1, 2]), pages([5, 5]))
    with pytest.raises(ValueError, match="2 sources but 1 destinations"):
        coalesce(pages([1, 2]), np.array([5], dtype=np.int64))


# -- split -------------------------------------------------------------------------------------


@given(mappings(), st.integers(1, 7))
def test_split_maps_every_page_once_inside_its_extent(
    m: tuple[list[int], list[int]], max_pages: int
) -> None:
    src, dst = m
    extents = coalesce(pages(src), pages(dst))
    pieces = split(extents, max_pages)
    # Every pair exactly once, in the extents' order (so still ordered by destination).
    assert expand(pieces) == expand(extents)
    assert all(1 <= p.count <= max_pages for p in pieces)
    # Each piece lies inside one extent: splitting never joins what coalescing kept apart (B13).
    for p in pieces:
        owners = [e for e in extents if e.dst_start <= p.dst_start < e.dst_start + e.count]
        assert len(owners) == 1
        e = owners[0]
        assert p.src_start - e.src_start == p.dst_start - e.dst_start
        assert p.dst_start + p.count <= e.dst_start + e.count
    # Minimal for the bound: an extent of n pages gives ceil(n / max_pages) pieces.
    assert len(pieces) == sum(-(-e.count // max_pages) for e in extents)


def test_split_docstring_example() -> None:
    pieces = split([Extent(10, 40, 7)], 3)
    assert pieces == [Extent(10, 40, 3), Extent(13, 43, 3), Extent(16, 46, 1)]
    assert split([Extent(10, 40, 7), Extent(0, 2, 1)], 7) == [Extent(10, 40, 7), Extent(0, 2, 1)]
    assert split([], 4) == []


@pytest.mark.parametrize("bad", [0, -1, 2.0])
def test_split_rejects_a_bound_below_one_page(bad: object) -> None:
    with pytest.raises(ValueError, match="max_pages must be a positive integer"):
        split([Extent(0, 0, 3)], bad)  # type: ignore[arg-type]
