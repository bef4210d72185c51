"""trace.schema.json and trace.md against the tables and `TraceEvent`."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from hicache.core.lifecycle import Lifecycle
from hicache.core.tiers import TIERS
from hicache.core.trace import HEADER_OMITS, TraceEvent, TraceHeader
from hicache.oracle.speccheck.mdtables import parse_tables

NON_LIFECYCLE_EVENTS: tuple[str, ...] = (
    "begin_request",
    "end_request",
    "cached_len",
    "split",
    "lock",
    "unlock",
    "node_remove",
    "tombstone",
    "revive",
)
"""Trace events that are not lifecycle transitions (spec/trace.md)."""


def check_trace_schema(lc: Lifecycle, schema_text: str, trace_md: str | None) -> list[str]:
    """The schema's event enum, per-tier event clauses, composite names and properties match
    the tables and `TraceEvent`; trace.md's event table lists the same events."""
    try:
        schema = json.loads(schema_text)
        props: Mapping[str, Any] = schema["properties"]
        events = list(props["event"]["enum"])
    except (ValueError, KeyError, TypeError) as e:
        return [
            f"trace.schema.json: properties.event.enum cannot be read ({type(e).__name__}: {e})"
        ]
    want = list(lc.transitions) + list(NON_LIFECYCLE_EVENTS)
    problems = _set_diff("trace.schema.json event enum", events, want)
    fields = [f.name for f in dataclasses.fields(TraceEvent)]
    problems += _set_diff("trace.schema.json properties", list(props), fields)
    names = [c.name for c in lc.composites]
    for key in ("before", "after"):
        enum = list(props.get(key, {}).get("enum", []))
        problems += _set_diff(f"trace.schema.json {key} enum", enum, names)
    by_tier: dict[str, list[str]] = {}
    for clause in schema.get("allOf", []):
        tier = clause.get("then", {}).get("properties", {}).get("tier", {}).get("const")
        if isinstance(tier, str):
            by_tier.setdefault(tier, []).extend(clause["if"]["properties"]["event"]["enum"])
    for tier in TIERS:
        rows = [t.name for t in lc.transitions.values() if t.tier == tier]
        pinned = by_tier.get(str(tier), [])
        problems += _set_diff(f"trace.schema.json events pinned to tier {tier}", pinned, rows)
    with_states = [
        e
        for c in schema.get("allOf", [])
        if "before" in c.get("then", {}).get("required", [])
        for e in c["if"]["properties"]["event"]["enum"]
    ]
    problems += _set_diff(
        "trace.schema.json events that require before/after",
        with_states,
        [t.name for t in lc.transitions.values() if not t.acts_on_copy],
    )
    optional = [
        e
        for c in schema.get("allOf", [])
        if "dependentRequired" in c.get("then", {})
        for e in c["if"]["properties"]["event"]["enum"]
    ]
    problems += _set_diff(
        "trace.schema.json events whose before/after may be absent (a duplicate copy)",
        optional,
        [t.name for t in lc.transitions.values() if t.acts_on_copy],
    )
    if trace_md is not None:
        listed = [
            row.get("event", "")
            for tb in parse_tables(trace_md)
            if tb.headers and tb.headers[0] == "event"
            for _, row in tb.rows
        ]
        problems += _set_diff("trace.md event table", listed, want)
    return problems


def check_header_schema(schema_text: str) -> list[str]:
    """trace.header.schema.json's properties are `TraceHeader`'s fields plus `format`, and
    its `omits` enum is HEADER_OMITS."""
    try:
        props: Mapping[str, Any] = json.loads(schema_text)["properties"]
        omits = list(props["omits"]["items"]["enum"])
    except (ValueError, KeyError, TypeError) as e:
        return [
            f"trace.header.schema.json: properties.omits cannot be read ({type(e).__name__}: {e})"
        ]
    fields = ["format", *(f.name for f in dataclasses.fields(TraceHeader))]
    return _set_diff("trace.header.schema.json properties", list(props), fields) + _set_diff(
        "trace.header.schema.json omits", omits, list(HEADER_OMITS)
    )


def _set_diff(what: str, have: Sequence[str], want: Sequence[str]) -> list[str]:
    problems = [f"{what}: {x!r} is missing" for x in want if x not in have]
    problems += [f"{what}: {x!r} is not expected" for x in have if x not in want]
    problems += [f"{what}: {x!r} is listed twice" for x in sorted(set(have)) if have.count(x) > 1]
    return problems
