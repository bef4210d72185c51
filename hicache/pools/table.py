"""Atomic group allocation: one page table per allocating pool of a tier's pool group.

A tier holding a pool group (hicache/pools/spec.py) keeps one `hicache.core.pages.PageTable` --
the FREE / PRIVATE / TREE ownership machine -- per pool with an allocator (the anchor and
every allocating side pool). A derived pool (sidecar or state) has no table: its indices
are its source's, so it is reserved, published, released and freed exactly once, through
its source, and asking it to `alloc`, `free` or report `available` pages raises
`NoAllocator` naming that source.

    pool        role        table   indices of a GroupPages
    ----------  ----------  ------  -------------------------
    kv          anchor      yes     gp.by_pool["kv"]
    swa         allocating  yes     gp.by_pool["swa"]
    c4, c128    sidecar     no      gp.by_pool["kv"]   (indices(pool, gp))
    c4_state    state       no      gp.by_pool["swa"]

Contract for callers (the group rules of spec/pools.md):

- `reserve_group` is all or nothing (R61). It takes the allocating pools in sorted name order
  (`PoolGroup.allocating`); a pool short of pages may call the caller's `reclaim(pool,
  pages_short)` at most once and retry once. When a pool still cannot be served, the pools
  already reserved in this call are released in reverse order -- their page tables, the
  generation counters included, are then as before the call -- and `OutOfPages` naming the
  pool (`<tier>.<pool>`) is raised. What the reclaim callback itself did (the caller's
  eviction, which may free pages of any pool) stays done.
- `publish_group`, `release_group` and `free_group` move every allocating pool exactly once,
  in the same sorted order, after checking every pool: a refused move changes no pool.
- The metrics (`free_pages_by_pool`, `used_pages_by_pool`) list allocating pools only: a
  derived pool has no free list to count (SGLang #39436: a metrics path asked a state pool
  for its available size and raised).

Faults for tests: `fault` (a `ReserveFault`, e.g. `PoolFaults`) is asked before every
reservation attempt of a pool; True makes that attempt fail as if the pool were out of
pages (`InjectedShortage`), so a test can fail pool k of n after pools 1..k-1 succeeded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from hicache.core.pages import PRIVATE, TREE, Pages, PageTable, pages
from hicache.errors import ConfigError, NoAllocator, OutOfPages
from hicache.pools.spec import PoolGroup

Reclaim = Callable[[str, int], None]
"""`reclaim(pool, pages_short)`: the caller's eviction, asked to free `pages_short` pages of
`pool` (it may free pages of other pools too). Called at most once per pool per reservation."""

ReserveFault = Callable[[str], bool]
"""`fault(pool)`: True makes this reservation attempt of `pool` fail as if out of pages."""


class InjectedShortage(OutOfPages):
    """An `OutOfPages` raised because the table's fault hook said so (tests only)."""


@dataclass
class PoolFaults:
    """A `ReserveFault`: `fail[pool]` is how many of the pool's next reservation attempts
    fail. With a reclaim callback, 1 fails the first attempt and lets the retry through; 2
    fails the whole reservation at that pool."""

    fail: dict[str, int] = field(default_factory=dict)

    def __call__(self, pool: str) -> bool:
        left = self.fail.get(pool, 0)
        if left <= 0:
            return False
        self.fail[pool] = left - 1
        return True


@dataclass(frozen=True)
class GroupPages:
    """The pages one group reservation holds in `tier`: for every allocating pool of the
    group, in sorted name order, its pages (one page array per pool, maybe empty). Derived
    pools have no entry: `GroupTable.indices` gives theirs."""

    tier: str
    by_pool: Mapping[str, Pages]

    @property
    def num_pages(self) -> dict[str, int]:
        return {name: int(p.size) for name, p in self.by_pool.items()}


