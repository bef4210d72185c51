"""The reference's page table as the checker runs it: the same choices, at a cost per page moved.

`PageTable.reserve` finds its pages (the shortest free run that holds them, the first of the
shortest; else the lowest free pages) by scanning the whole owner array: O(capacity) per
reservation, most of a replay's time once a tier has 100,000 pages. `RunIndexTable` is a
`PageTable` whose free pages are also kept as maximal runs, so the same pages are found in
O(log runs) (the lowest-pages fallback, when no run holds them, still scans), and which logs
the pages each move touched (`moved`: what the touched checks read instead of comparing the
whole owner array after every call).

    kept                      what for
    ------------------------  -----------------------------------------------------------
    runs: start -> length     the free runs, maximal (no two touch)
    starts: sorted            the run holding a page (bisect), for a move of given pages
    by_length: length ->      the first run of the shortest length >= n (a heap of starts
      heap of starts          per length, stale entries dropped when met)
    lengths: sorted           the lengths some run has
    moved: set | None         pages whose owner code changed since the log was taken

Every change of the owner array goes through `reserve` and `_move` (R2), which keep the
index; a write to `owner` from outside (a test corrupting the plane) is not seen by it.
`adopt` turns a plane's plain table into one in place (every holder of it keeps it).
"""

from __future__ import annotations

import bisect
import heapq

import numpy as np

from hicache.core.pages import FREE, PRIVATE, Pages, pages
from hicache.errors import OutOfPages
from hicache.pools.tiertable import TierTable


