"""Per-tier page tables: who owns each physical page, and the allocator.

The ownership vocabulary lives here, at the bottom of the control plane: `Pages` (an int64
page array), `pages()` (its constructor) and the ownership codes FREE / PRIVATE / TREE. Every
other module -- the tree, the data plane, the snapshot and the invariant checker -- imports it
from here.

One `PageTable` per tier holds the ownership machine of spec/lifecycle.toml [ownership] for
every physical page of the tier, in one uint8 array (FREE / PRIVATE / TREE). Each method is
one ownership transition over a batch of pages; it checks every page first and raises
`IllegalTransition` with nothing changed if any page is in the wrong state.

A tier holds a *pool group* (spec/pools.md, hicache.pools): one `PageTable` is the free list
of one allocating pool (for plain MHA, the group's one pool). Sidecar and state pools have no
table: they use their source's indices.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Self

import numpy as np
import numpy.typing as npt

from hicache.core.tiers import MAX_PAGES
from hicache.errors import ConfigError, IllegalTransition, OutOfPages

Pages = npt.NDArray[np.int64]
"""Physical page indices of one tier, in the order a record holds them (int64, 1-D)."""

# Codes of the physical-page ownership machine (spec/lifecycle.toml [ownership]): every page of
# every tier is, at every moment, exactly one of these.
FREE = 0
PRIVATE = 1
TREE = 2
OWNER_NAMES = ("FREE", "PRIVATE", "TREE")

SMALL_MOVE = 16  # pages: up to this many per move, plain Python checks them faster than numpy
SMALL_FREE = 256  # free pages: up to this many, the best-fit search runs in plain Python

Placement = Callable[[Pages, int], Pages]
"""Which `n` of the sorted free pages a reservation takes: `n` distinct pages of them, a
function of the free set and `n` alone (R69)."""


def pages(values: object = ()) -> Pages:
    """An int64 page array from any sequence (the one constructor every record uses): a
    1-D int64 array is returned as it is (no copy, as `np.asarray` makes none either)."""
    if type(values) is np.ndarray and values.ndim == 1 and values.dtype is _INT64:
        return values
    return np.asarray(values, dtype=np.int64).reshape(-1)


_INT64 = np.dtype(np.int64)


class PageTable:
    """Ownership and allocation of one tier's `capacity` physical pages."""

    def __init__(self, tier: str, capacity: int) -> None:
        if not 0 < capacity <= MAX_PAGES:
            raise ConfigError(
                f"{tier}.capacity_pages", f"in 1..{MAX_PAGES} (MAX_PAGES), got {capacity}"
            )
        self.tier = tier
        self.capacity = capacity
        self.owner: npt.NDArray[np.uint8] = np.zeros(capacity, dtype=np.uint8)  # all FREE
        # Per page, how many times it was reserved: a page's bytes may change only while it is
        # PRIVATE, so (page, generation) names one immutable content once it is published.
        self.generation: npt.NDArray[np.uint64] = np.zeros(capacity, dtype=np.uint64)
        self.placement: Placement | None = None
        """Another allocator than the reference's best fit (`reserve`): the fuzz's stand-in
        for an engine whose free list has fragmented (`spread`). None: best fit."""
        self.on_reserve: Callable[[Pages], None] | None = None
        """Called with the pages of each reservation once they are PRIVATE: an observer
        outside the control plane (the fuzz's poisoning of reserved pages, ControllerAdapter);
        None: no call."""

    def clone(self) -> Self:
        """An independent copy of the same class: the owner and generation arrays copied, the
        rest shared."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.owner = self.owner.copy()
        new.generation = self.generation.copy()
        return new

    # -- counts ---------------------------------------------------------------------------

    def count(self, state: int) -> int:
        return int(np.count_nonzero(self.owner == state))

    @property
    def free_count(self) -> int:
        return self.count(FREE)

    def free_pages(self) -> Pages:
        return np.flatnonzero(self.owner == FREE).astype(np.int64)

    # -- ownership transitions --------------------------------------------------------------

    def reserve(self, n: int) -> Pages:
        """FREE -> PRIVATE for `n` pages; a consecutive run when one exists (best fit: the
        shortest run that holds `n`), else the lowest-numbered free pages. OutOfPages if fewer
        than `n` are free (nothing changes). A function of the free set and `n` alone, so that
        tensor-parallel ranks with equal free sets reserve equal pages (R69); so is a
        `placement`, which chooses instead when set."""
        if n < 0:
            raise ValueError(f"cannot reserve {n} pages")
        idx = np.flatnonzero(self.owner == FREE)
        if idx.size < n:
            raise OutOfPages(self.tier, n, int(idx.size))
        if self.placement is None:
            chosen = _best_fit_run(idx, n)
        else:
            chosen = pages(self.placement(idx, n))
            # Verify the placement took n distinct free pages: anything else breaks I1.
            assert chosen.size == n and np.unique(chosen).size == n, (n, chosen)
            assert bool(np.isin(chosen, idx).all()), (chosen, idx)
        self.owner[chosen] = PRIVATE
        self.generation[chosen] += np.uint64(1)
        if self.on_reserve is not None:
            self.on_reserve(chosen)
        return chosen

    def reserve_exact(self, chosen: Pages) -> None:
        """FREE -> PRIVATE for exactly these pages (replay, tests)."""
        self._move(chosen, FREE, PRIVATE, "reserve")
        self.generation[pages(chosen)] += np.uint64(1)
        if self.on_reserve is not None:
            self.on_reserve(pages(chosen))

    def publish(self, p: Pages) -> None:
        """PRIVATE -> TREE: the pages become part of a node's value."""
        self._move(p, PRIVATE, TREE, "publish")

    def release(self, p: Pages) -> None:
        """PRIVATE -> FREE: failure, cancel, abort or duplicate insert."""
        self._move(p, PRIVATE, FREE, "release")

    def free(self, p: Pages) -> None:
        """TREE -> FREE: eviction or invalidation of a node's value."""
        self._move(p, TREE, FREE, "free")

    def check_move(self, p: Pages, source: int, name: str) -> None:
        """Verify transition `name` may move pages `p` out of state `source`: every page in
        range, named once and in `source`. IllegalTransition naming the first problem
        otherwise; changes nothing (a group checks every pool's table before moving one)."""
        p = pages(p)
        if p.size <= SMALL_MOVE:
            self._check_small(p.tolist(), source, name)
        else:
            self._check_large(p, source, name)

    def _move(self, p: Pages, source: int, dest: int, name: str) -> list[int] | None:
        """Move pages `p` from `source` to `dest` (transition `name`). Returns the pages as
        a list where one was built for the check (a small move), else None: a subclass that
        indexes the pages it moved need not list them again."""
        # R2: the only way a page changes owner; R3: every page is checked before one moves.
        p = pages(p)
        if p.size <= SMALL_MOVE:
            listed: list[int] = p.tolist()
            self._check_small(listed, source, name)
            owner = self.owner
            for x in listed:
                owner[x] = dest
            return listed
        self._check_large(p, source, name)
        self.owner[p] = dest
        return None

    def _check_large(self, p: Pages, source: int, name: str) -> None:
        # Verify every page is in range, named once, and in the source state before any write.
        if p.size and (p.min() < 0 or p.max() >= self.capacity):
            raise IllegalTransition(
                name, self.tier, "-", f"page out of range 0..{self.capacity - 1}"
            )
        if np.unique(p).size != p.size:
            raise IllegalTransition(name, self.tier, "-", "a page is named twice")
        wrong = p[self.owner[p] != source]
        if wrong.size:
            self._wrong(name, source, [int(x) for x in wrong])

    def _check_small(self, listed: list[int], source: int, name: str) -> None:
        """`_check_large` for a few pages, in plain Python (numpy's per-call cost dominates
        there): the same checks, in the same order, with the same errors."""
        # Verify every page is in range, named once, and in the source state before any write.
        if listed and (min(listed) < 0 or max(listed) >= self.capacity):
            raise IllegalTransition(
                name, self.tier, "-", f"page out of range 0..{self.capacity - 1}"
            )
        if len(set(listed)) != len(listed):
            raise IllegalTransition(name, self.tier, "-", "a page is named twice")
        owner = self.owner
        wrong = [x for x in listed if owner[x] != source]
        if wrong:
            self._wrong(name, source, wrong)

    def _wrong(self, name: str, source: int, wrong: list[int]) -> None:
        """IllegalTransition for pages `wrong` (in the order named) not in state `source`."""
        got = OWNER_NAMES[int(self.owner[wrong[0]])]
        raise IllegalTransition(
            name,
            self.tier,
            got,
            f"page {wrong[0]} is {got}, {name} needs {OWNER_NAMES[source]} "
            f"({len(wrong)} page(s) wrong)",
        )


