"""The lifecycle tables are executed, not re-implemented (hicache/core/execute.py): editing a row of
a loaded copy changes what the control plane does; the range and request rules are guards and
rules with typed errors; an op's pages survive a split as one ordered list."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from hicache.core.control import ControlPlane
from hicache.core.lifecycle import Lifecycle, load_lifecycle
from hicache.core.tiers import Direction
from hicache.core.trace import ListSink, Tracer
from hicache.errors import IllegalTransition, InvariantViolation

PS = 2


def edited(name: str, lc: Lifecycle | None = None, **changes: list[str]) -> Lifecycle:
    """A copy of `lc`'s tables (default: the shipped ones) with row `name`'s fields replaced;
    the cached shipped lifecycle is untouched."""
    tables: dict[str, Any] = copy.deepcopy(dict((lc or load_lifecycle()).tables))
    for tier in tables["residency"].values():
        for row in tier["transitions"]:
            if row["name"] == name:
                row.update(changes)
    return Lifecycle(tables)


def plane(lc: Lifecycle | None = None, check_mode: str = "every") -> tuple[ControlPlane, ListSink]:
    sink = ListSink()
    return ControlPlane(
        PS, (16, 16, 16), tracer=Tracer(sink), lifecycle=lc, check_mode=check_mode
    ), sink


def backed_up_then_evicted(cp: ControlPlane) -> Any:
    """One node [1, 2, 3, 4] in L2 only."""
    cp.begin_request(1, [1, 2, 3, 4, 5])
    cp.compute(1, 6)
    cp.insert(1)
    cp.end_request(1)
    (node,) = list(cp.tree.nodes())
    cp.complete(cp.issue(Direction.D2H, [node]).op_id)
    cp.evict("L1", 8)
    return node


def test_effects_column_is_what_runs() -> None:
    """Dropping lock(L2) / unlock(L2) from the H2D rows: the load-back no longer pins L2."""
    cp, _ = plane()
    node = backed_up_then_evicted(cp)
    op = cp.issue(Direction.H2D, [node])
    assert node.lock[1] == 1  # the shipped row: the source is locked (I2)
    cp.complete(op.op_id)
    lc = load_lifecycle()
    for name in ("h2d_issue", "h2d_complete", "h2d_fail", "h2d_cancel"):
        effects = [str(e) for e in lc.transitions[name].effects if e.op not in ("lock", "unlock")]
        lc = edited(name, lc, effects=effects)
    cp, _ = plane(lc, check_mode="off")
    node = backed_up_then_evicted(cp)
    op = cp.issue(Direction.H2D, [node])
    assert node.lock[1] == 0 and node.state[0] == "H2D_PENDING"
    cp.complete(op.op_id)
    assert node.state[0] == "RESIDENT"
    # ... and the invariant check sees the unpinned source at once (I2).
    cp, _ = plane(lc)
    node = backed_up_then_evicted(cp)
    with pytest.raises(InvariantViolation, match="I2 inflight_source_pinned"):
        cp.issue(Direction.H2D, [node])


def test_guards_column_is_what_runs() -> None:
    """A guard added to a row refuses; a guard removed from a row no longer does."""
    cp, _ = plane(edited("d2h_issue", guards=["L1 == RESIDENT", "L3 == RESIDENT"]))
    cp.begin_request(1, [1, 2, 3])
    cp.compute(1, 4)
    cp.insert(1)
    (node,) = list(cp.tree.nodes())
    with pytest.raises(IllegalTransition, match="'L3 == RESIDENT' fails"):
        cp.issue(Direction.D2H, [node])
    # Without `leaf(L1)`, a parent whose child holds L1 may be evicted from L1.
    for lc, refused in ((None, True), (edited("evict_l1", guards=["locks(L1) == 0"]), False)):
        cp, _ = plane(lc, check_mode="off")
        for rid, tokens in ((1, [1, 2, 3]), (2, [1, 2, 7, 7, 7])):
            cp.begin_request(rid, tokens)
            cp.compute(rid, -(-len(tokens) // PS) * PS - cp.requests[rid].published_len)
            cp.insert(rid)
            cp.end_request(rid)
        parent = cp.tree.match([1, 2], touch=False).path[0]
        assert any(c.state[0] == "RESIDENT" for c in parent.children.values())
        if refused:
            with pytest.raises(IllegalTransition, match="not a leaf"):
                cp.evict_node(parent, "L1")
        else:
            assert cp.evict_node(parent, "L1") == 1 and parent.state[0] == "ABSENT"


def test_compute_range_rules_are_guards() -> None:
    cp, sink = plane()
    cp.begin_request(1, [1, 2, 3, 4, 5])
    events = len(sink.events)
    for n, guard in ((3, "aligned(range)"), (0, "aligned(range)"), (8, "range <= prompt")):
        with pytest.raises(IllegalTransition, match=re.escape(f"guard '{guard}' fails")):
            cp.compute(1, n)
    cp.compute(1, 2)
    with pytest.raises(IllegalTransition, match="no_private"):
        cp.compute(1, 2)
    assert cp.tables[0].free_count == 15 and len(sink.events) == events + 1


def test_match_leaves_the_last_token_to_compute() -> None:
    """Rule match_short_of_last_token: a hit never covers the whole prompt."""
    cp, _ = plane()
    cp.begin_request(1, [1, 2, 3, 4, 5])
    cp.compute(1, 6)
    cp.insert(1)
    cp.end_request(1)
    assert cp.begin_request(2, [1, 2, 3, 4]).lengths[0] == 2  # default: len - 1, aligned down
    for bad in (4, -1):
        with pytest.raises(IllegalTransition, match="match_len"):
            cp.begin_request(3, [1, 2, 3, 4], match_len=bad)
    with pytest.raises(IllegalTransition, match="match_len"):
        cp.begin_request(3, [])
    assert sorted(cp.requests) == [2]


def test_split_while_pending_cuts_one_page_list() -> None:
    """spec/lifecycle.md, "A split while an op is pending": the end events name the issue's
    pages, in the same order, cut at the new boundary."""
    cp, sink = plane()
    cp.begin_request(1, [1, 2, 3, 4, 5, 6, 7])
    cp.compute(1, 8)
    cp.insert(1)
    cp.end_request(1)
    (node,) = list(cp.tree.nodes())
    op = cp.issue(Direction.D2H, [node])
    cp.begin_request(2, [1, 2, 3, 4, 9])  # splits the pending node after 4 tokens
    cp.end_request(2)
    assert [n.num_pages for n in op.nodes] == [2, 1]
    cp.complete(op.op_id)
    issued = [e for e in sink.events if e.event == "d2h_issue"]
    ended = [e for e in sink.events if e.event == "d2h_complete"]
    assert [p for e in ended for p in e.pages] == [p for e in issued for p in e.pages]
    assert [(e.node, e.token_start, e.token_end, len(e.pages)) for e in ended] == [
        (op.nodes[0].node_id, 0, 4, 2),
        (node.node_id, 4, 6, 1),
    ]
    assert [int(p) for n in op.nodes for p in (n.value[1] if n.value[1] is not None else [])] == [
        int(p) for p in op.target_pages
    ]
