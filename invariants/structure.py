"""Structural checks S1..S7: the tree's own bookkeeping agrees with itself and its holders.

S1 parent_child_links     parent and child ids agree; one root; every node reaches it
S2 no_dead_node           a node that holds nothing, is unlocked, waits on nothing and has
                          no children has been removed
S3 tier_size_accounting   the tree's per-tier page counter == pages in its node values
S4 locks_non_negative     no lock count below zero (a clamped or doubled unlock shows here)
S5 no_double_reference    no page of a tier is referenced twice by node values, op
                          targets and request-private pages together
S6 tier_ancestor_closed   a node present in tier T (RESIDENT, or pending into T) has a
                          parent that is the root, RESIDENT in T, or pending into T on the
                          same op (no backup gap, bug class B07)
S7 lock_accounting        every node's lock count per tier == the path locks its holders
                          record on it or below it: requests' L1 prefix locks and pins,
                          pending ops' source locks (a leaked lock pins a prefix forever)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

import numpy as np

from hicache.core.snapshot import NodeView, Snapshot
from hicache.invariants.claims import page_counts, tier_claims, unsettled
from hicache.invariants.ownership import RESIDENT
from hicache.invariants.violation import CheckName, Violation, shown

PARENT_CHILD_LINKS = CheckName("S1", "parent_child_links")
NO_DEAD_NODE = CheckName("S2", "no_dead_node")
TIER_SIZE_ACCOUNTING = CheckName("S3", "tier_size_accounting")
LOCKS_NON_NEGATIVE = CheckName("S4", "locks_non_negative")
NO_DOUBLE_REFERENCE = CheckName("S5", "no_double_reference")
TIER_ANCESTOR_CLOSED = CheckName("S6", "tier_ancestor_closed")
LOCK_ACCOUNTING = CheckName("S7", "lock_accounting")


def check_parent_child_links(s: Snapshot) -> list[Violation]:
    """S1: node ids are unique; exactly one node (`root_id`) has no parent; every other node's
    parent exists and lists it as a child (`parent_link_ok` too); every listed child exists,
    once, and names that parent; every node reaches the root through parent links (no cycle)."""
    by_id = s.by_id
    found: dict[str, list[int]] = {}

    def flag(problem: str, node_id: int) -> None:
        found.setdefault(problem, []).append(node_id)

    seen: set[int] = set()
    for n in s.nodes:
        if n.node_id in seen:
            flag("share their id with another node", n.node_id)
        seen.add(n.node_id)
        if n.parent_id is None:
            if n.node_id != s.root_id:
                flag(f"have no parent but are not the root (root id {s.root_id})", n.node_id)
            continue
        parent = by_id.get(n.parent_id)
        if parent is None:
            flag("name a parent that is not in the tree", n.node_id)
        elif not n.parent_link_ok or n.node_id not in parent.child_ids:
            flag("are not listed among their parent's children", n.node_id)
        if len(set(n.child_ids)) != len(n.child_ids):
            flag("list a child twice", n.node_id)
        for c in n.child_ids:
            child = by_id.get(c)
            if child is None or child.parent_id != n.node_id:
                flag("list a child that is missing or names another parent", n.node_id)
                break
    root = by_id.get(s.root_id)
    if root is None:
        flag("are missing from the tree, though the snapshot names it the root", s.root_id)
    elif root.parent_id is not None:
        flag("are the root, yet name a parent", s.root_id)
    found_unreached = _unreachable(s, by_id)
    if found_unreached:
        found["are not reached from the root through parent links (a cycle)"] = found_unreached
    return [
        PARENT_CHILD_LINKS.violation(f"node(s) [{shown(ids)}] {problem}", nodes=ids)
        for problem, ids in found.items()
    ]


def _unreachable(s: Snapshot, by_id: Mapping[int, NodeView]) -> list[int]:
    """Nodes whose parent exists but that the root does not reach through parent links."""
    children: dict[int, list[int]] = {}
    for n in s.nodes:
        if n.parent_id is not None:
            children.setdefault(n.parent_id, []).append(n.node_id)
    reached = {s.root_id}
    todo = deque([s.root_id])
    while todo:
        for c in children.get(todo.popleft(), ()):
            if c not in reached:
                reached.add(c)
                todo.append(c)
    return [
        n.node_id
        for n in s.nodes
        if n.node_id not in reached and n.parent_id is not None and n.parent_id in by_id
    ]


def check_no_dead_node(s: Snapshot) -> list[Violation]:
    """S2: every non-root node holds a value, a lock, a pending op or a child in some tier."""
    dead = [
        n.node_id
        for n in s.nodes
        if n.node_id != s.root_id
        and not n.child_ids
        and all(v is None for v in n.values.values())
        and not any(n.locks.values())
        and all(p is None for p in n.pending.values())
    ]
    if not dead:
        return []
    return [
        NO_DEAD_NODE.violation(
            f"node(s) [{shown(dead)}] hold nothing in any tier, are unlocked, wait on no op and "
            "have no children, yet are still in the tree",
            nodes=dead,
        )
    ]


def check_tier_size_accounting(s: Snapshot) -> list[Violation]:
    """S3: per tier, `tree_pages_counted` equals the pages in all node values of that tier."""
    out: list[Violation] = []
    for tier, view in s.tiers.items():
        held = sum(v.size for n in s.nodes if (v := n.values.get(tier)) is not None)
        if held != view.tree_pages_counted:
            out.append(
                TIER_SIZE_ACCOUNTING.violation(
                    f"the tree counts {view.tree_pages_counted} pages in {tier} but its node "
                    f"values hold {held}",
                    tier=tier,
                )
            )
    return out


def check_locks_non_negative(s: Snapshot) -> list[Violation]:
    """S4: every node's lock count in every tier is >= 0."""
    out: list[Violation] = []
    for tier in s.tiers:
        negative = [n.node_id for n in s.nodes if n.locks.get(tier, 0) < 0]
        if negative:
            out.append(
                LOCKS_NON_NEGATIVE.violation(
                    f"node(s) [{shown(negative)}] have a negative lock count in {tier} (an unlock "
                    "without its lock)",
                    tier=tier,
                    nodes=negative,
                )
            )
    return out