class RunIndexTable(TierTable):
    """A single pool's `TierTable` with an index of its free runs (the module docstring)."""

    runs: dict[int, int]
    starts: list[int]
    by_length: dict[int, list[int]]
    run_count: dict[int, int]  # runs per length
    lengths: list[int]
    n_free: int
    moved: set[int] | None

    @classmethod
    def adopt(cls, table: TierTable, log: bool) -> RunIndexTable:
        """`table` itself, now a RunIndexTable indexing its owner array as it is; `log`: keep
        `moved` (else None)."""
        table.__class__ = cls
        assert isinstance(table, RunIndexTable)  # Verify: the class swap took.
        table.reindex()
        table.moved = set() if log else None
        return table

    def reindex(self) -> None:
        """The index from the owner array (at adoption)."""
        self.runs, self.starts, self.by_length = {}, [], {}
        self.run_count, self.lengths = {}, []
        if not (self.owner != FREE).any():  # every page free (a new plane's): one run
            self.n_free = int(self.owner.size)  # (the scan below: ~0.75 ms at 100,000 pages)
            if self.n_free:
                self._add(0, self.n_free)
            return
        free = np.flatnonzero(self.owner == FREE)
        self.n_free = int(free.size)
        if free.size:
            breaks = np.flatnonzero(np.diff(free) != 1) + 1
            firsts = np.concatenate(([0], breaks))
            lasts = np.concatenate((breaks, [free.size]))
            for a, b in zip(firsts.tolist(), lasts.tolist()):
                self._add(int(free[a]), b - a)

    def clone(self) -> RunIndexTable:
        new = super().clone()
        assert isinstance(new, RunIndexTable)  # Verify: clone keeps the class.
        new.reindex()
        new.moved = None if self.moved is None else set(self.moved)
        return new

    @property
    def free_count(self) -> int:
        return self.n_free

    # -- the runs -----------------------------------------------------------------------------

    def _add(self, start: int, length: int) -> None:
        self.runs[start] = length
        bisect.insort(self.starts, start)
        k = self.run_count.get(length, 0)
        if k == 0:
            bisect.insort(self.lengths, length)
            self.by_length[length] = [start]
        else:
            heap = self.by_length[length]
            heapq.heappush(heap, start)
            if len(heap) > 2 * k + 16:  # stale entries: keep the heap's size bounded
                live = {s for s in heap if self.runs.get(s) == length}
                heap[:] = sorted(live)
        self.run_count[length] = k + 1

    def _drop(self, start: int) -> int:
        length = self.runs.pop(start)
        del self.starts[bisect.bisect_left(self.starts, start)]
        k = self.run_count[length] - 1
        if k:
            self.run_count[length] = k  # the heap's entry goes stale, dropped when met
        else:
            del self.run_count[length], self.by_length[length]
            del self.lengths[bisect.bisect_left(self.lengths, length)]
        return length

    def _take(self, first: int, end: int) -> None:
        """Pages [first, end), all free, leave the index."""
        s = self.starts[bisect.bisect_right(self.starts, first) - 1]
        length = self._drop(s)
        # Verify: the pages are free, in one run (the owner array said so before the move).
        assert s <= first and end <= s + length
        if first > s:
            self._add(s, first - s)
        if end < s + length:
            self._add(end, s + length - end)
        self.n_free -= end - first

    def _give(self, first: int, end: int) -> None:
        """Pages [first, end), none free before, join the index (merged with their
        neighbours)."""
        self.n_free += end - first
        i = bisect.bisect_left(self.starts, first)
        if i and (s := self.starts[i - 1]) + self.runs[s] == first:
            first = s
            self._drop(s)
        if end in self.runs:
            end += self._drop(end)
        self._add(first, end - first)

    def _segments(self, listed: list[int]) -> list[tuple[int, int]]:
        """Sorted pages (no repeats) as maximal [first, end) segments."""
        out: list[tuple[int, int]] = []
        for p in listed:
            if out and out[-1][1] == p:
                out[-1] = (out[-1][0], p + 1)
            else:
                out.append((p, p + 1))
        return out

    def _fit(self, n: int) -> int | None:
        """The first page of the first of the shortest free runs that hold `n` pages, or None
        when no run does."""
        i = bisect.bisect_left(self.lengths, n)
        if i == len(self.lengths):
            return None
        length = self.lengths[i]
        heap = self.by_length[length]
        while heap and self.runs.get(heap[0]) != length:
            heapq.heappop(heap)  # a stale entry
        # Verify: a length listed has a live run (run_count > 0 keeps it listed).
        assert heap
        return heap[0]

    def _best_fit(self, n: int) -> Pages:
        """`hicache.core.pages._best_fit_run`'s choice, from the index."""
        s = self._fit(n)
        if s is not None:
            return np.arange(s, s + n, dtype=np.int64)
        return np.flatnonzero(self.owner == FREE)[:n].astype(np.int64)  # no run holds n

    # -- moves ------------------------------------------------------------------------------

    def reserve(self, n: int) -> Pages:
        if n < 0:
            raise ValueError(f"cannot reserve {n} pages")
        if self.n_free < n:
            raise OutOfPages(self.tier, n, self.n_free)
        s = self._fit(n) if n else None
        if s is not None:  # the common case: one run, written as slices
            self._take(s, s + n)
            if self.moved is not None:
                self.moved.update(range(s, s + n))
            chosen = np.arange(s, s + n, dtype=np.int64)
            self.owner[s : s + n] = PRIVATE
            generation = self.generation[s : s + n]  # a view: the add writes in place
            generation += np.uint64(1)
        else:
            chosen = self._best_fit(n) if n else pages()
            listed = chosen.tolist()
            for first, end in self._segments(listed):
                self._take(first, end)
            if self.moved is not None:
                self.moved.update(listed)
            self.owner[chosen] = PRIVATE
            self.generation[chosen] += np.uint64(1)
        if self.on_reserve is not None:
            self.on_reserve(chosen)
        return chosen

    def _move(self, p: Pages, source: int, dest: int, name: str) -> list[int]:
        # `PageTable._move` checks and writes (R2, R3); then the index and the log, from the
        # page list it built (or one made here for a large move).
        p = pages(p)
        listed = super()._move(p, source, dest, name)
        if listed is None:
            listed = p.tolist()
        if source == FREE or dest == FREE:
            listed.sort()
            if source == FREE:
                for first, end in self._segments(listed):
                    self._take(first, end)
            else:
                for first, end in self._segments(listed):
                    self._give(first, end)
        if self.moved is not None:
            self.moved.update(listed)
        return listed

    def take_moved(self) -> set[int]:
        """The pages moved since the last call (the log restarts empty)."""
        assert self.moved is not None  # Verify: the table was adopted with a log.
        out, self.moved = self.moved, set()
        return out
