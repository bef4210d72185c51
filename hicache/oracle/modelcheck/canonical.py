"""The state the search hashes: canonical keys of a control plane, and why they are sound.

A key is a plain tuple; two planes with equal keys are the same search state. Three levels:

    level      what the key keeps                              used for
    ---------  ----------------------------------------------  -------------------------------
    concrete   everything, ids and page numbers as they are,   the soundness test (no
               LRU ticks, hits, page generations, id counters  reduction at all) and the
                                                               "a refusal changed nothing" check
    canonical  tree shape (keys, per-tier states, locks,       `--reduction canonical`, and the
               values), ops, requests, page-table owners,      search when requests are not
               the tree's own bookkeeping: node ids, op ids    symmetric
               and physical pages renamed canonically;
               history (ticks, hits, generations, counters)
               dropped
    symmetric  canonical, the least over every ordering of     the search when the config's
               the live requests' ids onto 0..k-1              requests are symmetric

Why each step is sound (spec/modelcheck.md says it at length; tests/test_modelcheck.py checks
that the reduced and unreduced searches reach the same states, transitions and verdicts):

- Physical pages are interchangeable. No guard or effect compares page numbers; `reserve`
  takes *some* free pages and any choice gives a state equal up to renaming free pages. So a
  renaming of one tier's pages maps every run onto a run. Labels go in a canonical order:
  node values in preorder, then op pages, then request pages.
- Node and op ids are fresh names: nothing reads their order except the eviction order of
  `evict` (LRU, ties by id), which the search never calls (it evicts every candidate).
  Nodes are labelled in preorder (children sorted by their first page, which is unique among
  siblings); ops by (direction, node labels), unique because a node's tier has one pending op.
- History: LRU ticks order only `evict`'s choice (as above); `hits` feeds write policies, not
  guards; page generations name bytes for I4, and the null plane has none; the id counters
  only mint fresh names. Dropping them keeps the state space finite.
- Nothing recorded is left out because it "follows" from the rest: the page tables' owners,
  the tree's leaf sets, child counts, node count and page counters are keyed too. In a
  correct plane they follow; a bug that breaks one must not be merged with the correct state
  it would otherwise equal (which would leave it unjudged).
- Request ids are renamed only when every request may begin the same prompts: the actions
  are then offered alike for every id, so swapping ids maps runs onto runs.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

from hicache.core.control import ControlPlane
from hicache.core.pages import FREE, PRIVATE, TREE, Pages
from hicache.core.records import PendingOp
from hicache.core.tiers import TIERS
from hicache.core.tree import HiRadixTree, TreeNode
from hicache.pools.tiertable import TierTable

Key = tuple[Any, ...]
_NONE = -1  # stands for None inside a key, so keys of different planes compare (min over renamings)


class _Labels:
    """Per tier, physical page -> label, in order of first sight."""

    def __init__(self) -> None:
        self.tiers: list[dict[int, int]] = [{} for _ in TIERS]

    def of(self, tier: int, pages: Pages) -> tuple[int, ...]:
        d = self.tiers[tier]
        return tuple([d.setdefault(p, len(d)) for p in pages.tolist()])

    def copy(self) -> _Labels:
        new = _Labels()
        new.tiers = [dict(d) for d in self.tiers]
        return new


def canonical_key(cp: ControlPlane, request_ids: Sequence[int] = ()) -> Key:
    """The canonical key of `cp`'s state (module docstring); with `request_ids` (every id the
    configuration may use, live or not), the least key over every renaming of those ids."""
    order = _preorder(cp.tree.root)
    label = {n.node_id: i for i, n in enumerate(order)}
    ops = sorted(
        cp.ops.values(),
        key=lambda op: (op.direction.value, tuple([label[n.node_id] for n in op.nodes])),
    )
    op_label = {op.op_id: i for i, op in enumerate(ops)}
    pages = _Labels()
    tree = cp.tree
    tree_part = (
        tuple(
            [
                (
                    label[n.parent.node_id] if n.parent is not None else _NONE,
                    n.key,
                    tuple(n.state),
                    tuple(n.lock),
                    tuple([_NONE if p is None else op_label[p] for p in n.pending]),
                    tuple([() if v is None else pages.of(t, v) for t, v in enumerate(n.value)]),
                    _bookkeeping(tree, n),
                )
                for n in order[1:]
            ]
        ),
        len(tree),
        tuple(tree.pages_held),
    )
    op_pages = [
        (
            pages.of(TIERS.index(op.direction.source), op.source_pages),
            pages.of(TIERS.index(op.direction.target), op.target_pages),
        )
        for op in ops
    ]
    live = sorted(cp.requests)
    renamings: Iterable[Sequence[int]] = [live]
    if len(request_ids) > 1 and live:
        # Live ids onto 0..k-1 in every order: the least key over these is the same for every
        # renaming of the ids (each renaming composed with them gives the same set of keys).
        renamings = itertools.permutations(range(len(live)))
    best: Key | None = None
    for image in renamings:
        rename = dict(zip(live, image))
        labels = pages.copy()
        reqs = _requests_part(cp, label, labels, rename)
        key = (tree_part, _ops_part(ops, label, op_pages, rename), reqs, _owners(cp, labels))
        if best is None or key < best:
            best = key
    assert best is not None  # Verify: there is always at least the identity renaming.
    return best


def _bookkeeping(tree: HiRadixTree, n: TreeNode) -> Key:
    """What the tree keeps about `n` besides its own fields: per tier, its count of present
    children and whether its leaf set holds it (both follow from the states in a correct
    tree; keyed so that a bug which breaks them is not merged with a correct state)."""
    return tuple(n.present_children), tree.in_leaf_sets(n)


def _owners(cp: ControlPlane, labels: _Labels) -> Key:
    """Per tier, the page table's owner code of every labelled page (in label order) and how
    many unlabelled pages hold each code: in a correct plane all of those are FREE, but a
    leaked or wrongly freed page must change the key."""
    out = []
    for t, table in enumerate(cp.tables):
        seen = labels.tiers[t]
        owner = table.owner.tolist()
        named = tuple([owner[p] for p in sorted(seen, key=seen.__getitem__)])
        rest = [c for p, c in enumerate(owner) if p not in seen]
        out.append((named, tuple([rest.count(code) for code in (FREE, PRIVATE, TREE)])))
        if len(table.pools) > 1:  # a group of one has no side pool (nor a key part for them)
            out.append(_side_owners(table, sorted(seen, key=seen.__getitem__)))
    return tuple(out)


def _side_owners(table: TierTable, anchor_pages: list[int]) -> Key:
    """Per side pool, the owner codes of the pages each labelled anchor page holds (in label
    order; -1 where it holds none) and how many other pages hold each code: side page
    numbers are named through their anchor pages, as the anchor's are through labels."""
    out = []
    for name, held in table.held_by.items():
        owner = table.pool_tables()[name].owner.tolist()
        rows = held[anchor_pages].tolist() if anchor_pages else []
        named = tuple([tuple([_NONE if s < 0 else owner[s] for s in row]) for row in rows])
        mine = {s for row in rows for s in row if s >= 0}
        rest = [c for s, c in enumerate(owner) if s not in mine]
        out.append((named, tuple([rest.count(code) for code in (FREE, PRIVATE, TREE)])))
    return tuple(out)


