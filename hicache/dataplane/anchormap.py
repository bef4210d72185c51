"""Anchor pages -> pool pages: the checked mapping every byte path of the engine moves by.

The controller names *anchor* pages (a tree value is anchor pages). A pool group's other
allocating pools have pages of their own, which the control plane's per-tier tables answer
(`TierPools.pool_pages`, given as `PoolPages`); derived pools take their source's:

    anchor pages   a0 a1 a2           ->   pool_pages("L1", [a0 a1 a2])
    kv  (anchor)   a0 a1 a2                 c4, c128 ... move these pages
    swa            s0 s1 s2 (x ratio)       c4_state ... move these pages

A group whose only allocating pool is its anchor (a group of one; MLA) needs no answer: its
anchor pages are its pool pages (`AnchorMap.of_one`).

Contract: `pages` checks a transfer's page arguments with the null engine's function
(`null.transfer_pages`), so every plane raises InvalidPages for the same inputs; `pool_pages`
then checks the answer -- every allocating pool named, `ratio` pages per anchor page, in
range, the anchor's own entry equal to the anchor pages -- and raises InvalidPages naming
the pool otherwise. A refused call issues nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from hicache.core.pages import Pages
from hicache.core.snapshot import TOMBSTONE
from hicache.core.tiers import Direction, Tier
from hicache.dataplane.null import page_array, transfer_pages
from hicache.errors import ConfigError, InvalidPages

PoolPages = Callable[[str, Pages], Mapping[str, object]]
"""(tier "L1" | "L2" | "L3", anchor pages) -> pages per allocating pool, anchor included,
`ratio` pages per anchor page in anchor order (the control plane's `TierPools.pool_pages`)."""


class AnchorMap:
    """The checked anchor -> pool pages mapping of one engine (module docstring).

    `capacity`: anchor pages (L3: anchor slots) per tier; `pool_caps`: own pages per
    allocating pool and tier; `ratios`: own pages per anchor page, by allocating pool;
    `anchor`: the anchor pool's name; `pool_pages`: the control plane's answer, None until
    `bind` for a group of several allocating pools (a group of one maps to itself)."""

    def __init__(
        self,
        capacity: Mapping[Tier, int],
        pool_caps: Mapping[Tier, Mapping[str, int]],
        ratios: Mapping[str, int],
        anchor: str,
        pool_pages: PoolPages | None,
    ) -> None:
        self.capacity = capacity
        self.pool_caps = pool_caps
        self.ratios = ratios
        self.anchor = anchor
        self._pool_pages = self._itself if self.of_one else pool_pages

    def _itself(self, tier: str, pages: Pages) -> Mapping[str, object]:
        return {self.anchor: pages}

    @property
    def of_one(self) -> bool:
        """Whether the anchor is the only allocating pool: its pages are every pool's."""
        return list(self.ratios) == [self.anchor]

    def bind(self, pool_pages: PoolPages | None) -> None:
        """Take the control plane's mapping (None: forget it, as a closed engine does). A
        group of one maps to itself whatever it is given: there is nothing to ask."""
        self._pool_pages = self._itself if pool_pages is not None and self.of_one else pool_pages

    def pages(self, direction: Direction, source: object, target: object) -> tuple[Pages, Pages]:
        """A transfer's validated anchor pages, source first (InvalidPages otherwise)."""
        return transfer_pages(
            direction,
            source,
            target,
            self.capacity[direction.source],
            self.capacity[direction.target],
        )

    def request(
        self, direction: Direction, source: object, target: object
    ) -> dict[str, tuple[Pages, Pages]]:
        """Per allocating pool, (source pages, target pages) of a transfer's anchor pages."""
        src, dst = self.pages(direction, source, target)
        a = self.pool_pages(direction.source, src)
        b = self.pool_pages(direction.target, dst)
        return {name: (a[name], b[name]) for name in self.ratios}

    def pool_pages(
        self, tier: Tier, anchor_pages: Pages, *, freed: bool = False
    ) -> dict[str, Pages]:
        """Every allocating pool's pages for validated `anchor_pages` of `tier`, checked
        against the contract; InvalidPages naming the pool otherwise. `freed`: let a freed
        window's pages through as `TOMBSTONE` (to read what is left of a page, never to move
        it: every transfer asks without)."""
        if self._pool_pages is None:
            raise ConfigError(
                "pool_pages",
                "the group engine has no control plane mapping: build it with pool_pages, "
                "or bind(pool_pages) one built before its control plane",
            )
        mapped = self._pool_pages(tier.value, anchor_pages)
        out: dict[str, Pages] = {}
        for name, ratio in self.ratios.items():
            field = f"{tier}.pool_pages.{name}"
            if name not in mapped:
                raise InvalidPages(field, f"the control plane named no pages of pool {name!r}")
            raw = np.asarray(mapped[name], dtype=np.int64)
            gone = raw == TOMBSTONE if freed else np.zeros(raw.shape, dtype=bool)
            ids = page_array(field, np.where(gone, 0, raw), self.pool_caps[tier][name])
            ids[gone] = TOMBSTONE
            # Verify `ratio` pages per anchor page: a short list would leave pages unmoved.
            if ids.size != anchor_pages.size * ratio:
                raise InvalidPages(
                    field, f"{ids.size} pages for {anchor_pages.size} anchor pages of ratio {ratio}"
                )
            out[name] = ids
        # Verify the anchor maps to itself: the tree's values are anchor pages.
        if not np.array_equal(out[self.anchor], anchor_pages):
            raise InvalidPages(
                f"{tier}.pool_pages.{self.anchor}",
                "the anchor's pages must be the anchor pages asked for",
            )
        return out
