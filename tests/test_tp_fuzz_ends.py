"""The TP fuzz's one-rank ends (hicache/testing/tpends.py) and C4's `landed` rule
(hicache/testing/adapters/tplanded.py): the clean cache passes them, the pre-fix C4 and C5
bugs (mutants TP-moving-landed, TP-cancel-ended) do not (tests/test_zoo.py EXPECTED)."""

from __future__ import annotations

from hicache.testing import zoo
from hicache.testing.machines import FuzzTp


def test_the_tp_machine_draws_ends_on_one_rank() -> None:
    assert hasattr(FuzzTp, "ends_on_one_rank")


def test_the_clean_cache_passes_the_landed_rule_where_a_later_op_republishes() -> None:
    """Seed 4 settles a failed D2H whose node a later op of the same step publishes: read
    after the step (not as each settle returns), the rule flagged the clean cache there."""
    steps, failure = zoo.run_seed(zoo.load_machine("fuzz-tp"), 4, 700)
    assert failure is None, failure
    assert steps == 700
