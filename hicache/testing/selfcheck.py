"""The fuzz judges its oracle: every run's trace through check-trace, and corrupted copies of it.

After every run of the controller's machines (`hicache fuzz`, the bug zoo's fuzz-* machines),
in the machine's teardown:

    1. the run's trace is cut into its engines' traces (each from seq 1: a restart or a
       crash starts a new engine; a TP cache: every rank's), each headed by its adapter's
       header, as `hicache fuzz --trace` writes them;
    2. each is replayed by check-trace (hicache/oracle/checktrace/forks.py: the verdict
       `check_lines` gives) and must be accepted: the machine accepted the run, so a
       rejection is the oracle's false alarm (or the machine's miss). One exception: a TP
       rank's trace rejected for an admission's hit (the ranks agree on the least of their
       hits, spec/tp.md C1a, which check-trace replaying one rank cannot know) is counted
       (`agreed`) and not judged further; and a trace check-trace leaves unjudged from an
       event on (exit 3: a duplicate copy its header declares, spec/tree.md) is judged up to
       that event (`cut`);
    3. the run's CORRUPTIONS corruptions, drawn by Hypothesis when the run starts (so they
       shrink and replay by seed), each an edit of the catalogue of illegal edits
       (hicache/oracle/checktrace/illegal.py) at a drawn event: check-trace must reject each --
       a violation (exit 1) at or after the first event of the first call that reads the
       edited line (check-trace blames a refused call's first event), malformed (exit 2)
       for an edit of the format, at or after the edited line. An accepted edit is a blind
       spot of the oracle, reported as a failure of the run. In a trace judged up to a cut,
       an edit at or past the cut, or one whose replay reaches the cut unjudged, is counted
       (`unjudged`), not judged;
    4. the walk judged the same way (hicache/testing/walkcheck.py): each trace, as written,
       must be a walk of the tables' machine (`tracewalk.first_break`), and each corruption
       that no walk continues (`walkcheck.must_break`) must break it.

A failure is `SelfCheckFailed` (an AssertionError: the machine's verdict) naming the engine,
the event, the edit and check-trace's message. A run that fails on its own is not judged
again (its trace may be wrong), nor one stopped by a budget; one Hypothesis ended early for
its draws (`StopTest`) is (Hypothesis drops what such a run raises: `hicache fuzz` keeps it
and reports it after its runs, hicache/testing/runner.py).
`SelfCheckCounts` (on `Coverage.selfcheck`) counts the traces and events replayed and, per
edit, the corruptions tried and rejected (and those the walk must see, broken): the fuzz
summary and `--report` print them.
"""

from __future__ import annotations

import itertools
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st
from hypothesis.errors import StopTest
from hypothesis.stateful import RuleBasedStateMachine, initialize

from hicache.core.trace import TraceEvent, TraceHeader
from hicache.core.tracewalk import first_break
from hicache.oracle.checktrace.forks import Fork, replay_forked
from hicache.oracle.checktrace.illegal import CATALOGUE, Edited, edit
from hicache.oracle.checktrace.traceview import Trace
from hicache.oracle.checktrace.verdict import MALFORMED, UNJUDGED, VALID, Verdict
from hicache.testing import walkcheck

CORRUPTIONS = 3
"""Corruptions of each run's trace (each a fork of its replay: a copy and the events from
the edit to check-trace's verdict)."""
WALK_CORRUPTIONS = 1
"""More corruptions of each run's trace, each placed where no walk continues it
(`walkcheck.must_break`): judged by check-trace and by the walk."""
WALK_PLACES = 32
"""Events a walk corruption tries, from its drawn one on, for a place where it breaks every
walk (the edits of WALK_EDITS apply to many events, most of them not such places)."""
AT_MAX = 2**16 - 1
"""A corruption's event is drawn as `at` in 0..AT_MAX, a fraction of the run's events."""


@dataclass(frozen=True)
class Corruption:
    """One drawn corruption: the edit `kind`, where (`at` / AT_MAX of the run's events; the
    first event from there on where the edit applies) and `salt` (its choices)."""

    kind: str
    at: int
    salt: int
    walk: bool = False  # placed only where no walk continues the edit


