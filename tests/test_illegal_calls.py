"""Illegal calls on the control plane (issue 31, item 2): each refused, typed, nothing changed.

The plane's public query `state_key` is the judge ("raise, state unchanged", spec/README.md).
Refusals that were missing are tested here: a transfer's rows run through `apply`, an advance
to a removed handle, a live id begun again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hicache.control import ControlPlane
from hicache.errors import IllegalTransition, OutOfPages
from hicache.records import LiveRequest
from hicache.tiers import Direction
from hicache.tree import TreeNode
from tests.test_control import PS, plane, served


def two_nodes(cp: ControlPlane) -> list[Any]:
    """One prompt of 3 pages served, then split after its first page by a second request's
    match: the chain [upper, lower] in L1 only, nobody holding it."""
    served(cp, 1, [7, 7, 8, 8, 9, 9])
    served(cp, 2, [7, 7, 5, 5])
    return list(cp.tree.match([7, 7, 8, 8, 9, 9], touch=False).path[:2])


# -- the judge: state_key --------------------------------------------------------------------


def test_state_key_is_stable_and_sees_every_record_a_call_could_change() -> None:
    cp = ControlPlane(PS, (16, 16, 16), check_mode="off")  # a bare lock breaks S7
    upper, lower = two_nodes(cp)
    key = cp.state_key()
    assert cp.state_key() == key and hash(key) == hash(cp.state_key())
    changes: list[Callable[[], object]] = [
        lambda: cp.tree.lock(upper, 0),  # a lock
        lambda: cp.tree.touch(lower, 0),  # an LRU tick
        lambda: cp.begin_request(3, [1, 2, 3]),  # a request (and trace events)
        lambda: cp.issue(Direction.D2H, [upper]),  # an op, its pages, the op id counter
        lambda: cp.skip_op_id(),  # the op id counter alone
        lambda: cp.evict_node(lower, "L1"),  # a node's value and a page's owner
    ]
    seen = {key}
    for change in changes:
        change()
        now = cp.state_key()
        assert now not in seen, f"state_key missed {change}"
        seen.add(now)


# -- refusals the catalogue found missing ----------------------------------------------------


def test_a_live_id_begun_again_is_refused_as_live_request_with_nothing_changed() -> None:
    """Before: a bare HiCacheError, which names no failure a caller could tell apart."""
    cp, _ = plane()
    cp.begin_request(1, [1, 2, 3])
    key = cp.state_key()
    with pytest.raises(LiveRequest, match="request 1 is already live"):
        cp.begin_request(1, [4, 5, 6])
    assert cp.state_key() == key


@pytest.mark.parametrize("end", ["d2h_complete", "d2h_fail", "d2h_cancel"])
def test_apply_refuses_an_ops_end_on_part_of_its_nodes(end: str) -> None:
    """Before: the row ran on the first node and left the op pending over both (I1, I2, I5
    and S7 broke, the plane poisoned)."""
    cp, _ = plane()
    chain = two_nodes(cp)
    op = cp.issue(Direction.D2H, chain)
    key = cp.state_key()
    with pytest.raises(IllegalTransition, match="keep its op record"):
        cp.apply(end, chain[:1], op.target_pages[: chain[0].num_pages], op_id=op.op_id)
    assert cp.state_key() == key and cp.poisoned is None
    cp.complete(op.op_id)
    assert all(n.state[1] == "RESIDENT" for n in chain)


def test_apply_refuses_an_ops_end_on_all_of_its_nodes_too() -> None:
    cp, _ = plane()
    chain = two_nodes(cp)
    op = cp.issue(Direction.D2H, chain)
    key = cp.state_key()
    with pytest.raises(IllegalTransition, match="keep its op record"):
        cp.apply("d2h_complete", chain, op.target_pages, op_id=op.op_id)
    assert cp.state_key() == key and op.op_id in cp.ops


def test_apply_refuses_an_issue_row_before_it_looks_at_pages() -> None:
    """Before: the row reserved L2 pages and marked the nodes pending on an op no record
    holds (I5, I6, S7); with too little room it raised OutOfPages instead."""
    cp, _ = plane(caps=(16, 2, 16))
    chain = two_nodes(cp)
    key = cp.state_key()
    for nodes in (chain[:1], chain):
        with pytest.raises(IllegalTransition, match="keep its op record"):
            cp.apply("d2h_issue", nodes, op_id=cp.next_op_id)
        assert cp.state_key() == key and cp.poisoned is None
    with pytest.raises(OutOfPages):  # the chain's three pages do not fit in L2's two
        cp.issue(Direction.D2H, chain)


def test_a_stale_ack_through_apply_is_still_refused_as_one() -> None:
    cp, _ = plane()
    upper, _ = two_nodes(cp)
    stale_op = cp.issue(Direction.D2H, [upper])
    cp.cancel(stale_op.op_id)
    live = cp.issue(Direction.D2H, [upper])
    with pytest.raises(IllegalTransition, match=f"not pending on op {stale_op.op_id}"):
        cp.apply("d2h_complete", [upper], live.target_pages, op_id=stale_op.op_id)


def test_advance_cached_len_refuses_a_removed_handle_as_an_illegal_transition() -> None:
    """As pin does; before: a TreeError out of the tree's walk, unlike every other refusal
    of the method (its docstring names IllegalTransition)."""
    cp, _ = plane()
    _upper, lower = two_nodes(cp)
    cp.begin_request(5, [7, 7, 8, 8, 9, 9, 1])
    key = cp.state_key()
    removed = TreeNode(lower.node_id, lower.parent, lower.key, 0, PS)  # not the tree's
    for handle in (removed, cp.tree.root):
        with pytest.raises(IllegalTransition, match="match again|root"):
            cp.advance_cached_len(5, handle)
        assert cp.state_key() == key
