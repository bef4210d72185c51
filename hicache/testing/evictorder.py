"""The eviction rules of spec/eviction.md, as the reference model checks them on an engine
with one tier: which pages a call may free, and in what order.

The model keeps the tree spec/tree.md says such an engine has, built from what the machine
sees: a node is the run of pages one insert added (`batch`: the pages a call made RESIDENT,
one new leaf per run); a node is split where an admission's match ends inside it
(`admitted`), where an insert's pages end inside it (`inserted`) or where new pages hang off
its middle; the last access of a node is the tick of the last match that reached it, or of
the insert that made it. With it, the pages a call frees must be what `evict` frees:

    rule             what the model requires of the pages freed by one call
    ---------------  ----------------------------------------------------------------------
    granularity      whole nodes: every page of a node, or none
    leaves only      each node freed is a leaf when it goes (its children went before it)
    order            each is the least recently used unlocked leaf left, ties to the older
                     node (locked: a page inside a live request's first `cached_len` tokens)
    how many         `evict(T, n)`: nodes go until n pages are freed or no leaf is left;
                     a prefill's make-room: any number, the first ones in that order (the
                     room a prefill needs is the engine's: its tail pages, its decode
                     pages, are not observed)

Why one tier only: with L2 and L3 the candidates also depend on transfers' source locks, the
pins of a restore, `keep` sets and the write-back that runs before an L1 victim goes
(spec/eviction.md, spec/restore.md), none of which the protocol reports; there the model
checks what holds for every engine (each tier closed under ancestors, reference.py) and the
conformance vectors check the order.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

Prefix = tuple[int, ...]


@dataclass(eq=False)
class Node:
    """A run of pages: tokens [start, end) of `tokens` (the path from the root to its end)."""

    order: int  # creation order: the spec's node id breaks ties
    tokens: Prefix
    start: int
    parent: Node | None
    tick: int
    children: list[Node] = field(default_factory=list)


class EvictionViolation(Exception):
    """What a call freed is not what spec/eviction.md's loop frees: `what` differed,
    `engine` the engine's pages, `spec` the loop's."""

    def __init__(self, what: str, engine: str, spec: str) -> None:
        self.what, self.engine, self.spec = what, engine, spec
        super().__init__(what)


def describe(pages: Collection[Prefix], page_size: int) -> str:
    """Pages as the prefixes they end, shortest first: `8-token prefix (1000..1007)`."""
    ends = sorted(pages, key=lambda p: (len(p), p))
    return ", ".join(f"{len(p)}-token prefix ({p[0]}..{p[-1]})" for p in ends) or "nothing"


class OneTierTree:
    """The nodes of a one-tier engine as spec/tree.md builds them (module docstring)."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.owner: dict[Prefix, Node] = {}  # every page the tier holds -> its node
        self.roots: list[Node] = []
        self.clock = self.created = 0

    def clear(self) -> None:
        self.owner.clear()
        self.roots.clear()

    def _pages(self, node: Node) -> list[Prefix]:
        ends = range(node.start + self.page_size, len(node.tokens) + 1, self.page_size)
        return [node.tokens[:end] for end in ends]

    def _new(self, tokens: Prefix, start: int, parent: Node | None, tick: int) -> Node:
        self.created += 1
        node = Node(self.created, tokens, start, parent, tick)
        (parent.children if parent is not None else self.roots).append(node)
        for page in self._pages(node):
            self.owner[page] = node
        return node

    def _split(self, page: Prefix) -> None:
        """Split the node holding `page` after it, unless `page` ends its node."""
        node = self.owner.get(page)
        if node is None or len(node.tokens) == len(page):
            return
        siblings = node.parent.children if node.parent is not None else self.roots
        siblings.remove(node)
        upper = self._new(page, node.start, node.parent, node.tick)
        upper.children.append(node)
        node.start, node.parent = len(page), upper

    def _matched(self, tokens: Sequence[int]) -> list[Prefix]:
        """The leading run of `tokens`' whole pages the tier holds."""
        ends = range(self.page_size, len(tokens) + 1, self.page_size)
        run = []
        for end in ends:
            if tuple(tokens[:end]) not in self.owner:
                break
            run.append(tuple(tokens[:end]))
        return run

    def admitted(self, tokens: Sequence[int]) -> None:
        """A match of `tokens` (the prompt less its last token): split where it ends, and
        one fresh tick for every node of the path (spec/tree.md, `match`)."""
        run = self._matched(tokens)
        self.clock += 1
        if not run:
            return
        self._split(run[-1])
        node: Node | None = self.owner[run[-1]]
        while node is not None:
            node.tick = self.clock
            node = node.parent

    def inserted(self, tokens: Sequence[int]) -> None:
        """An insert of `tokens`' whole pages, once its new pages are in (`batch`): split
        where they end inside a node (spec/tree.md, `insert`)."""
        run = self._matched(tokens)
        if run:
            self._split(run[-1])

    def batch(
        self,
        freed: Sequence[Prefix],
        added: Sequence[Prefix],
        served: Collection[Prefix],
        want: int | None = None,
    ) -> None:
        """One call's pages: `freed` (RESIDENT -> ABSENT) checked against the eviction loop
        (module docstring) on the tree as it was, `served` the pages live requests are
        served from (locked), `want` the pages an `evict` call asked for (None: a prefill's
        make-room); then `added` (ABSENT -> RESIDENT) become new leaves. Raises
        EvictionViolation, the tree then unchanged."""
        if freed or want is not None:
            for node in self._victims(set(freed), served, want):
                self._remove(node)
        self._add(added)

    def _leaves(self, locked: Collection[Node], gone: Collection[Node]) -> list[Node]:
        """The candidates: unlocked nodes every child of which is `gone`."""
        nodes = {id(n): n for n in self.owner.values() if n not in gone and n not in locked}
        return [n for n in nodes.values() if all(c in gone for c in n.children)]

    def _victims(
        self, freed: set[Prefix], served: Collection[Prefix], want: int | None
    ) -> list[Node]:
        """The nodes the loop frees, in its order, that make up `freed` exactly."""
        ps, count = self.page_size, 0
        taken: list[Node] = []
        locked = {self.owner[p] for p in served if p in self.owner}
        while freed:
            leaves = self._leaves(locked, taken)
            if not leaves:
                raise EvictionViolation(
                    "L1 pages freed that are locked (served) or above a page that stays",
                    describe(freed, ps),
                    "unlocked leaves only",
                )
            first = min(leaves, key=lambda n: (n.tick, n.order))
            pages = self._pages(first)
            if not set(pages) <= freed:
                raise EvictionViolation(
                    "L1 eviction: whole nodes, the least recently used unlocked leaf first",
                    describe(freed, ps),
                    f"first the node of {describe(pages, ps)}",
                )
            if want is not None and count >= want:
                raise EvictionViolation(
                    f"evict(L1, {want}) freed more after {count} pages",
                    describe(freed, ps),
                    "no more",
                )
            taken.append(first)
            freed -= set(pages)
            count += len(pages)
        left = self._leaves(locked, taken)
        if want is not None and count < want and left:
            first = min(left, key=lambda n: (n.tick, n.order))
            raise EvictionViolation(
                f"evict(L1, {want}) freed {count} pages with a leaf left",
                "no more",
                f"the node of {describe(self._pages(first), ps)} too",
            )
        return taken

    def _remove(self, node: Node) -> None:
        siblings = node.parent.children if node.parent is not None else self.roots
        siblings.remove(node)
        for page in self._pages(node):
            del self.owner[page]

    def _add(self, added: Sequence[Prefix]) -> None:
        """New pages: a run of them hanging off one page (or the root) is one new leaf,
        which splits the node it hangs off when it hangs off that node's middle."""
        fresh: list[Node] = []
        for page in sorted(added, key=len):
            up = page[: -self.page_size]
            node = self.owner.get(up)
            if node is not None and node in fresh and len(node.tokens) == len(up):
                node.tokens = page  # the run goes on: the same new node
                self.owner[page] = node
                continue
            self._split(up)
            self.clock += 1
            fresh.append(self._new(page, len(up), self.owner.get(up), self.clock))