def corruptions() -> st.SearchStrategy[tuple[Corruption, ...]]:
    """CORRUPTIONS corruptions (an edit of the catalogue, an event, a salt), then
    WALK_CORRUPTIONS of the edits the walk must see too."""

    def some(kinds: tuple[str, ...], n: int, walk: bool) -> st.SearchStrategy[list[Corruption]]:
        one = st.builds(
            Corruption,
            kind=st.sampled_from(kinds),
            at=st.integers(0, AT_MAX),
            salt=st.integers(0, 2**16 - 1),
            walk=st.just(walk),
        )
        return st.lists(one, min_size=n, max_size=n)

    return st.tuples(
        some(tuple(CATALOGUE), CORRUPTIONS, False),
        some(walkcheck.WALK_EDITS, WALK_CORRUPTIONS, True),
    ).map(lambda two: (*two[0], *two[1]))


@dataclass
class SelfCheckCounts:
    """The self-check's counts over every run given to `judge_run`."""

    traces: int = 0  # engines' traces replayed (each accepted)
    events: int = 0  # their events
    tried: Counter[str] = field(default_factory=Counter)  # corruptions tried, per edit
    rejected: Counter[str] = field(default_factory=Counter)  # ... that check-trace rejected
    inapplicable: int = 0  # corruptions whose edit applied to no event of the run
    agreed: int = 0  # TP ranks' traces not judged: an admission cut to the agreed hit
    cut: int = 0  # traces judged up to a duplicate copy (check-trace's UNJUDGED)
    unjudged: int = 0  # corruptions of those at or past the cut, or reaching it: not judged
    walk_tried: Counter[str] = field(default_factory=Counter)  # corruptions no walk continues
    walk_broken: Counter[str] = field(default_factory=Counter)  # ... that broke the walk

    def summary(self) -> str:
        """One line: what was replayed and how many corruptions check-trace rejected."""
        tried, rejected = sum(self.tried.values()), sum(self.rejected.values())
        return (
            f"self-check: {self.traces} traces ({self.events} events) replayed by check-trace, "
            f"{tried} corruptions tried, {rejected} rejected"
            + (f"; {self.agreed} TP rank traces cut to an agreed hit" if self.agreed else "")
            + (
                f"; {self.cut} traces judged up to a duplicate copy "
                f"({self.unjudged} corruptions there or past it not judged)"
                if self.cut
                else ""
            )
            + f"; the walk: {sum(self.walk_broken.values())} of "
            f"{sum(self.walk_tried.values())} corruptions it must see broke it"
        )

    def report(self) -> str:
        """The summary, then per edit of the catalogue: tried and rejected."""
        lines = [self.summary()]
        lines += [
            f"  {kind:<40} {self.rejected[kind]}/{self.tried[kind]} rejected"
            + (
                f", {self.walk_broken[kind]}/{self.walk_tried[kind]} broke the walk"
                if kind in walkcheck.WALK_EDITS
                else ""
            )
            for kind in CATALOGUE
        ]
        lines.append(f"  {'(applied to no event of the run)':<40} {self.inapplicable}")
        lines.append(f"  {'(TP rank traces cut to an agreed hit)':<40} {self.agreed}")
        lines.append(f"  {'(traces judged up to a duplicate copy)':<40} {self.cut}")
        return "\n".join(lines)


class SelfCheckFailed(AssertionError):
    """check-trace rejected a run's own trace, or accepted an illegal edit of it: `what` says
    which in a few words (the bug zoo names the check by it)."""

    def __init__(self, what: str, message: str, trace: Sequence[str] = ()) -> None:
        super().__init__(f"self-check: {message}")
        self.what = what
        self.trace = list(trace)  # the judged trace's lines (header first), for `--trace`


Engine = tuple[TraceHeader, Sequence[TraceEvent], str]
"""One engine's trace: its header, its events (seq 1 first), and a name for reports."""


