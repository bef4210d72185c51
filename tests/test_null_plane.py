"""The controller on the null data plane: no torch, completions chosen op by op.

A driver (the stateful machine) finishes, fails or leaves pending each transfer it picks from
`controller.pending()`; every controller path must hold up whatever order the completions
arrive in, including a restore's S2H and H2D in adverse orders, and an abort at any point.
Invariants are checked after every transition (check mode `every`)."""

from __future__ import annotations

import contextlib
import itertools
import random
import subprocess
import sys

import pytest

from hicache.controller.config import CacheConfig
from hicache.controller.controller import CacheController
from hicache.core.tiers import Direction, Tier
from hicache.dataplane.faults import FaultInjector, FaultSite, sites_for
from hicache.dataplane.handles import Finishable
from hicache.dataplane.null import NullEngine
from hicache.errors import ConfigError, OutOfPages

A = tuple(range(100, 112))  # 3 pages
AB = A + tuple(range(300, 312))  # 6 pages: A's node, then B's
ABC = AB + (7, 8, 9, 10, 11)  # restores A (from L2) and B (from L3), computes the rest


def make(**kw: object) -> CacheController:
    cfg = CacheConfig(**{"l1_pages": 16, "l2_pages": 32, "l3_slots": 64, "policy": "always", **kw})  # type: ignore[arg-type]
    return CacheController(cfg, engine=NullEngine(cfg.kv, cfg.l1_pages, cfg.l2_pages, cfg.l3_slots))


def finish(c: CacheController, op_id: int, ok: bool) -> None:
    """Let the next tick observe op `op_id` done (ok) or failed."""
    handle = c.handles[op_id]
    assert isinstance(handle, Finishable), "the null plane's handles are finished by the driver"
    handle.finish(ok)


def settle_all(c: CacheController, ok: bool = True) -> None:
    """Tick (which issues due backups); finish every pending transfer with `ok`; until none
    is left."""
    for _ in range(100):
        c.tick()
        if not c.handles:
            return
        for op_id in list(c.handles):
            finish(c, op_id, ok)
    raise AssertionError("transfers still pending after 100 rounds")


def serve(c: CacheController, rid: int, tokens: tuple[int, ...]) -> None:
    c.admit(rid, tokens)
    while not c.ready(rid):
        settle_all(c)
    c.prefill(rid)
    c.finish(rid)


def assert_clean(c: CacheController) -> None:
    """No op, handle, request, private page or lock is left; no invariant ever broke."""
    settle_all(c)
    assert not c.cp.ops and not c.handles and not c.cp.requests
    for table in c.cp.tables:
        assert table.count(1) == 0, f"{table.tier}: private pages left"
    assert all(c.cp.usage(t)["locked"] == 0 for t in Tier)
    assert c.cp.checker.violations_found == 0


def two_stage_restore() -> CacheController:
    """A controller where admitting ABC restores A from L2 (H2D) and B from L3 (S2H, H2D)."""
    c = make()
    serve(c, 1, A + (1,))
    serve(c, 2, AB + (1,))
    settle_all(c)  # backups: both nodes in L1, L2 and L3
    path = c.cp.tree.match(AB, split=False, touch=False).path
    node_a, node_b = path
    c.cp.evict_node(node_b, Tier.L1)
    c.cp.evict_node(node_b, Tier.L2)
    c.cp.evict_node(node_a, Tier.L1)
    return c


