"""Page digests for invariant I4, cached per (tier, page, generation).

A page's bytes may change only while it is PRIVATE (written by a compute or a transfer); the
page table bumps the page's generation at every reservation. I4 asks only for published
(TREE) pages, whose content is immutable until the page is freed and reserved again -- so a
digest computed once for a (page, generation) stays right, and checking I4 after every
transition costs digests of new pages only, not of the whole cache.

What this cannot see: a write into a published page that bypasses reservation (a kernel
writing the wrong page). The stateful fuzzer runs without the cache for that.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from hicache.core.pages import Pages, PageTable
from hicache.core.tiers import TIERS

Digests = Callable[[str, Pages], npt.NDArray[np.uint64]]


class CachedDigests:
    def __init__(self, digests: Digests, tables: Sequence[PageTable]) -> None:
        self.digests = digests
        self.tables = {str(t): table for t, table in zip(TIERS, tables)}
        self.value = {t: np.zeros(tab.capacity, np.uint64) for t, tab in self.tables.items()}
        self.valid_for = {
            t: np.full(tab.capacity, np.iinfo(np.uint64).max, np.uint64)
            for t, tab in self.tables.items()
        }
        self.computed = 0  # pages digested (misses)

    def __call__(self, tier: str, p: Pages) -> npt.NDArray[np.uint64]:
        gen = self.tables[tier].generation[p]
        stale = p[self.valid_for[tier][p] != gen]
        if stale.size:
            stale = np.unique(stale)
            self.value[tier][stale] = self.digests(tier, stale)
            self.valid_for[tier][stale] = self.tables[tier].generation[stale]
            self.computed += int(stale.size)
        return self.value[tier][p]
