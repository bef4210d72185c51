"""The cache controller on the CPU data plane: backup chain, restores from L2 and L3 with
every restored page verified, each failure/abort edge, write policies, metrics. Invariants
are checked after every transition (check mode `every`) in every test."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

from hicache.controller.config import CacheConfig
from hicache.controller.controller import CacheController
from hicache.core.lifecycle import RESIDENT
from hicache.core.tiers import Tier
from hicache.dataplane.faults import FaultInjector, FaultSite
from hicache.errors import ConfigError, IllegalTransition, ProducerError
from hicache.invariants.registry import check_all

PS = 4  # the tiny geometry's page size
PROMPT = tuple(range(100, 124))  # 6 pages
OTHER = tuple(range(200, 240))  # 10 pages


def make(faults: FaultInjector | None = None, **kw: object) -> CacheController:
    cfg = CacheConfig(**{"l1_pages": 16, "l2_pages": 32, "l3_slots": 64, "policy": "always", **kw})  # type: ignore[arg-type]
    return CacheController(cfg, faults=faults)


@pytest.fixture
def ctl() -> Iterator[CacheController]:
    c = make()
    yield c
    c.close()


def serve(c: CacheController, rid: int, tokens: tuple[int, ...]) -> int:
    """Admit, wait for the restore, prefill, finish; returns tokens recomputed."""
    c.admit(rid, tokens)
    while not c.ready(rid):
        c.tick()
    done = c.prefill(rid)
    c.finish(rid)
    return done


def push_out_of(c: CacheController, tiers: str) -> None:
    """Evict everything evictable from the named tiers (after the backups landed)."""
    c.drain()
    for t in tiers:
        c.cp.evict(f"L{t}", 10_000)


def assert_clean(c: CacheController) -> None:
    c.drain()
    assert not c.cp.ops and not c.handles
    for table in c.cp.tables:
        assert table.count(1) == 0, f"{table.tier}: private pages left"
    assert c.cp.checker.violations_found == 0


def test_write_through_backs_up_to_l2_and_l3(ctl: CacheController) -> None:
    assert serve(ctl, 1, PROMPT) == 24
    ctl.drain()
    states = {tuple(n.state) for n in ctl.cp.tree.nodes()}
    assert states == {(RESIDENT, RESIDENT, RESIDENT)}
    assert ctl.metrics.directions["D2H"].count == 1 and ctl.metrics.directions["H2S"].count == 1


@pytest.mark.parametrize("evicted, tier", [("1", "L2"), ("12", "L3")])
def test_restore_is_verified_byte_for_byte(ctl: CacheController, evicted: str, tier: str) -> None:
    serve(ctl, 1, PROMPT)
    push_out_of(ctl, evicted)
    assert serve(ctl, 2, PROMPT + (7, 7, 7, 7)) == 4  # only the new page is recomputed
    assert ctl.metrics.hit_tokens[tier] == 24
    assert ctl.metrics.verified_pages == 6
    assert_clean(ctl)


def test_no_promotion_drops_the_l2_copy() -> None:
    c = make(promotion=False)
    serve(c, 1, PROMPT)
    push_out_of(c, "12")
    serve(c, 2, PROMPT)
    assert all(n.state[1] != RESIDENT for n in c.cp.tree.nodes())
    assert c.metrics.promoted_pages == 0
    c.close()


@pytest.mark.parametrize(
    "site, evicted",
    [
        (FaultSite.H2D_COMPLETE, "1"),
        (FaultSite.IO_EIO, "12"),
        (FaultSite.CORRUPT_SLOT, "12"),
    ],
)
def test_failed_restore_falls_back_to_recompute(site: FaultSite, evicted: str) -> None:
    faults = FaultInjector()
    # Invariants after every step, CORRUPT_SLOT too: a rotten slot is unservable, and I4
    # exempts it (invariants/bytes.py), so the checker sees the miss, not a violation.
    c = make(faults, check_mode="every")
    if site is FaultSite.CORRUPT_SLOT:
        faults.once(site)  # corrupts the slot as it is written
    serve(c, 1, PROMPT)
    push_out_of(c, evicted)
    if site is not FaultSite.CORRUPT_SLOT:
        faults.once(site)
    assert serve(c, 2, PROMPT) == 24  # everything recomputed (B12: no raise, no hang)
    assert c.metrics.fallbacks == {
        "transfer_failed": 1,
        "no_room": 0,
        "restore_gap": 0,
        "l3_offline": 0,
        "dropped": 0,
        "load_back_pending": 0,
        "prefetch_clamped": 0,
    }
    assert c.metrics.verified_pages == 0
    if site is FaultSite.CORRUPT_SLOT:
        assert all(n.state[2] != RESIDENT for n in c.cp.tree.nodes())  # the slot is a miss now
        assert check_all(c.cp.snapshot()) == []
    assert_clean(c)
    c.close()


@pytest.mark.parametrize("site", [FaultSite.D2H_COMPLETE, FaultSite.IO_ENOSPC])
def test_failed_backup_is_counted_and_leaks_nothing(site: FaultSite) -> None:
    faults = FaultInjector().once(site)
    c = make(faults)
    serve(c, 1, PROMPT)
    c.drain()
    assert c.metrics.dropped_tokens["backup_failed"] == 24
    assert_clean(c)
    c.close()


def test_abort_while_restore_is_pending_leaves_nothing() -> None:
    """B03: finish (abort) a request whose restore is still in flight."""
    faults = FaultInjector(delay_polls=1000)
    c = make(faults)
    serve(c, 1, PROMPT)
    push_out_of(c, "1")
    faults.once(FaultSite.DELAY)
    mat = c.admit(2, PROMPT)
    c.tick()
    assert mat.ops and not c.ready(2)
    c.finish(2)
    assert_clean(c)
    assert all(n.lock == [0, 0, 0] for n in c.cp.tree.nodes())
    c.close()


def test_close_cancels_everything_in_flight() -> None:
    faults = FaultInjector(delay_polls=1000)
    c = make(faults)
    faults.once(FaultSite.DELAY)
    c.admit(1, PROMPT)
    c.prefill(1)  # its D2H is issued on the next tick and stays pending (DELAY)
    c.tick()
    assert c.handles
    c.close()
    assert not c.cp.ops and not c.cp.requests
    assert all(t.count(1) == 0 for t in c.cp.tables)


def test_blocking_restore_without_prefetch() -> None:
    c = make(prefetch=False)
    serve(c, 1, PROMPT)
    push_out_of(c, "1")
    mat = c.admit(2, PROMPT + (9,))
    assert mat.done  # admit waited for the load-back
    assert c.prefill(2) == 1  # the one-token tail, in a private page never published
    assert c.cp.tables[0].count(1) == 1
    c.finish(2)
    assert c.metrics.hit_tokens["L2"] == 24 and c.cp.tables[0].count(1) == 0
    c.close()


def test_a_restore_that_brought_nothing_new_is_not_verified(ctl: CacheController) -> None:
    """A restore can settle with nothing new in L1 for its request (another request's restore
    made the deepest node resident first): the verification range is empty, and producers
    refuse empty ranges. `hicache demo` failed that way in about one run of four."""
    tokens = tuple(range(64))
    assert ctl.producer is not None and ctl.verifier is not None  # a plane with bytes, verify on
    with pytest.raises(ProducerError, match="start < end"):
        ctl.producer.expected(tokens, 32, 32)  # why the check must come first
    assert (
        ctl.verifier.verify(tokens, 32, 32, np.zeros(0, dtype=np.int64)) == 0
    )  # nothing to compare
    assert_clean(ctl)


def test_last_page_is_always_recomputed(ctl: CacheController) -> None:
    """A hit covers at most len - 1 tokens: the last token's logits need a forward pass."""
    serve(ctl, 1, PROMPT)
    assert serve(ctl, 2, PROMPT) == 4 and ctl.metrics.hit_tokens["L1"] == 20


