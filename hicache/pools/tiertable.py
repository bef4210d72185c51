"""A tier's page table as the control plane sees it: a pool group, a single pool a group of one.

The control plane keeps one table per tier. For a preset of several pools it is a
`hicache.pools.tierpools.TierPools` (the anchor's pages, every side pool following them); for
a single pool it is a `TierTable`, the one pool's `hicache.core.pages.PageTable` answering the same
group questions, so that no caller asks which kind it holds (issue 34: "a single pool is a
group of one"). Its answers:

    pools                   (pool,)           the tier's pools; more than one: a group to name
    group_name              ""                a group of one has nothing to name
    pool_tables()           {pool: self}      every allocating pool's page table
    free_pages_by_pool()    {pool: free}      FREE pages per allocating pool
    held_by                 {}                side pools' pages per anchor page: none
    window                  ()                trailing side pools: nothing to tombstone
    window_present(p)       all True          every page holds its (empty) window
    pool_views()            ()                the snapshot's side-pool records: none
    side_key()              ()                the side pools' part of a state key: none
    set_reserve_fault(f)    f(pool) asked before each `reserve` (tests)

Where a record names the group and a single pool names none (the trace header's `pools`,
`usage`'s `free.<pool>`, a rank view's pool names, the model checker's side-pool key part),
the caller asks `len(table.pools) > 1`: the same answer for every table of one kind.

The ownership transitions and the allocator are `PageTable`'s, unchanged: this class adds
no work to them but the fault hook's one check in `reserve`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from hicache.core.pages import Pages, PageTable, pages
from hicache.core.snapshot import PoolView
from hicache.errors import ConfigError
from hicache.pools.table import InjectedShortage, ReserveFault

SINGLE_POOL_NAME = "kv"
"""A single pool's name when no group names it: the anchor of the single-pool preset `mha`
(spec/pools.toml; tests/test_tiertable.py holds them equal)."""

_NO_SIDE_POOLS: Mapping[str, npt.NDArray[np.int64]] = MappingProxyType({})


class TierTable(PageTable):
    """One tier's `capacity` pages of pool `pool`, and the tier's pool group when that pool is
    all of it (a group of one). `TierPools` answers the same interface for several pools."""

    held_by: Mapping[str, npt.NDArray[np.int64]] = _NO_SIDE_POOLS
    """Per side pool, the `ratio` pages each anchor page holds (a group of one: none)."""
    window: tuple[str, ...] = ()
    """The trailing side pools a freed window frees (a group of one: none)."""
    group_name = ""
    """The pool group's preset name when it has several pools (a group of one: "")."""

    def __init__(self, tier: str, capacity: int, pool: str = SINGLE_POOL_NAME) -> None:
        super().__init__(tier, capacity)
        if not pool:
            raise ConfigError(f"{tier}.pool", "a tier table's pool needs a name")
        self.pool = pool
        """The pool this table is the free list of (a group's: the anchor)."""
        self.reserve_fault: ReserveFault | None = None
        """Asked `reserve_fault(pool)` before each `reserve` of n > 0 pages; True raises
        InjectedShortage, nothing changed (tests: `set_reserve_fault`). None: never asked."""

    # -- the group interface --------------------------------------------------------------------

    @property
    def pools(self) -> tuple[str, ...]:
        """The names of the tier's pools in group order (anchor first): here `(pool,)`."""
        return (self.pool,)

    def pool_tables(self) -> Mapping[str, PageTable]:
        """The page table of every allocating pool, by pool name: here this one."""
        return {self.pool: self}

    def free_pages_by_pool(self) -> dict[str, int]:
        """FREE pages per allocating pool, in its own pages: the one pool's `free_count`."""
        return {self.pool: self.free_count}

    def window_present(self, p: Pages) -> npt.NDArray[np.bool_]:
        """Per anchor page of `p`: whether it holds its window. True for every page: a group
        of one has no trailing side pool to free."""
        return np.ones(pages(p).size, dtype=bool)

    def pool_views(self) -> tuple[PoolView, ...]:
        """Each side pool's records for the snapshot: none."""
        return ()

    def side_key(self) -> tuple[object, ...]:
        """The side pools' part of a state key (owners, generations, held-by maps): none."""
        return ()

    def set_reserve_fault(self, fault: ReserveFault | None) -> None:
        """Ask `fault(pool)` before each reservation attempt of each allocating pool; True
        fails it with InjectedShortage, nothing changed (tests: pool k of n fails after pools
        1..k-1 were reserved). None: no fault."""
        self.reserve_fault = fault

    @contextmanager
    def faults_off(self) -> Iterator[None]:
        """No injected reservation fault inside (a tensor-parallel rank's refused issue still
        takes its op and pages, as every rank does: spec/tp.md C2, the deferred reserve)."""
        fault, self.reserve_fault = self.reserve_fault, None
        try:
            yield
        finally:
            self.reserve_fault = fault

    # -- allocation -----------------------------------------------------------------------------

    def reserve(self, n: int) -> Pages:
        """`PageTable.reserve`, after the fault hook (when set) is asked for n > 0 pages."""
        fault = self.reserve_fault
        if fault is not None and n > 0 and fault(self.pool):
            raise InjectedShortage(self.tier, n, self.free_count)
        return super().reserve(n)
