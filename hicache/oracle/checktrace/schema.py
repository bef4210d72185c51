"""spec/trace.schema.json, compiled into one validator per event name, on its first sight.

The checker validates every event against the normative schema without a JSON Schema
library: `compile_schema` turns the subset of draft 2020-12 the schema uses into plain Python
closures, and resolves its `allOf` of `if {event: enum} then {...}` clauses per event name, so
that validating one event runs only the rules that apply to it.

    keyword                         compiled into
    ------------------------------  ------------------------------------------------------
    type, enum, const, minimum      one test on the value
    required, properties,           tests on an object's keys and on each present value
    additionalProperties: false,
    minProperties, dependentRequired
    items, minItems, maxItems       tests on an array and each of its items
    allOf [if event in E then S]    S added to the validator of each event name in E
    $schema, $id, title,            ignored (annotations)
    description

A keyword outside this table is a `SpecError` when the schema is loaded (`check_keywords`,
before anything is compiled): a schema edited to use one must extend this module (and its
test against the `jsonschema` package) first. What is compiled is compiled per event name on
the name's first sight (`EventSchema`): a short trace names few of them.

Types follow JSON Schema, not Python: `true` is no integer, and a number with a zero
fraction (`2.0`) is one; `hicache.oracle.checktrace.reader` parses such numbers as ints.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from hicache.core.trace import OMITTED_KEYS, TraceEvent
from hicache.errors import SpecError
from hicache.oracle.checktrace.fastschema import Predicate, compile_fast, compile_shaped
from hicache.spec import SPEC_DIR

TRACE_SCHEMA = SPEC_DIR / "trace.schema.json"

_T = TypeVar("_T")

Rule = Callable[[Any], "str | None"]
"""A compiled schema: the first thing wrong with a value, or None when it is valid."""

_ANNOTATIONS = frozenset({"$schema", "$id", "title", "description"})
_KNOWN = _ANNOTATIONS | {
    "type",
    "enum",
    "const",
    "minimum",
    "required",
    "properties",
    "additionalProperties",
    "minProperties",
    "dependentRequired",
    "items",
    "minItems",
    "maxItems",
    "allOf",
}


def _is_integer(x: Any) -> bool:
    return (isinstance(x, int) and not isinstance(x, bool)) or (
        isinstance(x, float) and x.is_integer()
    )


_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda x: isinstance(x, dict),
    "array": lambda x: isinstance(x, list),
    "string": lambda x: isinstance(x, str),
    "integer": _is_integer,
    "number": lambda x: isinstance(x, (int, float)) and not isinstance(x, bool),
    "boolean": lambda x: isinstance(x, bool),
    "null": lambda x: x is None,
}


def _shown(x: Any) -> str:
    text = json.dumps(x)
    return text if len(text) <= 40 else text[:37] + "..."


def _refuse_unknown_keywords(schema: Mapping[str, Any], where: str) -> None:
    """SpecError for a keyword outside this module's table (`allOf` too: resolved first)."""
    unknown = sorted(set(schema) - _KNOWN - {"allOf"}) or (["allOf"] if "allOf" in schema else [])
    if unknown:
        raise SpecError(
            f"trace.schema.json{' at ' + where if where else ''}: keyword(s) {unknown} "
            "are not compiled by hicache.oracle.checktrace.schema; extend it first"
        )


def compile_rule(schema: Mapping[str, Any], where: str = "") -> Rule:
    """One closure checking `schema` (no `allOf`: `compile_schema` resolves those first).
    `where` prefixes each message (the key path, e.g. "detail.hit")."""
    _refuse_unknown_keywords(schema, where)
    rules: list[Rule] = []
    at = f"{where}: " if where else ""
    if "type" in schema:
        name = schema["type"]
        test = _TYPES[name]
        rules.append(lambda x: None if test(x) else f"{at}expected {name}, got {_shown(x)}")
    if "enum" in schema:
        allowed = tuple(schema["enum"])
        choices = set(allowed)
        listed = (
            f"{list(allowed)}"
            if len(allowed) <= 6
            else f"the {len(allowed)} names the schema lists"
        )
        rules.append(
            lambda x: (
                None
                if (isinstance(x, str) and x in choices)
                or (not isinstance(x, str) and any(x == a and type(x) is type(a) for a in allowed))
                else f"{at}{_shown(x)} is not one of {listed}"
            )
        )
    if "const" in schema:
        want = schema["const"]
        rules.append(
            lambda x: (
                None
                if x == want and type(x) is type(want)
                else f"{at}must be {_shown(want)}, got {_shown(x)}"
            )
        )
    if "minimum" in schema:
        low = schema["minimum"]
        rules.append(
            lambda x: (
                None
                if not _TYPES["number"](x) or x >= low
                else f"{at}{_shown(x)} is below the minimum {low}"
            )
        )
    if any(
        k in schema
        for k in (
            "required",
            "properties",
            "additionalProperties",
            "minProperties",
            "dependentRequired",
        )
    ):
        rules.append(_object_rule(schema, where))
    if any(k in schema for k in ("items", "minItems", "maxItems")):
        rules.append(_array_rule(schema, where))
    return _all(rules)


