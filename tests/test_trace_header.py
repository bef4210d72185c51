"""The trace header (spec/trace.md, "Header"): what it accepts, what it refuses and why."""

from __future__ import annotations

import io

import pytest

from hicache.control import ControlPlane
from hicache.trace import NdjsonSink, TraceFormatError, TraceHeader


def test_plane_header_round_trips_and_leads_the_stream() -> None:
    cp = ControlPlane(4, [6, 5, 3])
    out = io.StringIO()
    cp.tracer.sink = NdjsonSink(out, cp.trace_header())
    cp.begin_request(7, [1, 2, 3, 4, 5])
    first, *events = out.getvalue().splitlines()
    header = TraceHeader.from_json(first)
    assert (header.page_size, dict(header.capacities), header.tiers) == (4, {"L1": 6, "L2": 5, "L3": 3}, ("L1", "L2", "L3"))
    assert TraceHeader.from_json(header.to_json()) == header
    assert '"prompt":[1,2,3,4,5]' in events[0]


@pytest.mark.parametrize("line, names", [
    ('{"seq":1,"event":"end_request","request":1}', '"format"'),
    ("not json", "not JSON"),
    ('{"format":"hicache-trace","version":2,"page_size":2,"capacities":{"L1":4}}', "version 2"),
    ('{"format":"hicache-trace","version":1,"capacities":{"L1":4}}', "'page_size' is missing"),
    ('{"format":"hicache-trace","version":1,"page_size":0,"capacities":{"L1":4}}', "page_size"),
    ('{"format":"hicache-trace","version":1,"page_size":2,"capacities":{"L1":4,"L3":4}}', "L1, L1+L2"),
    ('{"format":"hicache-trace","version":1,"page_size":2,"capacities":{"L1":-1}}', ">= 0"),
    ('{"format":"hicache-trace","version":1,"page_size":2,"capacities":{"L1":4},"omits":["bytes"]}', "omits"),
    ('{"format":"hicache-trace","version":1,"page_size":2,"capacities":{"L1":4},"colour":1}', "unknown keys"),
])
def test_bad_headers_name_the_field(line: str, names: str) -> None:
    with pytest.raises(TraceFormatError, match=names.replace("+", r"\+")):
        TraceHeader.from_json(line)


def test_an_engine_without_l3() -> None:
    header = TraceHeader.from_json('{"format":"hicache-trace","version":1,"page_size":16,'
                                   '"capacities":{"L1":100,"L2":400},"omits":["pages","locks"]}')
    assert header.tiers == ("L1", "L2") and header.omits == ("pages", "locks")
