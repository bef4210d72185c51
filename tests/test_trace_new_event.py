"""`new_event` builds the event `TraceEvent(**d)` builds, with or without owning `d`; so does
`adopt_event`, which the reader uses only under a schema that admits fields only."""

from __future__ import annotations

import json
from dataclasses import MISSING, fields

import pytest

from hicache.core.trace import TraceEvent, adopt_event, new_event
from hicache.oracle.checktrace.schema import TRACE_SCHEMA, EventSchema, load_event_schema

SAMPLES: list[dict[str, object]] = [
    {"seq": 1, "event": "begin_request", "request": 3, "detail": {"prompt": [1, 2]}},
    {"seq": 2, "event": "evict_l1", "tier": "L1", "node": 4, "pages": (1, 2), "before": "L1"},
    {"seq": 3, "event": "end_request", "request": 3},
]


def test_every_default_is_a_class_attribute() -> None:
    # new_event leaves absent fields out of the instance's dict: they read the class's.
    for f in fields(TraceEvent):
        if f.default is not MISSING:
            assert TraceEvent.__dict__[f.name] == f.default, f.name


@pytest.mark.parametrize("owned", [False, True])
@pytest.mark.parametrize("d", SAMPLES)
def test_new_event_is_the_constructors_event(d: dict[str, object], owned: bool) -> None:
    given = dict(d)
    event = new_event(given, owned=owned)
    want = TraceEvent(**d)  # type: ignore[arg-type]
    assert event == want
    assert event.to_json() == want.to_json()
    assert repr(event) == repr(want)
    assert all(getattr(event, f.name) == getattr(want, f.name) for f in fields(TraceEvent))
    assert (event.__dict__ is given) == owned  # owned: the dict becomes the event's own


def test_an_absent_detail_is_never_shared() -> None:
    a = new_event({"seq": 1, "event": "end_request"}, owned=True)
    b = new_event({"seq": 2, "event": "end_request"})
    assert a.detail == {} and b.detail == {} and a.detail is not b.detail


def test_a_key_that_is_no_field_is_refused() -> None:
    with pytest.raises(TypeError):
        new_event({"seq": 1, "event": "end_request", "nodes": 3}, owned=True)


@pytest.mark.parametrize("d", SAMPLES)
def test_adopt_event_is_the_constructors_event(d: dict[str, object]) -> None:
    given = dict(d)
    event = adopt_event(given)
    want = TraceEvent(**d)  # type: ignore[arg-type]
    assert event == want and event.to_json() == want.to_json() and repr(event) == repr(want)
    assert event.__dict__ is given  # the dict becomes the event's own


def test_the_shipped_schema_holds_every_key_to_a_field() -> None:
    """The reader builds its events with `adopt_event` (no key test) only under a schema
    whose objects hold `TraceEvent` fields only, `seq` and `event` among them: the shipped
    one, for every header `omits`; a schema allowing another key does not qualify."""
    for omits in [(), ("pages",), ("states",), ("pages", "states", "locks")]:
        assert load_event_schema(omits=omits).keys_are_fields
    raw = json.loads(TRACE_SCHEMA.read_text())
    assert not EventSchema({**raw, "additionalProperties": True}).keys_are_fields
    extra = {**raw, "properties": {**raw["properties"], "nodes": {"type": "integer"}}}
    assert not EventSchema(extra).keys_are_fields
    assert not EventSchema({**raw, "required": ["event"]}).keys_are_fields