def check_keywords(schema: Mapping[str, Any], where: str = "") -> None:
    """The SpecError `compile_rule(schema, where)` raises for a keyword outside its table,
    raised without compiling: the same schemas it visits (properties, items), in its order,
    the same message. A type name outside JSON Schema's is one too."""
    _refuse_unknown_keywords(schema, where)
    if "type" in schema and schema["type"] not in _TYPES:
        raise SpecError(
            f"trace.schema.json{' at ' + where if where else ''}: type {schema['type']!r} "
            f"is none of JSON Schema's {sorted(_TYPES)}"
        )
    for k, v in schema.get("properties", {}).items():
        check_keywords(v, f"{where}.{k}" if where else k)
    if "items" in schema:
        check_keywords(schema["items"], f"{where}[]")


def _object_rule(schema: Mapping[str, Any], where: str) -> Rule:
    required = tuple(schema.get("required", ()))
    props = {
        k: compile_rule(v, f"{where}.{k}" if where else k)
        for k, v in schema.get("properties", {}).items()
    }
    closed = schema.get("additionalProperties", True) is False
    least = int(schema.get("minProperties", 0))
    depends = {k: tuple(v) for k, v in schema.get("dependentRequired", {}).items()}
    at = f"{where}: " if where else ""

    def rule(x: Any) -> str | None:
        if not isinstance(x, dict):
            return None  # JSON Schema: object keywords ignore other types ("type" says it)
        for key in required:
            if key not in x:
                return f"{at}{key!r} is required"
        if closed:
            extra = [k for k in x if k not in props]
            if extra:
                return f"{at}unknown key(s) {sorted(extra)}"
        if len(x) < least:
            return f"{where or 'the event'} needs at least {least} key(s)"
        for key, need in depends.items():
            if key in x:
                missing = [n for n in need if n not in x]
                if missing:
                    return f"{at}{key!r} needs {missing}"
        for key, value in x.items():
            check = props.get(key)
            if check is not None:
                why = check(value)
                if why is not None:
                    return why
        return None

    return rule


def _array_rule(schema: Mapping[str, Any], where: str) -> Rule:
    item = compile_rule(schema["items"], f"{where}[]") if "items" in schema else None
    low, high = schema.get("minItems"), schema.get("maxItems")

    def rule(x: Any) -> str | None:
        if not isinstance(x, list):
            return None
        if low is not None and len(x) < low:
            return f"{where}: needs at least {low} item(s), has {len(x)}"
        if high is not None and len(x) > high:
            return f"{where}: allows at most {high} item(s), has {len(x)}"
        if item is not None:
            for v in x:
                why = item(v)
                if why is not None:
                    return why
        return None

    return rule


def _all(rules: list[Rule]) -> Rule:
    if len(rules) == 1:
        return rules[0]

    def rule(x: Any) -> str | None:
        for r in rules:
            why = r(x)
            if why is not None:
                return why
        return None

    return rule


def _clause_events(clause: Mapping[str, Any]) -> tuple[str, ...]:
    """The event names an `allOf` clause's `if` selects; SpecError for another `if` shape."""
    cond = clause.get("if", {})
    events = cond.get("properties", {}).get("event", {}).get("enum")
    if (
        set(clause) != {"if", "then"}
        or events is None
        or cond.get("required") != ["event"]
        or set(cond) != {"properties", "required"}
    ):
        raise SpecError(
            "trace.schema.json allOf: each clause must be "
            '{"if": {"properties": {"event": {"enum": [...]}}, "required": ["event"]}, '
            '"then": {...}}'
        )
    return tuple(events)


