"""The TP fuzz's one-rank ends (hicache/testing/tpends.py) and C4's `landed` rule
(hicache/testing/adapters/tplanded.py): the clean cache passes them, the pre-fix C4 and C5
bugs (mutants TP-moving-landed, TP-cancel-ended) do not (tests/test_zoo.py EXPECTED)."""

from __future__ import annotations

from typing import Any

from hicache.testing import zoo
from hicache.testing.adapters.controller import Setup
from hicache.testing.adapters.tp import TPSetup
from hicache.testing.machines import FuzzTp


def test_the_tp_machine_draws_ends_on_one_rank() -> None:
    assert hasattr(FuzzTp, "ends_on_one_rank")


def test_the_clean_cache_passes_the_landed_rule_where_a_later_op_republishes() -> None:
    """Seed 4 settles a failed D2H whose node a later op of the same step publishes: read
    after the step (not as each settle returns), the rule flagged the clean cache there."""
    steps, failure = zoo.run_seed(zoo.load_machine("fuzz-tp"), 4, 700)
    assert failure is None, failure
    assert steps == 700


def test_a_read_stopped_before_its_first_node_on_one_rank_leaves_equal_plans() -> None:
    """Rank 0's S2H stops before its first whole node while rank 1 still moves it: C4
    agrees on 0 nodes kept, rank 0 settles it as a clamp of 0, rank 1 cancels and settles
    it failed. Both must leave the restore's plan equal (I7's restores): it is what the
    next prefill serves from without a collective. Rank 0 dropped its L3 part while rank 1
    kept it; the prefill then served the L1 copy another request had computed on rank 1
    and recomputed it on rank 0 (fuzz --plane null --tp 2 --seed 230703)."""
    state: Any = FuzzTp()  # the machine class is built by with_one_rank_ends
    base = Setup(
        l1_pages=7,
        l2_pages=3,
        l3_slots=2,
        write_policy="write_through_selective",
        policy="always",
        promotion=False,
        plane="null",
        check_mode="off",
    )
    state.start(setup=TPSetup(base=base, size=2), corruptions=())
    state.ends_on_one_rank(
        source="L3", base=0, pages=2, pick=0, rank=0, how="partial", landed=0, then="tick"
    )
    state.cache.tick()  # the admission carried the first tick's C4 (C1a): this one settles it
    assert state.cache.pending_ops() == []
    state.agrees_with_reference()  # the engine's checks, I7 among them
    plans = [
        {rid: mat.record() for rid, mat in ctl.restores.items()}
        for ctl in state.cache.rank_controllers
    ]
    assert plans[0] and plans[0] == plans[1], plans
