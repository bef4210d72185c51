"""Faults: the site registry, seeded per-site schedules, faults aimed at one op, allocation
failure in every tier, and a crash between a transfer and its publication (spec/faults.md).
Driven on the null data plane (ops finished by hand), and on the CPU plane where bytes
matter (an aimed corrupt slot caught by the real checksum; a crash releasing the L3 file)."""

from __future__ import annotations

import os
import random

import pytest

from hicache.controller.config import CacheConfig
from hicache.controller.controller import CacheController
from hicache.core.tiers import Direction, Tier
from hicache.dataplane.faults import SITES, FaultInjector, FaultSite, SimulatedCrash, sites_for
from hicache.dataplane.null import NullEngine
from hicache.errors import ConfigError, QuiesceTimeout
from tests.test_null_plane import ABC, assert_clean, finish, settle_all, two_stage_restore


def null_ctl(faults: FaultInjector, **kw: object) -> CacheController:
    cfg = CacheConfig(**{"l1_pages": 16, "l2_pages": 32, "l3_slots": 64, "policy": "always", **kw})  # type: ignore[arg-type]
    engine = NullEngine(cfg.kv, cfg.l1_pages, cfg.l2_pages, cfg.l3_slots, faults=faults)
    return CacheController(cfg, faults=faults, engine=engine)


def with_faults(c: CacheController, faults: FaultInjector) -> CacheController:
    """`c` (from two_stage_restore) with `faults` attached to it and its null engine."""
    c.faults = faults
    assert isinstance(c.engine, NullEngine)
    c.engine.faults = faults
    return c


# -- registry and schedules ------------------------------------------------------------------


def test_every_site_is_registered_and_planes_are_named() -> None:
    assert set(SITES) == set(FaultSite)
    null_sites = set(sites_for("null"))
    assert FaultSite.DEVICE_ALLOC not in null_sites and FaultSite.SHORT_WRITE not in null_sites
    assert {
        FaultSite.ALLOC_L1,
        FaultSite.ALLOC_L2,
        FaultSite.ALLOC_L3,
        FaultSite.CRASH_BEFORE_PUBLISH,
        FaultSite.DELAY,
    } <= null_sites
    f = FaultInjector()
    f.fire(FaultSite.DELAY)
    assert FaultSite.DELAY not in f.unreached("null") and FaultSite.ALLOC_L1 in f.unreached("null")


def test_a_schedule_switches_sites_on_per_seed_then_fires_per_reach() -> None:
    a, b = FaultInjector.schedule(7, 0.5, 0.3), FaultInjector.schedule(7, 0.5, 0.3)
    assert a.rates == b.rates and 0 < len(a.rates) < len(SITES)
    assert set(FaultInjector.schedule(1, 1.0, 0.3).rates) == set(SITES)
    assert FaultInjector.schedule(1, 0.0, 0.3).rates == {}
    draws = [[f.fire(s) for s in a.rates for _ in range(20)] for f in (a, b)]
    assert draws[0] == draws[1] and any(draws[0])
    with pytest.raises(ConfigError, match="fire_p"):
        FaultInjector.schedule(1, 0.5, 1.5)
    with pytest.raises(ConfigError, match="aim.direction"):
        FaultInjector().aim("corrupt", direction=Direction.H2D)


# -- aimed at one op -----------------------------------------------------------------------


@pytest.mark.parametrize("action", ["fail", "corrupt", "short_read"])
def test_an_aimed_fault_fails_only_that_requests_s2h(action: str) -> None:
    faults = FaultInjector().aim(action, direction=Direction.S2H, request_id=3)  # type: ignore[arg-type]
    c = with_faults(two_stage_restore(), faults)
    c.admit(3, ABC)
    pending = {p.stage: p.op_id for p in c.pending()}
    finish(c, pending["load_l2"], True)
    finish(c, pending["promote"], True)  # ignored: the aimed fault already failed it
    c.tick()
    assert c.ready(3) and not c.pending()
    assert c.metrics.fallbacks["transfer_failed"] == 1
    assert c.handles == {}
    if action != "fail":  # a miss on a bad slot: the L3 copy that held it is dropped
        assert sum(c.metrics.l3_invalidated_pages.values()) > 0
    c.prefill(3)
    c.finish(3)
    assert_clean(c)


