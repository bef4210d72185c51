"""Faults the fuzz machine injects, one op at a time, on the null plane: what the controller
must do with each (spec/restore.md: nothing escapes `admit` or `tick` in normal operation)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch", reason="needs torch (the controller): pip install -e '.[data]'")

from hypothesis import strategies as st

from hicache.dataplane.faults import FaultSite
from hicache.errors import ConfigError
from hicache.testing import make_machine
from hicache.testing.adapters.controller import ControllerAdapter, Setup, controller_adapter
from hicache.testing.adapters.nullengine import FaultyNullHandle

PROMPT = tuple(range(1000, 1008)) + (50, 51, 52)


def served_then_evicted(plane: str = "null") -> ControllerAdapter:
    """A controller whose L2 (and L3) hold PROMPT's pages and whose L1 gave them up."""
    cache = ControllerAdapter(Setup(l1_pages=8, l2_pages=8, l3_slots=8, plane=plane))
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


def test_an_l1_reservation_refused_falls_back_to_recompute() -> None:
    cache = served_then_evicted()
    cache.aim("refuse", "L1")  # ALLOC_L1 aimed at the load-back
    got = cache.submit(2, PROMPT)
    assert got.hits["L2"] == 8 and cache.pending_ops() == [] and cache.ready(2)
    assert cache.fault_counts()["ALLOC_L1"] == 1
    assert cache.ctl.metrics.fallbacks["no_room"] == 1
    assert cache.prefill(2) and cache.cached_len(2) == 8
    assert cache.check() == []
    cache.close()


def test_an_aim_is_refused_with_a_typed_error_and_nothing_changes() -> None:
    cache = served_then_evicted()
    for action, tier in (("explode", "L1"), ("refuse", "L4")):
        with pytest.raises(ConfigError, match="an action of"):
            cache.aim(action, tier)
    assert cache.faults.aims == []
    with pytest.raises(ConfigError, match="'truncate' or 'remove'"):
        cache.damage_storage("burn")
    cache.close()


def test_an_aimed_corrupt_read_fails_on_the_null_plane_and_drops_the_slot() -> None:
    cache = served_then_evicted()
    cache.evict("L2", 100)
    cache.aim("corrupt", "L2")
    cache.submit(2, PROMPT)
    (op,) = cache.pending_ops()
    cache.complete(op)  # the machine says "complete": the corrupt slot still fails its read
    cache.tick()
    names = [e.event for e in cache.trace()]
    assert "s2h_fail" in names and "invalidate_l3" in names and "s2h_complete" not in names
    assert cache.ready(2) and cache.prefill(2) and cache.check() == []
    cache.close()


@pytest.mark.parametrize("plane", ["null", "cpu"])
@pytest.mark.parametrize("how", ["truncate", "remove"])
def test_a_damaged_l3_file_turns_restores_into_recomputation(plane: str, how: str) -> None:
    cache = served_then_evicted(plane)
    cache.evict("L2", 100)
    cache.damage_storage(how)
    got = cache.submit(2, PROMPT)
    assert got.hits["L3"] == 8  # the tree still names the copy (match is mechanical)
    cache.drain()  # an issued read fails (short), or none was issued (the file is gone)
    assert cache.ready(2) and cache.prefill(2) and cache.cached_len(2) == 8
    assert sum(cache.ctl.metrics.fallbacks.values()) == 1
    assert cache.check() == []
    names = [e.event for e in cache.trace()]
    assert "s2h_complete" not in names
    cache.finish(2)
    cache.drain()
    if how == "remove":
        assert not cache.ctl.l3_online  # offline for this controller's life
    cache.close()


def test_a_crash_ends_the_step_and_the_machine_reopens_the_cache_empty() -> None:
    machine: Any = make_machine(controller_adapter, st.just(Setup()))()
    machine.start(setup=Setup(l1_pages=8, l2_pages=8, l3_slots=8))
    machine.submit(tokens=PROMPT, serve=2)
    machine.drain()
    first = machine.cache.ctl
    machine.cache.aim("crash", "L1")  # the load-back's DONE is observed, never published
    machine.resubmit(pick=0, twice=False, deep=False, settle=1, abort_first=False, aim=None)
    assert first.crashed is not None and machine.cache.ctl is not first
    assert machine.model.requests == {} and machine.cache.live() == set()
    machine.agrees_with_reference()
    machine.submit(tokens=PROMPT, serve=0)  # nothing survived: a miss in every tier
    assert machine.model.requests[machine.next_rid - 1].cached_len == 0
    machine.agrees_with_reference()
    machine.teardown()


def test_a_lone_request_refused_for_room_that_could_be_made_is_a_finding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A prefill refused for room must lack it: alone, with nothing in flight, a prompt that
    fits L1 is served once what nobody holds is evicted. Here the controller's room count
    forgets every evictable page, so it refuses what eviction would have made room for."""
    from hicache.core.queries import PlaneQueries
    from hicache.testing.reference import Mismatch

    machine: Any = make_machine(controller_adapter, st.just(Setup()))()
    machine.start(setup=Setup(l1_pages=8, l2_pages=8, l3_slots=8))
    machine.submit(tokens=PROMPT, serve=2)  # 3 L1 pages nobody holds once finished
    machine.drain()
    monkeypatch.setattr(PlaneQueries, "evictable_l1", lambda self, keep=(): 0)
    with pytest.raises(Mismatch, match="prefill refused for room"):
        machine.submit(tokens=tuple(range(3000, 3030)), serve=1)  # 8 pages: L1 whole
    machine.teardown()


def test_a_cancelled_restore_that_keeps_its_pins_is_a_finding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`cancel_restore` releases the pins of what did not reach L1 (spec/restore.md): the
    machine's rule, on a prompt of its own, has a restore in flight to give up (here a second
    request's, sharing the first's load-back: no op of its own whose cancel would unpin), and
    the adapter reports a pin kept on a node L1 does not hold."""
    from hicache.controller.restore import RestoreStager

    def keeps_pins(self: RestoreStager, mat: Any) -> None:
        mat.deferred, mat.failed = False, True  # given up, but no pin released

    monkeypatch.setattr(RestoreStager, "abandon", keeps_pins)
    machine: Any = make_machine(controller_adapter, st.just(Setup()))()
    machine.start(setup=Setup(l1_pages=8, l2_pages=8, l3_slots=8))
    machine.cancel_restore(pick=0, deep=False, sharer=True, own=True)  # it shares a load-back
    with pytest.raises(AssertionError, match="cancel kept pins"):
        machine.agrees_with_reference()
    machine.teardown()


