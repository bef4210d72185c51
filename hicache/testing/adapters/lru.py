"""A plain LRU prefix cache without tiers: the smallest engine the machine can drive.

It shows what a port must supply (`CacheUnderTest`), with no transfers at all: one tier
("L1") of `capacity` pages, each named by its token prefix; a request is served from the
leading run of its prompt's pages that are cached, and `prefill` caches the prompt's whole
pages, evicting least recently used pages that no live request is served from.

`ForgetfulLRU` is the same cache with one bug -- it drops the least recently used page
without reporting it -- so that a test (and the README) can show what the machine says when
an engine is wrong.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from hicache.errors import HiCacheError
from hicache.testing.adapters.notransfers import WithoutTransfers
from hicache.testing.protocol import Admission, PageChange

Prefix = tuple[int, ...]


class LRUCache(WithoutTransfers):
    """`CacheUnderTest` over an OrderedDict of page prefixes (oldest first)."""

    tiers: tuple[str, ...] = ("L1",)

    def __init__(self, capacity: int = 6, page_size: int = 4) -> None:
        self.capacity, self.page_size = capacity, page_size
        self.pages: OrderedDict[Prefix, None] = OrderedDict()
        self.requests: dict[int, tuple[tuple[int, ...], int]] = {}  # id -> (tokens, cached_len)
        self._changes: list[PageChange] = []

    def _prefixes(self, tokens: Sequence[int], end: int) -> list[Prefix]:
        return [tuple(tokens[:k]) for k in range(self.page_size, end + 1, self.page_size)]

    def submit(self, request_id: int, tokens: Sequence[int]) -> Admission:
        if request_id in self.requests:
            raise HiCacheError(f"request {request_id} is already live; finish it first")
        hit = 0
        for p in self._prefixes(tokens, len(tokens) - 1):
            if p not in self.pages:
                break
            self.pages.move_to_end(p)
            hit = len(p)
        self.requests[request_id] = (tuple(tokens), hit)
        return Admission({"L1": hit}, hit)

    def prefill(self, request_id: int) -> bool:
        tokens, _ = self.requests[request_id]
        mine = self._prefixes(tokens, len(tokens))
        new = [p for p in mine if p not in self.pages]
        if len(new) > self.capacity - len(self.pages) + len(self._victims(mine)):
            return False
        for p in new:
            if len(self.pages) >= self.capacity:
                self._evict_one(mine)
            self.pages[p] = None
            self._changes.append(PageChange("L1", p, "RESIDENT"))
        self.requests[request_id] = (tokens, len(tokens) // self.page_size * self.page_size)
        return True

    def _victims(self, keep: Sequence[Prefix] = ()) -> list[Prefix]:
        """Pages in LRU order that no live request is served from (nor in `keep`)."""
        held = {
            p for tokens, cached in self.requests.values() for p in self._prefixes(tokens, cached)
        }
        held.update(keep)
        return [p for p in self.pages if p not in held]

    def _evict_one(self, keep: Sequence[Prefix] = ()) -> bool:
        victims = self._victims(keep)
        if not victims:
            return False
        del self.pages[victims[0]]
        self._changes.append(PageChange("L1", victims[0], "ABSENT"))
        return True

    def finish(self, request_id: int) -> None:
        self.requests.pop(request_id)

    def evict(self, tier: str, n_pages: int) -> None:
        for _ in range(n_pages):
            if not self._evict_one():
                return

    def restart(self) -> None:
        self.pages.clear()
        self.requests.clear()

    def close(self) -> None: ...

    # -- observation -------------------------------------------------------------------------

    def live(self) -> set[int]:
        return set(self.requests)

    def cached_len(self, request_id: int) -> int:
        return self.requests[request_id][1]

    def served_digests(self, request_id: int) -> list[int] | None:
        return None

    def changes(self) -> list[PageChange]:
        out, self._changes = self._changes, []
        return out

    def check(self) -> list[str]:
        return (
            []
            if len(self.pages) <= self.capacity
            else [f"{len(self.pages)} pages > {self.capacity}"]
        )


class ForgetfulLRU(LRUCache):
    """A broken LRU: evicting, it forgets to report the page it dropped."""

    def _evict_one(self, keep: Sequence[Prefix] = ()) -> bool:
        victims = self._victims(keep)
        if not victims:
            return False
        del self.pages[victims[0]]
        return True


def lru_adapter(capacity: Any) -> LRUCache:
    """The factory the machine calls (a capacity in pages -> a cache)."""
    return LRUCache(int(capacity))


def forgetful_adapter(capacity: Any) -> LRUCache:
    return ForgetfulLRU(int(capacity))


def setups(plane: str) -> Any:
    """Capacities the machine draws for the LRU cache (the plane does not apply)."""
    from hypothesis import strategies as st

    return st.integers(4, 8)
