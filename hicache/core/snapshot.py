"""The snapshot: every record of the control plane, as plain data (no torch, no live objects).

The control plane (hicache/core/control.py) builds one from its independent records -- the tree's
node values and lock counts, each tier's page table, the pending-op table and the requests --
so that a bug in one record shows up as a disagreement with another. The invariant checker
(`hicache.invariants`) reads it; it is core vocabulary, not the checker's: the core builds it
and never imports the checks. Page lists are int64 numpy arrays (`hicache.core.pages.Pages`); the
checks are vectorised over them (cost linear in pages, no Python loop per page).

    Snapshot
      page_size                     tokens per page (all tiers)
      tiers[T]    TierView          capacity, owner array, the tree's own size counter,
                                    and the window an L1 hit needs before its end
        pools     PoolView...       a pool group's side pools (none for one pool): owner codes
                                    and which anchor page holds each of their pages (I9)
      nodes       NodeView...       topology + per-tier value / sub-state / lock count / pending op
      ops         OpView...         in-flight transfers: source and target pages, source lock
      requests    RequestView...    cached_len, the L1 node it holds locked, pins, private pages
      digests     optional callable (tier, pages) -> uint64 per page, for I4 (bytes equal)

Locks appear twice on purpose: the tree's per-node counts (`NodeView.locks`) and the holders'
own records (`RequestView.locked_node_id`, `RequestView.pins`, `OpView.lock_node_id`). S7
(`lock_accounting`, spec/invariants.md) checks that they agree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import numpy.typing as npt

from hicache.core.pages import Pages

Digests = Callable[[str, Pages], npt.NDArray[np.uint64]]
"""(tier, pages) -> one uint64 digest per page, in the order asked."""

UNSERVABLE = np.uint64(np.iinfo(np.uint64).max)
"""The digest of a page whose bytes can never be served (an L3 slot failing its own checksum,
or unreadable). Digest functions never return it for real bytes; I4 skips such pages."""


NO_PAGES = -1
"""`PoolView.held_by` entry of an anchor page that holds no page of the pool (it is FREE)."""

TOMBSTONE = -2
"""`PoolView.held_by` entry of a TREE anchor page whose *window* was freed (spec/pools.md,
"Freed windows"): a trailing pool's pages gone while the anchor page and its sidecars stay."""


@dataclass(frozen=True)
class PoolView:
    """One side pool of a tier's pool group (an allocating pool that follows the anchor):
    its own owner codes, and per anchor page the `ratio` pages of it that page holds.
    `window`: a trailing pool (hit policy TRAILING_PAGES), whose rows may read TOMBSTONE."""

    pool: str
    tier: str  # "<tier>.<pool>", as the pool's page table names itself
    capacity: int  # this pool's pages
    owner: npt.NDArray[np.uint8]  # per page of this pool: FREE / PRIVATE / TREE
    held_by: npt.NDArray[np.int64]  # [anchor page, ratio]: its pages; NO_PAGES or TOMBSTONE
    window: bool = False


@dataclass(frozen=True)
class TierView:
    """One tier's page table, as its allocator records it (for a pool group: the anchor's,
    and in `pools` every side pool's)."""

    tier: str
    capacity: int  # pages
    owner: npt.NDArray[np.uint8]  # per physical page: FREE / PRIVATE / TREE
    tree_pages_counted: int  # the tree's own running count of pages it holds in this tier
    pools: tuple[PoolView, ...] = ()
    # Anchor pages just before the end of each live request's L1 prefix that must hold their
    # window (the plane's group hit policy; 0: none must, as without a trailing pool).
    hit_window: int = 0
    # Whether the engine declares this tier hash-keyed (spec/tree.md, "Hash-keyed tiers"):
    # S6, tier closure, is not required of it.
    hash_keyed: bool = False
    # Whether the engine declares this tier stacked (spec/tree.md, "Stacked ops"): a pending
    # node's parent may be pending into it on another op of the same direction.
    stacked: bool = False


@dataclass(frozen=True)
class NodeView:
    """One tree node. `values[T]` is None when the node holds nothing in tier T; while a
    transfer into T is pending, the target pages are in the op, not in `values[T]`. `locks[T]`
    is the tree's count of path locks held on this node or a descendant in T."""

    node_id: int
    parent_id: int | None  # None only for the root
    child_ids: tuple[int, ...]
    key_tokens: int  # length of the node's own token key
    values: Mapping[str, Pages | None]
    states: Mapping[str, str]  # residency sub-state per tier (spec/lifecycle.toml)
    locks: Mapping[str, int]
    pending: Mapping[str, int | None]  # op id of the transfer filling this tier, if any
    parent_link_ok: bool = True  # the parent lists this node among its children


