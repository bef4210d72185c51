"""One trace replayed once, and edits of it judged from where they begin.

    replay_forked(lines, forks) -> (verdict, [Judged, ...])

`lines` is a trace (header first) whose verdict is `check_lines(lines)`'s. Each `Fork` is an
edit of the same trace: the index of its first event line that differs (`first`, 0 for the
line after the header) and its event lines from there on (`tail`). A fork's verdict is the
one `check_lines` gives the edited trace, but it costs only the events from a call boundary
near `first` on, not the prefix both traces share:

    trace    e0 e1 e2 | e3 e4 | e5 e6 e7 | ...      | : call boundaries of the replay
    fork     e0 e1 e2 | e3 e4 | e5 X  ...           X : the fork's `first` (6)
                              ^ the replay is copied here, after the call at e5 read its
                                events and before it ran; the copy reads e5 and then the
                                fork's tail

The copy is taken at the boundary of the first call whose look-ahead read line `first`
(no call before it read any line the traces do not share, so the copy is in the state the
edited trace's replay reaches there). A call may read past its look-ahead as it runs (a
`cached_len` after `begin_request`, a `node_remove` after an eviction): where such lines
follow the look-ahead up to a fork's `first`, a copy is kept at that boundary too and judged
once the clean replay knows which call read the line. A fork no copy serves (a writer that
spells those lines otherwise) is replayed from its start: the same verdict, at its cost.

`Judged.blame_from` is the seq of the first event of the first call that read line `first`:
check-trace judges calls, blaming a refused call's first event (spec/trace.md, "Checking a
trace"), so that is the earliest event a verdict on the edit may name. The clean replay runs
to its end whatever the forks do; forks are judged only on a trace without `omits` (a partial
trace's skipped lines shift what the boundaries count).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from hicache.core.lifecycle import Lifecycle, load_lifecycle
from hicache.oracle.checktrace.reader import Malformed, TraceReader
from hicache.oracle.checktrace.replay import Replay, Violation, accepted, rejected
from hicache.oracle.checktrace.verdict import Verdict

TRAILING = ('"event":"node_remove"', '"event":"cached_len"')
"""Events a call may emit after those its look-ahead reads (an eviction's `node_remove`, an
admission's `cached_len`), as hicache's writer spells them: a fork whose first edited line is
among them right after a call's look-ahead is copied at that call's boundary too."""


@dataclass(frozen=True)
class Fork:
    """An edit of the trace: its event lines differ from the trace's first at index `first`
    (0: the line after the header); `tail` yields them from there on (read once, lazily)."""

    first: int
    tail: Iterable[str]


@dataclass(frozen=True)
class Judged:
    """A fork's verdict (check_lines' on the edited trace) and `blame_from`: the seq of the
    first event of the first call that read the fork's first edited line."""

    verdict: Verdict
    blame_from: int
    copied: bool = True  # judged from a copy of the trace's replay (else from its start)


class _Feed:
    """Event lines for a replay: `lines[start:]` of the trace, or for a fork the trace's up to
    its `first` and then its tail. An iterator, so a copied reader reads the copy's feed."""

    def __init__(self, lines: Sequence[str], start: int, stop: int, tail: Iterable[str]) -> None:
        self.lines, self.i, self.stop = lines, start, stop
        self.tail: Iterator[str] = iter(tail)

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        if self.i < self.stop:
            self.i += 1
            return self.lines[self.i - 1]
        return next(self.tail)