def spread(free_idx: Pages, n: int) -> Pages:
    """`n` pages spread evenly over the sorted free pages `free_idx` (a `Placement`): as far
    apart as the free pages allow, so a reservation is as many runs as it can be -- what an
    engine's free list gives after long churn, where the best fit would find one run."""
    return free_idx[(np.arange(n) * free_idx.size) // max(n, 1)].astype(np.int64)


def half_spread(free_idx: Pages, n: int) -> Pages:
    """The first ceil(n / 2) pages by best fit (one run where the free pages hold one), the
    rest spread evenly over the free pages that do not touch that run, centred (a `Placement`;
    over the other free pages when those are too few): a reservation of one long run and
    separate pages -- a free list part compacted, part churned, whose transfers mix runs long
    enough for their own DMA with single pages."""
    head = _best_fit_run(free_idx, -(-n // 2))
    k = n - head.size
    if k == 0:
        return head
    apart = free_idx[(free_idx < head[0] - 1) | (free_idx > head[-1] + 1)]
    rest = apart if apart.size >= k else free_idx[~np.isin(free_idx, head)]
    return np.concatenate((head, rest[((2 * np.arange(k) + 1) * rest.size) // (2 * k)]))


def _best_fit_run(free_idx: Pages, n: int) -> Pages:
    """`n` pages from sorted free indices: the shortest consecutive run of length >= n (the
    first of the shortest), else the lowest `n`. Vectorised: O(free pages); plain Python for
    up to SMALL_FREE free pages, where numpy's per-call cost is most of the time."""
    if n == 0:
        return pages()
    if free_idx.size <= SMALL_FREE:
        return pages(_best_fit_small(free_idx.tolist(), n))
    breaks = np.flatnonzero(np.diff(free_idx) != 1) + 1
    starts = np.concatenate(([0], breaks))
    lengths = np.diff(np.concatenate((starts, [free_idx.size])))
    fits = np.flatnonzero(lengths >= n)
    if fits.size:
        best = fits[np.argmin(lengths[fits])]
        s = int(starts[best])
        return free_idx[s : s + n].astype(np.int64)
    return free_idx[:n].astype(np.int64)


def _best_fit_small(free: list[int], n: int) -> list[int]:
    """`_best_fit_run` over a list: the same choice, run by run."""
    best_start, best_len = -1, 0
    start = 0
    for i in range(1, len(free) + 1):
        if i == len(free) or free[i] != free[i - 1] + 1:
            length = i - start
            if length >= n and (best_start < 0 or length < best_len):
                best_start, best_len = start, length
            start = i
    if best_start < 0:
        return free[:n]
    return free[best_start : best_start + n]
