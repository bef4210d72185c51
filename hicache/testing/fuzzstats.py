"""Step counts of fuzz machines run by an outside engine (HypoFuzz): what each worker process
did, written to a directory while it runs, and their sum.

HypoFuzz runs a machine forever in every worker and is stopped by a signal, so what a worker
did is written as it goes: with HICACHE_HYPOFUZZ_STATS=DIR set, a machine wrapped by
`with_step_counts` writes DIR/worker-PID.json at most every FLUSH_S seconds (and at once on
its first failing run). Each file holds, per target (the machine's class name): rule steps
run, runs (examples) ended, runs that failed, the wall-clock time (`time.time()`, seconds) of
the first failing run, and each failure's kind (exception type and first line) with its
count. `summarise(DIR)` adds the workers up (`Summary`): steps per second is the sum of each
worker's own rate, its steps over the seconds between its first step and its last write, so
the seconds a worker spends starting (pytest collection, imports) and the steps after its
last write (at most FLUSH_S seconds' worth, lost when it is killed) count for nothing.

Counting is an invariant (it draws nothing, so every seed's steps are as before) and a
teardown; a failing run is one whose teardown runs while an exception other than
Hypothesis' own control flow (`StopTest`, `UnsatisfiedAssumption`) propagates, or whose
teardown raises one itself (the machines judge their oracle there: selfcheck.py). HypoFuzz
replays a failing example many times while it shrinks it, so `failing_runs` counts those
too: `first_failure` and the kinds say what was found, not how often.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hypothesis.errors import Frozen, UnsatisfiedAssumption
from hypothesis.stateful import RuleBasedStateMachine, invariant

STATS_ENV = "HICACHE_HYPOFUZZ_STATS"
"""The environment variable naming the directory workers write their counts into."""
FLUSH_S = 1.0
"""Seconds between two writes of one worker's file (a step arriving later writes it)."""
PREFIX = "worker-"


@dataclass
class TargetCounts:
    """What one worker did on one target: rule `steps`, `runs` ended, `failing_runs`,
    `first_failure` (wall clock, s; None: none failed), `failures`: kind -> failing runs."""

    steps: int = 0
    runs: int = 0
    failing_runs: int = 0
    first_failure: float | None = None
    failures: dict[str, int] = field(default_factory=dict)


@dataclass
class WorkerCounts:
    """One worker process: its `pid`, `first_step` and `written` (wall clock, s) and its
    counts per target."""

    pid: int
    first_step: float | None = None
    written: float = 0.0
    targets: dict[str, TargetCounts] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        """Seconds between its first step and its last write (0: it has not stepped)."""
        return 0.0 if self.first_step is None else max(0.0, self.written - self.first_step)

    @property
    def steps(self) -> int:
        return sum(t.steps for t in self.targets.values())


class Recorder:
    """The counts of this process, written to `directory` (one per process: a forked worker
    starts its own, `recorder()`)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.counts = WorkerCounts(os.getpid())
        self.path = directory / f"{PREFIX}{self.counts.pid}.json"

    def _target(self, name: str) -> TargetCounts:
        return self.counts.targets.setdefault(name, TargetCounts())

    def step(self, name: str) -> None:
        now = time.time()
        if self.counts.first_step is None:
            self.counts.first_step = now
        self._target(name).steps += 1
        if now - self.counts.written >= FLUSH_S:
            self.write(now)

    def run_ended(self, name: str, error: BaseException | None) -> None:
        target = self._target(name)
        target.runs += 1
        if error is None:
            if time.time() - self.counts.written >= FLUSH_S:
                self.write()
            return
        target.failing_runs += 1
        kind = failure_kind(error)
        target.failures[kind] = target.failures.get(kind, 0) + 1
        if target.first_failure is None:
            target.first_failure = time.time()
            self.write()

    def write(self, now: float | None = None) -> None:
        """This process's counts into its file (replaced whole: a reader sees one or the
        other)."""
        self.counts.written = time.time() if now is None else now
        self.directory.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".part")
        partial.write_text(json.dumps(asdict(self.counts)))
        os.replace(partial, self.path)


_recorder: Recorder | None = None


def recorder() -> Recorder | None:
    """This process's recorder, when STATS_ENV names a directory (None: nothing counted)."""
    global _recorder
    directory = os.environ.get(STATS_ENV)
    if not directory:
        return None
    if (
        _recorder is None
        or _recorder.counts.pid != os.getpid()
        or _recorder.directory != Path(directory)
    ):
        _recorder = Recorder(Path(directory))
    return _recorder