@pytest.mark.parametrize("tokens, l1_pages", [(PROMPT, 16), (PROMPT + (7,), 7)])
def test_a_second_prefill_is_refused_before_anything_changes(
    tokens: tuple[int, ...], l1_pages: int
) -> None:
    """A request is prefilled once (the protocol's refusals; spec/vectors.md's l1_refused).
    Before, the controller refused a second prefill only by chance: a page-aligned prompt's
    counted its tokens recomputed again, then raised PolicyError (its decision was settled
    already); with L1 full it raised OutOfPages, "no room, try later"."""
    c = make(l1_pages=l1_pages)
    c.admit(1, tokens)
    c.prefill(1)
    before = (c.metrics.recomputed_tokens, c.cp.cached_len(1), c.cp.free_pages(Tier.L1))
    with pytest.raises(IllegalTransition, match="request 1 is served already"):
        c.prefill(1)
    assert (c.metrics.recomputed_tokens, c.cp.cached_len(1), c.cp.free_pages(Tier.L1)) == before
    c.finish(1)
    assert_clean(c)
    c.close()


def test_never_policy_recomputes_and_counts_skips() -> None:
    c = make(policy="never")
    serve(c, 1, PROMPT)
    push_out_of(c, "1")
    assert serve(c, 2, PROMPT) == 24
    assert c.metrics.policy_skips == 1 and c.metrics.decisions["recompute"] == 2
    c.close()


