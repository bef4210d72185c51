"""Illegal calls on the control plane (issue 31, item 2): each refused, typed, nothing changed.

The plane's public query `state_key` is the judge ("raise, state unchanged", spec/README.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hicache.control import ControlPlane
from hicache.tiers import Direction
from tests.test_control import PS, served


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
