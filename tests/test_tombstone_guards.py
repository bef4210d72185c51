"""`tombstone`'s guards as spec/pools.md ("Freed windows") states them: `evict_l1`'s, except
`leaf(L1)`. The sentence is read from the page and each guard it names is tried on the
reference: every guard kept refuses, the guard excepted does not."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hicache.core.lifecycle import load_lifecycle
from hicache.core.tiers import Direction
from hicache.errors import IllegalTransition
from tests.test_windows import three_nodes

SPEC = Path(__file__).resolve().parents[1] / "spec"


def stated() -> tuple[str, set[str]]:
    """The row whose guards pools.md says `tombstone` takes, and the guards it excepts."""
    text = " ".join((SPEC / "pools.md").read_text(encoding="utf-8").split())
    found = re.search(r"Its guards are `(\w+)`'s except ((?:`[^`]+`(?:, | and )?)+)", text)
    assert found, "pools.md does not say which row's guards tombstone takes and which not"
    return found.group(1), set(re.findall(r"`([^`]+)`", found.group(2)))


def test_tombstone_takes_evict_l1s_guards_but_leaf() -> None:
    """Before, the page said "its guards are an eviction's", while the reference frees an
    internal node's window (make-room relies on it): no leaf guard."""
    row, excepted = stated()
    guards = {g.text for g in load_lifecycle().transitions[row].guards}
    assert excepted == {"leaf(L1)"} and excepted <= guards
    cp, a, path = three_nodes()
    assert path[0].children  # not a leaf in L1: the excepted guard does not refuse
    cp.tombstone(path[0])
    # `locks(L1) == 0` and `L2 != D2H_PENDING`: a request's lock, a backup in flight.
    cp, a, path = three_nodes()
    cp.begin_request(7, a)
    with pytest.raises(IllegalTransition, match="locked"):
        cp.tombstone(path[-1])
    cp.end_request(7)
    op = cp.issue(Direction.D2H, path[:1])
    with pytest.raises(IllegalTransition, match="locked"):
        cp.tombstone(path[0])
    cp.cancel(op.op_id)
    cp.tombstone(path[0])