def _merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with a `then` clause's keywords added (both must hold: required lists join,
    per-property schemas are checked one after the other)."""
    out = dict(base)
    for key, value in extra.items():
        if key == "required":
            out["required"] = [*out.get("required", []), *value]
        elif key == "properties":
            props = dict(out.get("properties", {}))
            for name, sub in value.items():
                props[name] = {"allOf": [props[name], sub]} if name in props else sub
            out["properties"] = props
        elif key == "dependentRequired":
            dep = dict(out.get("dependentRequired", {}))
            for name, need in value.items():
                dep[name] = [*dep.get(name, []), *need]
            out["dependentRequired"] = dep
        else:
            raise SpecError(
                f"trace.schema.json allOf/then: keyword {key!r} is not merged; extend _merge"
            )
    return out


def _resolve(schema: Mapping[str, Any]) -> dict[str, Any]:
    """`schema` with each property schema `_merge` built from several parts folded into one."""
    out = dict(schema)
    if "properties" in out:
        out["properties"] = {k: _fold(v) for k, v in out["properties"].items()}
    return out


def _fold(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A property schema built by `_merge` from several (`{"allOf": [a, b]}`) as one."""
    if set(schema) != {"allOf"}:
        return _resolve(schema)
    out: dict[str, Any] = {}
    for part in schema["allOf"]:
        part = _fold(part)
        for key, value in part.items():
            if key == "required":
                out[key] = [*out.get(key, []), *value]
            elif key == "properties":
                props = dict(out.get("properties", {}))
                for name, sub in value.items():
                    props[name] = _fold({"allOf": [props[name], sub]}) if name in props else sub
                out["properties"] = props
            elif key in out and out[key] != value:
                if key in _ANNOTATIONS:
                    continue
                raise SpecError(f"trace.schema.json: {key!r} given twice with different values")
            else:
                out[key] = value
    return out


