"""Page placement (`PageTable.placement`): which free pages a reservation takes. The reference
reserves by best fit; the fuzz also draws `spread` (hicache/testing/adapters/controller.py,
PLACEMENTS), which fragments every reservation as far as the free pages allow, so that the
data plane's fragmented routes run under the machine."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hicache.core.pages import FREE, PRIVATE, PageTable, half_spread, pages, spread


@given(st.sets(st.integers(0, 199), min_size=1), st.data())
def test_spread_takes_n_distinct_free_pages_as_far_apart_as_they_allow(
    free: set[int], data: st.DataObject
) -> None:
    idx = pages(sorted(free))
    n = data.draw(st.integers(0, idx.size))
    chosen = spread(idx, n)
    assert chosen.size == n and np.all(np.diff(chosen) > 0) and np.isin(chosen, idx).all()
    at = np.searchsorted(idx, chosen)  # positions among the free pages
    if n > 1:  # consecutive picks skip floor(free / n) - 1 free pages between them
        assert int(np.diff(at).min()) >= idx.size // n


@given(st.sets(st.integers(0, 199), min_size=1), st.data())
def test_half_spread_takes_one_run_then_pages_apart_from_it(
    free: set[int], data: st.DataObject
) -> None:
    idx = pages(sorted(free))
    n = data.draw(st.integers(0, idx.size))
    chosen = half_spread(idx, n)
    assert chosen.size == n == np.unique(chosen).size and np.isin(chosen, idx).all()
    k = -(-n // 2)
    head, rest = chosen[:k], chosen[k:]
    runs = np.split(idx, np.flatnonzero(np.diff(idx) != 1) + 1)
    if n and any(r.size >= k for r in runs):  # a run of k free pages exists: the head is one
        assert np.all(np.diff(head) == 1), head
    others = idx[(idx < head[0] - 1) | (idx > head[-1] + 1)] if n else idx
    if rest.size and others.size >= rest.size:  # enough pages apart: none touches the head
        assert np.isin(rest, others).all() and np.all(np.diff(rest) > 0), (head, rest)


def test_a_table_with_half_spread_reserves_one_run_and_separate_pages() -> None:
    t = PageTable("L2", 12)
    t.placement = half_spread
    assert t.reserve(4).tolist() == [0, 1, 5, 9]  # a run of two, then two pages apart


def test_a_table_with_spread_reserves_separate_runs_and_is_refused_nothing_else() -> None:
    t = PageTable("L2", 12)
    t.placement = spread
    got = t.reserve(4)
    assert got.tolist() == [0, 3, 6, 9]  # four runs where best fit takes 0..3
    assert (t.owner[got] == PRIVATE).all() and t.free_count == 8
    t.placement = None
    assert t.reserve(2).tolist() == [1, 2]  # best fit: the first of the shortest runs


@pytest.mark.parametrize(
    "bad",
    [
        lambda idx, n: idx[:1].repeat(n),  # one page twice
        lambda idx, n: idx[: n - 1],  # one page short
        lambda idx, n: np.arange(100, 100 + n),  # pages that are not free
    ],
)
def test_a_placement_that_breaks_ownership_is_caught_before_anything_moves(bad: object) -> None:
    t = PageTable("L1", 8)
    t.reserve(2)
    t.placement = bad  # type: ignore[assignment]
    with pytest.raises(AssertionError):
        t.reserve(3)
    assert t.free_count == 6 and (t.owner[2:] == FREE).all()