def test_selective_write_through_backs_up_on_second_hit() -> None:
    c = make(write_policy="write_through_selective")
    serve(c, 1, PROMPT)
    c.drain()
    assert all(n.state[1] != RESIDENT for n in c.cp.tree.nodes())
    serve(c, 2, PROMPT)
    serve(c, 3, PROMPT)
    c.drain()
    assert any(n.state[1] == RESIDENT for n in c.cp.tree.nodes())
    c.close()


def test_write_back_backs_up_on_eviction() -> None:
    c = make(write_policy="write_back", l1_pages=12)
    serve(c, 1, PROMPT)
    c.drain()
    assert all(n.state[1] != RESIDENT for n in c.cp.tree.nodes())
    serve(c, 2, OTHER)  # needs L1 room: the first prompt is backed up, then evicted
    first = c.cp.tree.match(PROMPT, split=False, touch=False)
    assert (
        first.lengths[1] == 24 and c.metrics.dropped_tokens["write_through_unbacked_eviction"] == 0
    )
    c.close()


def test_outside_eviction_backs_up_under_write_back() -> None:
    """`CacheController.evict` (pressure from outside) runs the write-back hook, as every
    eviction must (spec/eviction.md): the unbacked prompt is backed up to L2 before its L1
    copy goes, so nothing is dropped. Calling the control plane's loop directly -- what the
    fuzz adapter used to do -- skipped it and lost the prompt."""
    c = make(write_policy="write_back", l1_pages=12)
    serve(c, 1, PROMPT)
    c.drain()
    assert c.evict("L1", 12) >= 6 and c.metrics.evicted_pages["L1"] >= 6
    first = c.cp.tree.match(PROMPT, split=False, touch=False)
    assert (
        first.lengths == (0, 24, 0)
        and c.metrics.dropped_tokens["write_through_unbacked_eviction"] == 0
    )
    c.close()


def test_write_through_unbacked_eviction_counts_dropped_tokens() -> None:
    c = make(write_policy="write_through_selective", l1_pages=12)
    serve(c, 1, PROMPT)
    serve(c, 2, OTHER)
    assert c.metrics.dropped_tokens["write_through_unbacked_eviction"] >= 24
    c.close()


def test_config_errors_name_the_field() -> None:
    for kw, field in (
        ({"l1_pages": 0}, "l1_pages"),
        ({"policy": "sometimes"}, "policy"),
        ({"write_policy": "later"}, "write_policy"),
        ({"check_mode": "often"}, "check_mode"),
    ):
        with pytest.raises(ConfigError) as e:
            CacheConfig(**kw)
        assert e.value.field == field


def test_status_and_prometheus(ctl: CacheController) -> None:
    serve(ctl, 1, PROMPT)
    ctl.drain()
    s = ctl.status()
    tiers = s["tiers"]
    assert isinstance(tiers, dict) and tiers["L1"]["tree"] == 6 and tiers["L1"]["private"] == 0
    text = ctl.metrics.to_prometheus()
    assert 'hicache_transfers_done_total{direction="D2H"} 1' in text
    assert 'hicache_hit_tokens_total{tier="L1"} 0' in text


