"""The checker's page table (hicache/oracle/checktrace/pagetable.py) chooses what `PageTable` does.

Random runs of reserve / publish / release / free on a plain table and on a `RunIndexTable`
must reserve the same pages, refuse the same calls and leave the same owner arrays; the
moved log names exactly the pages whose owner code changed.
"""

from __future__ import annotations

import copy

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hicache.core.pages import FREE, PRIVATE, TREE, PageTable, pages
from hicache.errors import HiCacheError
from hicache.oracle.checktrace.pagetable import RunIndexTable
from hicache.pools.tiertable import TierTable


def _pair(capacity: int) -> tuple[PageTable, RunIndexTable]:
    return TierTable("L1", capacity), RunIndexTable.adopt(TierTable("L1", capacity), log=True)


@settings(max_examples=300, deadline=None)
@given(
    capacity=st.integers(1, 700),
    actions=st.lists(
        st.tuples(st.sampled_from(["reserve", "publish", "release", "free"]), st.integers(0, 40)),
        max_size=120,
    ),
    data=st.data(),
)
def test_the_index_reserves_what_the_scan_reserves(
    capacity: int, actions: list[tuple[str, int]], data: st.DataObject
) -> None:
    plain, indexed = _pair(capacity)
    for name, n in actions:
        before = plain.owner.copy()
        if name == "reserve":
            want: object
            try:
                want = plain.reserve(n).tolist()
            except HiCacheError as e:
                want = str(e)
            try:
                got: object = indexed.reserve(n).tolist()
            except HiCacheError as e:
                got = str(e)
            assert got == want
        else:
            source = {"publish": PRIVATE, "release": PRIVATE, "free": TREE}[name]
            held = np.flatnonzero(plain.owner == source).tolist()
            if not held:
                continue
            chosen = pages(data.draw(st.lists(st.sampled_from(held), min_size=1, unique=True)))
            getattr(plain, name)(chosen)
            getattr(indexed, name)(chosen)
        assert (plain.owner == indexed.owner).all()
        assert (plain.generation == indexed.generation).all()
        assert indexed.free_count == plain.free_count
        reserved = set(want) if name == "reserve" and isinstance(want, list) else set()
        changed = set(np.flatnonzero(plain.owner != before).tolist())
        assert indexed.take_moved() == changed | reserved
        fresh = copy.deepcopy(indexed)
        fresh.reindex()  # the index kept by the moves is the one built from scratch
        assert (fresh.runs, fresh.starts, fresh.lengths) == (
            indexed.runs,
            indexed.starts,
            indexed.lengths,
        )


def test_a_refused_move_changes_nothing() -> None:
    _, t = _pair(8)
    got = t.reserve(3)
    index = (dict(t.runs), list(t.starts))
    try:
        t.free(got)  # PRIVATE pages: free needs TREE
    except HiCacheError:
        pass
    assert (dict(t.runs), list(t.starts)) == index and (t.owner[got] == PRIVATE).all()
    assert t.free_count == 5 and (t.owner[5:] == FREE).all()


def test_an_all_free_table_is_one_run() -> None:
    """`reindex` of a table whose pages are all free (every plane's at the start of a replay;
    found without the scan) is one run of them all, as the scan finds; one page taken, the
    scan's runs around it."""
    for capacity in (1, 2, 7, 100_000):
        t = RunIndexTable.adopt(TierTable("L1", capacity), log=False)
        assert (t.runs, t.starts, t.lengths) == ({0: capacity}, [0], [capacity])
        assert (t.by_length, t.run_count, t.n_free) == ({capacity: [0]}, {capacity: 1}, capacity)
        assert t.reserve(1).tolist() == [0]
        if capacity > 1:
            t.reindex()
            assert (t.runs, t.starts, t.lengths, t.n_free) == (
                {1: capacity - 1},
                [1],
                [capacity - 1],
                capacity - 1,
            )
