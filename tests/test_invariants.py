"""Invariants I1..I6 and structural checks S1..S7: a valid snapshot passes every check, and
breaking one property is reported with the exact check, tier, pages, nodes and ops.

The hand-built snapshot (page size 4 tokens, 8 pages per tier; locks are path locks):

    root 0 ─┬─ node 1 (8 tokens)  L1 [0,1]  L2 [0,1]  L3 [0,1]       all RESIDENT
            │   │                 L1 lock 2 (the two path locks on node 2)
            │   └─ node 2 (4)     L1 [2] RESIDENT, lock 2 (source of op 10; request 7's prefix)
            │                     L2 D2H_PENDING: op 10 fills L2 page 2
            └─ node 3 (8 tokens)  L1 H2D_PENDING: op 11 fills L1 pages 3,4 from L2 3,4
                                  L2 [3,4] RESIDENT, lock 2 (source of ops 11 and 12)
                                  L3 H2S_PENDING: op 12 fills L3 pages 5,6 from L2 3,4
    request 7: holds node 2 locked in L1 (12 tokens published), cached_len 8, private L1 page 5
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import cast

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hicache.bench.invariants import main as bench_main
from hicache.bench.invariants import synthetic_snapshot
from hicache.core.lifecycle import RESIDENT as SPEC_RESIDENT
from hicache.core.pages import FREE, PRIVATE, TREE, Pages, pages
from hicache.core.snapshot import (
    NO_PAGES,
    TOMBSTONE,
    NodeView,
    OpView,
    PoolView,
    RequestView,
    Snapshot,
    TierView,
)
from hicache.errors import ConfigError, InvariantViolation
from hicache.invariants import CHECKS, CheckMode, InvariantChecker, Violation, check_all, get_check
from hicache.invariants.ownership import RESIDENT

CAP = 8
TIERS = ("L1", "L2", "L3")
R, A = "RESIDENT", "ABSENT"


def owner(tree: list[int], private: list[int]) -> npt.NDArray[np.uint8]:
    o = np.full(CAP, FREE, dtype=np.uint8)
    o[tree] = TREE
    o[private] = PRIVATE
    return o


def node(
    node_id: int,
    parent: int | None,
    children: tuple[int, ...],
    key: int,
    values: dict[str, list[int] | None],
    states: dict[str, str],
    locks: dict[str, int] | None = None,
    pending: dict[str, int | None] | None = None,
) -> NodeView:
    return NodeView(
        node_id,
        parent,
        children,
        key,
        values={t: None if values.get(t) is None else pages(values[t]) for t in TIERS},
        states={t: states.get(t, A) for t in TIERS},
        locks={t: (locks or {}).get(t, 0) for t in TIERS},
        pending={t: (pending or {}).get(t) for t in TIERS},
    )


# Content (one digest per logical page) of each tier's physical pages.
CONTENT = {
    "L1": {0: 101, 1: 102, 2: 201},
    "L2": {0: 101, 1: 102, 3: 301, 4: 302},
    "L3": {0: 101, 1: 102},
}
DigestFn = Callable[[str, Pages], npt.NDArray[np.uint64]]


def digests_of(content: dict[str, dict[int, int]]) -> DigestFn:
    tables = {t: np.zeros(CAP, dtype=np.uint64) for t in TIERS}
    for t, pairs in content.items():
        for p, d in pairs.items():
            tables[t][p] = d

    def digests(tier: str, p: Pages) -> npt.NDArray[np.uint64]:
        return tables[tier][p]

    return digests


def valid() -> Snapshot:
    nodes = (
        node(0, None, (1, 3), 0, {}, {}),
        node(
            1,
            0,
            (2,),
            8,
            {"L1": [0, 1], "L2": [0, 1], "L3": [0, 1]},
            {"L1": R, "L2": R, "L3": R},
            {"L1": 2},
        ),
        node(2, 1, (), 4, {"L1": [2]}, {"L1": R, "L2": "D2H_PENDING"}, {"L1": 2}, {"L2": 10}),
        node(
            3,
            0,
            (),
            8,
            {"L2": [3, 4]},
            {"L1": "H2D_PENDING", "L2": R, "L3": "H2S_PENDING"},
            {"L2": 2},
            {"L1": 11, "L3": 12},
        ),
    )
    ops = (
        OpView(10, "D2H", "L1", "L2", (2,), pages([2]), pages([2]), 8, 12, lock_node_id=2),
        OpView(11, "H2D", "L2", "L1", (3,), pages([3, 4]), pages([3, 4]), 0, 8, lock_node_id=3),
        OpView(12, "H2S", "L2", "L3", (3,), pages([3, 4]), pages([5, 6]), 0, 8, lock_node_id=3),
    )
    tiers = {
        "L1": TierView("L1", CAP, owner([0, 1, 2], [3, 4, 5]), 3),
        "L2": TierView("L2", CAP, owner([0, 1, 3, 4], [2]), 4),
        "L3": TierView("L3", CAP, owner([0, 1], [5, 6]), 2),
    }
    requests = (request(7, 8, 2, [5]),)
    return Snapshot(4, tiers, nodes, ops, requests, digests_of(CONTENT), 0)


def request(
    request_id: int,
    cached_len: int,
    locked: int,
    private: list[int],
    pins: tuple[tuple[int, str], ...] = (),
) -> RequestView:
    return RequestView(
        request_id,
        cached_len,
        locked_node_id=locked,
        pins=pins,
        private_pages={"L1": pages(private)},
    )


# -- helpers that break one record ------------------------------------------------------------


def with_node(s: Snapshot, node_id: int, **changes: object) -> Snapshot:
    """`s` with node `node_id`'s fields replaced; per-tier dict fields are merged, not replaced."""

    def changed(n: NodeView) -> NodeView:
        merged: dict[str, object] = {}
        for field, new in changes.items():
            if isinstance(new, dict):
                old: dict[str, object] = dict(getattr(n, field))
                new = {**old, **new}
                if field == "values":
                    new = {t: None if v is None else pages(v) for t, v in new.items()}
            merged[field] = new
        return dataclasses.replace(n, **merged)  # type: ignore[arg-type]

    nodes = tuple(changed(n) if n.node_id == node_id else n for n in s.nodes)
    return dataclasses.replace(s, nodes=nodes)