def test_an_aimed_delay_holds_only_that_h2d() -> None:
    c = with_faults(
        two_stage_restore(), FaultInjector().aim("delay", direction=Direction.H2D, polls=2)
    )
    c.admit(3, ABC)
    pending = {p.stage: p.op_id for p in c.pending()}
    finish(c, pending["load_l2"], True)
    finish(c, pending["promote"], True)
    c.tick()
    assert [p.stage for p in c.pending()] == ["load_l2"]  # finished, observed late
    c.tick()
    c.tick()
    assert [p.stage for p in c.pending()] == ["load_l3"]
    settle_all(c)
    c.prefill(3)
    c.finish(3)
    assert_clean(c)


@pytest.mark.parametrize("tier", [Tier.L1, Tier.L2, Tier.L3])
def test_allocation_fails_in_every_tier_as_if_it_were_full(tier: Tier) -> None:
    site = {Tier.L1: FaultSite.ALLOC_L1, Tier.L2: FaultSite.ALLOC_L2, Tier.L3: FaultSite.ALLOC_L3}[
        tier
    ]
    faults = FaultInjector().once(site)
    c = null_ctl(faults)
    c.admit(1, ABC)
    c.prefill(1)
    c.finish(1)
    settle_all(c)  # D2H (L2), then H2S (L3)
    if tier is Tier.L1:
        c.cp.evict(Tier.L1, 100)
        c.admit(2, ABC)  # the load-back's L1 reservation fails: a fallback, recomputed
        assert c.metrics.fallbacks["no_room"] == 1 and c.ready(2)
        c.prefill(2)
        c.finish(2)
    else:
        reason = "host_pressure" if tier is Tier.L2 else "storage_pressure"
        assert c.metrics.dropped_tokens[reason] > 0
    assert faults.fired[site] == 1
    assert_clean(c)


# -- a crash between a transfer and its publication ------------------------------------------


def test_a_crash_before_publication_stops_the_controller_and_leaks_nothing() -> None:
    faults = FaultInjector().aim("crash", direction=Direction.D2H)
    c = null_ctl(faults)
    c.admit(1, ABC)
    c.prefill(1)
    c.finish(1)
    c.tick()  # the backup's D2H is issued
    (op,) = c.pending()
    finish(c, op.op_id, True)
    with pytest.raises(SimulatedCrash, match="close this controller"):
        c.tick()
    with pytest.raises(SimulatedCrash):
        c.admit(2, ABC)
    published = c.cp.usage(Tier.L2)["tree"]
    c.close()
    assert published == 0  # the D2H's pages were never published
    assert isinstance(c.engine, NullEngine) and not c.engine.pending()


READ_ONLY = {"status", "pending", "rank_view", "close"}
"""CacheController's public methods a dead controller still answers: diagnosis, and close."""

OPERATIONS = {
    "admit": (9, (300, 301, 302, 303, 304)),
    "ready": (2,),
    "wait": (2,),
    "prefill": (2,),
    "finish": (2,),
    "cancel_restore": (2,),
    "evict": ("L1", 3),
    "tick": (),
    "drain": (),
    "check_ranks": (),
}
"""Every other public method, with arguments that an alive controller would act on."""


def _dead(mode: str) -> CacheController:
    """A controller with evictable pages in every tier and a restore in flight (request 2),
    then crashed between a backup's DONE and its publication, or wedged."""
    faults = FaultInjector()
    c = null_ctl(faults)
    c.admit(7, tuple(range(500, 520)))
    c.prefill(7)
    c.finish(7)
    settle_all(c)
    c.cp.evict(Tier.L1, 100)
    c.admit(2, tuple(range(500, 512)))  # restored from L2: its H2D stays in flight
    if mode == "wedged":
        c.hooks.wedge("a cancel in this test")
        return c
    faults.aim("crash", direction=Direction.D2H)
    c.admit(1, ABC)
    c.prefill(1)
    c.finish(1)
    c.tick()  # the backup's D2H is issued
    d2h = [p for p in c.pending() if p.direction == "D2H"]
    finish(c, d2h[0].op_id, True)
    with pytest.raises(SimulatedCrash):
        c.tick()
    return c


