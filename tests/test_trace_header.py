"""The trace header (spec/trace.md, "Header"): what it accepts, what it refuses and why."""

from __future__ import annotations

import io
import json
import re

import pytest

from hicache.core.control import ControlPlane
from hicache.core.trace import (
    HEADER_OMITS,
    OMITTED_EVENTS,
    OMITTED_KEYS,
    NdjsonSink,
    TraceFormatError,
    TraceHeader,
    Tracer,
)
from hicache.oracle.checktrace import check_lines
from hicache.oracle.checktrace.verdict import MALFORMED, VALID
from hicache.spec import SPEC_DIR


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


def _script(cp: ControlPlane) -> None:
    """A request computes a page and a half, inserts the page, ends; the page is evicted."""
    cp.begin_request(1, [1, 2, 3, 4, 5, 6])
    cp.compute(1, 8)
    cp.insert(1)
    cp.end_request(1)
    cp.evict("L1", 1)


def test_a_plane_traced_through_a_bare_ndjson_sink_writes_its_header_first() -> None:
    """The public API's sink on a plane's tracer, given no header: the plane hands it its own
    when built. Before, the file had events only, and check-trace called it malformed until
    the header line of hicache/app/demo.py was copied in."""
    out = io.StringIO()
    cp = ControlPlane(4, [6, 5, 3], tracer=Tracer(NdjsonSink(out)))
    _script(cp)
    lines = out.getvalue().splitlines()
    assert TraceHeader.from_json(lines[0]) == cp.trace_header()
    verdict = check_lines(lines)
    assert verdict.exit_code == VALID, verdict.message
    # A sink put on the tracer later gets the header too, before the events it writes.
    later = io.StringIO()
    cp.tracer.sink = NdjsonSink(later, engine="mine")
    cp.begin_request(2, [9, 9, 9, 9, 9])
    first = TraceHeader.from_json(later.getvalue().splitlines()[0])
    assert first.engine == "mine" and first.capacities == cp.trace_header().capacities


def test_a_controller_traced_through_the_public_api_writes_a_trace_check_trace_reads() -> None:
    pytest.importorskip("torch", reason="the controller's data plane")
    from hicache import CacheConfig, CacheController

    out = io.StringIO()
    ctl = CacheController(
        CacheConfig(l1_pages=8, l2_pages=8, l3_slots=8), tracer=Tracer(NdjsonSink(out))
    )
    ctl.admit(1, list(range(20)))
    ctl.prefill(1)
    ctl.finish(1)
    ctl.close()
    verdict = check_lines(out.getvalue().splitlines())
    assert verdict.exit_code == VALID, verdict.message


def test_an_event_before_any_header_is_refused_and_check_trace_says_what_to_do() -> None:
    out = io.StringIO()
    with pytest.raises(TraceFormatError, match="an event before the trace's header"):
        Tracer(NdjsonSink(out)).emit("end_request", request=1)
    assert out.getvalue() == ""  # nothing half-written
    lines = io.StringIO()
    _script(ControlPlane(4, [6, 5, 3], tracer=Tracer(NdjsonSink(lines))))
    headless = lines.getvalue().splitlines()[1:]
    verdict = check_lines(headless)
    assert verdict.exit_code == MALFORMED
    assert "the first line is an event (seq 1), not the header" in verdict.message
    assert "NdjsonSink writes it" in verdict.message
