"""A group of thread-pool tasks that together carry out one transfer.

The L3 mover (storage_io.py) spreads one transfer's pieces over a bounded pool; the group
knows when no task touches the transfer's pages any more (what cancel and fail wait for),
stops on the first fault, keeps bugs apart from faults, and times queue wait and service.

`DeferredExecutor` is the pool of the deterministic I/O schedule (`io_threads=0`): tasks are
queued at issue and run, in issue order, on the thread that calls `run_queued` (the mover
does so in the first poll, wait, cancel or close after the issue), so a seeded run replays
exactly: the same calls make the same I/O at the same points.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

from hicache.errors import HiCacheError

MAX_IO_THREADS = 64  # bound on an I/O thread pool (`io_threads`)
# The default I/O thread pool. 8 rather than 4: a verified S2H is memory-bound on the host
# (the read, then the checksum pass), so more threads read more pages at once -- on the
# H200 host S2H of 22 / 63 pages went from 0.39 / 0.37 to 0.52 / 0.61 of the multi-thread
# read ceiling at 4 -> 8 threads (16: no better at 22 pages), and with 8 an L3 restore of
# 350 tokens (Qwen3-8B, CUDA graphs, layer-wise) beat recompute in 3 of 3 runs on an H100,
# with 4 in none (benchmarks/results/2026-12-06-storage-h200.md, 2026-12-06-session16-h100/).
IO_THREADS = 8

T = TypeVar("T")


class TaskGroup:
    """The pool tasks of one transfer, and the work items (pieces) they share.

    `idle()` is true once no task of the transfer runs or waits, i.e. no thread touches its
    pages any more. An item that raises a `HiCacheError` records it and stops the group: items
    not yet taken are skipped (the transfer has failed; their I/O would be wasted). Any other
    exception is a bug: it stays in its future and `reraise_bug()` raises it on the observing
    thread.
    """

    def __init__(self, issued_at: float) -> None:
        self.errors: list[HiCacheError] = []
        self._cond = threading.Condition()
        self._outstanding = 0
        self._futures: list[Future[None]] = []
        self._stop = False
        self._issued_at = issued_at
        self._first_start: float | None = None
        self._last_end: float | None = None

    def spread(
        self,
        pool: Executor,
        items: Sequence[T],
        lanes: Sequence[Callable[[T], None]],
        workers: int,
    ) -> None:
        """Apply every lane's function to every item, on at most `workers` pool tasks.

        Lanes are independent (no order between two lanes' work on one item); within a lane,
        items are taken in order. Worker k starts on lane min(k, lanes - 1) and, once that is
        empty, helps the others: with lanes (write, checksum), worker 0 writes while the rest
        checksum, then everyone finishes whatever is left. One submit per worker, not per
        item: issuing costs the same for 1 piece or 1,000, and the issuing thread does not
        hold the GIL through a loop of submits while the first pieces wait for it. Items not
        yet taken when the group stops (an error, a cancel) are skipped.
        """
        # popleft is atomic: workers share each queue without a lock.
        queues = [(fn, deque(items)) for fn in lanes]
        for k in range(min(workers, len(items) * len(lanes))):
            first = min(k, len(queues) - 1)
            self._submit(pool, self._drain, queues[first:] + queues[:first])

    def _drain(self, queues: list[tuple[Callable[[T], None], deque[T]]]) -> None:
        for fn, queue in queues:
            while not self._stop:
                try:
                    item = queue.popleft()
                except IndexError:
                    break
                fn(item)

    def _submit(self, pool: Executor, fn: Callable[..., None], *args: object) -> None:
        with self._cond:  # counted before it can run, so the group is never idle too early
            self._outstanding += 1
        try:
            future = pool.submit(self._run, fn, *args)
        except RuntimeError:  # the pool is shut down: this task will never run
            with self._cond:
                self._outstanding -= 1
                self._cond.notify_all()
            raise
        with self._cond:
            self._futures.append(future)

    def _run(self, fn: Callable[..., None], *args: object) -> None:
        start = time.perf_counter()
        try:
            if not self._stop:
                fn(*args)
        except HiCacheError as e:
            with self._cond:
                self.errors.append(e)
                self._stop = True
        finally:
            end = time.perf_counter()
            with self._cond:
                first, last = self._first_start, self._last_end
                self._first_start = start if first is None else min(first, start)
                self._last_end = end if last is None else max(last, end)
                self._outstanding -= 1
                self._cond.notify_all()

    def idle(self) -> bool:
        with self._cond:
            return self._outstanding == 0

    def join(self, timeout_s: float | None) -> bool:
        """Block until idle or `timeout_s` passes (None: no limit). Returns idle()."""
        with self._cond:
            return self._cond.wait_for(lambda: self._outstanding == 0, timeout_s)

    def stop(self) -> None:
        """Skip the tasks not yet started (running ones finish their item)."""
        with self._cond:
            self._stop = True

    def reraise_bug(self) -> None:
        """Raise the first non-HiCacheError exception a task died of (a bug, not a fault)."""
        with self._cond:
            futures = list(self._futures)
        for future in futures:
            future.result()

    def timings(self) -> tuple[float, float]:
        """(queue_wait_s, service_s): issue -> first task start -> last task end."""
        if self._first_start is None or self._last_end is None:
            return 0.0, 0.0
        return self._first_start - self._issued_at, self._last_end - self._first_start

    def seconds_since_issue(self) -> float:
        return time.perf_counter() - self._issued_at


class DeferredExecutor(Executor):
    """An executor that runs nothing until `run_queued`: then every queued task, in submit
    order, on the calling thread. Bounded by what the issuing thread submits (one task per
    transfer on the deterministic schedule); never starts a thread."""

    def __init__(self) -> None:
        self._queue: deque[tuple[Future[Any], Callable[[], Any]]] = deque()
        self._shutdown = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        if self._shutdown:
            raise RuntimeError("cannot schedule new futures after shutdown")
        future: Future[T] = Future()
        self._queue.append((future, lambda: fn(*args, **kwargs)))
        return future

    def run_queued(self) -> None:
        """Run every queued task in submit order (tasks a task submits run too)."""
        while self._queue:
            future, fn = self._queue.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as e:  # a bug in the task: kept in its future, as a pool does
                future.set_exception(e)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Run what is queued (issued I/O finishes, as with a thread pool), then refuse more."""
        if not cancel_futures:
            self.run_queued()
        self._shutdown = True
