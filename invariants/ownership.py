"""I1, I2 and I6: who owns each physical page of a tier, and what an in-flight transfer reads.

The tree, private and free-list records of a tier (`hicache.invariants.claims`) must agree
page by page. I1 and I6 first ask `unsettled`: one plain-Python pass per snapshot names the
tiers where some page is not claimed exactly once with its record's code (both hold in the
others). Only in those do they read the tier's `tier_claims` and work on whole page arrays
with `np.bincount` and masks, so their cost is linear in pages.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

import numpy as np

from hicache.core.pages import FREE, OWNER_NAMES, PRIVATE, TREE, Pages, pages
from hicache.core.snapshot import NodeView, OpView, Snapshot
from hicache.invariants.claims import TierClaims, inside, page_counts, tier_claims, unsettled
from hicache.invariants.violation import CheckName, Violation, shown

RESIDENT = "RESIDENT"  # the residency sub-state of a published value (spec/lifecycle.toml)

OWNERSHIP_DISJOINT = CheckName("I1", "ownership_disjoint")
INFLIGHT_SOURCE_PINNED = CheckName("I2", "inflight_source_pinned")
PAGE_CONSERVATION = CheckName("I6", "page_conservation")

# -- I1 ----------------------------------------------------------------------------------------


def check_ownership_disjoint(s: Snapshot) -> list[Violation]:
    """I1: per tier, tree-owned, free and private pages are pairwise disjoint, and each page a
    record claims carries that record's owner code (tree -> TREE, private -> PRIVATE)."""
    out: list[Violation] = []
    for tier in unsettled(s):
        c = tier_claims(s, tier)
        n = c.known
        owner = c.owner[:n]
        in_tree = page_counts(c.tree, n) > 0
        in_private = page_counts(c.private, n) > 0
        in_free = owner == FREE
        report = partial(_report, OWNERSHIP_DISJOINT, c)
        out += report(np.flatnonzero(in_tree & in_free), f"in node values and also {FREE_}")
        out += report(np.flatnonzero(in_tree & in_private), f"in node values and also {PRIVATE_}")
        out += report(np.flatnonzero(in_private & in_free), f"{PRIVATE_} and also {FREE_}")
        # Pages in both records, or FREE, were reported above as overlaps; the rest must agree.
        tree_p, private_p = inside(c.tree, n), inside(c.private, n)
        tree_p, private_p = tree_p[~in_private[tree_p]], private_p[~in_tree[private_p]]
        tree_code, private_code = owner[tree_p], owner[private_p]
        out += report(
            tree_p[(tree_code != TREE) & (tree_code != FREE)],
            "in node values but not TREE in the page table",
        )
        out += report(
            private_p[(private_code != PRIVATE) & (private_code != FREE)],
            f"{PRIVATE_} but not PRIVATE in the page table",
        )
    return out


FREE_ = "FREE (on the free list)"
PRIVATE_ = "private to a transfer or request"


def _report(check: CheckName, c: TierClaims, bad: Pages, what: str) -> list[Violation]:
    if not bad.size:
        return []
    bad = np.unique(bad)
    return [
        check.violation(
            f"{bad.size} page(s) of {c.tier} are {what}",
            tier=c.tier,
            pages=bad,
            nodes=c.nodes_at(bad),
            ops=c.ops_at(bad),
        )
    ]


# -- I2 ----------------------------------------------------------------------------------------


def check_inflight_source_pinned(s: Snapshot) -> list[Violation]:
    """I2: every pending op reads exactly its nodes' values in the source tier, in node order;
    those pages are TREE-owned, and every such node is RESIDENT there with a lock > 0, so no
    eviction can free (and no allocation reuse) a page the transfer still reads."""
    by_id = s.by_id
    out: list[Violation] = []
    for op in s.ops:
        out += _source_pinned(s, op, by_id)
    return out


