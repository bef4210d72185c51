"""check-trace's fast paths answer as the paths they stand in for: the schema predicates
compiled per key order (`EventSchema.shape`) as the per-name ones (`EventSchema.fast`) and
`jsonschema`; a plain-typed array's one-pass type test as the per-item one; the reader's
inline event path as `_event`'s; the tier and direction lookups as the enums' own; the tree's
`nodes_by_id` as its index; the comparer's op retirement as its full scan."""

from __future__ import annotations

import copy
import itertools
import json
import random
from typing import Any

import pytest

from hicache.core.control import ControlPlane
from hicache.core.lifecycle import ABSENT, RESIDENT, load_lifecycle
from hicache.core.pages import pages
from hicache.core.records import PendingOp
from hicache.core.tiers import (
    TIERS,
    Direction,
    Tier,
    direction_of,
    tier_index,
    tier_of,
)
from hicache.core.tracewalk import walked_events
from hicache.core.tree import HiRadixTree, TreeNode
from hicache.oracle.checktrace import MALFORMED, VALID, check_lines
from hicache.oracle.checktrace.compare import Comparer
from hicache.oracle.checktrace.fastschema import compile_fast, compile_shaped
from hicache.oracle.checktrace.reader import Malformed, TraceReader, parse_json
from hicache.oracle.checktrace.report import Before
from hicache.oracle.checktrace.schema import (
    SHAPES_MAX,
    TRACE_SCHEMA,
    EventSchema,
    load_event_schema,
)
from hicache.oracle.checktrace.touched import TARGET, TouchedChecks
from tests.test_checktrace import load_back, plane_trace, write_through
from tests.test_checktrace_input import _broken


def _cases() -> list[dict[str, Any]]:
    lines = plane_trace(write_through) + plane_trace(load_back)[1:]
    out: list[dict[str, Any]] = []
    for e in [json.loads(x) for x in lines if '"seq"' in x]:
        out += [e, *_broken(e), {**e, "pages": [0, 1.5]}, {**e, "tier": 1}]
        out.append({**e, "detail": {"hit": [0], "tokens": 1, "prompt": [1, True]}})
        out.append({**e, "detail": {"hit": [0], "tokens": 1, "prompt": [1, 2.5]}})
        out.append({**e, "detail": {"hit": [0], "tokens": 1, "prompt": [1, "2"]}})
        out.append({**e, "detail": {"hit": [0], "tokens": 1, "prompt": []}})
    return out


def test_the_shaped_predicates_answer_as_the_per_name_ones() -> None:
    """For every line and broken line of two plane traces, with its keys in their order and
    shuffled: the predicate compiled for its name and key order says what `fast` says (which
    the schema tests hold to jsonschema), and a new schema compiled on demand agrees too."""
    ours = load_event_schema()
    fresh = EventSchema(json.loads(TRACE_SCHEMA.read_text()))  # nothing cached yet
    rng = random.Random(3)
    checked = passed = 0
    for case in _cases():
        name = case.get("event")
        if type(name) is not str or name not in ours.fast:
            continue
        keys = list(case)
        for order in (keys, rng.sample(keys, len(keys)), keys[::-1]):
            d = {k: case[k] for k in order}
            want = ours.fast[name](d)
            for schema in (ours, fresh):
                key = (name, *d)
                shaped = schema.shapes.get(key) or schema.shape(key)  # as the reader asks
                assert shaped is not None and shaped(d) == want, (order, d)
                assert schema.shapes.get(key, shaped) is shaped  # kept (up to SHAPES_MAX)
                assert len(schema.shapes) <= SHAPES_MAX
            checked += 1
            passed += want
    assert checked > 1500 and 0 < passed < checked


