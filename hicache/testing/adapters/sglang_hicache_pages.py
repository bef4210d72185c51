"""What sglang's HiCache tree holds, page by page and tier by tier, for
hicache/testing/adapters/sglang_hicache.py: the tree walked before and after each engine
call, its differences reported as page changes (protocol.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hicache.testing.adapters.sglang import walk_nodes
from hicache.testing.protocol import PENDING, PageChange

Prefix = tuple[int, ...]


class PageView:
    """Mixin: `cache` (a UnifiedRadixCache on sglang's Python TreeCore), `full` (its FULL
    component type), `page_size`, `tiers`, `_loading` (load ack -> the L1 pages it fills),
    `_pages` (the states when last compared) and `_diffs` (changes not yet reported)."""

    cache: Any
    full: Any
    page_size: int
    tiers: tuple[str, ...]
    _loading: dict[int, set[Prefix]]
    _pages: set[tuple[str, Prefix, str]]
    _diffs: list[PageChange]

    def _walk(self) -> list[tuple[Prefix, Any]]:
        return walk_nodes(self.cache.tree_core.root_node)

    def _pages_of(self, ends: Prefix, node: Any) -> list[Prefix]:
        ps, start = self.page_size, len(ends) - len(node.key)
        return [ends[:k] for k in range(start + ps, len(ends) + 1, ps)]

    def _l1_pages(self) -> set[Prefix]:
        full = self.full
        return {
            p
            for ends, node in self._walk()
            if node.component_data[full].value is not None
            for p in self._pages_of(ends, node)
        }

    def _states(self) -> set[tuple[str, Prefix, str]]:
        """Each page's state per tier. L1: a device value, PENDING while the load-back that
        gave it is not acknowledged (sglang publishes the value at issue; its forward waits
        on the copy's event). L2: a host value, PENDING while its write-through is pending."""
        self._loading = {
            a: p for a, p in self._loading.items() if a in self.cache.ongoing_load_back
        }
        loading = set().union(*self._loading.values())
        out = set[tuple[str, Prefix, str]]()
        for ends, node in self._walk():
            data = node.component_data[self.full]
            for p in self._pages_of(ends, node) if data.value is not None else ():
                out.add(("L1", p, PENDING if p in loading else "RESIDENT"))
            pending = node.write_through_pending_id is not None
            for p in self._pages_of(ends, node) if data.host_value is not None else ():
                out.add(("L2", p, PENDING if pending else "RESIDENT"))
        return out

    def _hits(self, tokens: Sequence[int]) -> dict[str, int]:
        """Each tier's leading run of RESIDENT pages of tokens[:len-1], as the walk sees."""
        held = {(t, p) for t, p, s in self._states() if s == "RESIDENT"}
        hits = {}
        for tier in self.tiers:
            k = self.page_size
            while k <= len(tokens) - 1 and (tier, tuple(tokens[:k])) in held:
                k += self.page_size
            hits[tier] = k - self.page_size
        return hits

    def _track(self, call: Any) -> Any:
        """Run one engine call, keeping the page changes it made."""
        self._diffs += self._diff()
        try:
            return call()
        finally:
            self._diffs += self._diff()

    def changes(self) -> list[PageChange]:
        out, self._diffs = self._diffs + self._diff(), []
        return out

    def _diff(self) -> list[PageChange]:
        now = self._states()
        was = {(t, p): s for t, p, s in self._pages}
        cur = {(t, p): s for t, p, s in now}
        self._pages = now
        gone = sorted((k for k in was if k not in cur), key=lambda k: (k[0], -len(k[1]), k[1]))
        moved = sorted((k for k in cur if was.get(k) != cur[k]), key=lambda k: (k[0], len(k[1])))
        return [PageChange(t, p, "ABSENT") for t, p in gone] + [
            PageChange(t, p, cur[(t, p)]) for t, p in moved
        ]