def engines(cache: Any) -> list[Engine]:
    """The traces of every engine a run's adapter built: per rank (a TP cache's), its events
    cut where seq starts again at 1, headed by the rank's header."""
    ranks = getattr(cache, "ranks", None) or [cache]
    out: list[Engine] = []
    for r, rank in enumerate(ranks):
        events: list[TraceEvent] = rank.trace()
        if not events:
            continue  # an engine without a trace (protocol.py): nothing to judge
        header: TraceHeader = rank.trace_header()
        starts = [i for i, e in enumerate(events) if e.seq == 1] + [len(events)]
        for k, (a, b) in enumerate(itertools.pairwise(starts)):
            where = f"engine {k + 1}" + (f" of rank {r}" if len(ranks) > 1 else "")
            out.append((header, events[a:b], where))
    return out


def judge_run(
    traces: Sequence[Engine],
    drawn: Sequence[Corruption],
    counts: SelfCheckCounts,
    ranks: bool = False,
) -> SelfCheckFailed | None:
    """Replay each trace (it must pass check-trace) and each corruption (check-trace must
    reject it where the module docstring says): the failure of the first that does not, or
    None (what was judged counted in `counts`). `ranks`: the traces are a TP cache's ranks'
    (a rank's trace rejected at an agreed admission is not judged: `_agreed_hit`)."""
    views = [Trace(events, header.page_size) for header, events, _ in traces]
    planned: list[list[Edited]] = [[] for _ in traces]
    for c in drawn:
        found = _place(views, c)
        if found is None:
            counts.inapplicable += 1
        else:
            planned[found[0]].append(found[1])
    for (header, events, where), view, edits in zip(traces, views, planned):
        lines = [header.to_json(), *view.lines]
        # The tails the walk reads too, read once here (a fork reads its tail lazily).
        tails = {k: list(e.tail) for k, e in enumerate(edits) if walkcheck.must_break(events, e)}
        forks = [
            Fork(e.first, iter(tails[k]) if k in tails else e.tail) for k, e in enumerate(edits)
        ]
        verdict, judged = replay_forked(lines, forks)
        if ranks and _agreed_hit(events, verdict):
            counts.agreed += 1  # a TP rank's admission, cut to the ranks' agreed hit
            continue
        cut = None
        if verdict.exit_code == UNJUDGED and verdict.seq is not None:
            cut = verdict.seq  # a duplicate copy: judged up to it (module docstring)
            counts.cut += 1
        elif verdict.exit_code != VALID:
            return SelfCheckFailed(
                "rejected the run's trace",
                f"check-trace rejected the trace of {where} of a run the machine accepted: "
                f"{verdict.message}",
                lines,
            )
        # The walk reads states: an engine's trace that omits them has no walk to judge.
        walked = (
            None
            if "states" in header.omits or cut is not None
            else _walk(events, edits, tails, where, counts)
        )
        if walked is not None:
            return walked
        counts.traces += 1
        counts.events += len(events) if cut is None else cut - 1
        for e, j in zip(edits, judged):
            if cut is not None and (
                e.at + 1 >= cut or (j.verdict.exit_code == UNJUDGED and j.verdict.seq == cut)
            ):
                counts.unjudged += 1  # at or past the cut, or it reached the cut unseen
                continue
            counts.tried[e.kind] += 1
            why = _not_rejected(e, j.verdict.exit_code, j.verdict.seq, j.blame_from)
            if why is not None:
                return SelfCheckFailed(
                    f"accepted {e.kind}",
                    f"check-trace {why}: {e.kind} at event {e.at + 1} of {where} ({e.what}); "
                    f"the event was {view.lines[e.at]}; check-trace said: {j.verdict.message}",
                    lines,
                )
            counts.rejected[e.kind] += 1
    return None


def _walk(
    events: Sequence[TraceEvent],
    edits: Sequence[Edited],
    tails: dict[int, list[str]],
    where: str,
    counts: SelfCheckCounts,
) -> SelfCheckFailed | None:
    """The walk's half of the self-check: `events` must be a walk, and each edit of `tails`
    (those no walk continues) must break it; the failure, or None (counted in `counts`)."""
    found = first_break(events)
    if found is not None:
        return SelfCheckFailed(
            "the walk rejected the run's trace",
            f"the walk broke on the trace of {where} of a run the machine accepted: "
            f"{found.event.to_json()}: {found.why}",
        )
    for k, tail in tails.items():
        e = edits[k]
        counts.walk_tried[e.kind] += 1
        if walkcheck.walk_edited(events, e, tail) is None:
            return SelfCheckFailed(
                f"walked {e.kind}",
                f"the walk continued through an illegal edit: {e.kind} at event {e.at + 1} "
                f"of {where} ({e.what}); the event was {events[e.at].to_json()}",
            )
        counts.walk_broken[e.kind] += 1
    return None