def test_an_l3_part_dropped_as_a_gap_under_a_parent_l1_holds_is_a_finding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`restore_gap` only ends an L3 part whose chain's parent did not reach L1: a controller
    that drops one anyway (here every L3 part, once promoted) recomputes what it could have
    served, and the restore probe names it."""
    from hicache.controller.restore import RestoreStager

    def always_a_gap(self: RestoreStager, mat: Any, issue: Any) -> None:
        if not mat.ops:
            mat.l3_h2d_issued = True
            self._drop_part(mat, mat.l3_part, "restore_gap")

    monkeypatch.setattr(RestoreStager, "_issue_l3_h2d", always_a_gap)
    machine: Any = make_machine(controller_adapter, st.just(Setup()))()
    machine.start(setup=Setup(l1_pages=8, l2_pages=8, l3_slots=8))
    with pytest.raises(AssertionError, match="restore_gap for request"):
        machine.restore_from_l3(base=0, pages=2, aim=None)
        machine.agrees_with_reference()
    machine.teardown()


@pytest.mark.parametrize("window", [None, 6])
def test_an_engine_that_admits_a_prompt_larger_than_l1_is_a_finding(
    window: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The machine works L1's bound out from its own setup (`l1_prompt_pages`: L1's pages, or
    its windows), not from the engine: an engine that lets one token more in is caught at
    start. Here the controller's own bound is made too large."""
    from hicache.controller.config import CacheConfig
    from hicache.testing.reference import Mismatch

    # the bound forgets the windows, or is no bound at all
    bound = property(lambda c: c.l1_pages if window else 10_000)
    monkeypatch.setattr(CacheConfig, "l1_request_pages", bound)
    machine: Any = make_machine(controller_adapter, st.just(Setup()))()
    group = {"pools": "dsv4-tiny", "l1_window_pages": window} if window else {}
    with pytest.raises(Mismatch, match="more than L1 holds"):
        machine.start(setup=Setup(l1_pages=8, l2_pages=8, l3_slots=8, **group))  # type: ignore[arg-type]
    machine.teardown()


@pytest.mark.parametrize("call", ["evict", "ready", "admit"])
def test_a_crashed_engine_that_still_acts_is_a_finding(
    call: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R57 in the machine's model: before it reopens a crashed engine that lives on, it calls
    each operation once; one accepted (the crash refusal missing from `call`) is a Mismatch."""
    from hicache.controller.controller import CacheController
    from hicache.testing.reference import Mismatch

    real = getattr(CacheController, call)

    def no_refusal(self: CacheController, *args: Any) -> Any:
        crashed, self.hooks.crashed = self.hooks.crashed, None
        try:
            return real(self, *args)
        finally:
            self.hooks.crashed = crashed

    monkeypatch.setattr(CacheController, call, no_refusal)
    machine: Any = make_machine(controller_adapter, st.just(Setup()))()
    machine.start(setup=Setup(l1_pages=8, l2_pages=8, l3_slots=8))
    machine.submit(tokens=PROMPT, serve=2)
    machine.drain()
    machine.cache.aim("crash", "L1")  # the load-back's DONE is observed, never published
    with pytest.raises(Mismatch, match=f"{'submit' if call == 'admit' else call} after a crash"):
        machine.resubmit(pick=0, twice=False, deep=False, settle=1, abort_first=False, aim=None)
    machine.teardown()


def test_tick_is_drawn_only_while_the_engine_has_work() -> None:
    cache = ControllerAdapter(Setup(l1_pages=8, l2_pages=8, l3_slots=8))
    assert not cache.has_work()
    cache.submit(1, PROMPT)
    assert cache.prefill(1)
    assert cache.has_work()  # write-through: the backup is wanted on the next tick
    cache.drain()
    assert not cache.has_work()
    cache.close()


def test_steps_that_would_change_nothing_are_not_drawn() -> None:
    machine_class = make_machine(controller_adapter, st.just(Setup()))
    machine: Any = machine_class()
    machine.start(setup=Setup(l1_pages=8, l2_pages=8, l3_slots=8))
    machine.last_restart = -100  # long enough ago

    def drawable() -> set[str]:
        rules = machine._rules_strategy.rules  # what Hypothesis draws from
        return {r.function.__name__ for r in rules if all(p(machine) for p in r.preconditions)}

    idle = drawable()
    assert not {"tick", "pressure", "restart"} & idle  # an empty cache with nothing in flight
    machine.submit(tokens=PROMPT, serve=2)
    busy = drawable()
    assert {"tick", "pressure", "restart"} <= busy  # a wanted backup; pages nobody holds
    machine.teardown()
