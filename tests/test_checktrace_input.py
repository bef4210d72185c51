"""check-trace's input: each kind of malformed line is exit 2 naming the line; partial traces
(header `omits`) are checked for what they carry; the compiled schema agrees with the
`jsonschema` package; the trace is streamed; the command line's options and errors."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hicache.oracle.checktrace import MALFORMED, VALID, VIOLATION, check_lines
from hicache.oracle.checktrace.generate import controller_trace
from hicache.oracle.checktrace.schema import TRACE_SCHEMA, load_event_schema
from tests.test_checktrace import (
    edit,
    events,
    first,
    lines_of,
    load_back,
    plane_trace,
    write_through,
)

ROOT = Path(__file__).resolve().parents[1]
DROPPED = {"locks": ("lock", "unlock"), "node_remove": ("node_remove",), "split": ("split",)}


def strip(lines: list[str], omits: tuple[str, ...]) -> list[str]:
    """`lines` as an engine that leaves `omits` out would write them (renumbered)."""
    header = json.loads(lines[0])
    header["omits"] = list(omits)
    kept: list[dict[str, Any]] = []
    for e in events(lines):
        if any(e["event"] in DROPPED.get(o, ()) for o in omits):
            continue
        if "pages" in omits:
            e.pop("pages", None)
        if "states" in omits:
            e.pop("before", None)
            e.pop("after", None)
        kept.append({**e, "seq": len(kept) + 1})
    return lines_of(json.dumps(header), kept)


# -- malformed ----------------------------------------------------------------------------------


def _no_l3(lines: list[str]) -> list[str]:
    header = json.loads(lines[0])
    del header["capacities"]["L3"]
    return [json.dumps(header), *lines[1:]]


Case = tuple[Callable[[list[str]], list[str]], str]

MALFORMED_CASES: dict[str, Case] = {
    "bad JSON": (lambda ls: ls[:3] + ['{"seq": 3, "event"'] + ls[4:], "line 4: not JSON"),
    "missing header": (lambda ls: ls[1:], "line 1: header: the first line is an event (seq 1)"),
    "bad header": (
        lambda ls: [ls[0].replace('"version":1', '"version":2')] + ls[1:],
        "line 1: header version 2: this reader knows version 1 only",
    ),
    "unknown event": (lambda ls: edit(ls, 3, event="prefetch"), "line 4: unknown event 'prefetch'"),
    "schema mismatch": (
        lambda ls: edit(ls, 3, tier="L2"),
        'line 4: schema: tier: must be "L1", got "L2"',
    ),
    "unknown key": (lambda ls: edit(ls, 3, slot=4), "line 4: schema: unknown key(s) ['slot']"),
    "out of order": (lambda ls: ls[:2] + [ls[3], ls[2]] + ls[4:], "line 3: seq 3 where 2 is due"),
    "L3 event, no L3": (_no_l3, "line 9: h2s_issue needs tier L3, which the header's capacities"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED_CASES))
def test_malformed_input_is_exit_2_naming_the_line(case: str) -> None:
    make, text = MALFORMED_CASES[case]
    v = check_lines(make(plane_trace(write_through)))
    assert v.exit_code == MALFORMED
    assert v.message.startswith("malformed: ") and "\n" not in v.message
    assert text in v.message, v.message


def test_crlf_line_ends_a_byte_order_mark_and_blank_lines_are_read() -> None:
    lines = plane_trace(write_through)
    text = "\ufeff" + "\r\n".join(lines[:5]) + "\r\n\r\n" + "\r\n".join(lines[5:]) + "\r\n"
    v = check_lines(text.splitlines(keepends=True))
    assert (v.exit_code, v.events) == (VALID, len(lines) - 1), v.message


def test_empty_input_is_malformed() -> None:
    v = check_lines([])
    assert (v.exit_code, v.events, v.seq) == (MALFORMED, 0, None)
    assert "empty input" in v.message


def test_a_malformed_line_reports_its_seq_when_readable() -> None:
    v = check_lines(edit(plane_trace(write_through), 3, tier="L2"))
    assert (v.exit_code, v.seq, v.events) == (MALFORMED, 3, 2)


# -- partial traces -----------------------------------------------------------------------------


OMITS = [
    ("pages",),
    ("states",),
    ("locks",),
    ("node_remove",),
    ("split",),
    ("pages", "states", "locks", "node_remove"),
]


@pytest.mark.parametrize("omits", OMITS, ids=lambda o: "+".join(o))
def test_partial_traces_of_the_controller_are_valid(omits: tuple[str, ...]) -> None:
    lines = strip(controller_trace(1, 300), omits)
    v = check_lines(lines)
    assert v.exit_code == VALID, v.message
    assert v.message.endswith(f"; omits {', '.join(omits)}")


def test_omitted_states_are_not_compared_but_the_rest_is() -> None:
    lines = strip(plane_trace(load_back), ("states",))
    seq = first(lines, "h2d_complete")
    assert check_lines(edit(lines, seq, before="L1", after="L3")).exit_code == VALID
    v = check_lines(edit(lines, seq, token_start=2))
    assert (v.exit_code, v.seq) == (VIOLATION, seq)


def test_omitted_pages_are_not_mapped_but_a_missing_key_elsewhere_is_malformed() -> None:
    lines = strip(plane_trace(load_back), ("pages",))
    assert check_lines(lines).exit_code == VALID
    v = check_lines(edit(lines, first(lines, "compute"), tier=None))
    assert v.exit_code == MALFORMED and "schema: tier" in v.message


# -- the compiled schema against jsonschema -----------------------------------------------------


def _broken(e: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """`e` broken (or not) in the ways a writer gets a line wrong."""
    for key in list(e):
        yield {k: v for k, v in e.items() if k != key}  # each key dropped
    yield {**e, "seq": 0}
    yield {**e, "seq": 2.0}
    yield {**e, "seq": True}
    yield {**e, "extra": 1}
    yield {**e, "tier": "L4"}
    yield {**e, "tier": "L2"}
    yield {**e, "node": -1}
    yield {**e, "pages": []}
    yield {**e, "pages": [1, "2"]}
    yield {**e, "before": "L1_L4"}
    yield {**e, "token_start": 0}
    yield {**e, "detail": {}}
    yield {**e, "detail": {"hit": [0, 0], "tokens": 1, "prompt": [1]}}
    yield {**e, "detail": {"upper": 3, "at": 0}}
    yield {**e, "op": 0}


def test_the_compiled_schema_agrees_with_jsonschema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(json.loads(TRACE_SCHEMA.read_text()))
    ours = load_event_schema()
    lines = plane_trace(write_through) + plane_trace(load_back)[1:]
    checked = 0
    for e in [json.loads(x) for x in lines if '"seq"' in x]:
        for case in [e, *_broken(e)]:
            assert (ours.check(case) is None) == validator.is_valid(case), case
            checked += 1
    assert checked > 500


def test_the_schema_requires_the_op_and_node_trace_md_requires() -> None:
    """spec/trace.md: `op` on every transfer event, `node` on every lifecycle event on a node.
    The schema used to require neither (only the replay's dispatch refused a transfer that
    named no op), so a trace the schema called well formed failed in replay."""
    ours = load_event_schema()
    events_ = [
        json.loads(x)
        for x in plane_trace(write_through) + plane_trace(load_back)[1:]
        if '"seq"' in x
    ]
    transfers = [
        e for e in events_ if e["event"].split("_")[-1] in ("issue", "complete", "fail", "cancel")
    ]
    on_nodes = [e for e in events_ if e["event"] in ("insert", "evict_l1", "evict_l2", "evict_l3")]
    assert transfers and on_nodes
    for e in transfers:
        assert ours.check(e) is None, e
        for key in ("op", "node"):
            assert ours.check({k: v for k, v in e.items() if k != key}) is not None, (key, e)
    for e in on_nodes:
        assert ours.check({k: v for k, v in e.items() if k != "node"}) is not None, e


# -- streaming and the command line -------------------------------------------------------------


def test_lines_after_a_violation_are_never_read() -> None:
    """The checker streams: it stops reading a line after the bad event (look-ahead 1)."""
    lines = plane_trace(write_through)
    seq = first(lines, "d2h_complete")
    bad = edit(lines, seq, after="L1")
    read: list[int] = []

    def stream() -> Iterator[str]:
        for i, line in enumerate(bad):
            read.append(i)
            yield line

    v = check_lines(stream())
    assert (v.exit_code, v.seq) == (VIOLATION, seq)
    assert max(read) <= seq + 1 < len(bad) - 1


def _cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hicache", "check-trace", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_cli_file_options_and_exit_codes(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.ndjson", tmp_path / "bad.ndjson"
    lines = plane_trace(write_through)
    good.write_text("\n".join(lines) + "\n")
    bad.write_text("\n".join(edit(lines, first(lines, "d2h_complete"), after="L1")) + "\n")
    done = _cli(str(good), "--check-every", "10")
    assert (done.returncode, done.stderr) == (VALID, "")
    assert "checked every 10 events" in done.stdout
    done = _cli(str(bad), "--quiet")
    assert (done.returncode, done.stdout) == (VIOLATION, "")
    done = _cli(str(bad))
    assert done.returncode == VIOLATION and done.stdout.startswith("event 7: ")
    done = _cli(str(tmp_path / "missing.ndjson"))
    assert done.returncode == MALFORMED and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "missing.ndjson" in done.stderr
    done = _cli(str(good), "--check-every", "x")
    assert done.returncode == MALFORMED and done.stderr.count("\n") == 1


def test_a_header_asking_for_more_pages_than_a_tier_holds_is_malformed() -> None:
    """`"capacities": {"L1": 10**12}` used to end in numpy's MemoryError (931 GiB), a
    traceback with the violation exit status; it is a malformed header now, exit 2."""
    from hicache.core.tiers import MAX_PAGES

    lines = plane_trace(write_through)
    for too_many in (MAX_PAGES + 1, 10**12):
        header = json.loads(lines[0])
        header["capacities"]["L2"] = too_many
        verdict = check_lines([json.dumps(header), *lines[1:]])
        assert verdict.exit_code == MALFORMED and "0..16777216" in verdict.message, verdict.message


def test_the_fast_predicates_agree_with_jsonschema() -> None:
    """`EventSchema.fast` answers as jsonschema does on every line and broken line above
    (stricter only on a float given directly: the reader parses 2.0 as 2)."""
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(json.loads(TRACE_SCHEMA.read_text()))
    ours = load_event_schema()
    lines = plane_trace(write_through) + plane_trace(load_back)[1:]
    checked = 0
    for e in [json.loads(x) for x in lines if '"seq"' in x]:
        fast = ours.fast[e["event"]]
        for case in [e, *_broken(e), {**e, "pages": [0, 1.5]}, {**e, "tier": 1}]:
            floats = any(type(v) is float for v in case.values())
            if floats:
                assert not fast(case) or validator.is_valid(case), case
            else:
                assert fast(case) == validator.is_valid(case), case
            checked += 1
    assert checked > 500
