"""Simulated ranks: N ranks as threads of one process, meeting at every collective.

    group = ThreadGroup(size=2, timeout_s=5.0)
    results = group.run(lambda rank: cache[rank].admit(rid, tokens))   # one step, every rank

Each rank runs the same code (SPMD) on its own thread with its own `ThreadCollectives`
(`group.member(rank)`); a collective waits until every rank has arrived at the same
collective number, then each takes the combined result. The ranks share nothing else, so a
step's results depend on its inputs only, not on how the threads were scheduled: the fuzz
machine and the model checker drive these ranks in lockstep, one `run` per step.

A step never hangs. A waiting rank gives up at once, with a report, when

    the others arrived with another call      CollectiveMismatch (point, op, length by rank)
    every missing rank ended its step         CollectiveTimeout "skipped": they made fewer
                                              collectives (a conditional collective, F16)
    another rank raised                       RankFailed (the step re-raises the first error)
    `timeout_s` passed                        CollectiveTimeout (the watchdog)

and `run` re-raises the root cause: the lowest rank's error that is not a RankFailed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from hicache.distributed.collectives import (
    CollectiveMismatch,
    CollectiveTimeout,
    Entry,
    RankFailed,
    RecordingCollectives,
)
from hicache.errors import ConfigError

T = TypeVar("T")
WAIT_SLICE_S = 0.05  # a waiting rank re-checks the watchdog this often


class _Slot:
    """Collective number `seq`: what each rank brought, and how many have taken the result."""

    def __init__(self) -> None:
        self.calls: dict[int, tuple[Entry, tuple[int, ...]]] = {}
        self.taken = 0


class ThreadGroup:
    """`size` simulated ranks; `member(r)` is rank r's Collectives, `run(fn)` one step."""

    def __init__(self, size: int, timeout_s: float = 10.0) -> None:
        if not isinstance(size, int) or size < 1:
            raise ConfigError("tp.size", f"an integer >= 1, got {size!r}")
        if timeout_s <= 0:
            raise ConfigError("tp.timeout_s", f"> 0 seconds, got {timeout_s!r}")
        self.size, self.timeout_s = size, timeout_s
        self._cond = threading.Condition()
        self._slots: dict[int, _Slot] = {}
        self._next = [0] * size  # per rank: its next collective number
        self._last: dict[int, tuple[int, str]] = {}  # per rank: (number, point) last entered
        self._idle: set[int] = set(range(size))  # ranks not inside a step
        self._broken: tuple[int, str] | None = None  # (rank, why): a rank failed this step
        self.failed: str | None = None  # a step failed: the ranks' collective counts differ now
        self.members = [ThreadCollectives(self, r) for r in range(size)]

    def member(self, rank: int) -> ThreadCollectives:
        return self.members[rank]

    # -- one step ---------------------------------------------------------------------------

    def run(self, fn: Callable[[int], T]) -> list[T]:
        """`fn(rank)` on every rank at once; the results by rank. Re-raises the root cause
        when a rank raised (RankFailed of the others is its consequence)."""
        if self.failed is not None:
            raise ConfigError(
                "tp.group",
                f"a step of this group failed ({self.failed}): its ranks "
                "no longer agree on collective numbers; build a new group",
            )
        results: list[T | None] = [None] * self.size
        errors: list[BaseException | None] = [None] * self.size
        with self._cond:
            self._broken = None
            self._idle.clear()

        def body(rank: int) -> None:
            try:
                results[rank] = fn(rank)
            except BaseException as e:  # every rank's outcome is reported
                errors[rank] = e
                if not isinstance(e, RankFailed):
                    self._break(rank, f"{type(e).__name__}: {e}")
            finally:
                with self._cond:
                    self._idle.add(rank)
                    self._cond.notify_all()

        threads = [
            threading.Thread(target=body, args=(r,), name=f"rank{r}", daemon=True)
            for r in range(self.size)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        root = [e for e in errors if e is not None and not isinstance(e, RankFailed)]
        failed = root or [e for e in errors if e is not None]
        if failed:
            self.failed = f"{type(failed[0]).__name__}: {failed[0]}"
            raise failed[0]
        self._slots.clear()  # a completed step leaves no collective half taken
        return [r for r in results]  # type: ignore[misc]

    def _break(self, rank: int, why: str) -> None:
        with self._cond:
            if self._broken is None:
                self._broken = (rank, why)
            self._cond.notify_all()

    # -- one collective ---------------------------------------------------------------------

    def exchange(self, rank: int, entry: Entry, values: tuple[int, ...]) -> list[tuple[int, ...]]:
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            seq = self._next[rank]
            self._next[rank] += 1
            self._last[rank] = (seq, entry.point)
            slot = self._slots.setdefault(seq, _Slot())
            slot.calls[rank] = (entry, values)
            self._cond.notify_all()
            while len(slot.calls) < self.size:
                if self._broken is not None:
                    raise RankFailed(*self._broken)
                missing = [r for r in range(self.size) if r not in slot.calls]
                if all(r in self._idle for r in missing):
                    raise CollectiveTimeout(
                        seq,
                        entry.point,
                        missing,
                        self._last,
                        why="was skipped (the missing ranks ended the step)",
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CollectiveTimeout(seq, entry.point, missing, self._last)
                self._cond.wait(min(WAIT_SLICE_S, left))
            calls = {r: e for r, (e, _) in slot.calls.items()}
            # Verify every rank made the same call here (point, op, length).
            if len(set(calls.values())) != 1:
                raise CollectiveMismatch(seq, calls)
            out = [slot.calls[r][1] for r in range(self.size)]
            slot.taken += 1
            if slot.taken == self.size:
                del self._slots[seq]
            return out


class ThreadCollectives(RecordingCollectives):
    """Rank `rank` of a ThreadGroup."""

    def __init__(self, group: ThreadGroup, rank: int) -> None:
        super().__init__(rank, group.size)
        self.group = group

    def _exchange(self, entry: Entry, values: tuple[int, ...]) -> list[tuple[int, ...]]:
        return self.group.exchange(self.rank, entry, values)


__all__ = ["ThreadCollectives", "ThreadGroup"]