def test_a_shape_is_the_names_own() -> None:
    """Two events with the same keys in the same order, of two names whose schemas differ
    (evict_l1 wants tier L1, evict_l2 tier L2): each is judged by its own name's predicate."""
    ours = load_event_schema()
    base = {"after": "ABSENT", "before": "L1", "event": "evict_l1", "node": 1, "pages": [0]}
    base = {**base, "seq": 1, "tier": "L1", "token_end": 4, "token_start": 0}
    other = {**base, "event": "evict_l2"}
    assert ours.shape(("evict_l1", *base))(base)  # type: ignore[misc]
    assert not ours.shape(("evict_l2", *other))(other)  # type: ignore[misc]
    assert ours.fast["evict_l1"](base) and not ours.fast["evict_l2"](other)
    assert ours.shape(("no_such_event", *base)) is None
    # The reader asks by name and key order: the second line's name is its own.
    reader = TraceReader([plane_trace(load_back)[0]], load_lifecycle())
    assert reader.parse(json.dumps(base)).event.event == "evict_l1"
    with pytest.raises(Malformed, match="schema"):
        reader.parse(json.dumps({**other, "seq": 2}))


def test_compile_shaped_answers_the_key_tests_once() -> None:
    """Required, allowed, minProperties and dependentRequired decide a key order alone: a
    missing or unknown key's shape refuses every dict with it, as the general predicate."""
    schema = {
        "type": "object",
        "required": ["a"],
        "additionalProperties": False,
        "minProperties": 2,
        "properties": {
            "a": {"type": "integer", "minimum": 0},
            "b": {"type": "string", "enum": ["x", "y"]},
            "c": {"type": "array", "items": {"type": "integer"}},
        },
        "dependentRequired": {"c": ["b"]},
    }
    general = compile_fast(schema)
    values: dict[str, list[Any]] = {
        "a": [0, -1, "0", True],
        "b": ["x", "z", 1],
        "c": [[1, 2], [1, True], [], "1"],
        "d": [1],
    }
    n = 0
    for size in range(0, 5):
        for keys in itertools.permutations(values, size):
            shaped = compile_shaped(schema, keys)
            assert shaped is not None
            for combo in itertools.product(*(values[k] for k in keys)):
                d = dict(zip(keys, combo))
                assert shaped(d) == general(d), d
                n += 1
    assert n > 500
    assert compile_shaped({"type": "object", "properties": {}, "minimum": 1}, ()) is None
    assert compile_shaped({"type": "array", "items": {}}, ()) is None


def test_a_prompt_of_plain_items_is_tested_as_each_item() -> None:
    """`detail.prompt` (items: integers): one pass over the items' types, as `type(v) is int`
    per item -- a bool, a float or a string among them fails, an empty list passes."""
    ours = load_event_schema()
    lines = plane_trace(load_back)
    e = next(json.loads(x) for x in lines[1:] if '"begin_request"' in x)
    for prompt, ok in (([1, 2], True), ([1, True], False), ([1, 2.5], False), ([1, "2"], False)):
        d = {**e, "detail": {**e["detail"], "prompt": prompt}}
        assert ours.fast["begin_request"](d) == ok == (ours.check(d) is None), prompt
    d = {**e, "detail": {**e["detail"], "prompt": []}}
    assert ours.fast["begin_request"](d) == (ours.check(d) is None), d


def _parsed(lines: list[str], inline: bool) -> list[tuple[str, object]]:
    """Each line as the reader gives it (number, text, event's JSON) or its Malformed;
    `inline` False: every line through `_checked` (the path `_event` ends)."""
    reader = TraceReader(lines, load_lifecycle())
    out: list[tuple[str, object]] = []
    for text in lines[1:]:
        reader.number += 1
        try:
            line = (
                reader.parse(text)
                if inline
                else reader._checked(reader.number, text, json.loads(text))
            )
            out.append(("line", (line.number, line.text, line.event.to_json(), repr(line.event))))
        except Malformed as e:
            out.append(("malformed", (e.line, e.why, e.seq)))
            reader.seq += 1  # go on past it, as if read
    return out


def _with(lines: list[str], at: int, **changes: Any) -> list[str]:
    """`lines` with event `at`'s line changed (any key, `seq` too)."""
    i = next(i for i, x in enumerate(lines) if i and json.loads(x)["seq"] == at)
    return [*lines[:i], json.dumps({**json.loads(lines[i]), **changes}), *lines[i + 1 :]]


