"""S7 `lock_accounting` on the real control plane: the snapshot carries every holder's lock
record (a request's L1 prefix lock and pins, an op's source lock) independently of the tree's
counts, so a lock taken or dropped behind the holders' backs is caught."""

from __future__ import annotations

import pytest

from hicache.core.control import ControlPlane
from hicache.core.tiers import Direction
from hicache.errors import InvariantViolation
from hicache.invariants import check_all

PS = 4


def plane_with_prefix() -> ControlPlane:
    """Request 1 has inserted [0..8) (two nodes: [0..4) and [4..8), after request 2's split)
    and holds it locked in L1; request 2 holds [0..4); a D2H backup of [0..4) is in flight."""
    cp = ControlPlane(PS, (16, 16, 16), check_mode="every")
    cp.begin_request(1, list(range(9)), match_len=0)
    cp.compute(1, 8)
    cp.insert(1)
    cp.begin_request(2, [0, 1, 2, 3, 99], match_len=4)
    cp.issue(Direction.D2H, [cp.requests[2].locked])
    return cp


def test_snapshot_carries_each_holders_lock_records() -> None:
    cp = plane_with_prefix()
    upper = cp.requests[2].locked
    lower = cp.requests[1].locked
    cp.pin(2, upper, "L3")
    s = cp.snapshot()
    reqs = {r.request_id: r for r in s.requests}
    assert (reqs[1].locked_node_id, reqs[2].locked_node_id) == (lower.node_id, upper.node_id)
    assert reqs[2].pins == ((upper.node_id, "L3"),)
    assert [(op.source, op.lock_node_id) for op in s.ops] == [("L1", upper.node_id)]
    locks = {n.node_id: dict(n.locks) for n in s.nodes}
    # Path locks: request 1 counts on both nodes, request 2 and the op on the upper one.
    assert locks[upper.node_id] == {"L1": 3, "L2": 0, "L3": 1}
    assert locks[lower.node_id] == {"L1": 1, "L2": 0, "L3": 0}
    assert check_all(s) == []


def test_a_leaked_lock_is_caught() -> None:
    """A `tree.lock` with no owner: nobody will ever release it, so the prefix stays pinned."""
    cp = plane_with_prefix()
    leaked = cp.requests[1].locked
    cp.tree.lock(leaked, 1)
    found = check_all(cp.snapshot())
    assert {v.invariant for v in found} == {"S7"}
    assert all("leaked" in v.message and v.tier == "L2" for v in found)
    assert {n for v in found for n in v.nodes} == {n.node_id for n in cp.tree.path_to_root(leaked)}
    with pytest.raises(InvariantViolation, match="S7 lock_accounting"):
        cp.end_request(2)  # the next transition's check finds it


def test_a_lost_lock_is_caught() -> None:
    """Request 1 still records its L1 lock on [4..8), but the tree no longer counts it: an
    eviction could take pages the request attends to."""
    cp = plane_with_prefix()
    cp.tree.unlock(cp.requests[1].locked, 0)
    found = check_all(cp.snapshot())
    assert {v.invariant for v in found} == {"S7"}
    assert all("lost" in v.message and v.tier == "L1" for v in found)
    assert cp.tree.candidates(0) == [cp.requests[1].locked]  # what the lost lock allows


def test_an_op_that_records_the_wrong_source_lock_is_caught() -> None:
    """The op's lock record and the tree's count disagree when the lock moved elsewhere."""
    cp = plane_with_prefix()
    op = next(iter(cp.ops.values()))
    cp.tree.unlock(op.nodes[-1], 0)
    cp.tree.lock(cp.requests[1].locked, 0)  # the same count, on the wrong node
    found = check_all(cp.snapshot())
    assert {v.invariant for v in found} == {"S7"}
    assert {("leaked" in v.message, v.nodes) for v in found} == {
        (True, (cp.requests[1].locked.node_id,))
    }
