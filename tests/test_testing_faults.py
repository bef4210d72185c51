"""Faults the fuzz machine injects, one op at a time, on the null plane: what the controller
must do with each (spec/restore.md: nothing escapes `admit` or `tick` in normal operation)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="needs torch (the controller): pip install -e '.[data]'")

from hicache.dataplane.faults import FaultSite
from hicache.testing.adapters.controller import ControllerAdapter, Setup
from hicache.testing.adapters.nullengine import FaultyNullHandle

PROMPT = tuple(range(1000, 1008)) + (50, 51, 52)


def served_then_evicted() -> ControllerAdapter:
    """A controller whose L2 holds PROMPT's pages and whose L1 gave them up."""
    cache = ControllerAdapter(Setup(l1_pages=8, l2_pages=8, l3_slots=8))
    cache.submit(1, PROMPT)
    assert cache.prefill(1)
    cache.finish(1)
    cache.drain()
    cache.evict("L1", 100)
    return cache


def test_a_load_back_refused_at_issue_falls_back_to_recompute() -> None:
    cache = served_then_evicted()
    cache.faults.once(FaultSite.DEVICE_ALLOC)
    got = cache.submit(2, PROMPT)  # the H2D cannot get a workspace: TransferError at issue
    assert got.hits["L2"] == 8 and cache.ready(2)
    assert cache.ctl.metrics.fallbacks["transfer_failed"] == 1
    assert cache.prefill(2) and cache.cached_len(2) == 8
    assert cache.check() == []
    cache.close()


def test_a_backup_refused_at_issue_is_dropped_and_counted() -> None:
    cache = ControllerAdapter(Setup(l1_pages=8, l2_pages=8, l3_slots=8))
    cache.submit(1, PROMPT)
    cache.faults.once(FaultSite.PINNED_ALLOC)
    assert cache.prefill(1)
    cache.tick()  # the D2H is refused at issue
    assert cache.ctl.metrics.dropped_tokens["backup_failed"] == 8
    assert cache.pending_ops() == [] and cache.check() == []
    cache.close()


def test_a_chosen_s2h_fails_corrupt_and_its_slot_is_invalidated() -> None:
    cache = served_then_evicted()
    cache.evict("L2", 100)
    cache.submit(2, PROMPT)
    (op,) = cache.pending_ops()
    assert cache.ctl.cp.ops[op].direction.value == "S2H"
    cache.fail(op, "corrupt")
    cache.tick()
    names = [e.event for e in cache.trace()]
    assert "s2h_fail" in names and "invalidate_l3" in names
    cache.close()


def test_a_delayed_completion_is_observed_one_tick_late() -> None:
    cache = served_then_evicted()
    cache.submit(2, PROMPT)
    (op,) = cache.pending_ops()
    cache.faults.once(FaultSite.DELAY)
    cache.complete(op)
    handle = cache.ctl.handles[op]
    assert isinstance(handle, FaultyNullHandle)
    cache.tick()
    assert not cache.ready(2)
    cache.tick()
    assert cache.ready(2)
    cache.close()