def _without(schema: Any, keys: frozenset[str]) -> Any:
    """`schema` with `keys` struck from every `required` and `dependentRequired` in it."""
    if isinstance(schema, list):
        return [_without(x, keys) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for k, v in schema.items():
        if k == "required":
            out[k] = [x for x in v if x not in keys]
        elif k == "dependentRequired":
            out[k] = {a: [x for x in b if x not in keys] for a, b in v.items() if a not in keys}
        elif k == "properties":
            out[k] = {name: _without(sub, keys) for name, sub in v.items()}
        else:
            out[k] = _without(v, keys)
    return out


class Compiled(Mapping[str, _T]):
    """Event name -> its compiled schema (a `Rule` or a `Predicate`), compiled on the name's
    first look-up and kept: a trace that names few events compiles few (compiling every
    name cost ~16 ms of a process's first trace, in
    benchmarks/results/2026-12-06-checktrace-startup.md). Holds exactly the schema's names
    (`in`, `len`, iteration answer from them, nothing compiled); another name is a KeyError
    (`get`: the default), as for a dict of them all. `done` holds those compiled so far."""

    def __init__(
        self, schemas: Mapping[str, Mapping[str, Any]], compile_one: Callable[[Any], _T]
    ) -> None:
        self._schemas, self._compile = schemas, compile_one
        self.done: dict[str, _T] = {}

    def __getitem__(self, name: str) -> _T:
        found = self.done.get(name)
        if found is None:
            found = self.done[name] = self._compile(self._schemas[name])
        return found

    def get(self, name: str, default: Any = None) -> Any:
        """`self[name]`, or `default` for a name outside the schema's (never a KeyError
        of the compile itself, which a dict's `get` would hide)."""
        return self[name] if name in self._schemas else default

    def __contains__(self, name: object) -> bool:
        return name in self._schemas

    def __iter__(self) -> Iterator[str]:
        return iter(self._schemas)

    def __len__(self) -> int:
        return len(self._schemas)


class EventSchema:
    """The trace-event schema, compiled: `check(obj)` -> the first thing wrong, or None.
    `omits` (a header's) drops the requirement of the keys such a trace leaves out.

    Built, every name's schema is resolved (its `allOf` clauses merged) and its keywords
    checked (`check_keywords`: a SpecError now, not at a name's first sight), but nothing is
    compiled: `by_event` (the message-giving rules), `fast` (the yes/no predicates), the
    shaped predicates (`shape`) and `fallback` compile a name's on its first use. The answers
    are those of compiling them all up front (`eager=True` does that)."""

    def __init__(
        self, schema: Mapping[str, Any], omits: tuple[str, ...] = (), eager: bool = False
    ) -> None:
        gone = frozenset(k for o in omits for k in OMITTED_KEYS.get(o, ()))
        if gone:
            schema = _without(schema, gone)
        base = {k: v for k, v in schema.items() if k != "allOf"}
        names = tuple(schema["properties"]["event"]["enum"])
        per_event: dict[str, dict[str, Any]] = {n: dict(base) for n in names}
        for clause in schema.get("allOf", []):
            for name in _clause_events(clause):
                if name in per_event:
                    per_event[name] = _merge(per_event[name], clause["then"])
        self.names = names
        resolved = {n: _resolve(s) for n, s in per_event.items()}
        self._base = _resolve(base)
        for s in (*resolved.values(), self._base):
            check_keywords(s)
        self.by_event: Compiled[Rule] = Compiled(resolved, compile_rule)
        self.fast: Compiled[Predicate] = Compiled(resolved, compile_fast)
        self._resolved = resolved
        # (event name, *keys in order) -> `fast`'s answer for such a dict (`shape`).
        self.shapes: dict[tuple[str, ...], Predicate] = {}
        self._fallback: Rule | None = None
        fields = {f.name for f in dataclasses.fields(TraceEvent)}
        # Whether every object this schema passes holds only `TraceEvent` fields, `seq` and
        # `event` among them: then the reader builds its events without new_event's key test.
        self.keys_are_fields = all(
            s.get("additionalProperties", True) is False
            and set(s.get("properties", {})) <= fields
            and {"seq", "event"} <= set(s.get("required", ()))
            for s in (*resolved.values(), self._base)
        )
        if eager:  # in the order compiling them all used to take (the first error raised)
            for name in names:
                self.by_event[name]
            for name in names:
                self.fast[name]
            self._fallback = compile_rule(self._base)

    @property
    def fallback(self) -> Rule:
        """The rule for an event name outside the enum (the schema without its `allOf`)."""
        if self._fallback is None:
            self._fallback = compile_rule(self._base)
        return self._fallback

    def shape(self, shape: tuple[str, ...]) -> Predicate | None:
        """`fast[shape[0]]` for a dict whose keys are `shape[1:]` in that order, compiled
        for them (`compile_shaped`: the key tests answered once); `fast`'s own where the
        name's schema is not one `compile_shaped` takes; None for a name outside the enum.
        Kept in `shapes`, at most SHAPES_MAX (a trace has a few dozen shapes); past that,
        `fast`'s own (nothing compiled per line, whatever orders a writer uses)."""
        name, keys = shape[0], shape[1:]
        resolved = self._resolved.get(name)
        if resolved is None:
            return None
        if len(self.shapes) >= SHAPES_MAX:
            return self.fast[name]
        found = compile_shaped(resolved, keys) or self.fast[name]
        self.shapes[shape] = found
        return found

    def check(self, obj: Any) -> str | None:
        """The first way `obj` breaks the schema (a message naming the key), or None."""
        if not isinstance(obj, dict):
            return f"an event is a JSON object, got {_shown(obj)}"
        name = obj.get("event")
        fast = self.fast.get(name) if type(name) is str else None
        if fast is not None and fast(obj):
            return None
        rule = self.by_event.get(name) if isinstance(name, str) else None
        return (rule or self.fallback)(obj)


SHAPES_MAX = 1024
"""Most (event name, keys) shapes an `EventSchema` compiles predicates for; past it a new
shape is tested by its name's `fast` predicate (the same answers, its own speed)."""

_LOADED: dict[tuple[Path, tuple[str, ...]], EventSchema] = {}


def load_event_schema(path: Path = TRACE_SCHEMA, omits: tuple[str, ...] = ()) -> EventSchema:
    """The compiled schema of `path` (default: the shipped spec) for a trace omitting
    `omits`, compiled once per (path, omits)."""
    key = (path, tuple(sorted(omits)))
    found = _LOADED.get(key)
    if found is None:
        found = _LOADED[key] = EventSchema(json.loads(path.read_text()), key[1])
    return found