def check_no_double_reference(s: Snapshot) -> list[Violation]:
    """S5: within a tier, no physical page occurs twice among node values, op target pages and
    request-private pages taken together (within one record, too)."""
    out: list[Violation] = []
    for tier in unsettled(s):
        c = tier_claims(s, tier)
        every = np.concatenate((c.tree, c.private))
        outside = every[(every < 0) | (every >= c.capacity)]  # rare (I6 names them): sort those
        values, counts = np.unique(outside, return_counts=True)
        inner = np.flatnonzero(page_counts(every, c.capacity) > 1)
        twice = np.concatenate((inner, values[counts > 1]))
        if twice.size:
            out.append(
                NO_DOUBLE_REFERENCE.violation(
                    f"{twice.size} page(s) of {tier} are referenced more than once by node values, "
                    "op targets and request-private pages",
                    tier=tier,
                    pages=twice,
                    nodes=c.nodes_at(twice),
                    ops=c.ops_at(twice),
                )
            )
    return out


def check_tier_ancestor_closed(s: Snapshot) -> list[Violation]:
    """S6: a non-root node RESIDENT or pending in tier T has a parent that is the root, RESIDENT
    in T, or pending into T on the same op -- in a stacked tier, on any op of the same
    direction (R81). Not in a hash-keyed tier (spec/tree.md)."""
    by_id = s.by_id
    out: list[Violation] = []
    for tier in s.tiers:
        if s.tiers[tier].hash_keyed:
            continue
        gaps: list[int] = []
        ops: list[int] = []
        for n in s.nodes:
            op = n.pending.get(tier)
            if n.parent_id is None or n.parent_id == s.root_id:
                continue
            if op is None and n.states.get(tier) != RESIDENT:
                continue
            parent = by_id.get(n.parent_id)
            if parent is None:
                continue  # S1 reports the missing parent
            if parent.states.get(tier) == RESIDENT:
                continue
            if op is not None and parent.pending.get(tier) == op:
                continue
            stacked = s.tiers[tier].stacked and op is not None
            if stacked and parent.states.get(tier) == n.states.get(tier):
                continue  # R81: stacked under its parent's op of the same direction
            gaps.append(n.node_id)
            ops += [o for o in (op, parent.pending.get(tier)) if o is not None]
        if gaps:
            out.append(
                TIER_ANCESTOR_CLOSED.violation(
                    f"node(s) [{shown(gaps)}] are present in {tier} under a parent that is not (a "
                    "backup gap: a suffix held without its prefix)",
                    tier=tier,
                    nodes=gaps,
                    ops=ops,
                )
            )
    return out


def lock_holders(s: Snapshot) -> list[tuple[str, int, str]]:
    """Every path lock the holders' records name, as (tier, node id, holder): each request's
    L1 prefix lock (none when it is the root), each of its pins, each op's source lock."""
    out: list[tuple[str, int, str]] = []
    for r in s.requests:
        if r.locked_node_id != s.root_id:
            out.append(("L1", r.locked_node_id, f"request {r.request_id}"))
        out += [(tier, node, f"request {r.request_id} (pin)") for node, tier in r.pins]
    out += [
        (op.source, op.lock_node_id, f"op {op.op_id}")
        for op in s.ops
        if op.lock_node_id is not None
    ]
    return out


def check_lock_accounting(s: Snapshot) -> list[Violation]:
    """S7: for every tier T and non-root node n, `n.locks[T]` equals the number of path locks
    in T that holders record on n or a descendant of n (`lock_holders`). A holder naming a node
    that is not in the tree is reported too (its lock counts nowhere); negative counts are
    left to S4."""
    expected: dict[tuple[str, int], int] = {}
    astray: list[str] = []
    for tier, node, holder in lock_holders(s):
        path = s.path_to_root(node)
        if path is None or tier not in s.tiers:
            astray.append(f"{holder} in {tier} on node {node}")
            continue
        for n in path:
            expected[(tier, n)] = expected.get((tier, n), 0) + 1
    out: list[Violation] = []
    if astray:
        out.append(
            LOCK_ACCOUNTING.violation(
                f"{len(astray)} lock(s) are held on nodes that are not in the tree ({astray[0]})"
            )
        )
    for tier in s.tiers:
        # A negative count is S4's report; comparing it here would only repeat it.
        more = [
            (n.node_id, d)
            for n in s.nodes
            if n.node_id != s.root_id
            and (count := n.locks.get(tier, 0)) >= 0
            and (d := count - expected.get((tier, n.node_id), 0))
        ]
        for ids, what in (
            (
                [i for i, d in more if d > 0],
                "more locks than their holders record "
                "(a leaked lock: nothing will release it, so the prefix stays pinned)",
            ),
            (
                [i for i, d in more if d < 0],
                "fewer locks than their holders record "
                "(a lost lock: eviction may take a prefix a holder still uses)",
            ),
        ):
            if ids:
                first = next(d for i, d in more if i == ids[0])
                out.append(
                    LOCK_ACCOUNTING.violation(
                        f"node(s) [{shown(ids)}] hold {what} in {tier}; node {ids[0]} is off by "
                        f"{first:+d}",
                        tier=tier,
                        nodes=ids,
                    )
                )
    return out