def with_owner(s: Snapshot, tier: str, page: int, code: int) -> Snapshot:
    o = s.tiers[tier].owner.copy()
    o[page] = code
    return with_tier(s, tier, owner=o)


def with_tier(s: Snapshot, tier: str, **changes: object) -> Snapshot:
    view = dataclasses.replace(s.tiers[tier], **changes)  # type: ignore[arg-type]
    return dataclasses.replace(s, tiers={**s.tiers, tier: view})


def with_op(s: Snapshot, op_id: int, **changes: object) -> Snapshot:
    def changed(o: OpView) -> OpView:
        return dataclasses.replace(o, **changes)  # type: ignore[arg-type]

    ops = tuple(changed(o) if o.op_id == op_id else o for o in s.ops)
    return dataclasses.replace(s, ops=ops)


def ids(found: list[Violation]) -> set[str]:
    return {v.invariant for v in found}


def only(found: list[Violation], invariant: str) -> Violation:
    """The single violation of `invariant` in `found`."""
    mine = [v for v in found if v.invariant == invariant]
    assert len(mine) == 1, found
    return mine[0]


# -- the valid snapshot --------------------------------------------------------------------


def test_valid_snapshot_passes_every_check() -> None:
    assert check_all(valid()) == []


def test_every_check_has_a_violation_test() -> None:
    """spec/invariants.md names `test_<name>_violation` for each check; it must exist here."""
    assert [c.name for c in CHECKS if f"test_{c.name}_violation" not in globals()] == []


