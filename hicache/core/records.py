"""The control plane's records: a live request, a pending op, and the errors that name them.

Plain data, shared by the transitions (`hicache.core.control`) and the queries
(`hicache.core.queries`).
`Request.pins` and each op's source lock are what S7 (lock accounting) counts against the
tree's lock counts (spec/invariants.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hicache.core.pages import Pages, pages
from hicache.core.tiers import Direction
from hicache.core.tree import TreeNode
from hicache.errors import HiCacheError


class UnknownRequest(HiCacheError):
    def __init__(self, request_id: int) -> None:
        super().__init__(f"request {request_id} is not live; call begin_request first")


class LiveRequest(HiCacheError):
    """`begin_request` named a request id that is still live: ids name one request from its
    begin to its end, so a second begin would orphan the first's lock and pages."""

    def __init__(self, request_id: int) -> None:
        super().__init__(f"request {request_id} is already live; end it first")


class UnknownOp(HiCacheError):
    def __init__(self, op_id: int) -> None:
        super().__init__(f"op {op_id} is not pending (already completed, failed or cancelled?)")


@dataclass
class PendingOp:
    """One transfer between `issue` and its observed completion. `nodes` are in path order
    (parent first); page arrays are the nodes' pages concatenated in that order."""

    op_id: int
    direction: Direction
    nodes: list[TreeNode]
    source_pages: Pages
    target_pages: Pages
    request_id: int | None

    @property
    def token_range(self) -> tuple[int, int]:
        start = prefix_start(self.nodes[0])
        return start, start + sum(len(n.key) for n in self.nodes)


@dataclass
class Request:
    """A live request. `locked` is the deepest node whose L1 prefix it holds locked (root:
    none); `cached_len` tokens of its prefix are served from the cache (<= published_len)."""

    request_id: int
    tokens: tuple[int, ...]
    locked: TreeNode
    published_len: int = 0
    cached_len: int = 0
    private_pages: Pages = field(default_factory=pages)
    private_start: int = 0  # token offset the private pages begin at
    pins: list[tuple[TreeNode, int]] = field(default_factory=list)  # (node, tier index) locks


def prefix_start(node: TreeNode) -> int:
    """Tokens before `node`'s key: the sum of its ancestors' key lengths."""
    start = 0
    p = node.parent
    while p is not None:
        start += len(p.key)
        p = p.parent
    return start