def test_every_metric_family_is_documented_and_carries_its_unit() -> None:
    """The metrics module's table (attribute, unit, family) is the exporter's list: a family
    added or renamed without the table, or without a unit or `_total`, fails here."""
    import re

    from hicache.controller import metrics

    text = metrics.Metrics().to_prometheus()
    exported = set(re.findall(r"^# TYPE hicache_(\S+) counter$", text, re.M))
    documented = set(re.findall(r"\b([a-z0-9_<>]+_total)\b", metrics.__doc__ or ""))
    stages = {
        f"transfer_{s}_seconds_total"
        for s in ("enqueue", "workspace_setup", "queue_wait", "service")
    }
    documented = (documented - {"transfer_<stage>_seconds_total"}) | stages
    assert exported == documented
    units = ("_tokens_total", "_pages_total", "_seconds_total", "_bytes_total")
    counts = {
        "fallbacks_total",
        "policy_skips_total",
        "restores_total",
        "preemptions_total",
        "decisions_total",
        "transfers_done_total",
        "transfers_failed_total",
        "transfers_cancelled_total",
        "layerwise_prefills_total",
        "ahead_discarded_total",
    }  # events: the unit is the count itself
    assert all(name.endswith(units) or name in counts for name in exported), exported


def test_first_transfer_per_direction_is_not_a_cost_sample(ctl: CacheController) -> None:
    """The warm-up transfer pays one-time costs (JIT, first touch): the model skips it."""
    serve(ctl, 1, PROMPT)
    serve(ctl, 2, OTHER)
    ctl.drain()
    assert ctl.metrics.directions["D2H"].count == 2
    assert ctl.model.line("d2h").samples_seen == 1


class _Timed:
    """A finished transfer's handle as the controller reads it for a cost sample."""

    def __init__(self, nbytes: int, timings: object) -> None:
        self.nbytes, self.timings = nbytes, timings


def test_a_transfer_that_allocated_a_workspace_is_a_cost_sample_of_its_own_time(
    ctl: CacheController,
) -> None:
    """A handle's `enqueue_s` already leaves the workspace setup out (the movers measure the
    issuing call less the setup, TransferTimings' contract): the sample is enqueue + queue
    wait + service. Subtracting the setup again made a transfer that allocated a larger
    workspace than its own run took count as no sample at all (the flake of the test above:
    the second D2H of a larger size sometimes grew its workspace)."""
    from hicache.core.tiers import Direction
    from hicache.dataplane.handles import TransferTimings

    first = TransferTimings(enqueue_s=1e-3, workspace_setup_s=9e-3, service_s=2e-3)
    grown = TransferTimings(enqueue_s=1e-3, workspace_setup_s=5e-3, service_s=2e-3)
    ctl.transfers.sample(Direction.D2H, _Timed(4096, first))  # type: ignore[arg-type]  # the warm-up
    ctl.transfers.sample(Direction.D2H, _Timed(4096, grown))  # type: ignore[arg-type]
    line = ctl.model.line("d2h")
    assert line.samples_seen == 1
    size, seconds = line._window[-1]
    assert size == 4096.0 and seconds == pytest.approx(3e-3)
    stats = ctl.metrics.directions["D2H"]
    stats.enqueue_s, stats.workspace_setup_s, stats.service_s = 1e-3, 5e-3, 2e-3
    assert stats.steady_s == pytest.approx(3e-3)


def test_the_controller_asks_the_control_plane_and_evicts_through_its_one_loop() -> None:
    """No controller module reads a node's state, value, lock or pending op, or picks
    eviction victims itself (spec/eviction.md, "One loop"): it asks ControlPlane's queries."""
    import re
    from pathlib import Path

    import hicache.controller

    forbidden = re.compile(
        r"\.(state|value|lock|pending)\[|\.evictable\(|\bcp\.tables\[|free_count"
    )
    found = []
    for path in sorted(Path(hicache.controller.__file__).parent.glob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if forbidden.search(line) and path.name != "digests.py":  # digests reads page tables
                found.append(f"{path.name}:{number}: {line.strip()}")
    assert found == []