def test_registry_lists_fourteen_checks_in_spec_order() -> None:
    assert [c.id for c in CHECKS] == (
        [f"I{i}" for i in range(1, 7)] + ["I9"] + [f"S{i}" for i in range(1, 8)]
    )
    assert get_check("I2").name == "inflight_source_pinned"
    assert get_check("tier_ancestor_closed").id == "S6"
    assert get_check("I9").name == "group_atomic"
    with pytest.raises(ConfigError, match="invariant"):
        get_check("I7")


def test_resident_state_name_matches_the_spec_tables() -> None:
    assert RESIDENT == SPEC_RESIDENT


def test_violation_reads_as_one_line() -> None:
    v = Violation("I1", "ownership_disjoint", "L2", (3, 4), (), (7,), "two pages are both")
    assert str(v) == "I1 ownership_disjoint [L2] pages 3,4 ops 7: two pages are both"


# -- I1 .. I6 --------------------------------------------------------------------------------


def test_ownership_disjoint_violation() -> None:
    """L1 page 0 is in node 1's value and also on the free list."""
    found = check_all(with_owner(valid(), "L1", 0, FREE))
    v = only(found, "I1")
    assert (v.tier, v.pages, v.nodes) == ("L1", (0,), (1,))
    assert "FREE" in v.message
    assert ids(found) == {"I1", "I6"}  # page 0 is also counted twice (free list + node 1)


def test_ownership_disjoint_request_page_the_table_calls_tree() -> None:
    found = check_all(with_owner(valid(), "L1", 5, TREE))
    v = only(found, "I1")
    assert (v.tier, v.pages, v.nodes, v.ops) == ("L1", (5,), (), ())
    assert "not PRIVATE" in v.message
    assert ids(found) == {"I1", "I6"}  # the table now counts one TREE page too many


def test_ownership_disjoint_tree_page_also_private_to_a_request() -> None:
    s = valid()
    s = dataclasses.replace(s, requests=(request(7, 8, 2, [2]),))
    s = with_owner(s, "L1", 5, FREE)
    v = only(check_all(s), "I1")
    assert (v.tier, v.pages, v.nodes) == ("L1", (2,), (2,))
    assert "private" in v.message


def test_inflight_source_pinned_violation() -> None:
    """Node 2, the L1 source of op 10, holds no L1 lock."""
    found = check_all(with_node(valid(), 2, locks={"L1": 0}))
    v = only(found, "I2")
    assert (v.tier, v.nodes, v.ops) == ("L1", (2,), (10,))
    assert ids(found) == {"I2", "S7"}  # op 10 and request 7 record locks the tree lost


def test_inflight_source_pinned_pages_are_not_the_nodes_value() -> None:
    v = only(check_all(with_op(valid(), 10, source_pages=pages([1]))), "I2")
    assert (v.tier, v.pages, v.nodes, v.ops) == ("L1", (1, 2), (2,), (10,))


def test_inflight_source_pinned_page_not_tree_owned() -> None:
    found = check_all(with_owner(valid(), "L2", 4, PRIVATE))
    mine = [v for v in found if v.invariant == "I2"]
    assert {(v.tier, v.pages, v.ops) for v in mine} == {("L2", (4,), (11,)), ("L2", (4,), (12,))}


def test_page_aligned_violation() -> None:
    """Node 2's key is 5 tokens with 4-token pages."""
    found = check_all(with_node(valid(), 2, key_tokens=5))
    v = only(found, "I3")
    assert (v.tier, v.nodes) == (None, (2,))
    assert ids(found) == {"I3"}


def test_page_aligned_value_length_disagrees_with_key() -> None:
    found = check_all(with_node(valid(), 1, key_tokens=12))  # 3 pages of key, 2 in every value
    assert {(v.invariant, v.tier, v.nodes) for v in found} == {("I3", t, (1,)) for t in TIERS}


