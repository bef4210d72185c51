"""An adapter template: copy this file, keep `factory`, and make `Adapter` drive your engine.

    python3 -m hicache.testing.template > myengine.py        # this file, to edit
    hicache fuzz --adapter myengine:factory                  # the fuzz machine
    hicache vectors run vectors/ --adapter myengine:factory  # the conformance vectors

`factory(config)` is the one factory protocol both commands call (hicache/testing/factory.py):
it builds a fresh engine for an `EngineConfig`, or raises `UnsupportedConfig` for one the
engine cannot take. `Adapter` is the `CacheUnderTest` protocol (hicache/testing/protocol.py)
over a one-tier engine; its comments name the call of a real engine each step stands for
(SGLang's RadixCache names). As shipped it drives `TinyEngine`, a radix cache that does what
spec/tree.md and spec/eviction.md ask of one tier, so the template passes the fuzz and every
one-tier vector. An engine with L2 and L3 also implements the transfer methods that
`WithoutTransfers` leaves empty (hicache/testing/adapters/controller.py is one).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hicache.errors import HiCacheError
from hicache.testing import Admission, EngineConfig, PageChange, UnsupportedConfig
from hicache.testing.adapters.notransfers import WithoutTransfers

Prefix = tuple[int, ...]


class Refused(HiCacheError):
    """A call the engine refuses, having changed nothing (the protocol asks a typed error)."""


@dataclass(eq=False)
class Node:
    """A radix node: the tokens from the root to its end; its own key starts at `start`."""

    id: int
    tokens: Prefix
    start: int
    parent: Node | None
    children: dict[Prefix, Node] = field(default_factory=dict)  # by their first page
    last_access: int = 0
    locks: int = 0  # holders of this node or a descendant (spec/tree.md, `lock`)


class TinyEngine:
    """One tier of `capacity` pages: match, insert, lock and evict node by node, as
    spec/tree.md says (a stand-in for your engine; it reports each page it adds or drops)."""

    def __init__(self, capacity: int, page_size: int) -> None:
        self.capacity, self.page_size = capacity, page_size
        self.root = Node(0, (), 0, None)
        self.ids = self.clock = self.pages = 0
        self.changed: list[PageChange] = []

    def _node(self, tokens: Prefix, start: int, parent: Node, last_access: int) -> Node:
        self.ids += 1
        node = Node(self.ids, tokens, start, parent, last_access=last_access)
        parent.children[tokens[start : start + self.page_size]] = node
        return node

    def _split(self, node: Node, at: int) -> Node:
        """A new upper node for `node`'s tokens before `at`; `node` keeps the rest."""
        assert node.parent is not None
        upper = self._node(node.tokens[:at], node.start, node.parent, node.last_access)
        upper.locks = node.locks  # every holder of `node` holds through its upper part
        node.start, node.parent = at, upper
        upper.children[node.tokens[at : at + self.page_size]] = node
        return upper

    def walk(self, tokens: Prefix) -> list[Node]:
        """The nodes `tokens`' whole pages match, the last one split where the match ends."""
        ps, node = self.page_size, self.root
        path: list[Node] = []
        while (child := node.children.get(tokens[len(node.tokens) :][:ps])) is not None:
            end = child.start + ps
            while end < len(child.tokens) and tokens[end : end + ps] == child.tokens[end:][:ps]:
                end += ps
            if end < len(child.tokens):
                return path + [self._split(child, end)]
            path.append(child)
            node = child
        return path

    def match(self, tokens: Prefix) -> Node:
        """The deepest matched node (the root: none); the path gets one fresh LRU tick."""
        path = self.walk(tokens)
        self.clock += 1
        for n in path:
            n.last_access = self.clock
        return path[-1] if path else self.root

    def insert(self, tokens: Prefix) -> Node:
        """Publish `tokens` (whole pages): what the tree lacks becomes one new leaf."""
        path = self.walk(tokens)
        parent = path[-1] if path else self.root
        if len(parent.tokens) == len(tokens):
            return parent  # every page was there: the request's copies are discarded
        self.clock += 1
        leaf = self._node(tokens, len(parent.tokens), parent, self.clock)
        self._report(leaf, "RESIDENT")
        return leaf

    def lock(self, node: Node, by: int) -> None:
        n: Node | None = node
        while n is not None and n is not self.root:
            n.locks += by
            n = n.parent

    def _nodes(self) -> list[Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            out.append(stack.pop())
            stack += out[-1].children.values()
        return out

    def evictable(self) -> int:
        """Pages eviction could free now: every unlocked node's (leaves go first)."""
        return sum(len(n.tokens) - n.start for n in self._nodes() if not n.locks) // self.page_size

    def evict(self, want: int) -> None:
        """Free whole nodes, the least recently used unlocked leaf first (ties: the older
        node), until `want` pages are freed or no leaf is left (spec/eviction.md)."""
        freed = 0
        while freed < want:
            leaves = [n for n in self._nodes() if not n.children and not n.locks]
            if not leaves:
                return
            victim = self.first(leaves)
            assert victim.parent is not None
            del victim.parent.children[victim.tokens[victim.start :][: self.page_size]]
            freed += self._report(victim, "ABSENT")

    def first(self, leaves: list[Node]) -> Node:
        """The leaf eviction frees first: the least recently used, ties to the older node."""
        return min(leaves, key=lambda n: (n.last_access, n.id))

    def _report(self, node: Node, state: str) -> int:
        ends = range(node.start + self.page_size, len(node.tokens) + 1, self.page_size)
        self.changed += [PageChange("L1", node.tokens[:end], state) for end in ends]
        self.pages += len(ends) if state == "RESIDENT" else -len(ends)
        return len(ends)


@dataclass
class Request:
    tokens: Prefix
    node: Node  # the deepest node it holds locked (the root: none)
    cached_len: int
    served: bool = False


class Adapter(WithoutTransfers):
    """`CacheUnderTest` over a one-tier engine (`TinyEngine`: put yours in its place)."""

    tiers: tuple[str, ...] = ("L1",)

    def __init__(self, capacity: int, page_size: int) -> None:
        self.capacity, self.page_size = capacity, page_size
        self.restart()

    def restart(self) -> None:
        self.engine = TinyEngine(self.capacity, self.page_size)  # your engine, empty
        self.requests: dict[int, Request] = {}

    def close(self) -> None: ...

    def _request(self, request_id: int) -> Request:
        if request_id not in self.requests:
            raise Refused(f"request {request_id} is not live")
        return self.requests[request_id]

    def _pages(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    def submit(self, request_id: int, tokens: Sequence[int]) -> Admission:
        if request_id in self.requests:
            raise Refused(f"request {request_id} is live already")
        if not tokens:
            raise Refused("a prompt needs at least one token")
        if self._pages(len(tokens)) > self.capacity:
            raise Refused(f"{len(tokens)} tokens need more than L1's {self.capacity} pages")
        # match_prefix of all but the last token (it is computed: spec/tree.md), inc_lock_ref
        whole = (len(tokens) - 1) // self.page_size * self.page_size
        node = self.engine.match(tuple(tokens[:whole]))
        self.engine.lock(node, +1)
        hit = len(node.tokens)
        self.requests[request_id] = Request(tuple(tokens), node, hit)
        return Admission({"L1": hit}, hit)

    def prefill(self, request_id: int) -> bool:
        r = self._request(request_id)
        if r.served:
            raise Refused(f"request {request_id} is served already")
        # alloc for every page from cached_len on, the partial last page too (evict first)
        need = self._pages(len(r.tokens) - r.cached_len)
        tails = sum(
            1 for q in self.requests.values() if q.served and len(q.tokens) % self.page_size
        )
        free = self.capacity - self.engine.pages - tails
        if need > free + self.engine.evictable():
            return False  # refused for room, nothing evicted
        self.engine.evict(need - free)
        # insert the whole pages; dec_lock_ref / inc_lock_ref moves the lock to the new leaf
        leaf = self.engine.insert(r.tokens[: len(r.tokens) // self.page_size * self.page_size])
        self.engine.lock(leaf, +1)
        self.engine.lock(r.node, -1)
        r.node, r.cached_len, r.served = leaf, len(leaf.tokens), True
        return True

    def finish(self, request_id: int) -> None:
        self.engine.lock(self._request(request_id).node, -1)  # dec_lock_ref, free the tail
        del self.requests[request_id]

    def evict(self, tier: str, n_pages: int) -> None:
        if tier != "L1":
            raise Refused(f"tier {tier!r}: this engine has L1 alone")
        self.engine.evict(n_pages)

    def live(self) -> set[int]:
        return set(self.requests)

    def cached_len(self, request_id: int) -> int:
        return self._request(request_id).cached_len

    def served_digests(self, request_id: int) -> list[int] | None:
        return None  # no bytes; an engine with KV returns a digest per served page

    def changes(self) -> list[PageChange]:
        out, self.engine.changed = self.engine.changed, []
        return out

    def check(self) -> list[str]:
        return [] if self.engine.pages <= self.capacity else [f"{self.engine.pages} pages held"]


def factory(config: EngineConfig) -> Adapter:
    """The engine for `config`, or UnsupportedConfig (the vectors skip the case; the fuzz
    never draws the shape)."""
    if config.tiers != ("L1",):
        raise UnsupportedConfig(f"this engine has L1 alone; asked for {config.tiers}")
    return Adapter(config.capacities["L1"], config.page_size)


if __name__ == "__main__":  # `python3 -m hicache.testing.template > myengine.py`
    sys.stdout.write(Path(__file__).read_text(encoding="utf-8"))
