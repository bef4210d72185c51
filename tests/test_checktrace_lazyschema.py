"""The trace schema compiles a name's rules on its first sight (`EventSchema`, `Compiled`):
nothing is compiled when it is built, and the verdicts, messages and answers are those of
compiling every name up front (`eager=True`) -- on every shipped example, on broken lines, on
unknown names and on names a trace first uses late."""

from __future__ import annotations

import builtins
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hicache.oracle.checktrace.fastschema as fastschema
import hicache.oracle.checktrace.reader as reader_module
import hicache.oracle.checktrace.schema as schema_module
from hicache.core.lifecycle import load_lifecycle
from hicache.errors import SpecError
from hicache.oracle.checktrace import Verdict, check_lines
from hicache.oracle.checktrace.reader import Malformed, TraceReader
from hicache.oracle.checktrace.schema import TRACE_SCHEMA, EventSchema
from tests.test_checktrace import load_back, plane_trace, write_through
from tests.test_checktrace_input import _broken

EXAMPLES = Path(__file__).resolve().parents[1] / "spec" / "examples"


def _raw() -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(TRACE_SCHEMA.read_text())
    return raw


class _Counts:
    """Calls of `compile` (the generated predicates' source) and of `compile_rule`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.code = self.rules = 0
        real_compile, real_rule = builtins.compile, schema_module.compile_rule

        def code(*args: Any, **kwargs: Any) -> Any:
            self.code += 1
            return real_compile(*args, **kwargs)

        def rule(*args: Any, **kwargs: Any) -> Any:
            self.rules += 1
            return real_rule(*args, **kwargs)

        monkeypatch.setattr(fastschema, "compile", code, raising=False)
        monkeypatch.setattr(schema_module, "compile_rule", rule)


def test_building_the_schema_compiles_nothing_until_a_name_is_seen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Built, the schema has compiled no rule and no predicate (compiling the 32 names cost
    66 `compile`s and ~15 ms of every process's first trace); a name seen compiles its own
    predicate, a name refused its own rule, an unknown name the fallback, nothing else."""
    counts = _Counts(monkeypatch)
    ours = EventSchema(_raw())
    assert (counts.code, counts.rules) == (0, 0)
    assert not ours.fast.done and not ours.by_event.done
    assert len(ours.fast) == len(ours.names) > 20 and "evict_l1" in ours.fast
    assert "no_such_event" not in ours.fast and ours.fast.get("no_such_event") is None
    event = {"after": "ABSENT", "before": "L1", "event": "evict_l1", "node": 1, "pages": [0]}
    event = {**event, "seq": 1, "tier": "L1", "token_end": 4, "token_start": 0}
    assert ours.check(event) is None
    assert set(ours.fast.done) == {"evict_l1"} and not ours.by_event.done
    assert counts.code > 0 and counts.rules == 0
    assert ours.check({**event, "tier": "L2"}) == 'tier: must be "L1", got "L2"'
    assert set(ours.by_event.done) == {"evict_l1"} and counts.rules > 0
    assert ours.fast["evict_l1"] is ours.fast["evict_l1"]  # compiled once, kept
    rules = counts.rules
    assert ours.check({**event, "event": "no_such_event"}) is not None  # the fallback's
    assert set(ours.by_event.done) == {"evict_l1"} and counts.rules > rules
    # A shape compiles its own predicate, not the name's.
    ours.shape(("insert", *event))
    assert set(ours.fast.done) == {"evict_l1"}