def test_the_null_path_imports_no_torch() -> None:
    code = (
        "import sys; from tests.test_null_plane import make, serve; c = make(); "
        "serve(c, 1, tuple(range(30))); c.close(); assert 'torch' not in sys.modules, 'torch'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_producer_for_a_byte_free_plane_is_refused() -> None:
    cfg = CacheConfig(l1_pages=8, l2_pages=8, l3_slots=8)
    with pytest.raises(ConfigError, match="producer"):
        CacheController(
            cfg,
            producer=object(),  # type: ignore[arg-type]
            engine=NullEngine(cfg.kv, 8, 8, 8),
        )
    with pytest.raises(ConfigError, match="no pools"):
        _ = make().transfer_engine


def test_pending_names_direction_request_and_stage() -> None:
    c = two_stage_restore()
    c.admit(3, ABC)
    got = {(p.direction, p.request_id, p.stage) for p in c.pending()}
    assert got == {(Direction.H2D, 3, "load_l2"), (Direction.S2H, 3, "promote")}
    for p in c.pending():
        finish(c, p.op_id, True)
    c.tick()
    c.tick()
    assert [(p.direction, p.stage) for p in c.pending()] == [(Direction.H2D, "load_l3")]
    settle_all(c)
    c.prefill(3)
    c.finish(3)
    assert_clean(c)
    c.close()


OUTCOMES = [(True, True), (True, False), (False, True), (False, False)]


@pytest.mark.parametrize("h2d_first", [True, False])
@pytest.mark.parametrize("outcome", OUTCOMES)
@pytest.mark.parametrize("abort_at", [None, 0, 1, 2])
@pytest.mark.parametrize("tick_between", [True, False])
def test_restore_stages_in_any_order(
    h2d_first: bool, outcome: tuple[bool, bool], abort_at: int | None, tick_between: bool
) -> None:
    """H2D (L2 part) and S2H (L3 part) end in either order, each done or failed, observed on
    one tick or two; the request may be aborted before, between or after them; then the
    L3 part's H2D ends either way. Nothing leaks, no invariant breaks."""
    c = two_stage_restore()
    c.admit(3, ABC)
    by_stage: dict[str, int] = {p.stage: p.op_id for p in c.pending()}
    order = ["load_l2", "promote"] if h2d_first else ["promote", "load_l2"]
    oks = dict(zip(["load_l2", "promote"], outcome))
    for step, stage in enumerate(order):
        if abort_at == step:
            c.finish(3)
            break
        finish(c, by_stage[stage], oks[stage])
        if tick_between or step == 1:
            c.tick()
    else:
        if abort_at == 2:
            c.finish(3)
        else:
            c.tick()
            settle_all(c, ok=outcome[0])  # the L3 part's H2D, if it was issued
            assert c.ready(3)
            c.prefill(3)
            c.finish(3)
    assert_clean(c)
    c.close()


def test_any_permutation_of_completions_under_load() -> None:
    """Requests with shared prefixes; the pending ops are finished in rotations of issue
    order, some done and some failed; every third request is aborted mid-restore."""
    for shift, fail_every in itertools.product(range(3), (2, 3)):
        c = make(l1_pages=12, l2_pages=16, l3_slots=24)
        prompts = [AB + (1,), A + (2, 3, 4, 5), ABC, AB + (9,) * 7]
        for rid, p in enumerate(prompts * 2):
            c.admit(rid, p)
            ops = c.pending()
            ops = ops[shift % max(1, len(ops)) :] + ops[: shift % max(1, len(ops))]
            for i, op in enumerate(ops):
                finish(c, op.op_id, i % fail_every != 0)
                c.tick()
            if rid % 3 == 2:
                c.finish(rid)  # aborted, its restore perhaps still in flight
                continue
            while not c.ready(rid):
                settle_all(c)
            c.prefill(rid)
            c.finish(rid)
        assert_clean(c)
        c.close()


def test_a_scripted_engine_decides_outcomes_at_issue() -> None:
    from hicache.dataplane.null import ScriptedEngine

    cfg = CacheConfig(l1_pages=16, l2_pages=32, l3_slots=64, policy="always")
    fail_h2s = ScriptedEngine(cfg.kv, 16, 32, 64, script=lambda d, i: d is not Direction.H2S)
    c = CacheController(cfg, engine=fail_h2s)
    serve(c, 1, ABC)
    for _ in range(3):
        c.tick()  # D2H done, H2S issued and failed: no driver needed
    assert not c.handles and c.metrics.dropped_tokens["backup_failed"] > 0
    assert c.cp.usage(Tier.L2)["tree"] > 0 and c.cp.usage(Tier.L3)["tree"] == 0
    assert_clean(c)
    c.close()


@pytest.mark.parametrize("fail_d2h", [False, True])
def test_write_back_blocks_on_its_d2h_and_the_null_plane_ends_it(fail_d2h: bool) -> None:
    """Write-back backs an L1 victim up synchronously: on the null plane the blocking wait
    ends the D2H (done by default; failed when a fault is aimed at it), instead of hanging."""
    faults = FaultInjector()
    if fail_d2h:
        faults.aim("fail", direction=Direction.D2H)
    cfg = CacheConfig(
        l1_pages=8, l2_pages=16, l3_slots=16, policy="always", write_policy="write_back"
    )
    c = CacheController(cfg, faults=faults, engine=NullEngine(cfg.kv, 8, 16, 16, faults=faults))
    serve(c, 1, A + (1,))  # 3 pages in L1 only (write-back: no backup yet)
    serve(c, 2, tuple(range(500, 528)) + (1,))  # 8 pages: A is evicted, backed up first
    assert c.cp.usage(Tier.L2)["tree"] == (0 if fail_d2h else 3)
    assert (c.metrics.dropped_tokens["host_pressure"] > 0) == fail_d2h
    assert c.metrics.dropped_tokens["write_through_unbacked_eviction"] == 0
    assert_clean(c)
    c.close()


def test_a_delay_of_a_delay_is_still_finished_by_the_driver() -> None:
    from hicache.dataplane.handles import DelayedHandle, NullHandle, TransferStatus

    handle = DelayedHandle(DelayedHandle(NullHandle(Direction.H2D), 1), 1)
    handle.finish(True)
    assert [handle.poll() for _ in range(3)] == [TransferStatus.PENDING] * 2 + [TransferStatus.DONE]


def drive(seed: int, write_policy: str, steps: int = 200) -> None:
    """A seeded random driver: admit from shared prefixes, finish or fail a random pending op,
    tick, prefill, abort, aim a fault at a live request's next op, under a seeded fault
    schedule; then nothing may be left."""
    rng = random.Random(seed)
    sites = tuple(s for s in sites_for("null") if s is not FaultSite.CRASH_BEFORE_PUBLISH)
    faults = FaultInjector.schedule(seed, 0.5, 0.1, sites=sites)
    cfg = CacheConfig(
        l1_pages=rng.choice((10, 14)),
        l2_pages=rng.choice((8, 12, 20)),
        l3_slots=rng.choice((12, 24)),
        policy="always",
        write_policy=write_policy,
        promotion=rng.random() < 0.5,
    )
    c = CacheController(
        cfg,
        faults=faults,
        engine=NullEngine(cfg.kv, cfg.l1_pages, cfg.l2_pages, cfg.l3_slots, faults=faults),
    )
    prefixes = [tuple(range(1000 * p, 1000 * p + 4 * rng.randint(1, 4))) for p in range(3)]
    live: set[int] = set()
    prefilled: set[int] = set()
    for rid in range(steps):
        r = rng.random()
        if r < 0.2 and len(live) < 3:
            suffix = tuple(range(7, 7 + 4 * rng.randint(0, 3))) + (rng.randrange(3),) * rng.randint(
                1, 5
            )
            with contextlib.suppress(OutOfPages):
                c.admit(rid, rng.choice(prefixes) + suffix)
                live.add(rid)
        elif r < 0.5 and c.handles:
            finish(c, rng.choice(c.pending()).op_id, rng.random() < 0.8)
        elif r < 0.7:
            c.tick()
        elif r < 0.8 and live:
            q = rng.choice(sorted(live))
            if c.ready(q) and q not in prefilled:
                with contextlib.suppress(OutOfPages):
                    c.prefill(q)
                    prefilled.add(q)
        elif r < 0.9 and live:
            q = rng.choice(sorted(live))
            c.finish(q)  # finished, or aborted in whatever state its restore is
            live.discard(q)
        elif r < 0.93 and live:
            action = rng.choice(["fail", "delay", "corrupt", "short_read", "alloc"])
            direction = (
                Direction.S2H
                if action in ("corrupt", "short_read")
                else rng.choice(list(Direction))
            )
            faults.aim(
                action,  # type: ignore[arg-type]
                direction=direction,
                request_id=rng.choice(sorted(live) + [None]),
                polls=rng.randint(1, 3),
            )
        else:
            settle_all(c)
    for q in live:
        c.finish(q)
    assert_clean(c)
    c.close()


@pytest.mark.parametrize("write_policy", ["write_through", "write_back", "write_through_selective"])
@pytest.mark.parametrize("seed", [0, 1, 2, 102])
def test_random_completion_orders_with_faults_leave_nothing(seed: int, write_policy: str) -> None:
    drive(seed, write_policy)


def test_a_second_admission_during_a_promotion_decides_what_it_can_plan() -> None:
    """Request 3 promotes B from L3 (its S2H in flight); request 4, for the same prefix, finds
    B in L3 only, but a node L2 is filling ends every restore plan. Found by the fuzz machine's
    `decision unplanned` check (tests/test_testing_machine.py): request 4 chose L3, planned
    nothing, no fallback was counted, and the decision log settled an L3 restore against a
    recompute. The policy decides on the hits a plan reaches (`plan_reach`): recompute."""
    c = make()
    serve(c, 1, A + (1,))
    serve(c, 2, AB + (1,))
    settle_all(c)
    node_b = c.cp.tree.match(AB, split=False, touch=False).path[-1]
    c.cp.evict_node(node_b, Tier.L1)
    c.cp.evict_node(node_b, Tier.L2)
    assert c.admit(3, AB + (5,)).decision.choice == "L3"  # its S2H promotes B
    mat = c.admit(4, AB + (6,))
    assert mat.match.lengths == (len(A), len(A), len(AB)) and not mat.nodes
    assert mat.decision.choice == "recompute"
    assert c.decisions.summary()["choices"] == {"recompute": 3, "L2": 0, "L3": 1}
    settle_all(c)  # request 3's promotion and load-back
    for rid in (3, 4):
        assert c.ready(rid) and c.prefill(rid) >= 1
        c.finish(rid)
    assert_clean(c)
    c.close()
