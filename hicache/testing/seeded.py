"""Seeded Hypothesis runs that depend on the seed only, not on the process.

Hypothesis draws some values from constants in the source of every module loaded so far, so
a seed's run depended on what the process had loaded and on any edit to the repository: a
zoo seed caught at step 966 alone missed inside `--mutant all`, and a `hicache fuzz` seed run
inside pytest drew other steps than the same command on its own. Inside
`no_source_constants()` Hypothesis draws from none. It patches a Hypothesis internal; where
that is missing (another Hypothesis version), nothing is pinned and the block runs as is.
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
    except (ImportError, AttributeError):
        yield
        return
    empty = Constants(integers=SortedSet(), floats=SortedSet(key=float_to_int), bytes=SortedSet(),
                      strings=SortedSet())
    providers._get_local_constants = lambda: empty
    try:
        yield
    finally:
        providers._get_local_constants = original
