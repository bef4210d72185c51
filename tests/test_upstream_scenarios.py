"""The upstream failure scenarios that had no example of their own, on a dsv4-tiny group, and
the index of every scenario (spec/appendix-upstream.md, "Pool groups"), checked against the
tests it names so the table cannot drift.

Each test says in a comment how it was seen to fail with its rule broken: the guard reverted
or bypassed by hand (a monkeypatch in a scratch run, not kept), or a mutant of the zoo.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from hicache.controller.config import CacheConfig
from hicache.controller.controller import CacheController
from hicache.core.control import ControlPlane
from hicache.core.pages import PRIVATE
from hicache.core.tiers import Direction, Tier
from hicache.core.trace import Tracer
from hicache.core.tree import TreeNode
from hicache.dataplane.faults import FaultInjector, FaultSite
from hicache.dataplane.null import NullEngine, StoppedEarly
from hicache.errors import ConfigError, IllegalTransition
from hicache.invariants import check_all
from hicache.pools.presets import group
from hicache.pools.table import PoolFaults
from hicache.pools.tierpools import TierPools
from hicache.testing.adapters.controller import ControllerAdapter, Setup
from tests.test_null_plane import A, make, serve, settle_all
from tests.test_write_path_rows import a_in_l1_b_in_l3_only

PS = 4  # dsv4-tiny's anchor page size, in tokens
B = tuple(range(300, 312))  # 3 pages, A's child in A + B
SPEC = Path(__file__).resolve().parents[1] / "spec" / "appendix-upstream.md"


def group_controller(**kw: object) -> CacheController:
    """The controller on the null plane with a dsv4-tiny group in every tier, every
    transition checked."""
    return make(pools="dsv4-tiny", check_mode="every", **kw)


def by_pool(c: CacheController, tier: Tier) -> dict[str, int]:
    """FREE pages of every allocating pool of `tier`."""
    table = c.cp.tables[list(Tier).index(tier)]
    assert isinstance(table, TierPools)
    return table.free_pages_by_pool()


def no_private_page(cp: ControlPlane) -> bool:
    """No pool of any tier holds a PRIVATE page (what every release must leave)."""
    for table in cp.tables:
        assert isinstance(table, TierPools)
        if table.count(PRIVATE) or any(v.owner.tolist().count(PRIVATE) for v in table.pool_views()):
            return False
    return True


def owners(cp: ControlPlane) -> list[bytes]:
    out = []
    for table in cp.tables:
        assert isinstance(table, TierPools)
        out += [table.owner.tobytes()] + [v.owner.tobytes() for v in table.pool_views()]
    return out


def node_of(c: CacheController, tokens: tuple[int, ...]) -> TreeNode:
    return c.cp.tree.match(tokens, split=False, touch=False).path[-1]


# -- F5: write-back eviction whose host allocation fails ------------------------------------------


@pytest.mark.parametrize("why", ["swa_fails", "l2_too_small"])
def test_f5_a_write_back_victim_without_host_room_is_dropped_never_half_evicted(why: str) -> None:
    """Write-back: an L1 victim is backed up before it goes. When L2 cannot take it (its `swa`
    reservation fails after `kv`'s, or L2 is smaller than the node), the node leaves L1 with no
    L2 value (deleted, since no tier holds it), its tokens count once as `host_pressure`, and
    every L2 pool is as it was. Checked: with `Evictor._before_l1_eviction` made a no-op the
    drop count stays 0; with `GroupTable._rollback` skipped (B09) L2.kv keeps a PRIVATE page."""
    c = group_controller(write_policy="write_back", l2_pages=2 if why == "l2_too_small" else 32)
    serve(c, 1, A + (1,))
    node = node_of(c, A)
    assert c.cp.holds(node, Tier.L1) and not c.cp.holds(node, Tier.L2)
    l2_before = by_pool(c, Tier.L2)
    if why == "swa_fails":
        l2 = c.cp.tables[1]
        assert isinstance(l2, TierPools)
        l2.group_table.fault = PoolFaults({"swa": 2})  # the first try and the retry after a reclaim
    assert c.evict("L1", 3) == 3
    assert c.metrics.dropped_tokens["host_pressure"] == len(A)
    assert node not in c.cp.tree.nodes() and c.cp.residency(node, Tier.L2) == "ABSENT"
    assert by_pool(c, Tier.L2) == l2_before and no_private_page(c.cp)
    assert c.cp.checker.violations_found == 0 and check_all(c.cp.snapshot()) == []
    c.close()


def test_f5_a_write_back_victim_with_host_room_is_backed_up_first() -> None:
    """The same victim with room in L2: it is copied (every allocating pool takes its pages)
    before it leaves L1, nothing is dropped, and a later request finds it in L2. Checked: with
    `Evictor._before_l1_eviction` made a no-op the node leaves L1 with no L2 copy."""
    c = group_controller(write_policy="write_back")
    serve(c, 1, A + (1,))
    node = node_of(c, A)
    assert c.evict("L1", 3) == 3
    assert c.metrics.dropped_tokens["host_pressure"] == 0
    assert c.cp.residency(node, Tier.L2) == "RESIDENT" and not c.cp.holds(node, Tier.L1)
    assert by_pool(c, Tier.L2) == {"kv": 29, "swa": 29}
    assert c.admit(2, A + (2,)).match.lengths[1] == len(A)
    c.close()


# -- F6: a backup gap ------------------------------------------------------------------------------


def parent_and_child(c: CacheController) -> tuple[TreeNode, TreeNode]:
    serve(c, 1, A + (1,))
    serve(c, 2, A + B + (1,))
    child = node_of(c, A + B)
    assert child.parent is not None and child.parent is node_of(c, A)
    return child.parent, child


def test_f6_a_backup_of_a_child_whose_parent_is_not_backed_up_is_refused() -> None:
    """A D2H of the child alone, its parent not in L2: refused (the chain's parent must hold
    the target, S6), with no page of any pool of any tier touched. Checked: with the B07 mutant
    (`parent_resident` always true) the issue goes through and S6 reports the gap."""
    c = group_controller(write_policy="write_back")
    parent, child = parent_and_child(c)
    before = owners(c.cp)
    with pytest.raises(IllegalTransition):
        c.transfers.issue(Direction.D2H, [child])
    assert owners(c.cp) == before and not c.cp.ops
    op = c.transfers.issue(Direction.D2H, [parent, child])  # the whole chain is allowed
    assert isinstance(c.engine, NullEngine)
    c.engine.handles[-1].finish(True)  # the copy lands (its content tags arrive in L2)
    c.transfers.conclude([op.op_id])
    assert c.cp.holds(parent, Tier.L2) and c.cp.holds(child, Tier.L2)
    assert c.cp.checker.violations_found == 0
    c.close()


def test_f6_write_back_never_evicts_an_ancestor_before_its_children() -> None:
    """Write-back backs the L1 victim up with the ancestors L2 lacks (parent first), and an
    L2 eviction takes leaves only: the parent is refused while its child is in L2, and the
    pressure loop takes the child first. S6 holds after every step (check mode every).
    Checked: with the `leaf(L2)` guard made always true (`execute._Context.leaf`) the
    parent's eviction goes through and S6 `tier_ancestor_closed` reports the child."""
    c = group_controller(write_policy="write_back")
    parent, child = parent_and_child(c)
    assert c.evict("L1", 3) == 3  # the child is the only L1 leaf
    assert c.cp.holds(parent, Tier.L2) and c.cp.holds(child, Tier.L2)
    assert c.metrics.dropped_tokens["host_pressure"] == 0
    before = owners(c.cp)
    with pytest.raises(IllegalTransition):
        c.cp.evict_node(parent, Tier.L2)
    assert owners(c.cp) == before
    assert c.evict("L2", 3) == 3
    assert c.cp.holds(parent, Tier.L2) and not c.cp.holds(child, Tier.L2)
    assert c.cp.checker.violations_found == 0
    c.close()


# -- F7: the graft under a parent not backed up, every pool ---------------------------------------


def test_f7_a_dropped_graft_returns_every_pools_host_slots() -> None:
    """Guard 2 on a group: the L3-only child under an L1-only parent (write-through) is
    dropped before any L2 page of any pool is reserved, its L3 pin goes with it, and it is
    counted `dropped`. Checked: with the controller's guard removed
    (`RestoreStager._backed_up_above` always true) nothing is counted `dropped`."""
    c = group_controller(write_policy="write_through")
    _, child = a_in_l1_b_in_l3_only(c)
    l2_before, l3_before = by_pool(c, Tier.L2), by_pool(c, Tier.L3)
    mat = c.admit(3, A + B + (7,))
    assert mat.done and not c.handles and not mat.l3_part
    assert c.metrics.fallbacks["dropped"] == 1
    assert by_pool(c, Tier.L2) == l2_before and by_pool(c, Tier.L3) == l3_before
    assert child.lock == [0, 0, 0] and no_private_page(c.cp)
    c.close()


# -- F11, F12: an S2H that stops part way, per pool ------------------------------------------------


def a_and_b_in_l3_only(c: CacheController) -> tuple[TreeNode, TreeNode]:
    """A (3 pages) and its child B (3 pages), both held by L3 only: a restore of A + B is
    one S2H over the chain [A, B] (6 anchor pages), then its load-back."""
    serve(c, 1, A)
    serve(c, 2, A + B)
    settle_all(c)
    b = node_of(c, A + B)
    a = b.parent
    assert a is not None
    for tier in (Tier.L1, Tier.L2):
        c.cp.evict_node(b, tier)
        c.cp.evict_node(a, tier)
    assert [c.cp.residency(n, t) for n in (a, b) for t in Tier] == [
        "ABSENT",
        "ABSENT",
        "RESIDENT",
    ] * 2
    return a, b


def stop_s2h_part_way(c: CacheController, landed: dict[str, int]) -> None:
    """The restore's S2H (the only transfer in flight) ends FAILED, reporting `landed`
    pages per pool (what S2H_PARTIAL reports), and a tick applies it."""
    (op_id,) = c.handles
    assert c.cp.ops[op_id].direction is Direction.S2H
    handle = c.handles[op_id]
    handle.landed = landed
    handle.fail(StoppedEarly())
    c.tick()


def test_f11_an_s2h_stopped_before_a_sidecars_pages_publishes_only_the_clamp() -> None:
    """The anchor and every pool but `c4_indexer` landed all 6 pages; `c4_indexer` stopped
    after 4. `prefetch_clamp` publishes 4 anchor pages, which is node A whole (3) and not B:
    A is published in L2 and loaded back, B's pages are released in every pool, one fallback
    `prefetch_clamped`, and prefill serves A and recomputes the rest. Checked: with the clamp
    skipped (the anchor's count published, `clamped_nodes` reading `landed["kv"]`) B is
    published in L2 over `c4_indexer` pages that never arrived."""
    c = group_controller(write_policy="write_through")
    a, b = a_and_b_in_l3_only(c)
    l2_before = by_pool(c, Tier.L2)
    c.admit(3, A + B + (7,))
    full = {p.name: 6 for p in group("dsv4-tiny").pools}
    stop_s2h_part_way(c, {**full, "c4_indexer": 4})
    assert c.cp.residency(a, Tier.L2) == "RESIDENT" and c.cp.residency(b, Tier.L2) == "ABSENT"
    assert by_pool(c, Tier.L2) == {pool: n - 3 for pool, n in l2_before.items()}
    assert c.metrics.fallbacks["prefetch_clamped"] == 1  # A's load-back is in flight now
    assert not check_all(c.cp.snapshot())
    while not c.ready(3):
        settle_all(c)
    assert c.prefill(3) == len(B) + 1  # A restored; B and the last token recomputed
    c.finish(3)
    assert b.lock == [0, 0, 0] and no_private_page(c.cp)
    c.close()


def test_f12_a_pool_left_out_of_the_s2h_report_counts_zero_and_every_slot_is_released() -> None:
    """Every pool landed all 6 pages, but `c128` is missing from the per-pool report: it
    counts 0, so nothing is published, every reserved L2 page of every pool is released (no
    slot owned by nobody: I6, I9), one fallback `prefetch_clamped`, and prefill recomputes
    the whole prompt. Checked: with the missing pool skipped (`clamped_nodes` taking the
    minimum over the pools reported) A and B are both published in L2."""
    c = group_controller(write_policy="write_through")
    a, b = a_and_b_in_l3_only(c)
    l2_before = by_pool(c, Tier.L2)
    c.admit(3, A + B + (7,))
    full = {p.name: 6 for p in group("dsv4-tiny").pools}
    stop_s2h_part_way(c, {pool: n for pool, n in full.items() if pool != "c128"})
    assert [c.cp.residency(n, Tier.L2) for n in (a, b)] == ["ABSENT", "ABSENT"]
    assert by_pool(c, Tier.L2) == l2_before and no_private_page(c.cp)
    assert c.metrics.fallbacks["prefetch_clamped"] == 1
    assert not check_all(c.cp.snapshot())
    assert c.ready(3)
    assert c.prefill(3) == len(A + B) + 1  # everything recomputed
    c.finish(3)
    assert a.lock == b.lock == [0, 0, 0] and no_private_page(c.cp)
    c.close()


def aimed_partial_restore(
    seed: int, tracer: Tracer | None = None
) -> tuple[CacheController, TreeNode, TreeNode, dict[str, int]]:
    """A controller whose restore of A + B (one S2H over both, from L3) meets an aimed
    `partial` (FaultInjector seed `seed`); the S2H's drawn report, not yet applied."""
    faults = FaultInjector(seed=seed).aim("partial", direction=Direction.S2H)
    cfg = CacheConfig(
        l1_pages=16,
        l2_pages=32,
        l3_slots=64,
        policy="always",
        pools="dsv4-tiny",
        check_mode="every",
        write_policy="write_through",
    )
    c = CacheController(cfg, engine=NullEngine(cfg.kv, 16, 32, 64), faults=faults, tracer=tracer)
    a, b = a_and_b_in_l3_only(c)
    c.admit(3, A + B + (7,))
    (op_id,) = c.handles
    landed = c.handles[op_id].landed
    assert landed is not None and faults.fired[FaultSite.S2H_PARTIAL] == 1
    return c, a, b, landed


def test_an_aimed_partial_s2h_stops_with_a_drawn_report_and_publishes_its_clamp() -> None:
    """The fuzz's aimed `partial` (how the group machines reach F11-F13 every run): the S2H
    fails at issue with a per-pool report drawn by `FaultInjector.landing` over every
    backed-up pool (one pool short, or left out), and the controller publishes the whole
    nodes every pool covers -- A (3 pages) once each pool landed 3, B only with all 6 --
    releasing the rest of every pool (a pool left out counts none: F12). Over seeds 0-7
    the reports leave a pool out, stop one short, or land whole; they keep none, A, or both.
    Aiming it at a transfer that is not an L3 read is refused."""
    with pytest.raises(ConfigError, match="aim.direction"):
        FaultInjector().aim("partial", direction=Direction.H2D)
    pools = {p.name for p in group("dsv4-tiny").pools}
    outcomes, shapes = set(), set()
    for seed in range(8):
        c, a, b, landed = aimed_partial_restore(seed)
        assert set(landed) <= pools and sum(n < 6 for n in landed.values()) <= 1
        shapes.add(
            "left out"
            if set(landed) != pools
            # F12
            else "short"
            if min(landed.values()) < 6
            else "whole"
        )
        covered = min(landed.get(p, 0) for p in pools)  # every dsv4-tiny pool: ratio 1
        c.tick()
        assert c.metrics.fallbacks["prefetch_clamped"] == 1
        kept = [n for n in (a, b) if c.cp.residency(n, Tier.L2) == "RESIDENT"]
        assert kept == [a, b][: (covered >= 3) + (covered >= 6)] and not check_all(c.cp.snapshot())
        outcomes.add(len(kept))
        while not c.ready(3):
            settle_all(c)
        assert c.prefill(3) == len(A + B) + 1 - sum(len(n.key) for n in kept)
        c.finish(3)
        assert no_private_page(c.cp)
        c.close()
    assert outcomes == {0, 1, 2} and shapes == {"left out", "short", "whole"}


def test_an_aimed_partial_s2h_on_bytes_lands_what_it_reports_and_nothing_past_it() -> None:
    """On the CPU plane an aimed `partial` lets the real S2H run, then reports it stopped
    (aimed.py, `StoppedHandle`): every page a pool's run covers holds its slot's bytes, every
    page past it holds UNLANDED_BYTE (bytes that never arrived), so the clamp's nodes serve
    the slots' bytes (I4) and a page published past the clamp would not. Seen failing
    (`hicache fuzz --pools dsv4-tiny --plane cpu --seed 1`, I4 after s2h_complete of 1 node):
    the report was drawn and the handle failed at once, so a group's deferred L3 reads
    never ran, and the clamp published L2 pages holding another node's bytes."""
    pytest.importorskip("torch", reason="the CPU plane needs torch")
    from hicache.dataplane.engine import UNLANDED_BYTE

    for seed in range(8):
        faults = FaultInjector(seed=seed)
        cfg = CacheConfig(
            l1_pages=16,
            l2_pages=32,
            l3_slots=64,
            policy="always",
            device="cpu",
            backend="torch",
            pools="dsv4-tiny",
            check_mode="every",
            write_policy="write_through",
            io_threads=0,
        )
        c = CacheController(cfg, faults=faults)
        serve_bytes(c, 1, A)
        serve_bytes(c, 2, A + B)
        c.drain()
        b = node_of(c, A + B)
        a = b.parent
        assert a is not None
        plane = c.byte_plane
        assert not plane.one_pool
        l2_junk = plane.group_l2.bytes_view(plane.pools.pools[0].name)
        l2_junk.fill_(0x11)  # stale bytes in every free L2 page of the first pool
        for tier in (Tier.L1, Tier.L2):
            c.cp.evict_node(b, tier)
            c.cp.evict_node(a, tier)
        faults.aim("partial", direction=Direction.S2H)
        c.admit(3, A + B + (7,))
        (op_id,) = c.handles
        target = c.cp.ops[op_id].target_pages
        handle = c.handles[op_id]
        assert handle.wait(5.0).final and handle.landed is not None
        landed, mapped = handle.landed, plane.pool_pages(Tier.L2, target)
        c.tick()  # the clamp published; I4 checked after the transition (check_mode every)
        for n in (a, b):
            if c.cp.residency(n, Tier.L2) == "RESIDENT":
                l2, l3 = n.value[1], n.value[2]
                assert l2 is not None and l3 is not None
                assert (plane.digests("L2", l2) == plane.digests("L3", l3)).all(), seed
        for p in plane.pools.pools:  # released, not yet reused
            run = landed.get(p.name, 0)
            pages = plane.group_l2.packed(p.name, mapped[p.source])
            assert (pages[run:] == UNLANDED_BYTE).all(), (seed, p.name, run)
        c.drain()
        c.close()


def serve_bytes(c: CacheController, rid: int, tokens: tuple[int, ...]) -> None:
    """Admit, wait until ready, prefill and finish (a plane with bytes ends its own transfers)."""
    c.admit(rid, tokens)
    while not c.ready(rid):
        c.tick()
    c.prefill(rid)
    c.finish(rid)


# -- F23: a freed window is never served ---------------------------------------------------------


def test_f23_a_prefix_whose_window_was_freed_after_admission_is_recomputed_and_revived() -> None:
    """Request 2's load-back of A fails, so it waits with nothing restored; request 3 loads A
    into L1 and ends; then A's window is freed. Request 2's prefill finds A in L1 but may not
    serve it (a hit ending at A has a gap in its window): it recomputes A, and its copy gives
    A its window back (`revive`). Seen failing (found by the fuzz, seed 1, 4,000 steps):
    prefill served A from L1, and I9 reported request 2's prefix ending on a freed window."""
    c = group_controller(write_policy="write_through")
    serve(c, 1, A)
    settle_all(c)
    a = node_of(c, A)
    c.cp.evict_node(a, Tier.L1)
    c.admit(2, A + (7,))
    settle_all(c, ok=False)  # the load-back fails: request 2 is ready with nothing restored
    assert c.ready(2) and c.cp.cached_len(2) == 0
    serve(c, 3, A + (7,))  # loads A back into L1, and ends
    c.cp.tombstone(a)
    assert c.prefill(2) == len(A) + 1  # A recomputed: its freed window is never served
    assert c.cp.windows.freed(a) is False and not check_all(c.cp.snapshot())
    c.finish(2)
    c.close()


# -- F20: a request-scoped pool on a backup path ---------------------------------------------------


def test_f20_a_request_scoped_pool_is_on_no_tier_and_no_backup_path() -> None:
    """dsv41's pair ring is request-scoped: a backup path naming it is refused naming the
    field, and the plane's tiers hold only the pools of a node's value, so a whole backup to
    L2 and L3 maps every anchor page to pages of backupable pools only. Checked: with
    `tierpools.node_group` returning the group unchanged, every tier gets a `pair_ring`
    table."""
    g = group("dsv41-tiny")
    with pytest.raises(ConfigError, match="pair_ring.backupable"):
        g.backup_pools(["kv", "swa", "pair_ring"])
    c = make(pools="dsv41-tiny", check_mode="every", write_policy="write_through")
    serve(c, 1, A + (1,))
    settle_all(c)
    node = node_of(c, A)
    assert all(c.cp.holds(node, t) for t in Tier)
    backupable = {p.name for p in g.backup_pools()}
    for table in c.cp.tables:
        assert isinstance(table, TierPools)
        assert set(table.free_pages_by_pool()) == {"kv", "swa"}
        value = node.value[c.cp.tables.index(table)]
        assert value is not None and set(table.pool_pages(value)) <= backupable
    c.close()


# -- F24: a backend error before the slot release -------------------------------------------------


@pytest.mark.parametrize("site", ["fail", "enospc"])
def test_f24_backend_errors_on_l3_writes_never_drain_a_pools_free_list(site: str) -> None:
    """Every L3 write fails at the backend (EIO when it completes, or ENOSPC), four prompts in
    a row on an L3 of exactly one prompt: each failure releases its slots in every pool, so
    the fifth write finds the whole L3 free and lands. Checked: with `ControlPlane.fail` not
    releasing the target (made to drop the op and return early, SGLang's EIC shape) the
    L3 free list is short after the first failure."""
    a = ControllerAdapter(Setup(pools="dsv4-tiny", l3_slots=3, l2_pages=8))
    try:
        l3 = a.ctl.cp.tables[2]
        assert isinstance(l3, TierPools)
        full = l3.free_pages_by_pool()
        for rid in range(1, 5):
            if site == "fail":
                a.faults.aim("fail", direction=Direction.H2S)
            else:
                from hicache.dataplane.faults import FaultSite

                a.faults.once(FaultSite.IO_ENOSPC)
            prompt = tuple(range(rid * 100, rid * 100 + 3 * PS + 1))
            a.submit(rid, prompt)
            assert a.prefill(rid)
            a.finish(rid)
            a.drain()
            assert l3.free_pages_by_pool() == full and a.check() == []
        assert a.ctl.metrics.dropped_tokens["backup_failed"] == 4 * 3 * PS
        a.submit(9, tuple(range(900, 913)))
        assert a.prefill(9)
        a.finish(9)
        a.drain()
        assert l3.free_pages_by_pool() == {"kv": 0, "swa": 0} and a.check() == []
    finally:
        a.close()


# -- the index ------------------------------------------------------------------------------------


def scenario_rows() -> list[tuple[str, list[str]]]:
    """spec/appendix-upstream.md "Pool groups", in table order: (scenario, the tests its
    row names as `tests/FILE.py::NAME`)."""
    text = SPEC.read_text()
    section = text.split("## Pool groups (F1-F14, F19-F24)", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        m = re.match(r"\| (F\d+) \|", line)
        if m:
            rows.append((m.group(1), re.findall(r"`(tests/[\w/]+\.py::\w+)`", line)))
    return rows


def test_the_index_names_every_scenario_once_each_with_a_test() -> None:
    rows = scenario_rows()
    wanted = [f"F{n}" for n in [*range(1, 15), *range(19, 25)]]  # F15-F18: tensor parallelism
    assert [f for f, _ in rows] == wanted
    assert [f for f, named in rows if not named] == []


def test_every_test_the_index_names_exists() -> None:
    missing = []
    for f, named in scenario_rows():
        for ref in named:
            path, name = ref.split("::")
            module = importlib.import_module(path[:-3].replace("/", "."))
            if not callable(getattr(module, name, None)):
                missing.append(f"{f}: {ref}")
    assert missing == []


def test_f13_an_s2h_whose_window_stopped_early_publishes_no_page_without_its_window() -> None:
    """`swa` (trailing: `prefetch_clamp` does not clamp by it) landed 2 of 6 pages, every
    other pool all 6. L2 holds whole groups (a window is freed in L1 only), so only the
    pages whose window landed may be published: none of A's 3, so nothing is, and every
    reserved page of every pool is released -- the window held beyond the hit goes (F13).
    Checked: with the clamp by `prefetch_clamp` alone, A and B are published in L2 over swa
    pages that never arrived."""
    c = group_controller(write_policy="write_through")
    a, b = a_and_b_in_l3_only(c)
    l2_before = by_pool(c, Tier.L2)
    c.admit(3, A + B + (7,))
    full = {p.name: 6 for p in group("dsv4-tiny").pools}
    stop_s2h_part_way(c, {**full, "swa": 2, "c4_state": 2, "c4_indexer_state": 2})
    assert [c.cp.residency(n, Tier.L2) for n in (a, b)] == ["ABSENT", "ABSENT"]
    assert by_pool(c, Tier.L2) == l2_before and no_private_page(c.cp)
    assert c.metrics.fallbacks["prefetch_clamped"] == 1
    assert not check_all(c.cp.snapshot())
    c.close()
