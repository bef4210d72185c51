"""vLLM's file tier (`tiering/fs/`) made deterministic, for vllm_tiering.py.

vLLM's `FileSystemTierManager` does its work on two kinds of threads: a `DualQueueThreadPool`
whose workers run each job's file I/O (`batch_store_block` / `batch_load_block`, real
`os.write`/`os.readv` of one file per block), and an `AsyncLookupManager` thread that probes
which block files exist (`os.path.exists`) once per scheduler step. A differential check needs
each completion to happen when the fuzz machine says, so the adapter replaces both threads
and nothing else -- the tier's own code still builds every task, writes and reads every file
and interprets every result:

    thread             seam                       what the adapter does instead
    -----------------  -------------------------  -------------------------------------------
    pool workers       `tier._pool`, built with   `FileJobPlayer`: the same five methods
                       `n_read_threads=0,         (enqueue_load/enqueue_store/get_finished/
                       n_write_threads=0`          wait_idle/shutdown); a job's tasks (the
                                                  tier's closures) run on the caller's thread
                                                  when the machine completes it, or it is
                                                  reported failed without running
    lookup worker      `tier._lookup_manager`'s   `LookupPlayer`: the thread is stopped at
                       `_worker` loop over its    once (its own shutdown sentinel), and the
                       `_lookup_queue`             same `_worker` loop runs on the caller's
                                                  thread right after each `on_schedule_end`
                                                  (so a probe posted in step n answers in
                                                  step n + 1, as with a thread that keeps up)

`FileJobPlayer.play` records `(job_id, success, seconds)` in the finished queue exactly as the
pool's `_worker` does (a task that raises is a failed job), so `get_finished_jobs` -- the
tier's code -- sees what a real pool would have produced. Nothing here imports vllm.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

LOAD = "load"  # file -> primary (CPU) tier: a promotion
STORE = "store"  # primary tier -> file: a cascade


@dataclass
class PlayedJob:
    """One job the tier enqueued: its direction and the tier's own task closures."""

    job_id: int
    kind: str  # LOAD or STORE
    tasks: list[Callable[[], Any]]


@dataclass
class FileJobPlayer:
    """Stands in for `DualQueueThreadPool` (module docstring): jobs wait until played."""

    queued: dict[int, PlayedJob] = field(default_factory=dict)  # issue order (dicts keep it)
    finished: list[tuple[int, bool, float]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # what a failed task raised, for check()

    # -- the pool's interface, as FileSystemTierManager calls it --------------------------

    def enqueue_load(self, job_id: int, n_tasks: int, tasks: Iterable[Callable[[], Any]]) -> None:
        self._enqueue(job_id, LOAD, n_tasks, tasks)

    def enqueue_store(self, job_id: int, n_tasks: int, tasks: Iterable[Callable[[], Any]]) -> None:
        self._enqueue(job_id, STORE, n_tasks, tasks)

    def _enqueue(
        self, job_id: int, kind: str, n_tasks: int, tasks: Iterable[Callable[[], Any]]
    ) -> None:
        listed = list(tasks)
        # Verify the tier hands over what it says (the pool counts tasks to finish a job).
        assert len(listed) == n_tasks, f"job {job_id}: {n_tasks} tasks announced, {len(listed)}"
        assert job_id not in self.queued, f"job {job_id} enqueued twice"
        self.queued[job_id] = PlayedJob(job_id, kind, listed)

    def get_finished(self) -> list[tuple[int, bool, float]]:
        out, self.finished = self.finished, []
        return out

    def wait_idle(self) -> None:
        """`drain_jobs`: every queued job ends (runs, as a pool's threads would run it)."""
        for job_id in list(self.queued):
            self.play(job_id, True)

    def shutdown(self, wait: bool = True) -> None:
        """As the pool's shutdown: queued jobs are dropped, never reported."""
        self.queued.clear()

    # -- the machine's side ---------------------------------------------------------------

    def play(self, job_id: int, run: bool) -> bool:
        """End job `job_id`: `run` runs its tasks (a task that raises fails the job, as in
        the pool's worker); not `run` reports it failed without touching a file. Returns
        whether it succeeded."""
        job = self.queued.pop(job_id)
        start, ok = time.monotonic(), run
        if run:
            for task in job.tasks:
                try:
                    task()
                except Exception as e:  # the pool's worker catches any task error the same way
                    self.errors.append(f"job {job_id} ({job.kind}): {type(e).__name__}: {e}")
                    ok = False
        self.finished.append((job_id, ok, time.monotonic() - start))
        return ok


class LookupPlayer:
    """Runs an `AsyncLookupManager`'s worker loop on the caller's thread (module docstring).

    `manager` is the tier's `_lookup_manager`; its thread is stopped here with the
    manager's own shutdown sentinel, so `settle` is the only place probes run."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        manager._lookup_queue.put(None)
        manager._thread.join()

    def settle(self) -> None:
        """Answer every probe posted so far (the manager drains the answers itself, on its
        next lookup or flush)."""
        self.manager._lookup_queue.put(None)
        self.manager._worker()
