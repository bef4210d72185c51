"""The fuzz judges its oracle (hicache/testing/selfcheck.py): check-trace replays every run's
trace and must reject its corruptions (each edit's rejection: tests/test_checktrace_catalogue.py).

A rejection of the run's own trace, or an accepted edit, is a failure of the run; the fuzz
reports the counts; a shrink past its budget reports the failure found so far.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from hicache.core.trace import TraceEvent, TraceHeader
from hicache.oracle.checktrace import VIOLATION, check_lines
from hicache.oracle.checktrace.illegal import CATALOGUE, Edited, edit
from hicache.oracle.checktrace.traceview import Trace
from hicache.testing.mutants import activate
from hicache.testing.runner import LastTrace, arguments, fuzz
from hicache.testing.selfcheck import (
    AT_MAX,
    Corruption,
    SelfCheckCounts,
    SelfCheckFailed,
    judge_run,
)
from hicache.testing.walkcheck import WALK_EDITS, must_break, walk_edited
from tests.test_checktrace_catalogue import catalogue_traces, edited_lines


@pytest.fixture(scope="module")
def traces() -> list[tuple[TraceHeader, list[TraceEvent]]]:
    return catalogue_traces()


def _every_kind(at: int) -> list[Corruption]:
    return [Corruption(kind, at, salt) for salt, kind in enumerate(sorted(CATALOGUE))]


def test_judge_run_counts_what_it_judged(
    traces: list[tuple[TraceHeader, list[TraceEvent]]],
) -> None:
    engines = [(h, ev, f"engine {k + 1}") for k, (h, ev) in enumerate(traces)]
    counts = SelfCheckCounts()
    drawn = _every_kind(AT_MAX // 3) + _every_kind(AT_MAX // 2)
    assert judge_run(engines, drawn, counts) is None
    assert counts.traces == len(traces)
    assert counts.events == sum(len(ev) for _, ev in traces)
    assert counts.tried == counts.rejected
    assert sum(counts.tried.values()) + counts.inapplicable == len(drawn)
    assert set(counts.tried) == set(CATALOGUE)
    assert "rejected" in counts.report() and "pages-freed" in counts.report()


def test_a_rejected_run_trace_is_a_failure(
    traces: list[tuple[TraceHeader, list[TraceEvent]]], tmp_path: Path
) -> None:
    """The run's own trace with a wrong page on an eviction: check-trace rejects it, and the
    self-check says so (the machine accepted a run its oracle rejects)."""
    header, events = traces[0]
    view = Trace(events, header.page_size)
    wrong = edit(view, "pages-freed", 0, 0)
    assert wrong is not None
    bad = [TraceEvent.from_json(x) for x in edited_lines(view, wrong)]
    failed = judge_run([(header, bad, "engine 1")], [], SelfCheckCounts())
    assert isinstance(failed, SelfCheckFailed)
    assert failed.what == "rejected the run's trace"
    assert "check-trace rejected the trace of engine 1" in str(failed)
    # `hicache fuzz --trace F` writes the trace it judged (not the run's last engine's):
    # what check-trace rejects again from the file.
    assert failed.trace[0] == header.to_json() and len(failed.trace) == len(bad) + 1
    last = LastTrace(str(tmp_path / "t.ndjson"))
    last.judged = failed.trace
    assert "the self-check failed on" in last.write()
    again = check_lines((tmp_path / "t.ndjson").read_text().splitlines())
    assert again.exit_code == VIOLATION and str(again.seq) in str(failed)


@pytest.mark.parametrize(
    ("mutant", "kind"),
    [
        ("oracle-pages-count", "pages-freed"),
        ("oracle-two-ids", "node-second-id"),
        ("oracle-no-before", "before"),
        ("oracle-seq-repeat", "seq-repeated"),
    ],
)
def test_an_accepted_edit_is_a_failure(
    mutant: str, kind: str, traces: list[tuple[TraceHeader, list[TraceEvent]]]
) -> None:
    """With a blind spot planted in check-trace, some edit of the kind it cannot see is
    accepted, and the self-check names it (the oracle mutants of the bug zoo)."""
    engines = [(h, ev, f"engine {k + 1}") for k, (h, ev) in enumerate(traces)]
    drawn = [Corruption(kind, at * AT_MAX // 12, at) for at in range(12)]
    with activate(mutant):
        failed = judge_run(engines, drawn, SelfCheckCounts())
    assert isinstance(failed, SelfCheckFailed), mutant
    assert failed.what == f"accepted {kind}"
    assert f"{kind} at event" in str(failed)


def test_the_fuzz_reports_the_self_check() -> None:
    result = fuzz(arguments(seed=1, steps=150, report=True))
    assert result.ok, result.text
    counts = result.selfcheck
    assert counts.traces >= result.runs and counts.events >= result.events
    assert sum(counts.tried.values()) > 0 and counts.tried == counts.rejected
    assert counts.summary() in result.text
    assert all(kind in result.text for kind in CATALOGUE)  # --report: per edit


def test_a_shrink_past_its_budget_reports_the_failure_found_so_far() -> None:
    """A shrink that runs out of time (here at once: --shrink-seconds 0) is reported as a
    failure, as shrunk so far, with its replay line and the unshrunk run's -- not left to run
    past an outer budget (Hypothesis' own limit is five minutes) and end with nothing said."""
    from hicache.app.cli import main

    result = fuzz(arguments(seed=0, steps=500, mutant="checker-off", shrink_seconds=0))
    assert not result.ok
    text = result.text
    assert "shrinking stopped: its budget (--shrink-seconds 0) ran out" in text, text
    assert "error: AssertionError: the checker misses" in text
    assert "five minutes" not in text  # Hypothesis' own warning, replaced
    replay = "hicache fuzz --seed 0 --steps 500 --plane null --mutant checker-off"
    assert f"replay: {replay} --shrink-seconds 0\n" in text
    assert f"unshrunk: {replay} --no-shrink\n" in text
    assert main([*replay.split()[1:], "--no-shrink"]) == 0  # it fails again: caught


def _hit(e: TraceEvent) -> bool:
    hit = e.detail.get("hit")
    return isinstance(hit, list) and any(hit)


def test_a_tp_ranks_trace_cut_to_the_agreed_hit_is_counted_not_failed(
    traces: list[tuple[TraceHeader, list[TraceEvent]]],
) -> None:
    """A TP rank admits with the ranks' agreed hit, shorter than its own when the ranks'
    trees differ (spec/tp.md, C1a): check-trace, replaying the rank alone, rejects the
    admission's `detail.hit`. For a TP cache's ranks that is counted, not a failure; for one
    engine it is a failure (found by `hicache fuzz --tp 2 --plane cpu --pools dsv4-tiny
    --seed 3 --steps 100`, which failed before)."""
    header, events = traces[0]
    i = next(k for k, e in enumerate(events) if e.event == "begin_request" and _hit(e))
    agreed = dataclasses.replace(events[i], detail={**events[i].detail, "hit": [0, 0, 0]})
    cut = [*events[:i], agreed, *events[i + 1 :]]
    counts = SelfCheckCounts()
    assert judge_run([(header, cut, "engine 1 of rank 1")], [], counts, ranks=True) is None
    assert counts.agreed == 1 and "1 TP rank traces cut to an agreed hit" in counts.summary()
    failed = judge_run([(header, cut, "engine 1")], [], SelfCheckCounts())
    assert isinstance(failed, SelfCheckFailed) and "detail.hit" in str(failed)


def _walk_corruptions(at: int) -> list[Corruption]:
    return [Corruption(kind, at, salt, walk=True) for salt, kind in enumerate(WALK_EDITS)]


def test_every_walk_corruption_breaks_the_walk_and_is_counted(
    traces: list[tuple[TraceHeader, list[TraceEvent]]],
) -> None:
    """The walk's half (hicache/testing/walkcheck.py): each run's trace is a walk, and each
    corruption placed where no walk continues it breaks `first_break` (and check-trace
    rejects it too); every edit the walk must see is met on these traces."""
    engines = [(h, ev, f"engine {k + 1}") for k, (h, ev) in enumerate(traces)]
    drawn = [c for k in range(8) for c in _walk_corruptions(k * AT_MAX // 8)]
    counts = SelfCheckCounts()
    assert judge_run(engines, drawn, counts) is None
    assert set(counts.walk_tried) == set(WALK_EDITS)
    assert counts.walk_tried == counts.walk_broken
    assert sum(counts.walk_tried.values()) >= 20
    assert "broke the walk" in counts.report()


def test_a_walk_that_forgets_a_nodes_state_is_caught_by_the_self_check(
    traces: list[tuple[TraceHeader, list[TraceEvent]]],
) -> None:
    """walk-no-continuity (the walk judges each step by the machine, not where the node's
    walk left it): a duplicated or dropped transition passes it, and the self-check names
    the edit. Before the walk's half of the self-check, nothing in the fuzz could see this
    mutant: the reference's own events never leave a node's walk."""
    engines = [(h, ev, f"engine {k + 1}") for k, (h, ev) in enumerate(traces)]
    drawn = [Corruption("duplicated", k * AT_MAX // 8, k, walk=True) for k in range(8)]
    with activate("walk-no-continuity"):
        failed = judge_run(engines, drawn, SelfCheckCounts())
    assert isinstance(failed, SelfCheckFailed)
    assert failed.what == "walked duplicated"
    assert "the walk continued through an illegal edit" in str(failed)


def test_must_break_holds_only_where_the_walk_breaks(
    traces: list[tuple[TraceHeader, list[TraceEvent]]],
) -> None:
    """`must_break` is a claim about every walk: wherever it holds, the walk breaks; and an
    insert dropped (a node's first event: its walk may start anywhere) is not claimed."""
    claimed = 0
    for header, events in traces:
        view = Trace(events, header.page_size)
        for kind in WALK_EDITS:
            for salt in range(40):
                found = edit(view, kind, salt * len(events) // 40, salt)
                if found is None or not must_break(events, found):
                    continue
                claimed += 1
                assert walk_edited(events, found, list(found.tail)) is not None, found
        first = next(i for i, e in enumerate(events) if e.event == "insert")
        dropped = edit(view, "dropped", first, 0)
        if dropped is not None and dropped.at == first:
            assert not must_break(events, dropped)
    assert claimed >= 20


def test_must_break_leaves_a_copy_event_to_check_trace() -> None:
    """A `compute` over a node shows it as a contender sees it and leaves its walk where it
    was: written twice it may be another contender's, so the walk need not break (found by
    `hicache fuzz --seed 12`, where the claim failed: the walk continued, rightly). The
    node's own transition written twice is claimed."""
    lines = [
        '{"after":"L1","before":"L1_PRIVATE","event":"insert","node":5,"pages":[0],'
        '"request":1,"seq":1,"tier":"L1","token_end":4,"token_start":0}',
        '{"after":"L1_PRIVATE_L3","before":"L3","event":"compute","node":5,"pages":[4,6],'
        '"request":26,"seq":2,"tier":"L1","token_end":8,"token_start":0}',
    ]
    events = [TraceEvent.from_json(x) for x in lines]
    for at, claimed in ((0, True), (1, False)):
        twice = Edited("duplicated", at, at + 1, iter(()), "event written twice")
        assert must_break(events, twice) is claimed, events[at].event


def test_a_self_check_failure_hypothesis_dropped_is_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run Hypothesis ends for its draws (StopTest) is judged in its teardown, but
    Hypothesis drops whatever such a run raises: `hicache fuzz` found `walk-no-continuity`'s
    blind spot in two such runs of seed 7 and reported the seed clean. A failure at the
    teardown of such a run is kept (runner._keeping_dropped) and reported after the runs,
    with the replay line."""
    from hypothesis.errors import StopTest

    def run_machine(machine: Any, settings: Any) -> None:
        def teardown(self: Any) -> None:
            raise SelfCheckFailed("walked dropped", "planted")

        monkeypatch.setattr(machine.__mro__[1], "teardown", teardown)  # the machine's own
        run = object.__new__(machine)
        try:
            raise StopTest(0)
        except StopTest:
            with pytest.raises(SelfCheckFailed):
                run.teardown()  # what Hypothesis then drops

    monkeypatch.setattr("hypothesis.stateful.run_state_machine_as_test", run_machine)
    result = fuzz(arguments(seed=3, steps=50))
    assert not result.ok
    assert "a run Hypothesis ended for its draws failed at its teardown (1 such)" in result.text
    assert "error: SelfCheckFailed: self-check: planted" in result.text
    assert "replay: hicache fuzz --seed 3 --steps 50" in result.text
