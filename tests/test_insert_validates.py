"""`insert` validates before it splits: an insert that raises leaves the tree exactly as it
was, splits included (spec/tree.md, `insert`; "check everything, then change").

The shipped tables put no guard on `insert`, so the test runs the control plane on tables
whose `insert` row refuses a node that holds L2 (`L2 != RESIDENT`): the rejection then comes
from the lifecycle check of a node the walk ends *inside*, the one case where a split is due.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hicache.core.control import ControlPlane
from hicache.core.lifecycle import load_lifecycle
from hicache.core.tiers import Direction, Tier
from hicache.errors import IllegalTransition
from hicache.invariants import check_all
from hicache.spec import LIFECYCLE_TOML

PS = 4
INSERT_ROW = """name = "insert"
kind = "insert"
from = "PRIVATE"
to = "RESIDENT"
trigger = "the request inserts its computed prefix into the tree"
guards = []"""


def plane_refusing_insert_over_l2(tmp_path: Path) -> ControlPlane:
    text = LIFECYCLE_TOML.read_text()
    # Verify the row is still spelled as this test expects (else the guard would not land).
    assert INSERT_ROW in text
    tables = tmp_path / "lifecycle.toml"
    tables.write_text(
        text.replace(INSERT_ROW, INSERT_ROW.replace("guards = []", 'guards = ["L2 != RESIDENT"]'))
    )
    return ControlPlane(PS, (16, 16, 16), lifecycle=load_lifecycle(tables))


def tree_shape(cp: ControlPlane) -> list[tuple[int, int | None, tuple[int, ...], tuple[str, ...]]]:
    return [
        (n.node_id, None if n.parent is None else n.parent.node_id, n.key, tuple(n.state))
        for n in cp.tree.nodes()
    ]


def test_rejected_insert_leaves_the_tree_unsplit(tmp_path: Path) -> None:
    cp = plane_refusing_insert_over_l2(tmp_path)
    # Node X = [0..8) held only in L2: inserted by request 1, backed up, evicted from L1.
    cp.begin_request(1, list(range(9)), match_len=0)
    cp.compute(1, 8)
    cp.insert(1)
    (x,) = cp.tree.nodes()
    cp.complete(cp.issue(Direction.D2H, [x]).op_id)
    cp.end_request(1)
    assert cp.evict(Tier.L1, 2) == 2
    # Request 2 shares X's first page only; its insert would split X after 4 tokens.
    cp.begin_request(2, [0, 1, 2, 3, 50, 51, 52, 53, 7], match_len=0)
    cp.compute(2, 8)
    before = tree_shape(cp)
    assert cp.tree.cut([0, 1, 2, 3, 50, 51, 52, 53]) == (x, 4)
    with pytest.raises(IllegalTransition, match="L2 != RESIDENT"):
        cp.insert(2)
    assert tree_shape(cp) == before  # no split: X is whole, one node
    assert len(cp.tree) == 1 and cp.tree.audit() == []
    assert check_all(cp.snapshot()) == []


def test_accepted_insert_splits_after_validating(tmp_path: Path) -> None:
    """The same walk on the shipped tables: the split happens, the upper part is discarded
    into (it holds L1) and the rest becomes a new child."""
    cp = ControlPlane(PS, (16, 16, 16))
    cp.begin_request(1, list(range(9)), match_len=0)
    cp.compute(1, 8)
    cp.insert(1)
    cp.begin_request(2, [0, 1, 2, 3, 50, 51, 52, 53, 7], match_len=0)
    cp.compute(2, 8)
    assert cp.insert(2) == 8
    keys = sorted(n.key for n in cp.tree.nodes())
    assert keys == [(0, 1, 2, 3), (4, 5, 6, 7), (50, 51, 52, 53)]
    assert cp.requests[2].locked.key == (50, 51, 52, 53)