def _ops_part(
    ops: list[PendingOp],
    label: dict[int, int],
    op_pages: list[tuple[tuple[int, ...], tuple[int, ...]]],
    rename: dict[int, int],
) -> Key:
    return tuple(
        [
            (
                op.direction.value,
                tuple([label[n.node_id] for n in op.nodes]),
                src,
                tgt,
                _NONE if op.request_id is None else rename.get(op.request_id, op.request_id),
            )
            for op, (src, tgt) in zip(ops, op_pages)
        ]
    )


def _requests_part(
    cp: ControlPlane, label: dict[int, int], pages: _Labels, rename: dict[int, int]
) -> Key:
    out = []
    for old, new in sorted(rename.items(), key=lambda kv: kv[1]):
        r = cp.requests[old]
        pins = tuple(sorted((label[n.node_id], t) for n, t in r.pins))
        out.append(
            (
                new,
                r.tokens,
                label[r.locked.node_id],
                r.published_len,
                r.cached_len,
                pages.of(0, r.private_pages),
                r.private_start,
                pins,
            )
        )
    return tuple(out)


def concrete_key(cp: ControlPlane) -> Key:
    """Everything the plane records, names and history included (no reduction)."""
    tree = cp.tree
    nodes = tuple(
        [
            (
                n.node_id,
                _NONE if n.parent is None else n.parent.node_id,
                n.key,
                tuple(n.state),
                tuple(n.lock),
                tuple([_NONE if p is None else p for p in n.pending]),
                tuple([() if v is None else tuple(v.tolist()) for v in n.value]),
                tuple(n.last_access),
                n.hits,
                tuple(sorted(n.children)),
                _bookkeeping(tree, n),
            )
            for n in [tree.root, *tree.nodes()]
        ]
    )
    tables = tuple([(t.owner.tobytes(), t.generation.tobytes(), t.side_key()) for t in cp.tables])
    ops = tuple(
        [
            (
                i,
                op.direction.value,
                tuple([n.node_id for n in op.nodes]),
                tuple(op.source_pages.tolist()),
                tuple(op.target_pages.tolist()),
                _NONE if op.request_id is None else op.request_id,
            )
            for i, op in sorted(cp.ops.items())
        ]
    )
    reqs = tuple(
        [
            (
                i,
                r.tokens,
                r.locked.node_id,
                r.published_len,
                r.cached_len,
                tuple(r.private_pages.tolist()),
                r.private_start,
                tuple([(n.node_id, t) for n, t in r.pins]),
            )
            for i, r in sorted(cp.requests.items())
        ]
    )
    return (
        nodes,
        tables,
        ops,
        reqs,
        tree.tick,
        tree.next_id,
        cp.next_op_id,
        tuple(tree.pages_held),
        tuple(sorted(tree.node_ids())),
    )


def _preorder(root: TreeNode) -> list[TreeNode]:
    """The root, then each subtree in order of its first page (unique among siblings)."""
    out: list[TreeNode] = []
    stack = [root]
    while stack:
        n = stack.pop()
        out.append(n)
        stack += [c for _, c in sorted(n.children.items(), reverse=True)]
    return out