def _source_pinned(s: Snapshot, op: OpView, by_id: Mapping[int, NodeView]) -> list[Violation]:
    tier = op.source
    report = partial(INFLIGHT_SOURCE_PINNED.violation, tier=tier, ops=(op.op_id,))
    view = s.tiers.get(tier)
    if view is None:
        return [report(f"op {op.op_id} reads from {tier!r}, which is not a tier of the snapshot")]
    missing = [i for i in op.node_ids if i not in by_id]
    if missing or not op.node_ids:
        return [
            report(
                f"op {op.op_id} covers node(s) [{shown(missing)}] that are not in the tree",
                nodes=missing,
            )
        ]
    members = [by_id[i] for i in op.node_ids]
    out: list[Violation] = []
    unlocked = [n.node_id for n in members if n.locks.get(tier, 0) <= 0]
    if unlocked:
        out.append(
            report(
                f"source node(s) [{shown(unlocked)}] of op {op.op_id} hold no lock in "
                f"{tier}, so eviction could free pages the transfer still reads",
                nodes=unlocked,
            )
        )
    absent = [n.node_id for n in members if n.states.get(tier) != RESIDENT]
    if absent:
        out.append(
            report(
                f"source node(s) [{shown(absent)}] of op {op.op_id} are not RESIDENT in {tier}",
                nodes=absent,
            )
        )
    values = [n.values.get(tier) for n in members]
    expected = np.concatenate([pages(v) for v in values if v is not None] or [pages()])
    if any(v is None for v in values) or not np.array_equal(op.source_pages, expected):
        diff = np.setxor1d(op.source_pages, expected)
        out.append(
            report(
                f"op {op.op_id} reads {tier} pages [{shown(op.source_pages)}] but its "
                f"nodes' values are [{shown(expected)}]",
                pages=diff,
                nodes=op.node_ids,
            )
        )
    src = pages(op.source_pages)
    known = min(view.capacity, int(view.owner.size))
    ok = (src >= 0) & (src < known)
    ok[ok] = view.owner[src[ok]] == TREE
    if not ok.all():
        out.append(
            report(
                f"{int((~ok).sum())} source page(s) of op {op.op_id} are not TREE-owned in {tier}",
                pages=src[~ok],
            )
        )
    return out


# -- I6 ----------------------------------------------------------------------------------------


def check_page_conservation(s: Snapshot) -> list[Violation]:
    """I6: per tier, every page 0..capacity-1 is counted exactly once: on the free list, in a
    node value, or private to one op or request; so free + private + tree == capacity, and the
    page table's PRIVATE and TREE counts equal the records'. Once a tier has no transfer into
    it and no request holds pages of it, it has no PRIVATE page."""
    out: list[Violation] = []
    for tier in unsettled(s):
        out += _conserved(tier_claims(s, tier))
    return out


def _conserved(c: TierClaims) -> list[Violation]:
    report = partial(PAGE_CONSERVATION.violation, tier=c.tier)
    cap = c.capacity
    if c.owner.size != cap:
        return [
            report(
                f"the page table of {c.tier} has {c.owner.size} entries for a capacity of "
                f"{cap} pages"
            )
        ]
    records = np.concatenate((c.tree, c.private))
    outside = records[(records < 0) | (records >= cap)]
    if outside.size:
        return [
            report(
                f"{outside.size} page reference(s) lie outside {c.tier}'s pages 0..{cap - 1}",
                pages=outside,
                nodes=c.nodes_at(outside),
                ops=c.ops_at(outside),
            )
        ]
    bad_code = np.flatnonzero(c.owner > TREE)
    if bad_code.size:
        return [
            report(
                f"{bad_code.size} page(s) have an owner code that is none of FREE/PRIVATE/TREE",
                pages=bad_code,
            )
        ]
    claims = page_counts(c.tree, cap) + page_counts(c.private, cap) + (c.owner == FREE)
    out: list[Violation] = []
    unclaimed = np.flatnonzero(claims == 0)
    if unclaimed.size:
        out.append(report(_leak_message(c, unclaimed), pages=unclaimed))
    twice = np.flatnonzero(claims > 1)
    if twice.size:
        out.append(
            report(
                f"{twice.size} page(s) of {c.tier} are counted more than once across "
                "the free list, node values and private records",
                pages=twice,
                nodes=c.nodes_at(twice),
                ops=c.ops_at(twice),
            )
        )
    if out:
        return out
    # Every page is claimed once; the table's counts can still disagree with the records'.
    counted = np.bincount(c.owner, minlength=len(OWNER_NAMES))
    if counted[PRIVATE] != c.private.size or counted[TREE] != c.tree.size:
        wrong = np.concatenate(
            (c.tree[c.owner[c.tree] != TREE], c.private[c.owner[c.private] != PRIVATE])
        )
        out.append(
            report(
                f"the page table counts {counted[PRIVATE]} PRIVATE and {counted[TREE]} "
                f"TREE pages but the records hold {c.private.size} private and "
                f"{c.tree.size} tree pages",
                pages=wrong,
                nodes=c.nodes_at(wrong),
                ops=c.ops_at(wrong),
            )
        )
    return out


def _leak_message(c: TierClaims, unclaimed: Pages) -> str:
    codes = np.bincount(c.owner[unclaimed], minlength=len(OWNER_NAMES))
    kinds = ", ".join(f"{int(k)} {OWNER_NAMES[i]}" for i, k in enumerate(codes) if k)
    if not c.targets.size and not c.held.size and codes[PRIVATE]:
        return (
            f"no transfer or request holds pages of {c.tier}, yet {codes[PRIVATE]} page(s) "
            f"are still PRIVATE (leaked); unclaimed: {kinds}"
        )
    return f"{unclaimed.size} page(s) of {c.tier} are claimed by no record (leaked): {kinds}"
