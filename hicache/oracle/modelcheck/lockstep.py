"""One SPMD step across simulated ranks, run in lockstep without threads.

The TP model checker (tpsearch.py) runs the real controller code of a step on every rank --
`Transfers.issue` (C2), `Transfers.conclude` (C4) -- and that code stops at collectives
(hicache/distributed/agreement.py) whose results depend on every rank's values. Instead of a
thread per rank (`ThreadGroup`), a step is run in passes, each from the same starting state
(the caller's `call` works on its own copy each time):

    pass k   each rank runs the step; collectives 0..k-1 return the values recorded for
             them (every rank's), and collective k records this rank's call (point, op,
             length, values) and stops the step there
    compare  the ranks that stopped made the same call; a rank that finished its step
             without it skipped it (CollectiveTimeout "skipped": F16), different calls are
             a CollectiveMismatch (F17)
    last     a pass in which every rank finished: its results are the step's

Each call goes through the real `RecordingCollectives` (the point and op checked against
spec/tp.toml, the call logged). The results are what `ThreadGroup` gives -- each rank takes
the combined values at each collective -- but the same on every run, without threads: a
search makes one such step per edge (tests/test_modelcheck_tp.py compares the two).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from hicache.distributed.agreement import Agreement
from hicache.distributed.collectives import (
    CollectiveMismatch,
    CollectiveTimeout,
    Entry,
    RecordingCollectives,
)

T = TypeVar("T")
Call = tuple[Entry, tuple[int, ...]]
ROUNDS_MAX = 8  # collectives one step may make (C2 makes one; C4 one, and C6b one more)


class _Stop(Exception):
    """Ends a rank's step at the collective being recorded."""


class _Pass(RecordingCollectives):
    """Rank `rank`'s collectives in one pass: `rounds` replayed (every rank's values), the
    next one recorded into `made`, then the step stopped."""

    def __init__(self, rank: int, size: int, rounds: list[list[Call]]) -> None:
        super().__init__(rank, size)
        self.rounds = rounds
        self.made: Call | None = None
        self.n = 0

    def _exchange(self, entry: Entry, values: tuple[int, ...]) -> list[tuple[int, ...]]:
        i, self.n = self.n, self.n + 1
        if i < len(self.rounds):
            # Verify the step is deterministic: this rank brings what it brought before.
            assert self.rounds[i][self.rank] == (entry, values), (i, entry, values)
            return [v for _, v in self.rounds[i]]
        self.made = (entry, values)
        raise _Stop


def lockstep(size: int, call: Callable[[int, Agreement], T]) -> list[T]:
    """`call(rank, agreement)` on every rank of `size`, meeting at each collective (module
    docstring); the results by rank. `call` must start from the same state on every pass.
    Raises CollectiveTimeout when some ranks made a collective that others skipped,
    CollectiveMismatch when the ranks' calls differ."""
    rounds: list[list[Call]] = []
    for _ in range(ROUNDS_MAX + 1):
        results: list[T] = []
        made: list[Call | None] = []
        for r in range(size):
            c = _Pass(r, size, rounds)
            try:
                results.append(call(r, Agreement(c)))
            except _Stop:
                pass
            made.append(c.made)
        if all(m is None for m in made):
            return results
        _same_call(len(rounds), made)
        rounds.append([m for m in made if m is not None])
    raise AssertionError(f"a step made more than {ROUNDS_MAX} collectives")


def _same_call(seq: int, made: list[Call | None]) -> None:
    """Verify every rank made collective `seq`, and the same call (point, op, length)."""
    entries = {r: m[0] for r, m in enumerate(made) if m is not None}
    if len(entries) < len(made):
        last = {r: (seq, e.point) for r, e in entries.items()}
        missing = [r for r, m in enumerate(made) if m is None]
        point = next(iter(entries.values())).point
        raise CollectiveTimeout(seq, point, missing, last, why="was skipped (some ranks made none)")
    if len(set(entries.values())) > 1:
        raise CollectiveMismatch(seq, entries)


__all__ = ["ROUNDS_MAX", "lockstep"]