def test_the_readers_inline_path_builds_what_event_builds() -> None:
    """Valid lines, a seq gap, a repeated seq, a tier the header lacks and an event needing
    one: `parse` (its inline path) gives `_event`'s line or `_event`'s own Malformed."""
    lines = plane_trace(load_back)
    header = json.loads(lines[0])
    del header["capacities"]["L3"]
    no_l3 = [json.dumps(header), *lines[1:]]
    del header["capacities"]["L2"]
    l1_only = [json.dumps(header), *lines[1:]]
    for ls in (
        lines,
        _with(lines, 5, seq=9),
        _with(lines, 6, seq=5),
        lines[:4] + lines[5:],
        no_l3,
        _with(no_l3, 2, tier="L3"),
        l1_only,
    ):
        assert _parsed(ls, True) == _parsed(ls, False)
    found = [why for kind, why in _parsed(l1_only, True) if kind == "malformed"]
    assert any("needs tier L2" in str(why) for why in found), found


def test_the_tier_and_direction_lookups_are_the_enums() -> None:
    for t in TIERS:
        for given in (t, t.value):
            assert tier_of(given) is Tier(given) and tier_index(given) == TIERS.index(Tier(given))
    for d in Direction:
        assert direction_of(d.value) is Direction(d.value) is direction_of(d)
    for bad in ("L4", "l1", "", 1, None, ["L1"]):
        for ours, theirs in ((tier_of, Tier), (tier_index, Tier), (direction_of, Direction)):
            with pytest.raises(Exception) as mine:
                ours(bad)
            with pytest.raises(Exception) as enum:
                theirs(bad)
            assert type(mine.value) is type(enum.value) and str(mine.value) == str(enum.value)


def test_nodes_by_id_is_the_trees_index() -> None:
    """The tree's `nodes_by_id` is its node index itself -- after inserts, splits, removals,
    in a clone and in a deep copy."""
    cp = ControlPlane(4, [16, 16, 16], check_mode="off")
    tree = cp.tree
    assert tree.nodes_by_id is tree._nodes
    cp.begin_request(1, list(range(12)))
    cp.compute(1, 12)
    cp.insert(1)
    cp.end_request(1)
    cp.begin_request(2, [*range(4), 9, 9, 9, 9])
    cp.compute(2, 4)
    cp.insert(2)  # splits the first node
    cp.end_request(2)
    for t in (tree, tree.clone(), copy.deepcopy(tree)):
        assert isinstance(t, HiRadixTree) and t.nodes_by_id is t._nodes
        assert {i: t.get(i) for i in t.node_ids()} == dict(t.nodes_by_id)
    assert len(tree) >= 2


def test_a_retired_op_is_unbound_and_a_pending_one_kept() -> None:
    """`retire_ops`' one-test shortcut (every bound op pending) and its scan agree: an op the
    reference ended is unbound, a pending one stays."""
    cp = ControlPlane(4, [16, 16, 16], check_mode="off")
    comparer = Comparer(cp, load_lifecycle(), ())
    cp.ops[7] = object()  # type: ignore[assignment]
    comparer.ops.to_ref[70], comparer.ops.to_engine[7] = 7, 70
    comparer.retire_ops()
    assert comparer.ops.to_engine == {7: 70}
    comparer.ops.to_ref[80], comparer.ops.to_engine[8] = 8, 80  # op 8: not pending
    comparer.retire_ops()
    assert comparer.ops.to_engine == {7: 70} and 80 not in comparer.ops.to_ref
    del cp.ops[7]
    comparer.retire_ops()
    assert comparer.ops.to_engine == {}


def test_a_replay_is_walked_and_judged_as_before() -> None:
    """A whole replay: every event walked (`walked_events`) and the verdict valid; a line with
    another page on an event the tables move no pages for is refused naming the pages."""
    lines = plane_trace(load_back)
    before = walked_events()
    verdict = check_lines(lines)
    assert verdict.exit_code == VALID and walked_events() - before >= verdict.events > 10
    assert check_lines(lines[:3] + ["{"]).exit_code == MALFORMED


# -- the all-clear's per-node clauses against their earlier reading ----------------------------


