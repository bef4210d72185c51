"""The trace sglang's adapter writes (hicache/testing/adapters/sglang_trace.py), on a small
stand-in for sglang's tree (nodes with `id`, `key`, `children`, `value`), so it runs without
sglang; tests/test_engine_sglang.py drives the real tree and check-trace."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hicache.testing.adapters.sglang_trace import SGLangTrace, node_spans, path_nodes

PS = 2


@dataclass
class Key:
    tokens: tuple[int, ...]

    def raw_token_ids(self) -> tuple[int, ...]:
        return self.tokens

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class Node:
    id: int
    key: Key
    value: list[int]  # KV slot indices, one per token
    children: dict[Any, Node] = field(default_factory=dict)

    def add(self, child: Node) -> Node:
        self.children[child.key.tokens[:PS]] = child
        return child


def _tree() -> tuple[Node, Node, Node]:
    """root -> A [1 2 3 4] (slots 10-13) -> B [5 6] (slots 20-21)."""
    root = Node(0, Key(()), [])
    a = root.add(Node(1, Key((1, 2, 3, 4)), [10, 11, 12, 13]))
    b = a.add(Node(2, Key((5, 6)), [20, 21]))
    return root, a, b


def _events(trace: SGLangTrace) -> list[dict[str, object]]:
    return [
        {k: v for k, v in vars(e).items() if v not in (None, (), {}) and k != "seq"}
        for e in trace.events
    ]


def test_nodes_are_named_by_their_token_ranges() -> None:
    root, _a, _b = _tree()
    assert {nid: span for nid, (_, span) in node_spans(root).items()} == {1: (0, 4), 2: (4, 6)}
    # A prompt sharing A's first page only: the walk ends inside A (no split: read only).
    assert [(n.id, span) for n, span in path_nodes(root, (1, 2, 9, 9), PS)] == [(1, (0, 2))]
    assert [(n.id, span) for n, span in path_nodes(root, (1, 2, 3, 4, 5, 6, 7), PS)] == [
        (1, (0, 4)),
        (2, (4, 6)),
    ]


def test_a_split_is_traced_as_the_spec_names_it() -> None:
    """sglang's split keeps the old id for the lower part and gives the upper a new one."""
    root, a, _ = _tree()
    before = node_spans(root)
    upper = Node(3, Key((1, 2)), [10, 11])
    root.children = {(1, 2): upper}
    a.key, a.value = Key((3, 4)), [12, 13]
    upper.add(a)
    trace = SGLangTrace(PS, 8, "test")
    trace.splits(before, node_spans(root))
    assert _events(trace) == [{"event": "split", "node": 1, "detail": {"at": 2, "upper": 3}}]


def test_evictions_go_deepest_first_with_their_pages() -> None:
    root, _a, _b = _tree()
    before = node_spans(root)
    root.children = {}
    trace = SGLangTrace(PS, 8, "test")
    trace.evicted(before, node_spans(root))
    assert _events(trace) == [
        {
            "event": "evict_l1",
            "tier": "L1",
            "node": 2,
            "token_start": 4,
            "token_end": 6,
            "pages": (10,),
        },
        {
            "event": "evict_l1",
            "tier": "L1",
            "node": 1,
            "token_start": 0,
            "token_end": 4,
            "pages": (5, 6),
        },
    ]


def test_compute_crosses_nodes_then_the_tokens_no_node_holds() -> None:
    """A request computing [2, 8) of a prompt the tree holds to token 6: A's second page and
    B are duplicate copies (one event per node, the part of A it covers), [6, 8) no node
    holds; the request's row of slots names the pages."""
    root, _, _ = _tree()
    trace = SGLangTrace(PS, 8, "test")
    trace.compute(7, root, (1, 2, 3, 4, 5, 6, 7), [10, 11, 40, 41, 42, 43, 44, 45], 2, 8)
    assert _events(trace) == [
        {
            "event": "compute",
            "tier": "L1",
            "node": 1,
            "request": 7,
            "token_start": 2,
            "token_end": 4,
            "pages": (20,),
        },
        {
            "event": "compute",
            "tier": "L1",
            "node": 2,
            "request": 7,
            "token_start": 4,
            "token_end": 6,
            "pages": (21,),
        },
        {
            "event": "compute",
            "tier": "L1",
            "request": 7,
            "token_start": 6,
            "token_end": 8,
            "pages": (22,),
        },
    ]


def test_insert_discards_the_copies_inserts_the_new_node_and_end_discards_the_tail() -> None:
    """Admitted with a hit of 4 tokens, the request computed [4, 10); sglang's insert found
    [4, 6) held already (prefix_len 6) and made node 4 for [6, 8); the tail page [8, 10)
    is discarded when the request ends."""
    root, _, b = _tree()
    prompt, row = (1, 2, 3, 4, 5, 6, 7, 8, 9), [10, 11, 12, 13, 40, 41, 42, 43, 44, 45]
    b.add(Node(4, Key((7, 8)), [42, 43]))
    trace = SGLangTrace(PS, 8, "test")
    trace.insert(7, root, prompt, row, 4, 6)
    trace.insert(8, root, prompt[:5], row, 4, 4)  # only the tail page computed: no event
    trace.end(7, (8, 10), row[8:10])
    assert _events(trace) == [
        {
            "event": "discard",
            "tier": "L1",
            "node": 2,
            "request": 7,
            "token_start": 4,
            "token_end": 6,
            "pages": (20,),
        },
        {
            "event": "insert",
            "tier": "L1",
            "node": 4,
            "request": 7,
            "token_start": 6,
            "token_end": 8,
            "pages": (21,),
        },
        {"event": "cached_len", "request": 7, "token_end": 8},
        {
            "event": "discard",
            "tier": "L1",
            "request": 7,
            "token_start": 8,
            "token_end": 10,
            "pages": (22,),
        },
        {"event": "end_request", "request": 7},
    ]