def test_page_aligned_op_range() -> None:
    v = only(check_all(with_op(valid(), 11, token_start=2, token_end=10)), "I3")
    assert (v.tier, v.ops) == ("L1", (11,))


def test_tier_bytes_equal_violation() -> None:
    """Node 1's L3 page 1 holds other bytes than its L1 and L2 copies."""
    content = {**CONTENT, "L3": {0: 101, 1: 999}}
    found = check_all(dataclasses.replace(valid(), digests=digests_of(content)))
    v = only(found, "I4")
    assert (v.tier, v.pages, v.nodes) == ("L3", (1,), (1,))
    assert ids(found) == {"I4"}


def test_tier_bytes_equal_vacuous_without_digests() -> None:
    content = {**CONTENT, "L3": {0: 101, 1: 999}}
    assert check_all(dataclasses.replace(valid(), digests=None)) == []
    assert ids(check_all(dataclasses.replace(valid(), digests=digests_of(content)))) == {"I4"}


def test_publish_order_violation() -> None:
    """Node 2 is RESIDENT in L2 while op 10 still fills it."""
    found = check_all(with_node(valid(), 2, states={"L2": R}))
    v = only(found, "I5")
    assert (v.tier, v.nodes, v.ops) == ("L2", (2,), (10,))
    assert ids(found) == {"I5"}


def test_publish_order_op_target_already_tree() -> None:
    found = check_all(with_owner(valid(), "L2", 2, TREE))
    v = only(found, "I5")
    assert (v.tier, v.pages, v.ops) == ("L2", (2,), (10,))
    assert ids(found) == {"I1", "I5", "I6"}


def test_publish_order_cached_len_ahead_of_publication() -> None:
    s = dataclasses.replace(valid(), requests=(request(7, 16, 2, [5]),))
    v = only(check_all(s), "I5")
    assert "request(s) [7]" in v.message and "cached_len 16 > 12 tokens published" in v.message


def test_publish_order_request_clause_reads_the_tree() -> None:
    """The published prefix is measured in the tree, not taken from the request: moving the
    request's lock to node 1 (8 tokens) makes cached_len 12 early, whatever the request says."""
    s = dataclasses.replace(valid(), requests=(request(7, 12, 2, [5]),))
    assert check_all(s) == []
    s = dataclasses.replace(s, requests=(request(7, 12, 1, [5]),))
    s = with_node(with_node(s, 2, locks={"L1": 1}), 1, locks={"L1": 2})
    v = only(check_all(s), "I5")
    assert "cached_len 12 > 8 tokens published" in v.message


def test_publish_order_request_locks_an_unpublished_node() -> None:
    """Request 7 holds node 3, which is still being loaded back into L1 (H2D_PENDING)."""
    s = dataclasses.replace(valid(), requests=(request(7, 0, 3, [5]),))
    s = with_node(with_node(s, 2, locks={"L1": 1}), 1, locks={"L1": 1})
    s = with_node(s, 3, locks={"L1": 1})
    v = only(check_all(s), "I5")
    assert (v.tier, v.nodes) == ("L1", (3,)) and "not RESIDENT in L1" in v.message


def test_publish_order_request_locks_a_removed_node() -> None:
    s = dataclasses.replace(valid(), requests=(request(7, 0, 42, [5]),))
    s = with_node(with_node(s, 2, locks={"L1": 1}), 1, locks={"L1": 1})
    found = check_all(s)
    assert "not in the tree" in only(found, "I5").message
    assert "not in the tree" in only(found, "S7").message


def test_publish_order_pending_node_names_an_op_that_is_gone() -> None:
    found = check_all(with_node(valid(), 3, pending={"L3": 99}))
    # Both directions of the link break: node 3 waits on op 99, op 12 no longer has node 3.
    assert {(v.invariant, v.tier, v.nodes, v.ops) for v in found} == {
        ("I5", "L3", (3,), (99,)),
        ("I5", "L3", (3,), (12,)),
    }


