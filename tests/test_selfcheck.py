"""The fuzz judges its oracle (hicache/testing/selfcheck.py): check-trace replays every run's
trace, and the catalogue of illegal edits (hicache/checktrace/illegal.py) is rejected.

The forked replay (hicache/checktrace/forks.py) must give each edit the verdict `check_lines`
gives the whole edited trace; every edit of the catalogue must be rejected where it applies;
a rejection of the run's own trace, or an accepted edit, is a failure of the run; the fuzz
reports the counts.
"""

from __future__ import annotations

import dataclasses

import pytest

from hicache.checktrace.forks import Fork, replay_forked
from hicache.checktrace.generate import controller_trace
from hicache.checktrace.illegal import CATALOGUE, Edited, edit
from hicache.checktrace.replay import check_lines
from hicache.checktrace.traceview import Trace
from hicache.checktrace.verdict import VALID
from hicache.testing.mutants import activate
from hicache.testing.runner import arguments, fuzz
from hicache.testing.selfcheck import (
    AT_MAX,
    Corruption,
    SelfCheckCounts,
    SelfCheckFailed,
    judge_run,
)
from hicache.trace import TraceEvent, TraceHeader

POSITIONS = (0, 1, 5, 17, 40, 77, 150, 260)
"""Where the edits are tried (an index of the trace's events: the first from there on where
the edit applies)."""


def _trace(
    seed: int, steps: int = 120, faults: bool = True
) -> tuple[TraceHeader, list[TraceEvent]]:
    lines = controller_trace(seed, steps, faults=faults)
    return TraceHeader.from_json(lines[0]), [TraceEvent.from_json(x) for x in lines[1:]]


@pytest.fixture(scope="module")
def traces() -> list[tuple[TraceHeader, list[TraceEvent]]]:
    return [_trace(1), _trace(2, faults=False), _trace(3, steps=200)]


def _edits(view: Trace, kind: str) -> list[Edited]:
    out: list[Edited] = []
    for salt, at in enumerate(POSITIONS):
        found = edit(view, kind, at, salt)
        if found is not None and all(e.at != found.at for e in out):
            out.append(found)
    return out


def _edited_lines(view: Trace, e: Edited) -> list[str]:
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
    rejects the whole edited trace (exit 1 or 2) at or after the edited event."""
    applied = 0
    for header, events in traces:
        view = Trace(events, header.page_size)
        for e in _edits(view, kind):
            applied += 1
            verdict = check_lines([header.to_json(), *_edited_lines(view, e)])
            assert verdict.exit_code != VALID, (kind, e.what, view.lines[e.at])
            if not e.malformed:
                assert verdict.exit_code == 1, (kind, e.what, verdict.message)
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
        whole = check_lines([header.to_json(), *_edited_lines(view, e)])
        assert (j.verdict.exit_code, j.verdict.seq, j.verdict.message) == (
            whole.exit_code,
            whole.seq,
            whole.message,
        ), (kind, e.what)
        assert j.blame_from <= e.first + 1  # a call's first event, at most the first edited


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
    traces: list[tuple[TraceHeader, list[TraceEvent]]],
) -> None:
    """The run's own trace with a wrong page on an eviction: check-trace rejects it, and the
    self-check says so (the machine accepted a run its oracle rejects)."""
    header, events = traces[0]
    view = Trace(events, header.page_size)
    wrong = edit(view, "pages-freed", 0, 0)
    assert wrong is not None
    bad = [TraceEvent.from_json(x) for x in _edited_lines(view, wrong)]
    failed = judge_run([(header, bad, "engine 1")], [], SelfCheckCounts())
    assert isinstance(failed, SelfCheckFailed)
    assert failed.what == "rejected the run's trace"
    assert "check-trace rejected the trace of engine 1" in str(failed)


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
    from hicache.cli import main

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