def test_the_readers_shapes_compile_only_what_the_trace_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A valid trace compiles one predicate per (name, key order) it holds, and no per-name
    predicate or rule: the reader asks the shaped ones."""
    counts = _Counts(monkeypatch)
    lines = plane_trace(load_back)
    ours = EventSchema(_raw())
    got = list(TraceReader(lines, load_lifecycle(), ours))
    assert len(got) == len(lines) - 1
    assert not ours.fast.done and not ours.by_event.done and counts.rules == 0
    names = {json.loads(x)["event"] for x in lines[1:]}
    assert {s[0] for s in ours.shapes} == names and len(names) < len(ours.names)


def test_an_unknown_keyword_or_type_is_refused_when_the_schema_is_built() -> None:
    """A keyword `compile_rule` does not compile is a SpecError when the schema is built (not
    at its name's first sight), with `compile_rule`'s message; a type JSON Schema does not
    have is one too."""
    raw = _raw()
    clause = {
        "if": {"properties": {"event": {"enum": ["evict_l2"]}}, "required": ["event"]},
        "then": {"properties": {"detail": {"type": "object", "patternProperties": {}}}},
    }
    bad = {**raw, "allOf": [*raw["allOf"], clause]}
    with pytest.raises(SpecError) as lazy:
        EventSchema(bad)
    with pytest.raises(SpecError) as direct:
        schema_module.compile_rule({"type": "object", "patternProperties": {}}, "detail")
    assert str(lazy.value) == str(direct.value)
    assert "keyword(s) ['patternProperties']" in str(lazy.value)
    clause["then"] = {"properties": {"zz": {"type": "dict"}}}
    with pytest.raises(SpecError, match="at zz: type 'dict' is none of JSON Schema's"):
        EventSchema({**raw, "allOf": [*raw["allOf"], clause]})


def _examples() -> list[tuple[str, list[str]]]:
    found = sorted(EXAMPLES.glob("*.ndjson"))
    assert len(found) > 20
    return [(p.name, p.read_text().splitlines()) for p in found]


def _edited(lines: list[str], rng: random.Random) -> Iterator[list[str]]:
    """`lines` with one event line broken, in the ways `_broken` breaks one, or renamed (to
    another event, or to none the schema knows), or cut short."""
    for _ in range(12):
        out = list(lines)
        if len(out) < 2:
            return
        i = rng.randrange(1, len(out))
        try:
            e = json.loads(out[i])
        except ValueError:
            continue
        if not isinstance(e, dict):
            continue
        choices: list[Any] = [*_broken(e), {**e, "event": "no_such_event"}, {**e, "event": 3}]
        choices += [{**e, "event": rng.choice(["h2s_issue", "evict_l3", "insert", "split"])}]
        choices += [None]
        pick = rng.choice(choices)
        out[i] = out[i][: len(out[i]) // 2] if pick is None else json.dumps(pick)
        yield out


def _verdicts(traces: list[list[str]], eager: bool, shared: bool) -> list[Verdict]:
    """`check_lines` of each trace, the reader's schema eager or lazy, one per (omits) for all
    traces (`shared`: names first seen in a later trace) or a new one per trace."""
    made: dict[tuple[str, ...], EventSchema] = {}

    def load(path: Path = TRACE_SCHEMA, omits: tuple[str, ...] = ()) -> EventSchema:
        key = tuple(sorted(omits))
        if key not in made:
            made[key] = EventSchema(json.loads(path.read_text()), key, eager=eager)
        return made[key]

    out = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reader_module, "load_event_schema", load)
        for lines in traces:
            if not shared:
                made.clear()
            out.append(check_lines(lines))
    return out


def test_lazy_and_eager_schemas_give_the_same_verdicts() -> None:
    """Every shipped example and ~300 edits of them (a key dropped or wrong, an extra key, an
    event renamed to another or to an unknown name, a line cut short): the same exit code,
    events, seq and message, whether the schema compiled every name up front or compiles each
    on its first sight -- with a new schema per trace and with one for all of them (a name
    first seen in the tenth trace)."""
    rng = random.Random(11)
    traces = []
    for _, lines in _examples():
        traces += [lines, *_edited(lines, rng)]
    want = _verdicts(traces, eager=True, shared=True)  # every name compiled: one will do
    assert {v.exit_code for v in want} == {0, 1, 2}
    assert sum(v.exit_code == 2 and "schema:" in v.message for v in want) > 50
    assert sum("unknown event" in v.message for v in want) > 5
    assert _verdicts(traces, eager=False, shared=False) == want
    assert _verdicts(traces, eager=False, shared=True) == want


def test_lazy_and_eager_schemas_answer_alike_on_broken_events() -> None:
    """`check`, `fast` and each rule of `by_event` on every line and broken line of two plane
    traces (and a few values that are not events): the same answers, lazy or eager."""
    eager, lazy = EventSchema(_raw(), eager=True), EventSchema(_raw())
    assert not lazy.fast.done
    lines = plane_trace(write_through) + plane_trace(load_back)[1:]
    cases: list[Any] = [None, [], "x", {}, {"event": 3}, {"event": "no_such_event", "seq": 1}]
    for e in [json.loads(x) for x in lines if '"seq"' in x]:
        cases += [e, *_broken(e)]
    for case in reversed(cases):  # the last lines' names first
        assert lazy.check(case) == eager.check(case), case
        name = case.get("event") if isinstance(case, dict) else None
        if isinstance(name, str) and name in eager.fast:
            assert lazy.fast[name](case) == eager.fast[name](case), case
            assert lazy.by_event[name](case) == eager.by_event[name](case), case
    assert lazy.fallback({"seq": "x"}) == eager.fallback({"seq": "x"})
    assert set(lazy.fast.done) < set(lazy.names)


def test_the_readers_answers_are_the_same_lazy_or_eager() -> None:
    """The reader itself (the shaped predicates, then `check` for a refused line) on every
    example: the same events and the same Malformed, line by line."""

    def read(lines: list[str], schema: EventSchema) -> list[Any]:
        out: list[Any] = []
        try:
            r = TraceReader(lines, load_lifecycle(), schema)
            for line in r:
                out.append((line.number, line.text, line.event.to_json()))
        except Malformed as e:
            out.append((e.line, e.why, e.seq))
        return out

    rng = random.Random(5)
    eager, shared = EventSchema(_raw(), eager=True), EventSchema(_raw())
    for _, lines in _examples():
        for trace in [lines, *_edited(lines, rng)]:
            want = read(trace, eager)
            assert read(trace, EventSchema(_raw())) == want
            assert read(trace, shared) == want
