"""The trace header (spec/trace.md, "Header"): what it accepts, what it refuses and why."""

from __future__ import annotations

import io
import json
import re

import pytest

from hicache.control import ControlPlane
from hicache.spec import SPEC_DIR
from hicache.trace import (
    HEADER_OMITS,
    OMITTED_EVENTS,
    OMITTED_KEYS,
    NdjsonSink,
    TraceFormatError,
    TraceHeader,
)


def test_plane_header_round_trips_and_leads_the_stream() -> None:
    cp = ControlPlane(4, [6, 5, 3])
    out = io.StringIO()
    cp.tracer.sink = NdjsonSink(out, cp.trace_header())
    cp.begin_request(7, [1, 2, 3, 4, 5])
    first, *events = out.getvalue().splitlines()
    header = TraceHeader.from_json(first)
    assert (header.page_size, dict(header.capacities), header.tiers) == (
        4,
        {"L1": 6, "L2": 5, "L3": 3},
        ("L1", "L2", "L3"),
    )
    assert TraceHeader.from_json(header.to_json()) == header
    assert '"prompt":[1,2,3,4,5]' in events[0]


@pytest.mark.parametrize(
    "line, names",
    [
        ('{"seq":1,"event":"end_request","request":1}', '"format"'),
        ("not json", "not JSON"),
        ('{"format":"hicache-trace","version":2,"page_size":2,"capacities":{"L1":4}}', "version 2"),
        ('{"format":"hicache-trace","version":1,"capacities":{"L1":4}}', "'page_size' is missing"),
        ('{"format":"hicache-trace","version":1,"page_size":0,"capacities":{"L1":4}}', "page_size"),
        (
            '{"format":"hicache-trace","version":1,"page_size":2,"capacities":{"L1":4,"L3":4}}',
            "L1, L1+L2",
        ),
        (
            '{"format":"hicache-trace","version":1,"page_size":2,"capacities":{"L1":-1}}',
            "integers in 0..16777216",
        ),
        (
            '{"format":"hicache-trace","version":1,"page_size":2,"capacities":{"L1":4},"omits":["bytes"]}',
            "omits",
        ),
        (
            '{"format":"hicache-trace","version":1,"page_size":2,"capacities":{"L1":4},"colour":1}',
            "unknown keys",
        ),
        (
            '{"format":"hicache-trace","version":1,"page_size":2,"capacities":{"L1":4},"omits":["pages","pages"]}',
            "twice",
        ),
        (
            '{"format":"hicache-trace","version":1,"page_size":2,"capacities":{"L1":4},"engine":7}',
            "engine",
        ),
    ],
)
def test_bad_headers_name_the_field(line: str, names: str) -> None:
    with pytest.raises(TraceFormatError, match=names.replace("+", r"\+")):
        TraceHeader.from_json(line)


def test_an_engine_without_l3() -> None:
    header = TraceHeader.from_json(
        '{"format":"hicache-trace","version":1,"page_size":16,'
        '"capacities":{"L1":100,"L2":400},"omits":["pages","locks"]}'
    )
    assert header.tiers == ("L1", "L2") and header.omits == ("pages", "locks")


def test_capacities_in_any_key_order_are_tier_order() -> None:
    """A JSON object's keys have no order (the schema says none): L2 before L1 is the same
    header, read in tier order."""
    header = TraceHeader.from_json(
        '{"format":"hicache-trace","version":1,"page_size":2,"capacities":{"L2":4,"L1":8}}'
    )
    assert header.tiers == ("L1", "L2") and list(header.capacities.values()) == [8, 4]


def test_every_shipped_header_matches_the_header_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((SPEC_DIR / "trace.header.schema.json").read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    files = sorted((SPEC_DIR / "examples").glob("*.ndjson"))
    assert files
    for path in files:
        first = path.read_text(encoding="utf-8").splitlines()[0]
        try:
            header = TraceHeader.from_json(first)
        except TraceFormatError:
            assert list(validator.iter_errors(json.loads(first))) != [], path.name  # both refuse
            continue
        assert list(validator.iter_errors(json.loads(first))) == [], path.name
        assert TraceHeader.from_json(header.to_json()) == header


def test_the_omit_tables_are_the_partial_traces_table() -> None:
    """OMITTED_KEYS / OMITTED_EVENTS (what check-trace and the example generator read) say
    what spec/trace.md's "Partial traces" table says each omission leaves out."""
    text = (
        (SPEC_DIR / "trace.md")
        .read_text(encoding="utf-8")
        .split("## Partial traces", 1)[1]
        .split("\n## ", 1)[0]
    )
    rows = {
        m.group(1): set(re.findall(r"`([a-z_]+)`", m.group(2)))
        for m in re.finditer(r"^\| `([a-z_]+)` \| ([^|]*) \|", text, re.M)
    }
    assert set(rows) == set(HEADER_OMITS)
    for omit in HEADER_OMITS:
        assert set(OMITTED_KEYS.get(omit, ())) | set(OMITTED_EVENTS.get(omit, ())) == rows[omit], (
            omit
        )
        assert (omit in OMITTED_KEYS) != (omit in OMITTED_EVENTS), omit
