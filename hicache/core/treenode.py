"""A node of the HiRadixTree and the answers a walk gives (`MatchResult`, `Cut`).

Plain records: the tree (`hicache.core.tree`) owns every change to them. Per tier (index 0, 1, 2 =
L1, L2, L3) a node carries its value (physical pages, int64, one per key page, or None), its
residency sub-state, its lock count, the op id filling it, and its LRU tick.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from hicache.core.lifecycle import ABSENT, PRIVATE, RESIDENT, load_lifecycle
from hicache.core.pages import Pages
from hicache.core.tiers import TIERS

ROOT_ID = 0
N_TIERS = len(TIERS)


@functools.lru_cache(maxsize=1)
def node_states() -> tuple[frozenset[str], ...]:
    """Per tier, the residency sub-states a node may hold: the tier's states in
    spec/lifecycle.toml except PRIVATE (private pages belong to a request, not to a node).
    Built once per loaded lifecycle (the tree asks on every write)."""
    spec = load_lifecycle()
    found = _NODE_STATES.get(id(spec))
    if found is None or found[0] is not spec:
        found = (spec, tuple(frozenset(s for s in spec.states[t] if s != PRIVATE) for t in TIERS))
        _NODE_STATES[id(spec)] = found
    return found[1]


_NODE_STATES: dict[int, tuple[object, tuple[frozenset[str], ...]]] = {}


class TreeNode:
    """One node: a page-aligned token key and, per tier, value/state/lock/pending/LRU tick."""

    __slots__ = (
        "children",
        "hits",
        "is_root",
        "key",
        "last_access",
        "lock",
        "node_id",
        "page_size",
        "parent",
        "pending",
        "present_children",
        "state",
        "value",
    )

    def __init__(
        self, node_id: int, parent: TreeNode | None, key: tuple[int, ...], tick: int, page_size: int
    ) -> None:
        self.node_id = node_id
        # Whether this is the tree's root (id ROOT_ID); an attribute, not a property: it is
        # asked on every walk, and a node's id never changes.
        self.is_root: bool = node_id == ROOT_ID
        self.page_size = page_size
        self.parent = parent
        self.children: dict[tuple[int, ...], TreeNode] = {}
        self.key = key
        self.value: list[Pages | None] = [None] * N_TIERS
        self.state: list[str] = [ABSENT] * N_TIERS
        self.lock: list[int] = [0] * N_TIERS
        self.pending: list[int | None] = [None] * N_TIERS
        self.last_access: list[int] = [tick] * N_TIERS
        self.hits = 0
        # Per tier, how many children are not ABSENT there: a node is a leaf in tier T when
        # this is 0. Kept by HiRadixTree.set_value; read-only for everyone else.
        self.present_children: list[int] = [0] * N_TIERS

    @property
    def num_pages(self) -> int:
        """Pages in this node's key (its key length is a whole number of pages)."""
        return len(self.key) // self.page_size

    def holds(self, tier: int) -> bool:
        """True when the node's pages are published (RESIDENT) in `tier`."""
        return self.state[tier] == RESIDENT

    def is_dead(self) -> bool:
        """No tier holds or awaits data, nothing is locked, no child: safe to remove."""
        return (
            not self.is_root
            and not self.children
            and all(s == ABSENT for s in self.state)
            and all(v is None for v in self.value)
            and not any(self.lock)
            and all(p is None for p in self.pending)
        )

    def __repr__(self) -> str:
        return (
            f"TreeNode(id={self.node_id}, tokens={len(self.key)}, state={self.state}, "
            f"lock={self.lock}, pending={self.pending})"
        )


class MatchResult(NamedTuple):
    """One walk's answer. Lengths are in tokens, page aligned.

    lengths  per tier: tokens in the leading run of `path` nodes RESIDENT in that tier
    handles  per tier: the deepest node of that run (the root when the run is empty)
    path     matched nodes, the root's child first, whatever their tier states
    """

    lengths: tuple[int, int, int]
    handles: tuple[TreeNode, TreeNode, TreeNode]
    path: tuple[TreeNode, ...]
    matched_len: int


class Cut(NamedTuple):
    """Where a walk ends inside a node's key: `node` shares its first `at_tokens` tokens (whole
    pages, at least one, fewer than its key) with the tokens walked."""

    node: TreeNode
    at_tokens: int
