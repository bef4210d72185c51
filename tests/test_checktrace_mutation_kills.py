"""Traces that kill mutants of check-trace which its other tests and the fuzz let through.

The mutants are first-order edits of check-trace's source drawn by
benchmarks/checktrace_ast_mutants.py; each test here names the one it was written against
(benchmarks/results/2026-12-04-checktrace-mutation-score.md). Each edits one event of a valid
controller trace (hicache/oracle/checktrace/generate.py) in a way the spec forbids and requires the
violation at that event.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from hicache.core.lifecycle import ABSENT, RESIDENT, load_lifecycle
from hicache.core.trace import TraceEvent
from hicache.invariants import check_all
from hicache.oracle.checktrace.compare import ownership_ops
from hicache.oracle.checktrace.generate import controller_trace
from hicache.oracle.checktrace.invariants import Checks, Scope
from hicache.oracle.checktrace.maps import IdMap
from hicache.oracle.checktrace.names import TraceNames
from hicache.oracle.checktrace.replay import Replay, check_lines
from hicache.oracle.checktrace.schema import _fold, compile_rule
from hicache.oracle.checktrace.traceview import StateBefore, Trace
from hicache.oracle.checktrace.verdict import MALFORMED, VALID, VIOLATION
from tests.test_checktrace_input import strip
from tests.test_checktrace_touched import replay_until
from tests.test_checktrace_touched import trace as trace_of


@pytest.fixture(scope="module")
def trace() -> list[str]:
    lines = controller_trace(1, 120)
    assert check_lines(lines).exit_code == VALID
    return lines


def _with(lines: list[str], i: int, **fields: object) -> list[str]:
    d = json.loads(lines[i])
    d.update(fields)
    return [*lines[:i], json.dumps(d), *lines[i + 1 :]]


@pytest.mark.parametrize("kind", ["lock", "unlock", "node_remove", "d2h_cancel", "d2h_issue"])
def test_an_event_of_another_kind_differs_from_the_reference(trace: list[str], kind: str) -> None:
    """compare.py's first check (the event's kind is the reference's): a `d2h_complete`
    renamed, every other field kept, is a violation at that event. (Mutant: the check's
    `raise` removed; the ids, states and pages of the renamed event still agree.)"""
    at = [i for i, x in enumerate(trace) if json.loads(x).get("event") == "d2h_complete"][:3]
    assert at
    for i in at:
        verdict = check_lines(_with(trace, i, event=kind))
        assert verdict.exit_code == VIOLATION, (i, kind, verdict.message)
        assert verdict.seq == json.loads(trace[i])["seq"], (i, kind, verdict.message)


def test_a_split_left_out_is_resolved_by_state_or_is_ambiguous() -> None:
    """spec/trace.md, "Partial traces": without `split`, a new node id is bound to the one
    unnamed reference node covering its range in the event's `before` state; when several
    still fit, exit 2 naming the event. Seed 7's event 106 (a `d2h_issue` on an upper part)
    has two such nodes. (Mutant: a candidate's L2 state read from its L1 state, which binds
    one of them and reports a violation.)"""
    lines = strip(controller_trace(7, 300), ("split",))
    verdict = check_lines(lines)
    assert (verdict.exit_code, verdict.seq) == (MALFORMED, 106), verdict.message
    assert "trace node 6 cannot be identified: 2 reference nodes" in verdict.message


def test_a_split_left_out_is_resolved_by_an_evictions_pages() -> None:
    """spec/trace.md, "Partial traces": without `split` (and `states`), a new node id on an
    eviction is bound to the one unnamed node covering its range that holds its pages. Seed
    25's event 150 has two nodes covering its range; the pages tell them apart. (Mutants of
    `Resolver._narrow`: the page map looked up by no tier, narrowing only past two
    candidates, or keeping the nodes whose pages differ; each leaves it ambiguous, exit 2.)"""
    lines = strip(controller_trace(25, 300), ("split", "states"))
    verdict = check_lines(lines)
    assert verdict.exit_code == VALID, verdict.message


def test_a_compute_without_its_first_token_is_a_violation(trace: list[str]) -> None:
    """A `compute` without `token_start` passes the schema (only `token_start` needs
    `token_end`), but the reference cannot tell how many tokens it reserves for: a violation
    at that event, never a crash. (Mutants of `_compute`'s guard: its `raise` removed, or
    `or` made `and`; each reaches `stop - None`.)"""
    i = next(i for i, x in enumerate(trace) if json.loads(x).get("event") == "compute")
    d = json.loads(trace[i])
    del d["token_start"]
    verdict = check_lines([*trace[:i], json.dumps(d), *trace[i + 1 :]])
    assert (verdict.exit_code, verdict.seq) == (VIOLATION, d["seq"]), verdict.message
    assert "compute names no token range" in verdict.message


def test_a_second_binding_names_the_trace_id_the_reference_id_has() -> None:
    """IdMap's report on an id naming a second live node names the trace id the other node
    already has, and only when it has one. (Mutant: the `is not None` test inverted, which
    says "(trace node None)" and drops the real name.)"""
    m = IdMap("node")
    assert m.match(1, 10) is None and m.match(2, 20) is None and m.match(3, 30) is None
    named = m.match(1, 20)
    assert named is not None and named.endswith('"Partial traces")')
    assert "(trace node 2)" in named
    m.drop_ref(30)
    unnamed = m.match(2, 30)
    assert unnamed is not None and "(trace node" not in unnamed


def test_a_node_no_event_created_is_reported_as_unknown(trace: list[str]) -> None:
    """An event naming a node id no earlier event bound is not enabled, and the report says
    the id is unknown (not that a reference node was removed). (Mutant: the unknown-id test
    made False; the lookup of None then reports a removed node.)"""
    i = next(i for i, x in enumerate(trace) if json.loads(x).get("event") == "d2h_issue")
    verdict = check_lines(_with(trace, i, node=999))
    assert (verdict.exit_code, verdict.seq) == (VIOLATION, json.loads(trace[i])["seq"])
    assert "trace node 999 is unknown" in verdict.message, verdict.message


def test_a_report_rewrites_the_references_id_lists_into_the_traces() -> None:
    """names.py's table: `nodes [4, 15]` in the reference's words is `trace nodes [7, 8]` in
    a report, and an id the trace never named is written `reference <id>`. (Mutants: the
    list's last character kept, which drops 15's last digit; every id written as the
    reference's.)"""
    nodes, ops = IdMap("node"), IdMap("op")
    assert nodes.match(7, 4) is None and nodes.match(8, 15) is None
    names = TraceNames(nodes, ops, {})
    assert names.text("nodes [4, 15] and node 4") == "trace nodes [7, 8] and trace node 7"
    assert names.text("node(s) [15, 16]") == "trace node(s) [8, reference 16]"


def test_a_property_given_by_two_parts_keeps_both_parts_rules() -> None:
    """schema.py folds a property that two `allOf` parts constrain into one schema with both
    parts' keywords (today's spec never does, so the traces cannot tell). (Mutant: the second
    part replaces the first, losing `type`.)"""
    parts = [{"properties": {"a": {"type": "integer"}}}, {"properties": {"a": {"minimum": 1}}}]
    rule = compile_rule(_fold({"allOf": parts}))
    assert rule({"a": 2}) is None
    assert rule({"a": 0}) == "a: 0 is below the minimum 1"
    assert rule({"a": "x"}) == 'a: expected integer, got "x"'


def _an_untouched_ancestor_corrupted(kind: str, seen: list[str]) -> Callable[[Replay, Scope], bool]:
    """A hook for `replay_until`: after the first call that touched a node with an ancestor
    (below the root) it did not touch, corrupts that ancestor (`kind`: its L1 lock count or
    its L1 state) and requires the incremental checks to report what the full checks do."""

    def hook(replay: Replay, scope: Scope) -> bool:
        live, root = replay.cp.tree._nodes, replay.cp.tree.root.node_id
        touched = [live[i] for i in sorted(scope.nodes) if i in live and i != root]
        for n in touched:
            p = n.parent
            while p is not None and p.parent is not None and p.node_id in scope.nodes:
                p = p.parent
            if p is None or p.parent is None:
                continue
            if kind == "lock":
                p.lock[0] += 1
            else:
                p.state[0] = ABSENT if p.state[0] == RESIDENT else RESIDENT
            full = [replay.names.violation(v) for v in check_all(replay.cp.snapshot())]
            assert Checks.after(replay.checks, 1, scope) == full and full, kind
            seen.append(kind)
            return True
        return False

    return hook


def test_an_untouched_ancestor_of_a_touched_node_is_in_the_checks_scope() -> None:
    """touched.py: the incremental checks' scope takes every ancestor of a touched node (to
    the root's child), so a wrong lock count or state there is reported as the full checks
    report it. (Mutant: the ancestor walk's `not in` made `in`, which walks no ancestor.)"""
    seen: list[str] = []
    for kind in ("lock", "state"):
        replay_until(trace_of(1), 1, _an_untouched_ancestor_corrupted(kind, seen))
    assert seen == ["lock", "state"]


def test_the_catalogues_state_before_drops_released_and_freed_pages() -> None:
    """traceview.StateBefore (what the catalogue of illegal edits thinks is owned) drops a
    tier's pages on a release or a free and keeps them on a publish: `pages-reserved` must
    reserve a page that really is still owned. (Mutants: the release/free test inverted, or
    its tier test inverted; either leaves freed pages "owned".)"""
    ownership = ownership_ops(load_lifecycle())
    state = StateBefore()
    for event, pages in (
        ("compute", (1, 2, 3)),
        ("insert", (1, 2, 3)),
        ("evict_l1", (1,)),
        ("discard", (3,)),
    ):
        state.advance(TraceEvent(seq=1, event=event, tier="L1", node=1, pages=pages), ownership)
    assert state.owned == {"L1": {2}, "L2": set(), "L3": set()}


def test_the_catalogues_runs_of_an_eviction_and_of_a_lock() -> None:
    """traceview's runs (which events of one call the catalogue's edits treat as fixed by the
    state before them): an eviction and its node's `node_remove` are one determined run; an
    eviction followed by another node's `node_remove` is a run of one, and a `begin_request`
    takes its `cached_len` along, nothing else; unlocks that end at `end_request` take it
    along, nothing else. (Mutants: the `node_remove` test inverted; the `cached_len` test
    made True; the walk over the unlocks stepping two events at a time; the look past
    splits reading beyond the trace's end.)"""

    def ev(seq: int, event: str, node: int | None = 1) -> TraceEvent:
        return TraceEvent(seq=seq, event=event, tier="L1", node=node, request=1)

    evict = [ev(1, "evict_l1"), ev(2, "node_remove"), ev(3, "lock")]
    assert Trace(evict, 4).runs == [(0, 2, True), (0, 2, True), (2, 3, False)]
    other = [ev(1, "evict_l1"), ev(2, "node_remove", node=2), ev(3, "cached_len", None)]
    assert Trace(other, 4).runs[:2] == [(0, 1, True), (1, 2, False)]
    begin = [ev(1, "begin_request", None), ev(2, "cached_len", None), ev(3, "lock")]
    assert Trace(begin, 4).runs == [(0, 2, True), (0, 2, True), (2, 3, False)]
    assert Trace([begin[0], begin[2]], 4).runs == [(0, 1, True), (1, 2, False)]
    ends = [ev(1, "unlock"), ev(2, "end_request", None), ev(3, "lock")]
    assert Trace(ends, 4).runs == [(0, 2, True), (0, 2, True), (2, 3, False)]
    split = TraceEvent(seq=1, event="split", node=1, detail={"at": 4, "upper": 2})
    assert Trace([split], 4).runs == [(0, 1, False)]  # a trace may stop inside a call


def test_a_number_is_an_int_or_a_float_never_a_bool_or_a_string() -> None:
    """schema.py's `number` type (today's spec uses none, so no trace can tell): an int or a
    float passes, a string or a bool does not. (Mutant: its `and not bool` made `or`, which
    passes anything but a bool.)"""
    rule = compile_rule({"type": "number"})
    assert rule(1) is None and rule(1.5) is None
    assert rule("x") == 'expected number, got "x"'
    assert rule(True) == "expected number, got true"


def _a_touched_leaf_made_dead(seen: list[str]) -> Callable[[Replay, Scope], bool]:
    """A hook for `replay_until`: after the first call that touched an unlocked leaf with no
    op pending, drops the leaf's copies (pages freed, every tier ABSENT): a dead node left in
    the tree (S2); the incremental checks must report what the full checks do."""

    def hook(replay: Replay, scope: Scope) -> bool:
        cp = replay.cp
        live, root = cp.tree._nodes, cp.tree.root.node_id
        for i in sorted(scope.nodes):
            n = live.get(i)
            if n is None or i == root or n.children or any(n.lock) or n.pending.count(None) != 3:
                continue
            for t in range(3):
                v = n.value[t]
                if v is not None:
                    cp.tables[t].free(v)
                    cp.tree.set_value(n, t, None, ABSENT)
            full = [replay.names.violation(v) for v in check_all(cp.snapshot())]
            assert Checks.after(replay.checks, 1, scope) == full and full
            seen.append("dead")
            return True
        return False

    return hook


def test_a_dead_leaf_left_in_the_tree_is_reported_by_the_incremental_checks() -> None:
    """touched.py's all-clear says no for a touched node that is dead yet in the tree (S2):
    every tier ABSENT, unlocked, nothing pending, no copy. (Mutant: its ABSENT count 3 made
    2, which never matches a dead node.)"""
    seen: list[str] = []
    replay_until(trace_of(1), 1, _a_touched_leaf_made_dead(seen))
    assert seen == ["dead"]