@dataclass(frozen=True)
class OpView:
    """One pending transfer: reads `source_pages` of `source`, fills `target_pages` of
    `target` (PRIVATE until completion publishes them). It holds one path lock in `source`, on
    node `lock_node_id` (the deepest node it reads), as the op table records it."""

    op_id: int
    direction: str
    source: str
    target: str
    node_ids: tuple[int, ...]
    source_pages: Pages
    target_pages: Pages
    token_start: int  # logical token range the op covers (page aligned)
    token_end: int
    lock_node_id: int | None = None  # None: the op records no source lock


@dataclass(frozen=True)
class RequestView:
    """One live request, as the request table records it: how far its KV is usable and what
    it holds. `locked_node_id` is the deepest node of the L1 prefix it holds one path lock on
    (the root: none); `pins` are its other path locks, one (node id, tier) per lock taken."""

    request_id: int
    cached_len: int  # tokens whose KV the request may attend to
    locked_node_id: int  # its L1 prefix lock; the snapshot's root id when it holds none
    pins: tuple[tuple[int, str], ...] = ()
    private_pages: Mapping[str, Pages] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    """Every record at one moment. `root_id` names the root node (no key, no pages)."""

    page_size: int
    tiers: Mapping[str, TierView]
    nodes: tuple[NodeView, ...]
    ops: tuple[OpView, ...]
    requests: tuple[RequestView, ...] = ()
    digests: Digests | None = None
    root_id: int = 0

    @cached_property
    def memo(self) -> dict[str, object]:
        """Data its readers derive from this snapshot, kept so that each is computed once per
        snapshot (the checks share one index of every tier's page claims here). Empty when
        built and not a record: a snapshot is never changed after it is built, so whatever
        is derived from it stays true."""
        return {}

    @cached_property
    def by_id(self) -> Mapping[int, NodeView]:
        """Each node by id (the last one, should two share an id: S1 reports that)."""
        return {n.node_id: n for n in self.nodes}

    def path_to_root(self, node_id: int) -> tuple[int, ...] | None:
        """The ids of `node_id`, its parent, ... up to the root's child, following each
        node's `parent_id` (the root itself excluded: () for the root). What one path lock on
        `node_id` counts on. None when the walk meets a missing node or loops (S1 reports
        both)."""
        out: list[int] = []
        at: int | None = node_id
        while at is not None and at != self.root_id:
            node = self.by_id.get(at)
            if node is None or len(out) > len(self.nodes):
                return None
            out.append(at)
            at = node.parent_id
        return tuple(out) if at == self.root_id else None


# -- across ranks (tensor parallelism): one rank's view, for I7, I8, I10, I11 ------------------
# Built by hicache/distributed/rankview.py (which says what each field holds and leaves out).


@dataclass(frozen=True)
class NodeRecord:
    node_id: int
    parent_id: int | None
    key_tokens: int
    key_hash: str
    states: tuple[str, str, str]
    locks: tuple[int, int, int]
    filling: tuple[str | None, str | None, str | None]  # direction of the op filling each tier
    pages: tuple[int, int, int]  # pages held per tier (0: none)
    lru: tuple[int, int, int] = (0, 0, 0)  # LRU tick per tier: eviction's order, so equal too


@dataclass(frozen=True)
class RankView:
    rank: int
    size: int
    nodes: tuple[NodeRecord, ...]
    requests: tuple[tuple[int, int, tuple[int, ...], int], ...]
    ops: tuple[tuple[int, str, tuple[int, ...], int, int], ...]
    free: tuple[tuple[str, str, int], ...]
    log_count: int
    log_digest: str
    log_tail: tuple[str, ...]
    l3_writes: tuple[tuple[int, str, int], ...]
    replicated: tuple[tuple[tuple[str, int, str], tuple[int, ...]], ...] = ()
    quiescent: bool = False
    modes: tuple[tuple[str, str], ...] = ()  # (pool, tp_mode) of the backed-up group
    next_op: int = 0  # the op id the next transfer takes (equal on every rank: C2)
    # (request id, restore record, pins (node id, tier index)) per live restore: a prefill's serve
    # reads the plan without a collective where no window is freed (C1c), so equal too
    restores: tuple[tuple[int, tuple[object, ...], tuple[tuple[int, int], ...]], ...] = ()
