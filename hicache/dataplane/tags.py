"""Content tags: what the null data plane holds in place of bytes, so I4 runs without them.

A byte-free plane cannot compare bytes, but it can track where each page's content came
from. Every anchor page of every tier carries one uint64 tag, changed only where a real
plane's bytes would change:

    event                                tags of the pages it writes
    -----------------------------------  --------------------------------------------------
    a transfer issued (its targets are   fresh: a value no content has, as the garbage a
    reserved)                            reservation leaves would be (a sanitizer's fill)
    a compute of tokens t (prefill)      page i: a hash of t[: (i + 1) x page_size], so the
                                         same tokens give the same tag, as the same bytes
                                         would (a recompute matches its backed-up copy)
    a transfer that landed whole         its sources' tags, copied to its targets
    an S2H that stopped part way         its leading pages whose every pool's pages landed
                                         (each pool's landed run, in anchor pages); the
                                         rest keep their fresh tags
    (read) a corrupt or unreadable slot  UNSERVABLE (a read of it would fail, I4 exempts it)

The plane's `digests(tier, pages)` are these tags. I4 then catches, on the null plane and
without torch, a page published before its content arrived: a stopped S2H's clamp ignored
(F11), a failed or cancelled transfer published. Content tags are below 2**63 and fresh tags
at or above it, so a report shows which a page holds.

Contract: tags are kept per anchor page, one for all its pools (the null plane moves anchor
pages): a page's content arrived when every bound pool's pages of it did, which is the least
any clamp must demand. A tag changes only while its page is reserved (a transfer's target, a
compute's new page): the digest cache's rule (controller/digests.py). The landing of a
transfer is reported once, by its handle.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from hicache.core.pages import Pages
from hicache.core.snapshot import UNSERVABLE
from hicache.core.tiers import Direction, Tier

__all__ = ["FRESH", "ContentTags", "Lands", "content_tags"]

FRESH = np.uint64(1 << 63)  # fresh tags have this bit; content tags never do
Lands = Callable[["Mapping[str, int] | None"], None]  # a handle's landing: None, whole


def content_tags(
    tokens: Sequence[int], page_size: int, first: int, last: int
) -> npt.NDArray[np.uint64]:
    """The content tags of pages `first` .. `last` - 1 of `tokens` (page i covers tokens
    [i x page_size, (i + 1) x page_size)): a chained hash of every token through the page's
    end, below 2**63. ValueError unless 0 <= first <= last <= len(tokens) / page_size."""
    if not 0 <= first <= last or last * page_size > len(tokens):
        raise ValueError(f"pages {first}..{last} of {len(tokens)} tokens of {page_size} per page")
    out = np.empty(last - first, dtype=np.uint64)
    h = b""
    words = np.asarray(tokens[: last * page_size], dtype=np.int64)
    for i in range(last):
        h = hashlib.blake2b(
            h + words[i * page_size : (i + 1) * page_size].tobytes(), digest_size=8
        ).digest()
        if i >= first:
            out[i - first] = int.from_bytes(h, "little") >> 1
    return out


class ContentTags:
    """The tags of every anchor page of each tier (`capacity`: pages per tier), all fresh at
    first. `ratios`: the bound pools, each with its pages per anchor page, by which the
    per-pool report of an S2H that stopped part way is read (none until the plane binds its
    pools: such an S2H lands nothing)."""

    def __init__(self, capacity: Mapping[Tier, int], page_size: int) -> None:
        self.page_size = page_size
        self.ratios: dict[str, int] = {}
        self._next = itertools.count()
        self.tags = {tier: self._fresh(n) for tier, n in capacity.items()}

    def _fresh(self, n: int) -> npt.NDArray[np.uint64]:
        start = next(self._next)
        for _ in range(n - 1):
            next(self._next)
        return FRESH | np.arange(start, start + n, dtype=np.uint64)

    def reserve(self, tier: Tier, pages: Pages) -> None:
        """`pages` of `tier` were taken by a transfer: they hold what no content holds."""
        self.tags[tier][pages] = self._fresh(int(pages.size))

    def compute(self, tokens: Sequence[int], start: int, end: int, l1_pages: Pages) -> None:
        """Tokens `[start, end)` of `tokens` (page-aligned) were computed into `l1_pages`."""
        ps = self.page_size
        assert start % ps == 0 and end % ps == 0, "a compute writes whole pages"
        assert l1_pages.size == (end - start) // ps, "one L1 page per computed page"
        self.tags[Tier.L1][l1_pages] = content_tags(tokens, ps, start // ps, end // ps)

    def whole(self, landed: Mapping[str, int]) -> int:
        """Leading anchor pages whose every bound pool's pages are in `landed` (each pool's
        landed run, in its own pages); 0 while no pool is bound."""
        if not self.ratios:
            return 0
        return max(0, min(landed.get(pool, 0) // r for pool, r in self.ratios.items()))

    def lander(self, direction: Direction, source: Pages, target: Pages) -> Lands:
        """What a transfer's handle calls when its content arrives: with None (all of it) or a
        per-pool landing report (its `whole` leading pages are copied)."""
        src, dst = source.copy(), target.copy()

        def lands(landed: Mapping[str, int] | None) -> None:
            n = int(src.size) if landed is None else min(int(src.size), self.whole(landed))
            self.tags[direction.target][dst[:n]] = self.tags[direction.source][src[:n]]

        return lands

    def digests(self, tier: Tier, pages: Pages, unservable: set[int]) -> npt.NDArray[np.uint64]:
        """The tags of `pages` of `tier`; an L3 slot in `unservable`: UNSERVABLE."""
        out = self.tags[tier][pages].copy()
        if tier is Tier.L3 and unservable:
            out[np.isin(pages, np.fromiter(unservable, dtype=np.int64))] = UNSERVABLE
        return out