def failure_kind(error: BaseException) -> str:
    """`Type: first line of the message` (at most 160 characters): one failure's kind."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:160]


def _failing(error: BaseException | None) -> BaseException | None:
    """`error`, unless it is Hypothesis' own control flow (`StopTest` is no `Exception`) or
    no failure (an interrupt)."""
    if not isinstance(error, Exception) or isinstance(error, UnsatisfiedAssumption | Frozen):
        return None
    return error


def with_step_counts(
    machine: type[RuleBasedStateMachine], name: str
) -> type[RuleBasedStateMachine]:
    """`machine` (a subclass named `name`) that counts its steps, runs and failing runs into
    this process's recorder (when STATS_ENV is set; module docstring)."""

    class Counted(machine):  # type: ignore[valid-type, misc]
        @invariant()
        def counted_step(self) -> None:
            """Runs after every step (and never before the first): one step counted."""
            rec = recorder()
            if rec is not None:
                rec.step(name)

        def teardown(self) -> None:
            # In a `finally` (Hypothesis' run), sys.exc_info() is the error propagating.
            error = _failing(sys.exc_info()[1])
            try:
                super().teardown()
            except BaseException as raised:
                # The machine's own end may fail the run: the fuzz machines judge their
                # oracle there (selfcheck.py), so a run whose steps all passed fails here.
                error = error or _failing(raised)
                raise
            finally:
                rec = recorder()
                if rec is not None:
                    rec.run_ended(name, error)

    Counted.__name__ = Counted.__qualname__ = name
    return Counted


@dataclass(frozen=True)
class Summary:
    """Every worker's counts of a directory added up (module docstring)."""

    workers: int
    first_step: float | None  # the earliest first step of a worker (wall clock, s)
    steps: int
    runs: int
    steps_per_s: float
    failing_runs: int
    first_failure: dict[str, float]  # target -> earliest wall-clock time of a failing run
    failures: dict[str, dict[str, int]]  # target -> kind -> failing runs
    per_worker: list[dict[str, Any]]


def read(directory: Path) -> list[WorkerCounts]:
    """The worker files of `directory` (a file being replaced is skipped)."""
    workers = []
    for path in sorted(directory.glob(f"{PREFIX}*.json")):
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        targets = {k: TargetCounts(**v) for k, v in raw.pop("targets").items()}
        workers.append(WorkerCounts(targets=targets, **raw))
    return workers


def summarise(directory: Path) -> Summary:
    """The counts of every worker that wrote into `directory`, added up."""
    workers = read(directory)
    first: dict[str, float] = {}
    failures: dict[str, Counter[str]] = {}
    for w in workers:
        for name, t in w.targets.items():
            if t.first_failure is not None:
                first[name] = min(first.get(name, t.first_failure), t.first_failure)
            if t.failures:
                failures.setdefault(name, Counter()).update(t.failures)
    return Summary(
        workers=len(workers),
        first_step=min((w.first_step for w in workers if w.first_step is not None), default=None),
        steps=sum(w.steps for w in workers),
        runs=sum(t.runs for w in workers for t in w.targets.values()),
        steps_per_s=sum(w.steps / w.seconds for w in workers if w.seconds > 0),
        failing_runs=sum(t.failing_runs for w in workers for t in w.targets.values()),
        first_failure=first,
        failures={name: dict(kinds) for name, kinds in failures.items()},
        per_worker=[
            {"pid": w.pid, "steps": w.steps, "seconds": round(w.seconds, 2)} for w in workers
        ],
    )
