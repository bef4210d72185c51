"""Illegal calls of transfers: issues the rows refuse, and ends in the wrong op's name.

Each builder looks at the plane now and returns one call of its kind, or None (the table of
kinds is in hicache/testing/illegal/__init__.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hicache.core.control import ControlPlane
from hicache.core.lifecycle import ABSENT, RESIDENT
from hicache.core.records import UnknownOp, UnknownRequest
from hicache.core.tiers import Direction
from hicache.core.tree import TreeNode
from hicache.errors import IllegalTransition
from hicache.testing.illegal.base import (
    NOT_LIVE,
    Builder,
    IllegalCall,
    choose,
    ends,
    ids,
    issuable,
    stale,
)

CHAIN_MAX = 3
"""Nodes of an `issue_bad_tail` chain at most: its head, one node between, its tail."""
ENDS = ("complete", "fail", "cancel")


def _issue(cp: ControlPlane, d: Direction, chain: Sequence[TreeNode]) -> Callable[[], object]:
    return lambda: cp.issue(d, list(chain))


def _single(
    kind: str, cp: ControlPlane, found: Sequence[tuple[Direction, TreeNode]], pick: int, why: str
) -> IllegalCall | None:
    """`issue(d, [n])` of the `pick`-th candidate (d, n), refused because `why`."""
    got = choose(found, pick)
    if got is None:
        return None
    d, n = got
    return IllegalCall(
        kind, f"issue({d.value}, node {n.node_id}: {why})", _issue(cp, d, [n]), IllegalTransition
    )


def _issuable_pairs(cp: ControlPlane) -> list[tuple[Direction, TreeNode]]:
    return [(d, n) for d in Direction for n in cp.tree.nodes() if issuable(cp, n, d)]


def issue_child_first(cp: ControlPlane, pick: int) -> IllegalCall | None:
    """A parent and its child, each issuable in a chain that runs parent first (and room for
    both in the target), issued child first: only the chain's order is wrong."""
    found = [
        (d, n, c)
        for d in Direction
        for n in cp.tree.nodes()
        if issuable(cp, n, d)
        for c in n.children.values()
        if issuable(cp, c, d, after_parent=True)
        and cp.free_pages(d.target) >= n.num_pages + c.num_pages
    ]
    got = choose(found, pick)
    if got is None:
        return None
    d, n, c = got
    what = f"issue({d.value}, nodes {ids([c, n])}: the child first)"
    return IllegalCall("issue_child_first", what, _issue(cp, d, [c, n]), IllegalTransition)


def issue_gap(cp: ControlPlane, pick: int) -> IllegalCall | None:
    """A node and its grandchild, the child between left out (in a direction the node may be
    issued in, when there is one)."""
    found = [
        (n, g) for n in cp.tree.nodes() for c in n.children.values() for g in c.children.values()
    ]
    got = choose(found, pick)
    if got is None:
        return None
    n, g = got
    d = choose([d for d in Direction if issuable(cp, n, d)] or list(Direction), pick)
    assert d is not None  # Verify: the list above is never empty.
    what = f"issue({d.value}, nodes {ids([n, g])}: a gap between them)"
    return IllegalCall("issue_gap", what, _issue(cp, d, [n, g]), IllegalTransition)


def issue_bad_tail(cp: ControlPlane, pick: int) -> IllegalCall | None:
    """A parent-first chain whose head (and any node between) may be issued and whose last
    node may not (its source not RESIDENT or its target not ABSENT): the row holds on the
    first node only, so a guard read on the chain's head alone would accept it."""
    found: list[tuple[Direction, list[TreeNode]]] = []
    for d, n in _issuable_pairs(cp):
        found += _bad_tails(cp, d, [n])
    got = choose(found, pick)
    if got is None:
        return None
    d, chain = got
    what = f"issue({d.value}, nodes {ids(chain)}: the last may not be issued)"
    return IllegalCall("issue_bad_tail", what, _issue(cp, d, chain), IllegalTransition)