def _node_before(checks: TouchedChecks, n: TreeNode) -> bool:
    """`TouchedChecks._node` as it read before its per-tier clauses were regrouped (kept
    here as the reference the regrouped one must agree with)."""
    cp = checks.cp
    ps = cp.page_size
    parent = n.parent
    live = cp.tree.get
    if (
        parent is None
        or live(n.node_id) is not n
        or parent.children.get(n.key[:ps]) is not n
        or (parent.parent is not None and live(parent.node_id) is not parent)
    ):
        return False
    for c in n.children.values():
        if c.parent is not n:
            return False
    state, lock, pending, value = n.state, n.lock, n.pending, n.value
    if (
        not n.children
        and state.count(ABSENT) == 3
        and lock == [0, 0, 0]
        and pending.count(None) == 3
        and all(v is None for v in value)
    ):
        return False
    pages = len(n.key) // ps
    if len(n.key) % ps:
        return False
    for t in range(3):
        v, st, op_id = value[t], state[t], pending[t]
        if lock[t] < 0 or (v is not None and v.size != pages):
            return False
        if op_id is not None:
            op = cp.ops.get(op_id)
            if (
                st == RESIDENT
                or v is not None
                or op is None
                or TARGET[op.direction] != t
                or n not in op.nodes
            ):
                return False
        elif (v is not None) != (st == RESIDENT):
            return False
        if (
            (op_id is not None or st == RESIDENT)
            and parent.parent is not None
            and parent.state[t] != RESIDENT
            and t in checks.closed
            and (op_id is None or parent.pending[t] != op_id)
        ):
            return False
    return True


def test_the_node_clauses_answer_as_before() -> None:
    """A parent and its child (and the child alone under the root) given random sub-states,
    values, pending ops (filling the right tier for it, another tier, another node, none
    known), locks and closed tiers: `_node` says what its earlier reading says, each way
    seen many times."""
    cp = ControlPlane(4, [64, 64, 64], check_mode="off")
    cp.begin_request(1, list(range(8)))
    cp.compute(1, 8)
    cp.insert(1)
    cp.end_request(1)
    cp.begin_request(2, [0, 1, 2, 3, 9, 9, 9, 9])
    cp.compute(2, 4)
    cp.insert(2)  # the first 8 tokens' node split: a parent with two children
    cp.end_request(2)
    checks = TouchedChecks(cp)
    parent = next(n for n in cp.tree.nodes() if len(n.children) == 2)
    child = next(iter(parent.children.values()))
    lone = ControlPlane(4, [64, 64, 64], check_mode="off")
    lone.begin_request(1, list(range(4)))
    lone.compute(1, 4)
    lone.insert(1)
    lone.end_request(1)
    alone = next(iter(lone.tree.nodes()))
    rng = random.Random(11)
    states = [ABSENT, RESIDENT, "D2H_PENDING", "H2D_PENDING", "S2H_PENDING"]
    seen = {True: 0, False: 0}
    for trial in range(6000):
        plane, checker, n = (cp, checks, child) if trial % 3 else (lone, TouchedChecks(lone), alone)
        plane.ops.clear()
        for k, d in enumerate(Direction):
            target = [n, parent] if rng.random() < 0.9 else [parent]
            plane.ops[k + 1] = PendingOp(k + 1, d, target, pages(), pages(), None)
        filling = {TARGET[op.direction]: op.op_id for op in plane.ops.values()}
        checker.closed = [t for t in range(3) if rng.random() < 0.8]
        for m in (n, n.parent):
            assert m is not None
            if m.is_root:
                continue
            size = len(m.key) // 4
            for t in range(3):  # mostly a consistent tier, at times any mix
                mode = rng.random()
                m.lock[t] = 0 if rng.random() < 0.9 else rng.choice([1, -1])
                if mode < 0.35:
                    m.state[t], m.value[t], m.pending[t] = ABSENT, None, None
                elif mode < 0.75:
                    m.state[t], m.value[t], m.pending[t] = RESIDENT, pages(range(size)), None
                elif mode < 0.9:
                    m.state[t], m.value[t], m.pending[t] = states[2], None, filling[t]
                else:
                    m.state[t] = rng.choice(states)
                    m.pending[t] = rng.choice([None, None, 1, 2, 3, 4, 9])
                    m.value[t] = rng.choice([None, pages(range(size)), pages(range(size + 1))])
        want = _node_before(checker, n)
        assert checker._node(n) == want, (trial, n.state, n.pending, n.lock, n.value)
        seen[want] += 1
    assert min(seen.values()) > 300, seen