class _Forks:
    """The trace's forks not judged yet, the copies kept for them, and the calls replayed."""

    def __init__(
        self, lines: Sequence[str], forks: Sequence[Fork], lc: Lifecycle, check_every: int
    ) -> None:
        self.header, self.events, self.forks = lines[0], lines[1:], forks
        self.lc, self.check_every = lc, check_every
        self.waiting = sorted(range(len(forks)), key=lambda i: forks[i].first)
        self.copies: dict[int, tuple[Replay, int]] = {}  # fork -> (copy, its boundary)
        self.judged: dict[int, Judged] = {}
        self.calls: list[tuple[int, int]] = []  # (a call's first event line, lines read by its end)

    def read_while_running(self, read: int) -> None:
        """Judge the forks whose first line an earlier call read as it ran (`read` lines are
        read now), each from the last copy kept for it (or from the start)."""
        while self.waiting and self.forks[self.waiting[0]].first < read:
            self._leftover(self.waiting.pop(0))

    def at_boundary(self, clean: Replay, start: int) -> None:
        """At the boundary `start` of a decided call: judge each waiting fork whose first
        line the call's look-ahead read, from a copy of `clean` (its state is the edited
        trace's here); keep a copy for each whose first line the call may read as it runs."""
        read = _read(clean)
        while self.waiting and self.forks[self.waiting[0]].first < read:
            i = self.waiting.pop(0)
            self.copies.pop(i, None)
            self.judged[i] = Judged(_run(self._copy(clean, start, i)), start + 1)
        tail = read  # the call may read these as it runs: its `node_remove`s and `cached_len`
        while tail < len(self.events) and any(e in self.events[tail] for e in TRAILING):
            tail += 1
        for i in self.waiting:
            if self.forks[i].first >= tail:
                break
            self.copies[i] = (self._copy(clean, start, i), start)

    def finish(self, clean: Replay | None) -> list[Judged]:
        """Judge what is left: from a copy of `clean` at its end (the trace was read to its
        end; None: it was not) the forks no call read, the rest as `_leftover` does; every
        fork's Judged, in the order given."""
        if clean is not None:
            end = clean.consumed
            for i in self.waiting:
                if i not in self.judged and self.forks[i].first >= _read(clean):
                    self.judged[i] = Judged(_run(self._copy(clean, end, i)), end + 1)
        for i in range(len(self.forks)):
            if i not in self.judged:
                self._leftover(i)
        return [self.judged[i] for i in range(len(self.forks))]

    def _copy(self, clean: Replay, start: int, i: int) -> Replay:
        """A copy of `clean` at call boundary `start` (the reference's state before the
        call) reading fork i's lines from there: the trace's up to its `first`, its tail."""
        reader = clean.buffer.reader
        fork = self.forks[i]
        feed = _Feed(self.events, start, fork.first, fork.tail)
        keep: dict[int, object] = {id(clean.lc): clean.lc, id(reader.schema): reader.schema}
        walker = getattr(clean.cp.tracer.sink, "walker", None)
        if walker is not None:  # the tables' machine and its answers: one per tables, shared
            keep[id(walker.machine)], keep[id(walker.judged)] = walker.machine, walker.judged
        keep[id(reader.source)] = feed
        keep[id(clean.buffer.lines)] = type(clean.buffer.lines)()  # read ahead: read again
        out: Replay = copy.deepcopy(clean, keep)
        out.buffer.done, out.buffer.read = False, start
        # The copy's reader resumes after event `start` (seqs 1..start, which the trace's
        # reader checked), on line start + 1 (the header is line 1).
        out.buffer.reader.seq, out.buffer.reader.number = start, start + 1
        return out

    def _leftover(self, i: int) -> None:
        """Fork i, which no call's look-ahead reached: judged from the last copy kept for
        it (or from the start); blamed from the first call that read its first line."""
        first = self.forks[i].first
        readers = [start for start, read in self.calls if read > first]
        blame_from = (readers[0] if readers else len(self.events)) + 1
        kept = self.copies.pop(i, None)
        if kept is None:
            self.judged[i] = Judged(self._from_start(i), blame_from, copied=False)
            return
        copied, start = kept
        # Verify the copy was taken before every call that read the fork's first line.
        assert start + 1 <= blame_from, (start, blame_from)
        self.judged[i] = Judged(_run(copied), blame_from)

    def _from_start(self, i: int) -> Verdict:
        fork = self.forks[i]
        feed = _Feed(self.events, 0, fork.first, fork.tail)
        replay: Replay | None = None
        try:
            replay = Replay(
                TraceReader(_headed(self.header, feed), self.lc), self.lc, self.check_every
            )
            n = replay.run()
        except (Malformed, Violation) as e:
            return rejected(replay, e)
        return accepted(replay, n, self.check_every)


def replay_forked(
    lines: Sequence[str],
    forks: Sequence[Fork] = (),
    lifecycle: Lifecycle | None = None,
    check_every: int = 1,
) -> tuple[Verdict, list[Judged]]:
    """The trace's verdict and, in the order given, each fork's (module docstring). Never
    raises on bad input; the forks of a trace that omits parts are judged from its start."""
    lc = lifecycle or load_lifecycle()
    state = _Forks(lines, forks, lc, check_every)
    clean: Replay | None = None
    try:
        clean = Replay(TraceReader(_Feed(lines, 0, len(lines), ()), lc), lc, check_every)
        if clean.header.omits:
            state.waiting = []  # the boundaries count skipped lines: no copies
        while True:
            state.read_while_running(clean.buffer.read)
            decided = clean.decide()
            if decided is None:
                break
            start = clean.consumed
            state.at_boundary(clean, start)
            clean.execute(*decided)
            state.calls.append((start, _read(clean)))
        verdict = accepted(clean, clean.events + clean.buffer.skipped, check_every)
    except (Malformed, Violation) as e:
        return rejected(clean, e), state.finish(None)
    return verdict, state.finish(clean)


def _read(replay: Replay) -> int:
    """The lines `replay` has read, counting the trace's end as one more once a look-ahead
    met it: a call that read to the end of the trace would read a line an edit appends
    there too (a chain of issues the last event of the trace was part of)."""
    return replay.buffer.read + (1 if replay.buffer.done else 0)


def _run(replay: Replay) -> Verdict:
    """The rest of `replay` (a copy), judged."""
    try:
        n = replay.run()
    except (Malformed, Violation) as e:
        return rejected(replay, e)
    return accepted(replay, n, replay.checks.every)


def _headed(header: str, feed: Iterator[str]) -> Iterator[str]:
    yield header
    yield from feed