def test_page_conservation_violation() -> None:
    """Free L1 page 6 turns PRIVATE with no op or request holding it."""
    found = check_all(with_owner(valid(), "L1", 6, PRIVATE))
    v = only(found, "I6")
    assert (v.tier, v.pages) == ("L1", (6,))
    assert ids(found) == {"I6"}


def test_page_conservation_leak_after_transfers_drain() -> None:
    s = with_owner(valid(), "L3", 7, PRIVATE)
    s = dataclasses.replace(s, ops=tuple(o for o in s.ops if o.op_id != 12))
    s = with_node(s, 3, states={"L3": A}, pending={"L3": None}, locks={"L2": 1})
    s = with_owner(with_owner(s, "L3", 5, FREE), "L3", 6, FREE)
    v = only(check_all(s), "I6")
    assert (v.tier, v.pages) == ("L3", (7,))
    assert "still PRIVATE" in v.message


def test_page_conservation_page_outside_capacity() -> None:
    v = only(check_all(with_op(valid(), 12, target_pages=pages([5, 9]))), "I6")
    assert (v.tier, v.pages, v.ops) == ("L3", (9,), (12,))


# -- S1 .. S6 --------------------------------------------------------------------------------


def test_parent_child_links_violation() -> None:
    """Node 2 is missing from its parent's child list."""
    found = check_all(with_node(valid(), 2, parent_link_ok=False))
    v = only(found, "S1")
    assert v.nodes == (2,)
    assert ids(found) == {"S1"}


def test_parent_child_links_cycle() -> None:
    s = with_node(with_node(valid(), 1, parent_id=2), 0, child_ids=(3,))
    found = [v for v in check_all(s) if v.invariant == "S1"]
    assert any("cycle" in v.message and v.nodes == (1, 2) for v in found)


def test_parent_child_links_two_roots() -> None:
    found = [v for v in check_all(with_node(valid(), 3, parent_id=None)) if v.invariant == "S1"]
    assert any(v.nodes == (3,) and "not the root" in v.message for v in found)


def test_no_dead_node_violation() -> None:
    """Node 4 holds nothing, waits on nothing and has no children."""
    s = with_node(valid(), 1, child_ids=(2, 4))
    s = dataclasses.replace(s, nodes=(*s.nodes, node(4, 1, (), 4, {}, {})))
    found = check_all(s)
    assert only(found, "S2").nodes == (4,)
    assert ids(found) == {"S2"}


def test_tier_size_accounting_violation() -> None:
    """The tree counts 5 L2 pages; its values hold 4."""
    found = check_all(with_tier(valid(), "L2", tree_pages_counted=5))
    v = only(found, "S3")
    assert v.tier == "L2" and "counts 5" in v.message and "hold 4" in v.message
    assert ids(found) == {"S3"}


def test_locks_non_negative_violation() -> None:
    """Node 1's L3 lock count is -1."""
    found = check_all(with_node(valid(), 1, locks={"L3": -1}))
    v = only(found, "S4")
    assert (v.tier, v.nodes) == ("L3", (1,))
    assert ids(found) == {"S4"}


def test_no_double_reference_violation() -> None:
    """L1 page 1 is in node 1's value and in node 2's."""
    s = with_node(valid(), 2, values={"L1": [1]})  # node 1 holds L1 page 1 too
    s = with_owner(with_op(s, 10, source_pages=pages([1])), "L1", 2, FREE)
    found = check_all(s)
    v = only(found, "S5")
    assert (v.tier, v.pages, v.nodes) == ("L1", (1,), (1, 2))
    assert ids(found) == {"S5", "I6"}  # page 1 is also counted twice


