"""`hicache check-trace` and a trace header's `duplicate_copies` (spec/tree.md, "Duplicate
copies"): an engine whose L1 is keyed by block hash (vLLM) caches a page a request computed
next to the copy another request's load-back is filling. The reference holds one copy per page
(S5), so check-trace judges such a trace up to that insert and says so (exit 3, UNJUDGED); the
fuzz self-check judges it up to there. Found by the traced fuzz of vLLM's tiering manager
(seed 3, 1,000 steps): before, the trace was rejected as a violation."""

from __future__ import annotations

import dataclasses

from hicache.core.trace import TraceFormatError, TraceHeader
from hicache.oracle.checktrace import MALFORMED, VALID, VIOLATION, check_lines
from hicache.oracle.checktrace.verdict import UNJUDGED
from hicache.testing.adapters.vllm_trace import VLLMTrace
from hicache.testing.selfcheck import SelfCheckCounts, judge_run

TOKENS = tuple(range(9))  # two whole pages of 4 tokens and a tail
P1, P2 = TOKENS[:4], TOKENS[:8]


def _trace(duplicates: bool, second_copy: bool = True) -> VLLMTrace:
    """Request 1 computes P1 and P2 and backs them up; L1 drops both; request 2 loads them
    back from L2 (op 2, in flight); request 3, with the same prompt, computes P1 itself and
    -- `second_copy` -- vLLM caches it beside the load (else the load lands first)."""
    t = VLLMTrace(4, {"L1": 8, "L2": 8}, "test")
    t.header = dataclasses.replace(t.header, duplicate_copies=duplicates)
    t.begin(1, TOKENS, 0, 0)
    t.computed(1, P1, "")
    t.computed(1, P2, "")
    t.tail(1, 8, 12)
    t.transfer("d2h_issue", "L2", 1, [P1, P2], 1)
    t.transfer("d2h_complete", "L2", 1, [P1, P2], 1)
    t.end(1, (8, 12))
    t.evicted("L1", [P1, P2])
    t.begin(2, TOKENS, 0, 8)
    t.transfer("h2d_issue", "L1", 2, [P1, P2], 2)
    t.begin(3, TOKENS, 0, 8)
    if not second_copy:
        t.transfer("h2d_complete", "L1", 2, [P1, P2], 2)
    t.computed(3, P1, "other" if second_copy else "L1")
    return t


def _seq_of_second_copy(t: VLLMTrace) -> int:
    return next(e.seq for e in t.events if e.event == "insert" and e.request == 3)


def test_a_declared_second_copy_stops_the_judging_there() -> None:
    t = _trace(duplicates=True)
    verdict = check_lines(t.lines())
    assert verdict.exit_code == UNJUDGED, verdict.message
    assert verdict.seq == _seq_of_second_copy(t)
    assert verdict.events == verdict.seq - 1  # every event before it judged, and valid
    assert "second L1 copy" in verdict.message and "Duplicate copies" in verdict.message


def test_without_the_header_a_second_copy_is_a_violation() -> None:
    t = _trace(duplicates=False)
    verdict = check_lines(t.lines())
    assert verdict.exit_code == VIOLATION, verdict.message
    assert verdict.seq == _seq_of_second_copy(t)


def test_the_header_lifts_nothing_else() -> None:
    """A copy of a page that is RESIDENT is the ordinary discard, valid either way; and an
    illegal event before the second copy is still a violation under the header."""
    assert check_lines(_trace(duplicates=True, second_copy=False).lines()).exit_code == VALID
    t = _trace(duplicates=True)
    lines = t.lines()
    at = next(i for i, line in enumerate(lines) if '"h2d_issue"' in line)
    bad = [*lines[:at], lines[at].replace('"op":2', '"op":9'), *lines[at + 1 :]]
    verdict = check_lines(bad)
    assert verdict.exit_code in (VIOLATION, MALFORMED), verdict.message
    assert verdict.seq is not None and verdict.seq < _seq_of_second_copy(t)


def test_the_header_field_round_trips_and_is_a_bool() -> None:
    h = TraceHeader(4, {"L1": 8}, duplicate_copies=True)
    assert TraceHeader.from_json(h.to_json()) == h
    assert "duplicate_copies" not in TraceHeader(4, {"L1": 8}).to_json()
    try:
        TraceHeader.from_json(h.to_json().replace("true", '"yes"'))
    except TraceFormatError as e:
        assert "duplicate_copies" in str(e)
    else:
        raise AssertionError("a non-bool duplicate_copies was accepted")


def test_the_self_check_judges_a_cut_trace_up_to_the_cut() -> None:
    """The fuzz's self-check accepts a trace unjudged past a declared second copy (before:
    SelfCheckFailed, 'rejected the run's trace') and counts it."""
    t = _trace(duplicates=True)
    counts = SelfCheckCounts()
    failed = judge_run([(t.header, t.events, "engine 1")], (), counts)
    assert failed is None, failed
    assert (counts.cut, counts.traces, counts.events) == (1, 1, _seq_of_second_copy(t) - 1)
