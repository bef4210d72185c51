"""Seeded Hypothesis runs that depend on the seed only, not on the process.

Hypothesis draws some values from constants in the source of every module loaded so far, so
a seed's run depended on what the process had loaded and on any edit to the repository: a
zoo seed caught at step 966 alone missed inside `--mutant all`, and a `hicache fuzz` seed run
inside pytest drew other steps than the same command on its own. Inside
`no_source_constants()` Hypothesis draws from none. It patches a Hypothesis internal; where
that is missing (another Hypothesis version), nothing is pinned and the block runs as is.

Hypothesis also caches, per thread and per (choice type, constraints), the constants that
a draw may take; the entries filled by earlier runs outside the block still hold the source's
constants. So the block empties that cache on entry (and on exit, for the runs after it):
without that, FuzzTp's seed 2 missed TP-local-capacity after tests/test_write_path_rows.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def no_source_constants() -> Iterator[None]:
    """Within the block, Hypothesis draws no constants from loaded modules' source."""
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants
        from hypothesis.internal.floats import float_to_int
        from sortedcontainers import SortedSet  # type: ignore[import-untyped]

        original = providers._get_local_constants
        cached = providers.CONSTANTS_CACHE.cache  # this thread's; filled by earlier runs
    except (ImportError, AttributeError):
        yield
        return
    empty = Constants(
        integers=SortedSet(),
        floats=SortedSet(key=float_to_int),
        bytes=SortedSet(),
        strings=SortedSet(),
    )
    providers._get_local_constants = lambda: empty
    cached.clear()
    try:
        yield
    finally:
        providers._get_local_constants = original
        cached.clear()