def _place(views: Sequence[Trace], c: Corruption) -> tuple[int, Edited] | None:
    """Corruption `c` placed: (trace, edit) at the first event from `at`'s place on (that
    trace's, then the next traces') where its edit applies; None where it applies nowhere."""
    total = sum(len(v.events) for v in views)
    if not total:
        return None
    at = c.at * total // (AT_MAX + 1)
    first = 0
    while at >= len(views[first].events):
        at -= len(views[first].events)
        first += 1
    for k in range(len(views)):
        t = (first + k) % len(views)
        found = _place_in(views[t], c, at if k == 0 else 0)
        if found is not None:
            return t, found
    return None


def _place_in(view: Trace, c: Corruption, at: int) -> Edited | None:
    """`c`'s edit at the first event of `view` from `at` on where it applies (and, for a walk
    corruption, breaks every walk: WALK_PLACES events tried at most, not wrapping around)."""
    for _ in range(WALK_PLACES if c.walk else 1):
        found = edit(view, c.kind, at, c.salt)
        if found is None or not c.walk or walkcheck.must_break(view.events, found):
            return found
        if found.at < at:
            return None  # wrapped around: the rest of the trace has no place for it
        at = found.at + 1
        if at >= len(view.events):
            return None
    return None


def _agreed_hit(events: Sequence[TraceEvent], verdict: Verdict) -> bool:
    """Whether check-trace rejected a TP rank's trace for the hit of an admission: the ranks
    agree on the least of their hits (spec/tp.md, C1a `admit`), which a rank's own trace does
    not show and check-trace, replaying that rank alone, cannot know."""
    if verdict.exit_code == VALID or verdict.seq is None or not 0 < verdict.seq <= len(events):
        return False
    at = events[verdict.seq - 1]
    return (
        at.event == "begin_request" and "differs from the reference: detail.hit" in verdict.message
    )


def _not_rejected(e: Edited, code: int, seq: int | None, blame_from: int) -> str | None:
    """Why check-trace's verdict does not reject edit `e` as it must; None when it does."""
    if code == VALID:
        return "accepted an illegal edit"
    if e.malformed and code != MALFORMED:
        return "did not find an edit of the format malformed"
    floor = e.at + 1 if e.malformed else blame_from
    if seq is not None and seq < floor:
        return f"blamed event {seq}, before the edit's (from event {floor} on)"
    return None


def with_self_check(
    base: type[RuleBasedStateMachine],
    setups: st.SearchStrategy[Any],
    counts: SelfCheckCounts | None,
    name: str,
) -> type[RuleBasedStateMachine]:
    """`base` (a machine of make_machine's whose runs start with `setups`) whose runs also
    draw their corruptions and, in teardown, judge check-trace (module docstring); `counts`
    (None: kept nowhere) counts what was judged."""
    kept = counts if counts is not None else SelfCheckCounts()

    class Machine(base):  # type: ignore[valid-type, misc]
        @initialize(setup=setups, corruptions=corruptions())
        def start(self, setup: Any, corruptions: tuple[Corruption, ...] = ()) -> None:
            # (none: a test that builds the machine and calls start itself)
            self.corruptions = corruptions
            super().start(setup)

        def teardown(self) -> None:
            # A run that failed (or was stopped) is not judged; one Hypothesis ended for its
            # draws (StopTest: an example too long) ran every step as drawn, and is.
            ending = sys.exc_info()[1]
            cache = getattr(self, "cache", None)
            super().teardown()
            if cache is not None and (ending is None or isinstance(ending, StopTest)):
                self.self_check(cache)

        def self_check(self, cache: Any) -> None:
            """check-trace accepts the run's traces and rejects their corruptions."""
            ranks = len(getattr(cache, "ranks", None) or ()) > 1
            failed = judge_run(engines(cache), self.corruptions, kept, ranks)
            if failed is not None:
                raise failed  # here: the machine's check that failed is `self_check`

    Machine.__name__ = Machine.__qualname__ = name
    return Machine
