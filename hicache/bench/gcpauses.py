"""The garbage collector in timed work: its pauses in a region, and a heap frozen out of it.

    with GcPauses() as pauses:
        ...timed work...
    pauses.seconds, pauses.collections   # total pause, and collections per generation

    with frozen():                       # what is alive now is never scanned again
        ...a serving run...

A launch-bound (eager) prefill allocates thousands of Python objects; a collection of an older
generation in a process that holds a model's modules walks all of them and may fall, now and
then, inside one timed round. The serving bench records each timed sample's pauses, so that a
slow sample can be told from a slow path (the bench's rows, `gc_ms`). `GcPauses` changes
nothing in the collector: it only listens (`gc.callbacks`), from entry to exit, on every thread.
`frozen` is what serving engines do once their model is loaded and warmed up: collect, then
move every surviving object to the collector's permanent generation (`gc.freeze`), so later
collections walk only what was made since (`hicache bench serving --gc-freeze`).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any


class GcPauses:
    """Collections that ran between `__enter__` and `__exit__` (any thread): their count per
    generation (`collections`, index = generation) and their summed wall time (`seconds`)."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.seconds = 0.0
        self._started: float | None = None

    def _listen(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:  # "stop" of a collection this listener saw start
            self.seconds += time.perf_counter() - self._started
            self.collections[int(info["generation"])] += 1
            self._started = None

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._listen)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        gc.callbacks.remove(self._listen)

    def record(self) -> dict[str, Any]:
        """What a bench row keeps: milliseconds paused and collections per generation."""
        return {"gc_ms": self.seconds * 1e3, "gc_collections": list(self.collections)}


@contextmanager
def frozen() -> Iterator[None]:
    """Collect, then freeze what survived (`gc.freeze`) until the block ends; the objects are
    given back to the collector (`gc.unfreeze`) on the way out, an error included."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
