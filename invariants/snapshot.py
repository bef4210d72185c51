"""The snapshot the invariant checkers read: plain data, no torch, no live objects.

The control plane (hicache/control.py) builds one from its independent records -- the tree's
node values, each tier's page table, the pending-op table and the requests -- so that a bug in
one record shows up as a disagreement with another. Page lists are int64 numpy arrays; the
checkers are vectorised over them (cost linear in pages, no Python loop per page).

    Snapshot
      page_size                     tokens per page (all tiers)
      tiers[T]    TierView          capacity, owner array, the tree's own size counter
      nodes       NodeView...       topology + per-tier value / sub-state / lock / pending op
      ops         OpView...         in-flight transfers: source and target pages
      requests    RequestView...    cached_len, the L1 prefix it holds, its private pages
      digests     optional callable (tier, pages) -> uint64 per page, for I4 (bytes equal)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np
import numpy.typing as npt

Pages = npt.NDArray[np.int64]

# Codes of the physical-page ownership machine (spec/lifecycle.toml [ownership]).
FREE = 0
PRIVATE = 1
TREE = 2
OWNER_NAMES = ("FREE", "PRIVATE", "TREE")


def pages(values: object = ()) -> Pages:
    """An int64 page array from any sequence (the one constructor every record uses)."""
    return np.asarray(values, dtype=np.int64).reshape(-1)


@dataclass(frozen=True)
class TierView:
    """One tier's page table, as its allocator records it."""

    tier: str
    capacity: int  # pages
    owner: npt.NDArray[np.uint8]  # per physical page: FREE / PRIVATE / TREE
    tree_pages_counted: int  # the tree's own running count of pages it holds in this tier


@dataclass(frozen=True)
class NodeView:
    """One tree node. `values[T]` is None when the node holds nothing in tier T; while a
    transfer into T is pending, the target pages are in the op, not in `values[T]`."""

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
    """One pending transfer: reads `source_pages` of `source` (locked), fills `target_pages`
    of `target` (PRIVATE until completion publishes them)."""

    op_id: int
    direction: str
    source: str
    target: str
    node_ids: tuple[int, ...]
    source_pages: Pages
    target_pages: Pages
    token_start: int  # logical token range the op covers (page aligned)
    token_end: int


@dataclass(frozen=True)
class RequestView:
    """One live request: how far its KV is usable, and what it holds."""

    request_id: int
    cached_len: int  # tokens whose KV the request may attend to
    published_len: int  # tokens of its prefix published in L1 and locked by it
    private_pages: Mapping[str, Pages] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    page_size: int
    tiers: Mapping[str, TierView]
    nodes: tuple[NodeView, ...]
    ops: tuple[OpView, ...]
    requests: tuple[RequestView, ...] = ()
    digests: Callable[[str, Pages], npt.NDArray[np.uint64]] | None = None
    root_id: int = 0
