"""check-trace rejects every edit of the catalogue of illegal edits
(hicache/oracle/checktrace/illegal.py).

Each edit is applied to valid controller traces (hicache/oracle/checktrace/generate.py) at several
events; check-trace must reject the whole edited trace (a violation, or malformed for an
edit of the format). The fuzz makes the same edits of its own runs' traces
(hicache/testing/selfcheck.py), judged by a forked replay (hicache/oracle/checktrace/forks.py): its
verdict must be `check_lines`' on the whole edited trace. These tests kill the oracle mutants
of hicache/testing/mutants/oracle.py, which the other check-trace tests let through
(benchmarks/results/2026-12-04-zoo-oracle.md).
"""

from __future__ import annotations

import pytest

from hicache.core.trace import TraceEvent, TraceHeader
from hicache.oracle.checktrace.forks import Fork, replay_forked
from hicache.oracle.checktrace.generate import controller_trace
from hicache.oracle.checktrace.illegal import CATALOGUE, Edited, edit
from hicache.oracle.checktrace.replay import check_lines
from hicache.oracle.checktrace.traceview import Trace
from hicache.oracle.checktrace.verdict import MALFORMED, VALID, VIOLATION

POSITIONS = (0, 1, 5, 17, 40, 77, 150, 260)
"""Where the edits are tried (an index of the trace's events: the first from there on where
the edit applies)."""


def _trace(
    seed: int, steps: int = 120, faults: bool = True
) -> tuple[TraceHeader, list[TraceEvent]]:
    lines = controller_trace(seed, steps, faults=faults)
    return TraceHeader.from_json(lines[0]), [TraceEvent.from_json(x) for x in lines[1:]]


def catalogue_traces() -> list[tuple[TraceHeader, list[TraceEvent]]]:
    """Three valid controller traces (header, events): with faults, without, longer."""
    return [_trace(1), _trace(2, faults=False), _trace(3, steps=200)]


@pytest.fixture(scope="module")
def traces() -> list[tuple[TraceHeader, list[TraceEvent]]]:
    return catalogue_traces()


def _edits(view: Trace, kind: str) -> list[Edited]:
    out: list[Edited] = []
    for salt, at in enumerate(POSITIONS):
        found = edit(view, kind, at, salt)
        if found is not None and all(e.at != found.at for e in out):
            out.append(found)
    return out


def edited_lines(view: Trace, e: Edited) -> list[str]:
    return [*view.lines[: e.first], *e.tail]


def test_the_traces_are_valid(traces: list[tuple[TraceHeader, list[TraceEvent]]]) -> None:
    for header, events in traces:
        lines = [header.to_json(), *(e.to_json() for e in events)]
        assert check_lines(lines).exit_code == VALID, check_lines(lines).message


@pytest.mark.parametrize("kind", sorted(CATALOGUE))
def test_every_edit_applies_and_is_rejected(
    kind: str, traces: list[tuple[TraceHeader, list[TraceEvent]]]
) -> None:
    """Each edit of the catalogue applies to some event of the traces, and check-trace
    rejects the whole edited trace: a violation (exit 1), or malformed (exit 2) for an edit of
    the format."""
    applied = 0
    for header, events in traces:
        view = Trace(events, header.page_size)
        for e in _edits(view, kind):
            applied += 1
            verdict = check_lines([header.to_json(), *edited_lines(view, e)])
            assert verdict.exit_code != VALID, (kind, e.what, view.lines[e.at])
            # A rule broken is a violation (exit 1); the format broken, malformed (exit 2:
            # a repeated seq is refused by the reader, never replayed as another event).
            want = MALFORMED if e.malformed else VIOLATION
            assert verdict.exit_code == want, (kind, e.what, verdict.message)
    assert applied, f"{kind} applied to no event of the test traces"


@pytest.mark.parametrize("kind", sorted(CATALOGUE))
def test_a_forked_replay_gives_check_lines_verdict(
    kind: str, traces: list[tuple[TraceHeader, list[TraceEvent]]]
) -> None:
    """replay_forked judges each edit as check_lines judges the whole edited trace: the same
    exit code, blamed event and message; and the clean trace as check_lines does."""
    header, events = traces[0]
    view = Trace(events, header.page_size)
    lines = [header.to_json(), *view.lines]
    edits = _edits(view, kind)
    clean, judged = replay_forked(lines, [Fork(e.first, e.tail) for e in edits])
    assert (clean.exit_code, clean.message) == (
        check_lines(lines).exit_code,
        check_lines(lines).message,
    )
    for e, j in zip(_edits(view, kind), judged, strict=True):
        whole = check_lines([header.to_json(), *edited_lines(view, e)])
        assert (j.verdict.exit_code, j.verdict.seq, j.verdict.message) == (
            whole.exit_code,
            whole.seq,
            whole.message,
        ), (kind, e.what)
        assert j.blame_from <= e.first + 1  # a call's first event, at most the first edited


def _ending_in_a_chain() -> list[tuple[TraceHeader, list[TraceEvent]]]:
    """Traces that end inside an op's chain of issues: a controller trace cut after the
    second issue of its first op of two or more nodes, and a vLLM-shaped partial trace
    (omits pages, states, ...) whose last event is its store's second issue."""
    header, events = _trace(1)
    at = next(
        i
        for i in range(len(events) - 1)
        if events[i].event.endswith("_issue")
        and events[i + 1].event == events[i].event
        and events[i + 1].op == events[i].op
    )
    from hicache.testing.adapters.vllm_trace import VLLMTrace

    tokens = tuple(range(9))
    t = VLLMTrace(4, {"L1": 8, "L2": 8}, "test")
    t.begin(1, tokens, 0, 0)
    t.computed(1, tokens[:4], "")
    t.computed(1, tokens[:8], "")
    t.tail(1, 8, 12)
    t.transfer("d2h_issue", "L2", 1, [tokens[:4], tokens[:8]], 1)
    return [(header, events[: at + 2]), (t.header, list(t.events))]


@pytest.mark.parametrize("which", [0, 1])
def test_an_edit_of_a_traces_last_event_is_blamed_from_the_call_reading_it(which: int) -> None:
    """An edit at the end of a trace that ends inside a chain (an issue written twice, ...)
    is read by the chain's call: the earliest event a verdict may blame is that call's first.
    Before, a look-ahead that met the end of the trace did not count as reading past it, so
    the blame bound was the end of the trace, and the fuzz's self-check failed a correct
    verdict (vLLM tiering, seed 6: 'check-trace blamed event 53, before the edit's')."""
    header, events = _ending_in_a_chain()[which]
    view = Trace(events, header.page_size)
    lines = [header.to_json(), *view.lines]
    assert check_lines(lines).exit_code == VALID
    found = [
        e
        for kind in CATALOGUE
        if (e := edit(view, kind, len(events) - 1, 0)) is not None and e.at == len(events) - 1
    ]
    assert any(e.kind == "duplicated" for e in found)
    _, judged = replay_forked(lines, [Fork(e.first, e.tail) for e in found])
    for e, j in zip(found, judged, strict=True):
        if j.verdict.exit_code == VIOLATION:
            assert j.verdict.seq is not None and j.verdict.seq >= j.blame_from, (e.kind, j)
