"""Two one-tier caches that are wrong on purpose, to show what the judges say.

`LRUCache` is the plain prefix cache a first port often writes: one tier ("L1") of
`capacity` pages, each named by its token prefix; a request is served from the leading run of
its prompt's pages that are cached, and `prefill` caches the prompt's whole pages, evicting the
least recently used *page* that no live request is served from. spec/eviction.md frees a
node's whole value, least recently used leaf first, so this cache breaks three of its rules:
it frees a page in the middle of a cached prefix (the tier stops being closed under
ancestors), part of a node, and not in the spec's order; and it raises `KeyError` for a
request that is not live, where the protocol asks a typed error. The fuzz machine and the
conformance vectors both catch it.

`ForgetfulLRU` is the template's correct cache (hicache/testing/template.py) with one bug: it
drops its least recently used node without reporting it, so that a test (and the README) can
show what the machine says when an engine is wrong.

Both factories take the one factory protocol's `EngineConfig` (hicache/testing/factory.py)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from hicache.errors import HiCacheError
from hicache.testing.adapters.notransfers import WithoutTransfers
from hicache.testing.factory import EngineConfig, UnsupportedConfig
from hicache.testing.protocol import Admission, PageChange
from hicache.testing.template import Adapter, Node, TinyEngine

Prefix = tuple[int, ...]


class LRUCache(WithoutTransfers):
    """`CacheUnderTest` over an OrderedDict of page prefixes (oldest first): page by page."""

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


class ForgetfulEngine(TinyEngine):
    """The template's engine, forgetting to report the pages an eviction drops."""

    def _report(self, node: Node, state: str) -> int:
        pages = super()._report(node, state)
        if state == "ABSENT":
            del self.changed[-pages:]
        return pages


class ForgetfulLRU(Adapter):
    """The template's adapter over the forgetful engine."""

    def restart(self) -> None:
        super().restart()
        self.engine = ForgetfulEngine(self.capacity, self.page_size)


def _one_tier(config: EngineConfig) -> tuple[int, int]:
    if config.tiers != ("L1",):
        raise UnsupportedConfig(f"the LRU cache has one tier (L1); asked for {config.tiers}")
    return config.capacities["L1"], config.page_size


def lru_adapter(config: EngineConfig) -> LRUCache:
    """The page-by-page LRU cache for a one-tier configuration."""
    return LRUCache(*_one_tier(config))


def forgetful_adapter(config: EngineConfig) -> ForgetfulLRU:
    """The cache that drops pages without reporting them, for a one-tier configuration."""
    return ForgetfulLRU(*_one_tier(config))
