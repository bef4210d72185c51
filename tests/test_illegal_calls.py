"""Illegal calls on the control plane (issue 31, item 2): each refused, typed, nothing changed.

The plane's public query `state_key` is the judge ("raise, state unchanged", spec/README.md);
the catalogue (hicache/testing/illegal/) builds the calls from the plane's state; the fuzz
machine makes them (`illegal_calls`). The refusals the catalogue found missing are fixed in
the plane and tested here first: a transfer's rows run through `apply`, an advance to a
removed handle, a live id begun again.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from hicache.core.control import ControlPlane
from hicache.core.records import LiveRequest
from hicache.core.tiers import Direction
from hicache.core.tree import TreeNode
from hicache.errors import IllegalTransition, OutOfPages
from hicache.pools.presets import group
from hicache.testing.coverage import Coverage
from hicache.testing.illegal import KINDS, IllegalCall, calls, refusal
from hicache.testing.machines import controller_machine
from hicache.testing.seeded import no_source_constants
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


# -- the catalogue and its judge -------------------------------------------------------------


def test_refusal_tells_accepted_wrong_error_and_changed_apart() -> None:
    cp, _ = plane()
    upper, _ = two_nodes(cp)
    ok = IllegalCall("k", "issue([])", lambda: cp.issue(Direction.D2H, []), IllegalTransition)
    assert refusal(cp, ok) is None
    accepted = IllegalCall("k", "a legal call", lambda: cp.tree.root, IllegalTransition)
    assert "was accepted" in (refusal(cp, accepted) or "")
    other = IllegalCall("k", "compute", lambda: cp.compute(99, 2), IllegalTransition)
    assert "raised UnknownRequest" in (refusal(cp, other) or "")

    def lock_then_refuse() -> None:
        cp.tree.lock(upper, 0)
        raise IllegalTransition("x", "L1", "-", "too late")

    changed = IllegalCall("k", "a partial write", lock_then_refuse, IllegalTransition)
    assert "changed the plane's state" in (refusal(cp, changed) or "")


def busy_plane() -> ControlPlane:
    """Prompts split into chains of two and three nodes, one backed up at its head
    (an H2S chain whose tail has no L2 copy), one pending a backup, an ended op, a node in
    L2 alone, a request holding private pages and one holding nothing."""
    cp, _ = plane()
    u1, _l1 = two_nodes(cp)  # [7 7][8 8 9 9]
    cp.complete(cp.issue(Direction.D2H, [u1]).op_id)
    served(cp, 11, [7, 7, 8, 8, 4, 4])  # [7 7][8 8][9 9]: three nodes on one path
    served(cp, 3, [4, 4, 6, 6])
    served(cp, 4, [4, 4, 3, 3])  # [4 4][6 6], [4 4][3 3]: L1 alone
    served(cp, 5, [2, 2, 1, 1])
    cp.issue(Direction.D2H, list(cp.tree.match([2, 2, 1, 1], touch=False).path))
    served(cp, 6, [5, 5])
    (alone,) = cp.tree.match([5, 5], touch=False).path
    cp.complete(cp.issue(Direction.D2H, [alone]).op_id)
    cp.evict_node(alone, "L1")  # in L2 alone
    cp.begin_request(7, [7, 7, 8, 8, 9, 9, 1])
    cp.compute(7, 2)  # the tail page: private until the request ends
    cp.begin_request(8, [9, 9, 9])
    served(cp, 9, [6, 6])
    (deep,) = cp.tree.match([6, 6], touch=False).path
    cp.complete(cp.issue(Direction.D2H, [deep]).op_id)
    cp.complete(cp.issue(Direction.H2S, [deep]).op_id)
    cp.evict_node(deep, "L1")
    cp.evict_node(deep, "L2")  # in L3 alone: promoted for request 10
    cp.begin_request(10, [6, 6, 0])
    cp.issue(Direction.S2H, [deep], request_id=10)
    return cp


def windows_plane() -> ControlPlane:
    """dsv4-tiny (a trailing window pool): a node whose L1 window is freed, one locked by a
    request, one in L1 alone."""
    cp = ControlPlane(4, (16, 16, 16), pools=group("dsv4-tiny"))  # its anchor's page size
    a, b = [1] * 4 + [2] * 4, [3] * 4
    served(cp, 1, a)
    served(cp, 2, b)
    cp.tombstone(cp.tree.match(a, touch=False).path[-1])
    cp.begin_request(3, [*b, 0])
    return cp


def test_every_kind_of_the_catalogue_is_built_and_refused_on_two_busy_planes() -> None:
    offered: set[str] = set()
    for cp in (busy_plane(), windows_plane()):
        for pick in range(16):
            before = cp.state_key()
            for call in calls(cp, pick):
                assert refusal(cp, call, before) is None, call.what
                offered.add(call.kind)
    assert set(KINDS) - offered == set()


def _kinds_refused(pools: str, seed: int, runs: int) -> Coverage:
    coverage = Coverage()
    machine: Any = controller_machine("null", coverage, name="Illegal", pools=pools)
    machine._hypothesis_internal_use_seed = seed
    config = settings(
        max_examples=runs,
        stateful_step_count=50,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    with no_source_constants():
        run_state_machine_as_test(machine, settings=config)
    return coverage


RARE = {
    "advance_unpublished",
    "end_part_keep",
    "end_request_pending",
    "issue_bad_head",
    "issue_bad_tail",
    "issue_freed_window",
    "issue_gap",
}
"""Kinds whose state the machine reaches seldom (a request behind a restore, an S2H or a
request's restore pending between steps, a freed window over a node L2 lacks, a path of
nodes half issuable, three nodes on one path): a few hundred steps may make none of them
(hicache fuzz --report counts each; the busy planes above build every kind)."""


def test_the_fuzz_machine_makes_the_illegal_calls_between_its_steps() -> None:
    """The product machine on the null plane, one pool and dsv4-tiny (freed windows): every
    kind but the rare ones is made and refused within a few hundred steps each."""
    refused = _kinds_refused("mha", 1, 10).refused + _kinds_refused("dsv4-tiny", 1, 10).refused
    assert set(KINDS) - RARE - set(refused) == set(), sorted(refused)
    assert refused["unknown_request"] > 0


def test_lifecycle_md_lists_every_kind_of_the_catalogue_once() -> None:
    """spec/lifecycle.md, "Refused calls, and the fuzz that makes them": one row per kind."""
    text = (Path(__file__).resolve().parent.parent / "spec" / "lifecycle.md").read_text()
    section = text.split("### Refused calls, and the fuzz that makes them")[1].split("\n## ")[0]
    rows = re.findall(r"^\| `(\w+)` \|", section, flags=re.MULTILINE)
    assert sorted(rows) == sorted(KINDS) and len(rows) == len(set(rows))