def _bad_tails(
    cp: ControlPlane, d: Direction, chain: list[TreeNode]
) -> list[tuple[Direction, list[TreeNode]]]:
    """Chains of at most CHAIN_MAX nodes that extend `chain` (issuable so far) down the tree
    and end at a node `<d>_issue` refuses."""
    out: list[tuple[Direction, list[TreeNode]]] = []
    for c in chain[-1].children.values():
        if not issuable(cp, c, d, after_parent=True):
            out.append((d, [*chain, c]))
        elif len(chain) + 1 < CHAIN_MAX:
            out += _bad_tails(cp, d, [*chain, c])
    return out


def issue_bad_head(cp: ControlPlane, pick: int) -> IllegalCall | None:
    """A parent-first chain whose first node may not be issued (its parent lacks the target,
    or its source or target is wrong) and whose other nodes may, below it: the row holds on
    every node but the head, so a guard read on the chain's deepest node alone (where the
    op's lock lands) would accept it."""
    found = [
        (d, [n, *below])
        for d in Direction
        for n in cp.tree.nodes()
        if not issuable(cp, n, d)
        for below in _good_runs(cp, d, n, CHAIN_MAX - 1)
    ]
    got = choose(found, pick)
    if got is None:
        return None
    d, chain = got
    what = f"issue({d.value}, nodes {ids(chain)}: the first may not be issued)"
    return IllegalCall("issue_bad_head", what, _issue(cp, d, chain), IllegalTransition)


def _good_runs(cp: ControlPlane, d: Direction, top: TreeNode, most: int) -> list[list[TreeNode]]:
    """Runs of 1..`most` nodes down the tree from a child of `top`, each node issuable after
    the one before it."""
    out: list[list[TreeNode]] = []
    for c in top.children.values():
        if issuable(cp, c, d, after_parent=True):
            out.append([c])
            if most > 1:
                out += [[c, *run] for run in _good_runs(cp, d, c, most - 1)]
    return out


def issue_parent_gap(cp: ControlPlane, pick: int) -> IllegalCall | None:
    found = [
        (d, n)
        for d in Direction
        for n in cp.tree.nodes()
        if issuable(cp, n, d, after_parent=True) and not issuable(cp, n, d)
    ]
    return _single("issue_parent_gap", cp, found, pick, "its parent lacks the target tier")


def issue_no_source(cp: ControlPlane, pick: int) -> IllegalCall | None:
    found = [
        (d, n)
        for d in Direction
        for n in cp.tree.nodes()
        if n.state[ends(d)[0]] != RESIDENT and n.state[ends(d)[1]] == ABSENT
    ]
    return _single("issue_no_source", cp, found, pick, "its source is not RESIDENT")


def issue_target_busy(cp: ControlPlane, pick: int) -> IllegalCall | None:
    found = [
        (d, n)
        for d in Direction
        for n in cp.tree.nodes()
        if n.state[ends(d)[0]] == RESIDENT and n.state[ends(d)[1]] != ABSENT
    ]
    return _single("issue_target_busy", cp, found, pick, "its target is not ABSENT")


def issue_freed_window(cp: ControlPlane, pick: int) -> IllegalCall | None:
    d = Direction.D2H
    found = [
        (d, n) for n in cp.tree.nodes() if cp.windows.freed(n) and issuable(cp, n, d, window=False)
    ]
    return _single("issue_freed_window", cp, found, pick, "its L1 window is freed")


def issue_stale_node(cp: ControlPlane, pick: int) -> IllegalCall | None:
    got = choose(_issuable_pairs(cp), pick)
    if got is None:
        return None
    d, n = got
    what = f"issue({d.value}, a removed handle of node {n.node_id})"
    return IllegalCall("issue_stale_node", what, _issue(cp, d, [stale(n)]), IllegalTransition)


def issue_unknown_request(cp: ControlPlane, pick: int) -> IllegalCall | None:
    got = choose(_issuable_pairs(cp), pick)
    if got is None:
        return None
    d, n = got
    what = f"issue({d.value}, node {n.node_id}, for request {NOT_LIVE}, which is not live)"
    return IllegalCall(
        "issue_unknown_request",
        what,
        lambda: cp.issue(d, [n], request_id=NOT_LIVE),
        UnknownRequest,
    )