class GroupTable:
    """Ownership and allocation of one tier's pool group: a `PageTable` per allocating pool,
    `capacity_pages[pool]` pages each (in that pool's pages)."""

    def __init__(
        self,
        tier: str,
        group: PoolGroup,
        capacity_pages: Mapping[str, int],
        fault: ReserveFault | None = None,
    ) -> None:
        allocating = [p.name for p in group.allocating]
        for name in capacity_pages:
            spec = group.pool(name)
            if not spec.has_allocator:
                raise ConfigError(
                    f"{tier}.{name}.capacity_pages",
                    f"a {spec.role} pool has no allocator; its capacity is {spec.source!r}'s",
                )
        missing = [name for name in allocating if name not in capacity_pages]
        if missing:
            raise ConfigError(
                f"{tier}.{missing[0]}.capacity_pages",
                f"every allocating pool needs a capacity; missing {missing}",
            )
        self.tier = tier
        self.group = group
        self.fault = fault
        self.tables: dict[str, PageTable] = {
            name: PageTable(f"{tier}.{name}", capacity_pages[name]) for name in allocating
        }
        for spec in group.pools:
            spec.check_window("pools", self.tables[spec.source].capacity, tier)

    # -- one pool ------------------------------------------------------------------------------

    def table(self, pool: str, operation: str = "table") -> PageTable:
        """The page table of allocating pool `pool`; NoAllocator for a derived pool (R62)."""
        spec = self.group.pool(pool)
        if not spec.has_allocator:
            raise NoAllocator(pool, operation, spec.source)
        return self.tables[pool]

    def alloc(self, pool: str, n: int) -> Pages:
        """FREE -> PRIVATE for `n` pages of one allocating pool (no group, no reclaim)."""
        return self.table(pool, "alloc").reserve(n)

    def free(self, pool: str, p: Pages) -> None:
        """TREE -> FREE for pages of one allocating pool."""
        self.table(pool, "free").free(p)

    def available(self, pool: str) -> int:
        """FREE pages of one allocating pool."""
        return self.table(pool, "available").free_count

    def indices(self, pool: str, gp: GroupPages) -> Pages:
        """Pool `pool`'s indices in reservation `gp`: its own, or its source's if derived."""
        self._verify_group_pages(gp, "indices")
        return gp.by_pool[self.group.pool(pool).source]

    # -- metrics -------------------------------------------------------------------------------

    def free_pages_by_pool(self) -> dict[str, int]:
        """FREE pages per allocating pool, in sorted name order; derived pools are skipped."""
        return {name: t.free_count for name, t in self.tables.items()}

    def used_pages_by_pool(self) -> dict[str, int]:
        """PRIVATE + TREE pages per allocating pool, in sorted name order (derived skipped)."""
        return {name: t.capacity - t.free_count for name, t in self.tables.items()}

    # -- the group -----------------------------------------------------------------------------

    def reserve_group(self, want: Mapping[str, int], reclaim: Reclaim | None = None) -> GroupPages:
        """FREE -> PRIVATE for `want[pool]` pages of every allocating pool (a pool not named
        gets none), all or nothing; see the module's contract. Raises OutOfPages naming the
        pool that could not be served, NoAllocator for a derived pool in `want`, ConfigError
        for an unknown pool and ValueError for a negative count (those two before anything)."""
        counts = self._counts(want)
        taken: dict[str, Pages] = {}
        done = False
        try:
            for name in self.tables:  # sorted name order
                taken[name] = self._reserve_pool(name, counts[name], reclaim)
            done = True
        finally:
            if not done:
                self._rollback(taken)
        return GroupPages(self.tier, taken)

    def publish_group(self, gp: GroupPages) -> None:
        """PRIVATE -> TREE in every allocating pool: the reservation becomes a node's value."""
        self._move_group(gp, PRIVATE, "publish")

    def release_group(self, gp: GroupPages) -> None:
        """PRIVATE -> FREE in every allocating pool: failure, cancel or abort."""
        self._move_group(gp, PRIVATE, "release")

    def free_group(self, gp: GroupPages) -> None:
        """TREE -> FREE in every allocating pool: eviction of a node's value."""
        self._move_group(gp, TREE, "free")

    # -- internals -----------------------------------------------------------------------------

    def _counts(self, want: Mapping[str, int]) -> dict[str, int]:
        """`want` checked, as a count for every allocating pool (0 when not named)."""
        for name, n in want.items():
            self.table(name, "alloc")  # ConfigError if unknown, NoAllocator if derived
            if not isinstance(n, (int, np.integer)) or n < 0:
                raise ValueError(f"{self.tier}.{name}: cannot reserve {n!r} pages")
        return {name: int(want.get(name, 0)) for name in self.tables}

    def _reserve_pool(self, name: str, n: int, reclaim: Reclaim | None) -> Pages:
        """One pool's reservation: try; if short, reclaim once (when given) and try again."""
        table = self.tables[name]
        if n == 0:
            return pages()  # nothing to run out of: the fault hook is not asked
        injected = False
        for attempt in range(2):
            injected = self.fault is not None and self.fault(name)
            if not injected and table.free_count >= n:
                return table.reserve(n)
            if attempt == 1 or reclaim is None:
                break
            # An injected shortage is as if nothing were free: the whole request is short.
            reclaim(name, n if injected else n - table.free_count)
        error = InjectedShortage if injected else OutOfPages
        raise error(table.tier, n, table.free_count)

    def _rollback(self, taken: Mapping[str, Pages]) -> None:
        """Release this call's reservations in reverse pool order, and undo their generation
        steps: the pages were never written, so each table is as before the call."""
        for name in reversed(list(taken)):
            table = self.tables[name]
            table.release(taken[name])
            table.generation[taken[name]] -= np.uint64(1)

    def _move_group(self, gp: GroupPages, source: int, event: str) -> None:
        """Apply PageTable.`event` to every pool of `gp`, in sorted order, once every pool's
        table has checked it (`PageTable.check_move`): the first refusal raises
        IllegalTransition before any pool is touched."""
        self._verify_group_pages(gp, event)
        for name, table in self.tables.items():
            table.check_move(gp.by_pool[name], source, event)
        for name, table in self.tables.items():
            getattr(table, event)(gp.by_pool[name])

    def _verify_group_pages(self, gp: GroupPages, event: str) -> None:
        # Verify the reservation is of this tier and names each allocating pool once, so no
        # derived pool is ever released on its own.
        if gp.tier != self.tier:
            raise ConfigError("group_pages.tier", f"{event}: pages of {gp.tier}, not {self.tier}")
        if set(gp.by_pool) != set(self.tables):
            for name in gp.by_pool:
                self.table(name, event)  # NoAllocator for a derived pool
            raise ConfigError(
                "group_pages.by_pool",
                f"{event}: names {list(gp.by_pool)}, needs {list(self.tables)}",
            )