@pytest.mark.parametrize("mode", ["crashed", "wedged"])
def test_a_dead_controller_refuses_every_operation_but_close_and_changes_nothing(
    mode: str,
) -> None:
    """R57 (and R79's wedge): every public method that acts refuses, with nothing changed; the
    set is CacheController's own, so a new operation must be sorted into one of the two."""
    public = {n for n, v in vars(CacheController).items() if callable(v) and n[0] != "_"}
    assert public == READ_ONLY | set(OPERATIONS), "sort a new public method into one of them"
    c = _dead(mode)
    expected = SimulatedCrash if mode == "crashed" else QuiesceTimeout
    before = {t: c.cp.usage(t) for t in Tier}, sorted(c.cp.ops), sorted(c.cp.requests)
    for name, args in OPERATIONS.items():
        with pytest.raises(expected):
            getattr(c, name)(*args)
        after = {t: c.cp.usage(t) for t in Tier}, sorted(c.cp.ops), sorted(c.cp.requests)
        assert after == before, f"{name} on a {mode} controller changed the cache"
    assert c.status()["pending_ops"] == len(before[1])  # diagnosis keeps answering
    c.close()


def test_a_crash_on_the_cpu_plane_releases_the_l3_file(tmp_path: os.PathLike[str]) -> None:
    pytest.importorskip("torch")
    path = os.path.join(tmp_path, "l3.bin")
    faults = FaultInjector().once(FaultSite.CRASH_BEFORE_PUBLISH)
    cfg = CacheConfig(
        l1_pages=16, l2_pages=32, l3_slots=64, policy="always", l3_path=path, device="cpu"
    )
    c = CacheController(cfg, faults=faults)
    fd = c.transfer_engine.l3.fd
    c.admit(1, ABC)
    c.prefill(1)
    c.finish(1)
    with pytest.raises(SimulatedCrash):
        for _ in range(100):
            c.tick()
    c.close()
    with pytest.raises(OSError):
        os.fstat(fd)  # the crashed controller's L3 file is closed
    reopened = CacheController(cfg)  # the same path; it starts empty
    m = reopened.admit(1, ABC)
    assert m.match.lengths == (0, 0, 0)
    reopened.finish(1)
    reopened.close()


def test_an_aimed_corrupt_slot_is_caught_by_the_real_checksum() -> None:
    pytest.importorskip("torch")
    faults = FaultInjector()
    cfg = CacheConfig(l1_pages=16, l2_pages=32, l3_slots=64, policy="always", device="cpu")
    c = CacheController(cfg, faults=faults)
    c.admit(1, ABC)
    c.prefill(1)
    c.finish(1)
    c.drain()
    c.cp.evict(Tier.L1, 100)
    c.cp.evict(Tier.L2, 100)
    faults.aim("corrupt", direction=Direction.S2H, request_id=2)
    c.admit(2, ABC)
    while not c.ready(2):
        c.wait(2)
        c.tick()
    assert c.metrics.fallbacks["transfer_failed"] == 1
    assert c.transfer_engine.storage.counters.corrupt_reads >= 1
    c.prefill(2)
    c.finish(2)
    c.close()


# -- every null-plane site reached under a schedule ----------------------------------------------


def test_a_full_schedule_reaches_every_null_site_and_breaks_nothing() -> None:
    faults = FaultInjector.schedule(3, enable_p=1.0, fire_p=0.15, sites=sites_for("null"))
    faults.rates.pop(FaultSite.CRASH_BEFORE_PUBLISH)  # reached, never fired: the run goes on
    faults.rates[FaultSite.S2H_PARTIAL] = (
        1.0  # S2Hs are few here: every one not failed stops part way
    )
    c = null_ctl(faults, l1_pages=12, l2_pages=16, l3_slots=24)
    rng = random.Random(3)
    for rid in range(60):
        tokens = ABC[: rng.choice((13, 17, 29))] + (rid % 4,) * rng.randint(1, 8)
        c.admit(rid, tokens)
        for _ in range(rng.randint(1, 4)):
            for p in c.pending():
                if rng.random() < 0.7:
                    finish(c, p.op_id, rng.random() < 0.9)
            c.tick()
        while not c.ready(rid):
            settle_all(c)
        try:
            c.prefill(rid)
        except Exception as e:  # OutOfPages under injected pressure is a documented outcome
            assert type(e).__name__ == "OutOfPages", e
        c.finish(rid)
    assert faults.unreached("null") == []
    assert set(faults.fired) >= set(sites_for("null")) - {FaultSite.CRASH_BEFORE_PUBLISH}
    assert_clean(c)
    c.close()