def issue_empty(cp: ControlPlane, pick: int) -> IllegalCall | None:
    d = list(Direction)[pick % len(Direction)]
    return IllegalCall("issue_empty", f"issue({d.value}, [])", _issue(cp, d, []), IllegalTransition)


def issue_in_apply(cp: ControlPlane, pick: int) -> IllegalCall | None:
    """An issue row run through `apply`: it would start an op no record holds."""
    got = choose(_issuable_pairs(cp), pick)
    if got is None:
        return None
    d, n = got
    name = f"{d.value.lower()}_issue"
    return IllegalCall(
        "issue_in_apply",
        f"apply({name}, node {n.node_id})",
        lambda: cp.apply(name, [n], op_id=cp.next_op_id),
        IllegalTransition,
    )


# -- ends of ops ----------------------------------------------------------------------------


def end_unknown_op(cp: ControlPlane, pick: int) -> IllegalCall | None:
    """complete / fail / cancel / complete_part of an op id that ended (odd picks, when one
    did) or was never issued."""
    ended = [i for i in range(1, cp.next_op_id) if i not in cp.ops]
    op_id = ended[pick // 2 % len(ended)] if ended and pick % 2 else cp.next_op_id + pick
    end = (*ENDS, "complete_part")[pick % 4]
    run: Callable[[], object] = (
        (lambda: cp.complete_part(op_id, 1))
        if end == "complete_part"
        else (lambda: getattr(cp, end)(op_id))
    )
    return IllegalCall("end_unknown_op", f"{end}(op {op_id}, not pending)", run, UnknownOp)


def end_in_apply(cp: ControlPlane, pick: int) -> IllegalCall | None:
    """A pending op's end row run through `apply` over its nodes, in another op's name (a
    stale ack: rule ack_matches_pending_id) or its own (it would end the op and leave its
    record pending)."""
    ops = list(cp.ops.values())
    op = choose(ops, pick)
    if op is None:
        return None
    names = [o.op_id for o in ops if o is not op] + [cp.next_op_id, op.op_id]
    other = names[pick // 2 % len(names)]
    name = f"{op.direction.value.lower()}_{ENDS[pick % 3]}"
    what = f"apply({name}, op {op.op_id}'s nodes {ids(op.nodes)}, in op {other}'s name)"
    return IllegalCall(
        "end_in_apply",
        what,
        lambda: cp.apply(name, op.nodes, op.target_pages, op_id=other),
        IllegalTransition,
    )


def end_part_not_s2h(cp: ControlPlane, pick: int) -> IllegalCall | None:
    op = choose([o for o in cp.ops.values() if o.direction is not Direction.S2H], pick)
    if op is None:
        return None
    keep = 1 + pick % len(op.nodes)
    what = f"complete_part(op {op.op_id}, a {op.direction.value}, keep {keep})"
    return IllegalCall(
        "end_part_not_s2h", what, lambda: cp.complete_part(op.op_id, keep), IllegalTransition
    )


def end_part_keep(cp: ControlPlane, pick: int) -> IllegalCall | None:
    op = choose([o for o in cp.ops.values() if o.direction is Direction.S2H], pick)
    if op is None:
        return None
    keep = -1 if pick % 2 else len(op.nodes) + 1
    what = f"complete_part(op {op.op_id}, keep {keep} of its {len(op.nodes)} nodes)"
    return IllegalCall(
        "end_part_keep", what, lambda: cp.complete_part(op.op_id, keep), IllegalTransition
    )


BUILDERS: dict[str, Builder] = {
    b.__name__: b
    for b in (
        issue_child_first,
        issue_gap,
        issue_bad_tail,
        issue_bad_head,
        issue_parent_gap,
        issue_no_source,
        issue_target_busy,
        issue_freed_window,
        issue_stale_node,
        issue_unknown_request,
        issue_empty,
        issue_in_apply,
        end_unknown_op,
        end_in_apply,
        end_part_not_s2h,
        end_part_keep,
    )
}
"""This module's kinds, in catalogue order."""
