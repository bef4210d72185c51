"""What the transfer benchmarks share (`transfer.py`, and `multipool.py` which `hicache bench
transfer --preset` runs): the run's settings and the end-to-end timing of issued work.

A path is timed by its `start`: a call that issues the work and returns its poll (True once
the work is complete); `e2e_ms_interleaved` times several paths round-robin, each run from an
idle device, and `enqueued` makes a `start` of a plain function queued on the device.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from hicache.dataplane.geometry import KVGeometry

FIRST_CHUNK_MIB_OTHER = (2, 64)  # first-chunk sizes (MiB) measured beside the default's
Poll = Callable[[], bool]  # True once the work is complete


@dataclass(frozen=True)
class Settings:
    geometry: KVGeometry
    preset_name: str
    tokens: tuple[int, ...]
    repeats: int
    warmup: int
    device: torch.device
    quick: bool
    first_chunk_mib: tuple[int, ...] = FIRST_CHUNK_MIB_OTHER  # variants beside the default
    sections: tuple[str, ...] = ("dma", "storage", "kernels")

    @property
    def page_counts(self) -> list[int]:
        return [math.ceil(t / self.geometry.page_size) for t in self.tokens]


def e2e_ms(start: Callable[[], Poll], s: Settings) -> float:
    """Median ms from calling `start` (which issues the work) until its poll says complete,
    each run from an idle device."""
    return e2e_ms_interleaved({"only": start}, s)["only"]


def e2e_ms_interleaved(starts: dict[str, Callable[[], Poll]], s: Settings) -> dict[str, float]:
    """`e2e_ms` of several paths, timed round-robin (one run of each per round), so that a
    machine drifting during the measurement shifts every path alike instead of whichever
    happened to run then (the shared H200 machine drifts by several percent in seconds).
    Each round starts one path further on, so every path runs at every place in the round
    equally often: on an H100 host the path right after the ceiling read 1-4 points under
    identical ones later in the round (session 18), a place's cost, not the path's."""
    times: dict[str, list[float]] = {name: [] for name in starts}
    names = list(starts)
    for i in range(s.warmup + s.repeats):
        turn = i % len(names)
        for name in names[turn:] + names[:turn]:
            start = starts[name]
            if s.device.type == "cuda":
                torch.cuda.synchronize(s.device)
            t0 = time.perf_counter()
            complete = start()
            while not complete():
                pass
            if i >= s.warmup:
                times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: statistics.median(ts) for name, ts in times.items()}


def enqueued(fn: Callable[[], None], device: torch.device) -> Callable[[], Poll]:
    """`start` for `e2e_ms`: enqueue `fn` on the current stream, poll an event after it."""

    def start() -> Poll:
        fn()
        if device.type != "cuda":
            return lambda: True
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record()
        return lambda: bool(event.query())  # type: ignore[no-untyped-call]

    return start
