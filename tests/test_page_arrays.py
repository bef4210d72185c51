"""The page arrays every transfer is validated with (null.py: `page_array`, `transfer_pages`),
against a numpy oracle on both sides of SMALL_PAGES: arrays up to it are checked on a Python
list, longer ones in numpy, and the answer (or the InvalidPages) must not depend on which."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hicache.core.tiers import Direction
from hicache.dataplane.null import SMALL_PAGES, page_array, transfer_pages
from hicache.errors import InvalidPages

CAPACITY = 150
sizes = st.integers(0, SMALL_PAGES + 60)


@given(values=st.lists(st.integers(-3, CAPACITY + 3), max_size=SMALL_PAGES + 60))
def test_page_array_refuses_exactly_the_pages_outside_the_tier(values: list[int]) -> None:
    arr = np.array(values, dtype=np.int64)
    outside = bool(arr.size) and (int(arr.min()) < 0 or int(arr.max()) >= CAPACITY)
    if outside:
        with pytest.raises(InvalidPages, match=r"\[0, 150\)"):
            page_array("d2h.l1_pages", arr, CAPACITY)
    else:
        assert np.array_equal(page_array("d2h.l1_pages", arr, CAPACITY), arr)


@given(n=sizes, data=st.data())
def test_transfer_pages_refuses_exactly_a_repeated_target(n: int, data: st.DataObject) -> None:
    """Targets must be distinct (two copies landing on one page race); sources may repeat."""
    src = np.array(data.draw(st.lists(st.integers(0, 9), min_size=n, max_size=n)), np.int64)
    dst = np.array(
        data.draw(st.lists(st.integers(0, CAPACITY - 1), min_size=n, max_size=n)), np.int64
    )
    repeated = np.unique(dst).size < dst.size
    if repeated:
        with pytest.raises(InvalidPages, match="named twice"):
            transfer_pages(Direction.D2H, src, dst, CAPACITY, CAPACITY)
    else:
        got_src, got_dst = transfer_pages(Direction.D2H, src, dst, CAPACITY, CAPACITY)
        assert np.array_equal(got_src, src) and np.array_equal(got_dst, dst)


def test_unsigned_and_narrow_integers_are_read_as_pages_on_both_paths() -> None:
    for n in (3, SMALL_PAGES + 5):
        for dtype in (np.uint8, np.int32, np.uint64):
            arr = np.arange(n, dtype=dtype)
            got = page_array("h2d.l2_pages", arr, CAPACITY)
            assert got.dtype == np.int64 and got.tolist() == list(range(n))
