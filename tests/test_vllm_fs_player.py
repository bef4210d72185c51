"""The file tier's deterministic seams (hicache/testing/adapters/vllm_fs.py), without vLLM:
`FileJobPlayer` reports what vLLM's `DualQueueThreadPool` would, `LookupPlayer` runs a lookup
manager's own worker loop only when asked."""

from __future__ import annotations

import functools
import queue
import threading
from typing import Any

from hicache.testing.adapters.vllm_fs import LOAD, STORE, FileJobPlayer, LookupPlayer


def test_a_job_runs_its_tasks_only_when_played_and_reports_like_the_pool() -> None:
    ran: list[int] = []
    player = FileJobPlayer()
    player.enqueue_store(3, 1, [lambda: ran.append(3)])
    player.enqueue_load(4, 1, [lambda: ran.append(4)])
    assert ran == [] and player.get_finished() == []
    assert [j.kind for j in player.queued.values()] == [STORE, LOAD]  # issue order
    assert player.play(4, True)
    assert ran == [4]
    [(job_id, ok, seconds)] = player.get_finished()
    assert (job_id, ok) == (4, True) and seconds >= 0
    assert player.get_finished() == []  # reported once, as the pool's finished queue


def test_a_failed_job_runs_nothing_and_a_raising_task_fails_its_job() -> None:
    ran: list[int] = []

    def broken() -> None:
        raise OSError("Short read: expected 4096 bytes, read 3")

    player = FileJobPlayer()
    player.enqueue_store(1, 1, [lambda: ran.append(1)])
    player.enqueue_load(2, 1, [broken])
    assert not player.play(1, False)
    assert not player.play(2, True)
    assert ran == []
    assert [(j, ok) for j, ok, _ in player.get_finished()] == [(1, False), (2, False)]
    assert player.errors == ["job 2 (load): OSError: Short read: expected 4096 bytes, read 3"]


def test_drain_runs_every_queued_job_and_shutdown_drops_them() -> None:
    ran: list[int] = []
    player = FileJobPlayer()
    for j in range(3):
        player.enqueue_store(j, 1, [functools.partial(ran.append, j)])
    player.wait_idle()
    assert ran == [0, 1, 2] and not player.queued
    player.enqueue_load(9, 1, [lambda: ran.append(9)])
    player.shutdown(wait=True)
    assert ran == [0, 1, 2] and player.get_finished()[-1][0] == 2


class _Manager:
    """The shape of vLLM's AsyncLookupManager that LookupPlayer relies on: a queue of
    batches with a None sentinel, a worker loop over it, the loop's thread."""

    def __init__(self) -> None:
        self._lookup_queue: queue.SimpleQueue[list[int] | None] = queue.SimpleQueue()
        self.answered: list[int] = []
        self._thread = threading.Thread(target=self._worker, daemon=True)
        self._thread.start()

    def _worker(self) -> None:
        while (batch := self._lookup_queue.get()) is not None:
            self.answered += batch


def test_the_lookup_thread_stops_and_probes_answer_only_on_settle() -> None:
    manager: Any = _Manager()
    player = LookupPlayer(manager)
    assert not manager._thread.is_alive()
    manager._lookup_queue.put([1, 2])
    assert manager.answered == []
    player.settle()
    assert manager.answered == [1, 2]
    player.settle()  # nothing posted: returns at once
    assert manager.answered == [1, 2]