def test_tier_ancestor_closed_violation() -> None:
    """Node 1 loses its L2 value while op 10 backs its child up to L2."""
    s = with_node(valid(), 1, values={"L2": None}, states={"L2": A})
    s = with_owner(with_owner(s, "L2", 0, FREE), "L2", 1, FREE)
    s = with_tier(s, "L2", tree_pages_counted=2)
    found = check_all(s)
    v = only(found, "S6")
    assert (v.tier, v.nodes, v.ops) == ("L2", (2,), (10,))
    assert ids(found) == {"S6"}


def test_tier_ancestor_closed_resident_child() -> None:
    # Op 10 completed (node 2 now RESIDENT in L2 page 2), then node 1 lost its L2 value.
    s = dataclasses.replace(valid(), ops=tuple(o for o in valid().ops if o.op_id != 10))
    s = with_node(s, 2, values={"L2": [0]}, states={"L2": R}, pending={"L2": None}, locks={"L1": 1})
    s = with_node(s, 1, locks={"L1": 1})  # request 7's lock is left
    s = with_node(s, 1, values={"L2": None}, states={"L2": A})
    s = with_owner(with_owner(s, "L2", 1, FREE), "L2", 2, FREE)
    s = with_tier(s, "L2", tree_pages_counted=3)
    s = dataclasses.replace(s, digests=digests_of({**CONTENT, "L2": {0: 201, 3: 301, 4: 302}}))
    found = check_all(s)
    v = only(found, "S6")
    assert (v.tier, v.nodes, v.ops) == ("L2", (2,), ())
    assert ids(found) == {"S6"}


def test_lock_accounting_violation() -> None:
    """A leaked lock: node 3 is locked once more in L2 than ops 11 and 12 account for (a
    `tree.lock` no holder records). Nothing else is wrong, so only S7 sees it."""
    found = check_all(with_node(valid(), 3, locks={"L2": 3}))
    v = only(found, "S7")
    assert (v.tier, v.nodes) == ("L2", (3,))
    assert "leaked" in v.message and "+1" in v.message
    assert ids(found) == {"S7"}


def test_lock_accounting_lost_lock() -> None:
    """A lost lock: request 7's L1 lock on node 2 is gone from the tree (node 2 and its parent
    count only op 10's), though the request still records it."""
    found = check_all(with_node(with_node(valid(), 2, locks={"L1": 1}), 1, locks={"L1": 1}))
    v = only(found, "S7")
    assert (v.tier, v.nodes) == ("L1", (1, 2))
    assert "lost" in v.message and "-1" in v.message
    assert ids(found) == {"S7"}


def test_lock_accounting_counts_pins_and_path_locks() -> None:
    """A pin is a path lock too: pinning node 2 in L3 must show on nodes 2 and 1."""
    s = dataclasses.replace(valid(), requests=(request(7, 8, 2, [5], pins=((2, "L3"),)),))
    assert ids(check_all(s)) == {"S7"}
    s = with_node(with_node(s, 2, locks={"L3": 1}), 1, locks={"L3": 1})
    assert check_all(s) == []
    s = with_node(s, 1, locks={"L3": 0})  # the pin counted on node 2 but not its ancestor
    assert only(check_all(s), "S7").nodes == (1,)


def with_grandchild(s: Snapshot, d2h_op: int) -> Snapshot:
    """`s` plus node 5 (child of node 2, L1 page 6) being backed up to L2 page 7 by op
    `d2h_op`: op 10 itself (one op over the chain 2 -> 5) or a separate op."""
    child = node(
        5, 2, (), 4, {"L1": [6]}, {"L1": R, "L2": "D2H_PENDING"}, {"L1": 1}, {"L2": d2h_op}
    )
    s = dataclasses.replace(s, nodes=(*s.nodes, child))
    if d2h_op == 10:  # op 10's one source lock moves down to the chain's deepest node
        s = with_op(
            s,
            10,
            node_ids=(2, 5),
            source_pages=pages([2, 6]),
            target_pages=pages([2, 7]),
            token_end=16,
            lock_node_id=5,
        )
        s = with_node(s, 2, child_ids=(5,))
    else:  # op 13's lock counts on node 5 and on its ancestors 2 and 1
        op = OpView(d2h_op, "D2H", "L1", "L2", (5,), pages([6]), pages([7]), 12, 16, lock_node_id=5)
        s = dataclasses.replace(s, ops=(*s.ops, op))
        s = with_node(with_node(s, 2, child_ids=(5,), locks={"L1": 3}), 1, locks={"L1": 3})
    s = with_tier(with_owner(s, "L1", 6, TREE), "L1", tree_pages_counted=4)
    return with_owner(s, "L2", 7, PRIVATE)


