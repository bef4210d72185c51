"""Which records claim each physical page of a tier, gathered once per snapshot.

Three records claim a tier's pages, each kept by a different part of the control plane, so a
bug in one shows up as a disagreement with the others:

    record      its pages                                            owner code it implies
    ----------  ---------------------------------------------------  ---------------------
    tree        every node's value in the tier                       TREE
    private     pending ops' target pages + requests' private pages  PRIVATE
    free list   pages whose owner code is FREE (the allocator)       FREE

Two readers, both computed at most once per snapshot (kept in `Snapshot.memo`):

    unsettled(s)          the tiers where some page is not claimed exactly once with its
                          record's code; I1, I6 and S5 hold in every other tier (the common
                          case: one pass in plain Python, no numpy call per page array)
    tier_claims(s, tier)  the records as page arrays with the claimant of each page, which
                          the checks read to name what is wrong (cost linear in pages)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import numpy.typing as npt

from hicache.core.pages import FREE, PRIVATE, TREE, Pages, pages
from hicache.core.snapshot import Snapshot, TierView

Ids = npt.NDArray[np.int64]
Counts = npt.NDArray[np.intp]

SMALL_TIER = 512  # pages: up to this capacity plain Python reads the owner array faster than numpy


@dataclass(frozen=True)
class TierClaims:
    """The tree and private records of one tier, each as one page array plus, per page, the
    id of the node / op / request that claims it."""

    tier: str
    capacity: int  # pages
    owner: npt.NDArray[np.uint8]
    tree: Pages  # node values, concatenated in snapshot node order
    tree_nodes: Ids
    targets: Pages  # target pages of ops filling this tier
    target_ops: Ids
    held: Pages  # requests' private pages in this tier
    held_requests: Ids

    @property
    def known(self) -> int:
        """Pages the owner array describes (the checks index it only below this)."""
        return min(self.capacity, int(self.owner.size))

    @property
    def private(self) -> Pages:
        return np.concatenate((self.targets, self.held))

    def nodes_at(self, p: Pages) -> Ids:
        """Ids of the nodes whose value holds any of pages `p`."""
        return self.tree_nodes[np.isin(self.tree, p)]

    def ops_at(self, p: Pages) -> Ids:
        """Ids of the ops whose target pages include any of pages `p`."""
        return self.target_ops[np.isin(self.targets, p)]


def tier_claims(s: Snapshot, tier: str) -> TierClaims:
    """Tier `tier`'s records in `s` (the tier must be one of `s.tiers`), gathered once per
    snapshot."""
    memo = cast(dict[str, TierClaims], s.memo.setdefault("tier_claims", {}))
    found = memo.get(tier)
    if found is None:
        found = memo[tier] = _gather(s, tier)
    return found


def _gather(s: Snapshot, tier: str) -> TierClaims:
    view = s.tiers[tier]
    tree, tree_nodes = _joined(
        [(n.node_id, v) for n in s.nodes if (v := n.values.get(tier)) is not None]
    )
    targets, target_ops = _joined(
        [(op.op_id, op.target_pages) for op in s.ops if op.target == tier]
    )
    held, held_requests = _joined(
        [(r.request_id, v) for r in s.requests if (v := r.private_pages.get(tier)) is not None]
    )
    return TierClaims(
        tier, view.capacity, view.owner, tree, tree_nodes, targets, target_ops, held, held_requests
    )


def _joined(parts: list[tuple[int, Pages]]) -> tuple[Pages, Ids]:
    """Concatenate page arrays, and repeat each part's id once per page."""
    if not parts:
        return pages(), pages()
    ids, arrays = zip(*parts)
    joined = np.concatenate(arrays).astype(np.int64, copy=False)
    return joined, np.repeat(np.asarray(ids, dtype=np.int64), [len(a) for a in arrays])


def page_counts(p: Pages, size: int) -> Counts:
    """How often each page 0..size-1 occurs in `p` (length `size`); other pages are ignored."""
    return np.bincount(inside(p, size), minlength=size)[:size]


def inside(p: Pages, size: int) -> Pages:
    """The pages of `p` in 0..size-1 (a page outside is a conservation violation, I6)."""
    return p[(p >= 0) & (p < size)]


# -- the fast all-clear -------------------------------------------------------------------------


def unsettled(s: Snapshot) -> list[str]:
    """The tiers of `s` (in snapshot order) where some page is not claimed exactly once -- by
    one node value (code TREE), one op target or request (code PRIVATE), or the free list
    (code FREE) -- or whose owner array is not `capacity` long. I1, I6 and S5 find nothing in
    the other tiers, so they read only these."""
    found = s.memo.get("unsettled")
    if found is None:
        found = s.memo["unsettled"] = _unsettled(s)
    return cast(list[str], found)


def _unsettled(s: Snapshot) -> list[str]:
    """`unsettled`, reading each node, op and request once."""
    tree: dict[str, list[Pages]] = {t: [] for t in s.tiers}
    private: dict[str, list[Pages]] = {t: [] for t in s.tiers}
    for n in s.nodes:
        for t, v in n.values.items():
            if v is not None and t in tree:
                tree[t].append(v)
    for op in s.ops:
        if op.target in private:
            private[op.target].append(op.target_pages)
    for r in s.requests:
        for t, v in r.private_pages.items():
            if t in private:
                private[t].append(v)
    return [t for t, view in s.tiers.items() if not _settled(view, tree[t], private[t])]


def _settled(view: TierView, tree: list[Pages], private: list[Pages]) -> bool:
    """The all-clear of one tier. Records distinct and in range, every tree page TREE and
    every private page PRIVATE, and the table counting exactly as many TREE and PRIVATE pages
    as the records hold and FREE for all the rest: then each page is claimed exactly once."""
    if view.owner.size != view.capacity:
        return False
    if view.capacity <= SMALL_TIER:
        return _settled_small(
            view, [p for v in tree for p in v.tolist()], [p for v in private for p in v.tolist()]
        )
    return _settled_large(
        view, np.concatenate(tree or [pages()]), np.concatenate(private or [pages()])
    )


def _settled_small(view: TierView, tree: list[int], private: list[int]) -> bool:
    """`_settled` in plain Python (a few pages: numpy's fixed cost per call would dominate)."""
    cap, records = view.capacity, tree + private
    if len(set(records)) != len(records):
        return False
    if records and (min(records) < 0 or max(records) >= cap):
        return False
    codes = view.owner.tolist()
    counted = [codes.count(FREE), codes.count(PRIVATE), codes.count(TREE)]
    return (
        counted == [cap - len(records), len(private), len(tree)]
        and all(codes[p] == TREE for p in tree)
        and all(codes[p] == PRIVATE for p in private)
    )


def _settled_large(view: TierView, tree: Pages, private: Pages) -> bool:
    """`_settled` with numpy: a fixed number of calls, each linear in pages."""
    cap, owner = view.capacity, view.owner
    records = np.concatenate((tree, private)).astype(np.int64, copy=False)
    if records.size and (int(records.min()) < 0 or int(records.max()) >= cap):
        return False
    if np.bincount(owner, minlength=TREE + 1).tolist() != [
        cap - records.size,
        private.size,
        tree.size,
    ]:
        return False
    if not (np.all(owner[tree] == TREE) and np.all(owner[private] == PRIVATE)):
        return False
    seen = np.zeros(cap, dtype=bool)
    seen[records] = True
    return int(np.count_nonzero(seen)) == records.size  # no page named twice
