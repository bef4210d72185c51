"""The collector walks only the check's own objects while a trace is judged.

A check allocates as it reads, and the allocations decide when CPython's collector runs a
full (generation 2) collection: one that falls due inside `check_lines` walks every object
the process holds -- an engine's whole heap when the oracle runs embedded in it, the
imports' when it runs first in a fresh process (~17-23 ms of a 5,000-event check's ~250,
benchmarks/results/2026-12-06-checktrace-startup.md). That is not the trace's cost and it
grows with whatever else the process holds, so for the call's length the objects that
existed before it are frozen (`gc.freeze`: the collector skips them) and given back after
(`gc.unfreeze`), an error included. The check's own garbage is collected as always.

A caller that froze its heap itself (`gc.get_freeze_count() > 0`) keeps it frozen: this
neither freezes more nor unfreezes what the caller froze.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def own_heap() -> Iterator[None]:
    """Freeze the objects alive now for the block (module docstring); a no-op when the
    process has frozen objects already."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