def test_tier_ancestor_closed_holds_for_one_op_chain() -> None:
    assert check_all(with_grandchild(valid(), 10)) == []


def test_tier_ancestor_closed_child_on_another_op() -> None:
    found = check_all(with_grandchild(valid(), 13))
    v = only(found, "S6")
    assert (v.tier, v.nodes, v.ops) == ("L2", (5,), (10, 13))
    assert ids(found) == {"S6"}


# -- properties over synthetic snapshots -------------------------------------------------------


@given(st.integers(22, 600), st.integers(0, 2**16))
def test_synthetic_snapshots_are_valid(n_pages: int, seed: int) -> None:
    assert check_all(synthetic_snapshot(n_pages, seed=seed, node_pages=4)) == []


@given(st.integers(22, 400), st.integers(0, 2**16), st.data())
def test_any_single_owner_flip_is_caught(n_pages: int, seed: int, data: st.DataObject) -> None:
    """Whatever page's owner code changes, some check names that page in that tier."""
    s = synthetic_snapshot(n_pages, seed=seed, node_pages=4)
    tier = data.draw(st.sampled_from(TIERS))
    page = data.draw(st.integers(0, s.tiers[tier].capacity - 1))
    was = int(s.tiers[tier].owner[page])
    code = data.draw(st.sampled_from([c for c in (FREE, PRIVATE, TREE) if c != was]))
    found = check_all(with_owner(s, tier, page, code))
    assert any(v.tier == tier and page in v.pages for v in found), found


# -- check modes ---------------------------------------------------------------------------


def test_check_mode_parses_the_three_forms() -> None:
    assert CheckMode.parse("off") == CheckMode("off")
    assert CheckMode.parse("every") == CheckMode("every")
    assert CheckMode.parse("periodic 3") == CheckMode("periodic", 3)
    for bad in ("", "sometimes", "periodic", "periodic 0", "periodic -2", "periodic x", "every 2"):
        with pytest.raises(ConfigError, match="check_mode"):
            CheckMode.parse(bad)


@pytest.mark.parametrize(("mode", "expected"), [("every", 7), ("periodic 3", 2), ("off", 0)])
def test_checker_builds_snapshots_only_when_due(mode: str, expected: int) -> None:
    built: list[Snapshot] = []

    def build() -> Snapshot:
        built.append(valid())
        return built[-1]

    checker = InvariantChecker(mode)
    for step in range(7):
        checker.after_transition(build, f"step {step}")
    assert (checker.transitions, checker.checks_run, len(built)) == (7, expected, expected)
    assert checker.violations_found == 0


@pytest.mark.parametrize(("mode", "raises_at"), [("every", 1), ("periodic 3", 3)])
def test_checker_raises_with_every_violation_and_context(mode: str, raises_at: int) -> None:
    broken = with_node(with_owner(valid(), "L1", 6, PRIVATE), 1, locks={"L3": -1})
    checker = InvariantChecker(mode)
    for step in range(1, raises_at):
        checker.after_transition(lambda: broken, f"step {step}")
    with pytest.raises(InvariantViolation) as err:
        checker.after_transition(lambda: broken, f"step {raises_at}")
    found = cast("tuple[Violation, ...]", err.value.violations)
    assert {v.invariant for v in found} == {"I6", "S4"}
    assert f"after step {raises_at}" in str(err.value)
    assert (checker.checks_run, checker.violations_found) == (1, 2)


