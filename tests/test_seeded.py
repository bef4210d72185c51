"""`no_source_constants()` (hicache/testing/seeded.py): a seeded Hypothesis run inside it
draws the same values whatever ran before it in the process, including runs outside it that
filled Hypothesis' cache of the constants a draw may take."""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from hicache.testing.seeded import no_source_constants

# A range that holds many of the integer literals in this repository's source (page sizes,
# byte counts, step budgets): the source's constants are likely draws in it.
LOW, HIGH = 0, 1 << 20


def seeded_draws(examples: int = 300) -> list[int]:
    """The integers one fixed-seed run draws in [LOW, HIGH], in order."""
    seen: list[int] = []

    @settings(
        max_examples=examples,
        database=None,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @seed(20261203)
    @given(st.integers(LOW, HIGH))
    def record(x: int) -> None:
        seen.append(x)

    record()
    return seen


def test_a_seeded_run_does_not_depend_on_the_runs_before_it() -> None:
    with no_source_constants():
        first = seeded_draws()
    seeded_draws()  # outside the block: the source's constants, and they are cached
    with no_source_constants():
        again = seeded_draws()
    assert again == first