def test_a_requests_locked_node_is_read_live() -> None:
    """I5's request clause reads the locked node in the tree's index (`tree.contains`,
    inline): a request locking a node the index lost fails it; one locking the root passes."""
    cp = ControlPlane(4, [64, 64, 64], check_mode="off")
    cp.begin_request(1, list(range(8)))
    cp.compute(1, 8)
    cp.insert(1)
    cp.end_request(1)
    cp.begin_request(2, list(range(8)))  # matches and locks the node
    cp.begin_request(3, [7, 7, 7, 7])  # matches nothing: locks the root
    checks = TouchedChecks(cp)
    locked = cp.requests[2].locked
    assert not locked.is_root and cp.requests[3].locked.is_root
    assert checks._requests([2, 3])
    del cp.tree._nodes[locked.node_id]
    assert not checks._requests([2]) and checks._requests([3])
    cp.tree._nodes[locked.node_id] = locked
    assert checks._requests([2, 3])


def test_before_copies_each_node_as_it_was() -> None:
    """`Before.capture` copies each concerned node (the root left out) as the per-node copy
    it replaced did: id, states, locks, pending ops, present children, whether the parent
    is the root, the parent's states -- values, not the live lists."""
    cp = ControlPlane(4, [64, 64, 64], check_mode="off")
    cp.begin_request(1, list(range(8)))
    cp.compute(1, 8)
    cp.insert(1)
    cp.begin_request(2, [0, 1, 2, 3, 9, 9, 9, 9])
    cp.compute(2, 4)
    cp.insert(2)
    nodes = [cp.tree.root, *cp.tree.nodes()]
    assert len(nodes) >= 4
    before = Before.capture(cp, nodes, 2)
    want = []
    for n in nodes[1:]:
        p = n.parent
        assert p is not None
        want.append(
            (
                n.node_id,
                tuple(n.state),
                tuple(n.lock),
                tuple(n.pending),
                tuple(n.present_children),
                p.is_root,
                tuple(p.state),
            )
        )
    assert before._raw_nodes == tuple(want)
    assert any(not raw[5] for raw in before._raw_nodes)  # a node below another
    nodes[1].state[0] = "D2H_PENDING"  # a later change is not in the copy
    assert before._raw_nodes == tuple(want)
    assert [r.ref_id for r in before.nodes] == [n.node_id for n in nodes[1:]]


@pytest.mark.parametrize(
    "text",
    ['{"seq": 1}', ' {"seq": 1}', '{"seq": 1} x', '{"seq": 1', "[1, 2]", '"x"', "", "{}}"],
)
def test_the_readers_json_is_parse_jsons(text: str) -> None:
    """The reader's inline JSON read answers as `parse_json`: the same value, or Malformed
    naming `parse_json`'s own error."""
    reader = TraceReader([plane_trace(load_back)[0]], load_lifecycle())
    try:
        parse_json(text)
        want = None  # JSON: the reader may refuse it later (schema, seq), never as JSON
    except ValueError as e:
        want = f"not JSON ({e})"
    try:
        reader.parse(text)
        got = None
    except Malformed as e:
        got = e.why if e.why.startswith("not JSON") else None
    assert got == want, text


def test_past_its_bound_a_new_shape_is_the_names_predicate() -> None:
    """Once SHAPES_MAX shapes are compiled, a new one is tested by the name's `fast`
    predicate: nothing compiled per line (a writer of random key orders stays as fast)."""
    fresh = EventSchema(json.loads(TRACE_SCHEMA.read_text()))
    first = fresh.shape(("evict_l1", "event", "seq"))
    assert first is not None and first is not fresh.fast["evict_l1"]
    for i in range(SHAPES_MAX - 1):
        fresh.shapes[("x", str(i))] = first
    assert fresh.shape(("evict_l1", "seq", "event")) is fresh.fast["evict_l1"]
    assert len(fresh.shapes) == SHAPES_MAX