def test_group_atomic_violation() -> None:
    """I9: a side pool page whose anchor page was freed (B10) is reported; the valid
    snapshot with that side pool following its anchor passes."""
    pool = PoolView(
        "swa", "L1.swa", CAP, owner([0, 1, 2], [3, 4, 5]), np.full((CAP, 1), -1, dtype=np.int64)
    )
    pool.held_by[[0, 1, 2, 3, 4, 5], 0] = [0, 1, 2, 3, 4, 5]
    s = valid()
    good = dataclasses.replace(
        s, tiers={**s.tiers, "L1": dataclasses.replace(s.tiers["L1"], pools=(pool,))}
    )
    assert check_all(good) == []
    freed = with_owner(good, "L1", 0, FREE)  # the anchor page is freed, its swa page kept
    found = [v for v in check_all(freed) if v.invariant == "I9"]
    assert {v.tier for v in found} == {"L1"} and found[0].pages == (0,)
    assert "group_atomic" in str(found[0])


def windowed(freed: list[int], hit_window: int = 1, window: bool = True) -> Snapshot:
    """valid() with an L1 trailing pool (`swa`, ratio 1) following the anchor, the windows
    of anchor pages `freed` freed (TOMBSTONE rows, their swa pages FREE)."""
    held = np.full((CAP, 1), NO_PAGES, dtype=np.int64)
    held[[0, 1, 2, 3, 4, 5], 0] = [0, 1, 2, 3, 4, 5]
    held[freed] = TOMBSTONE
    kept = [p for p in (0, 1, 2) if p not in freed]
    pool = PoolView(
        "swa",
        "L1.swa",
        CAP,
        owner(kept, [p for p in (3, 4, 5) if p not in freed]),
        held,
        window=window,
    )
    return with_tier(valid(), "L1", pools=(pool,), hit_window=hit_window)


def test_group_atomic_allows_a_freed_window_of_a_whole_node_outside_every_hit_window() -> None:
    """Node 1 (L1 pages 0, 1) lost its window; request 7 reads the prefix 0, 1, 2 and needs
    only the last page's window (hit_window 1): I9 holds."""
    assert check_all(windowed([0, 1])) == []


def test_group_atomic_window_violations() -> None:
    """I9's window rules: a request's prefix with a gap within its hit window; a window
    freed for part of a node; one freed for a page not TREE; a TOMBSTONE in a pool that is
    not a trailing pool."""
    gap = only(check_all(windowed([0, 1], hit_window=2)), "I9")
    assert gap.pages == (1,) and "request 7" in gap.message
    half = only(check_all(windowed([1])), "I9")
    assert half.nodes == (1,) and "whole node" in half.message
    private = [v for v in check_all(windowed([0, 1, 3])) if v.invariant == "I9"]
    assert any(v.pages == (3,) and "not TREE" in v.message for v in private)
    plain = only(check_all(windowed([0, 1], window=False)), "I9")
    assert "outside" in plain.message and plain.pages == (TOMBSTONE,)  # listed once


def test_checker_off_never_raises() -> None:
    broken = with_owner(valid(), "L1", 6, PRIVATE)
    checker = InvariantChecker("off")
    for step in range(5):
        checker.after_transition(lambda: broken, f"step {step}")
    assert (checker.checks_run, checker.violations_found) == (0, 0)


# -- benchmark entry point -----------------------------------------------------------------


def test_bench_writes_one_row_per_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "invariants.json"
    assert bench_main(["--pages", "100", "200", "--repeats", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["pages_per_tier"] for r in rows] == [100, 200]
    assert set(rows[0]["checks_us"]) == {c.id for c in CHECKS}
    assert "ns/page" in capsys.readouterr().out
