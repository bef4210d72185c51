"""Pool groups in the control plane: `TierPools` (hicache/pools/tierpools.py), a
`ControlPlane(pools=...)`, I9 `group_atomic` on real planes, and the named scenarios F1
(pool k of n fails), F2 (a reclaim of one pool frees another's), F3 (a partial eviction:
B10), F19 (state pools have no allocator) and F22 (after a close, every pool is whole).

The groups are the dsv4-tiny and dsv41-tiny presets; `RATIO2` is dsv4-tiny with a `swa`
page half the anchor's, so that each anchor page holds two `swa` pages.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from hicache.core.control import ControlPlane
from hicache.core.pages import FREE, PRIVATE, TREE, Pages, PageTable, pages
from hicache.core.tiers import Direction
from hicache.core.trace import ListSink, Tracer
from hicache.core.tree import TreeNode
from hicache.errors import (
    ConfigError,
    IllegalTransition,
    InvariantViolation,
    NoAllocator,
    OutOfPages,
)
from hicache.invariants import Violation, check_all
from hicache.pools.presets import group
from hicache.pools.spec import PoolGroup
from hicache.pools.table import GroupTable, InjectedShortage, PoolFaults
from hicache.pools.tierpools import TierPools
from hicache.pools.tiertable import TierTable
from hicache.testing import mutants, zoo

PS = 4
DSV4 = group("dsv4-tiny")
RATIO2 = PoolGroup(
    "dsv4-ratio2",
    tuple(
        dataclasses.replace(p, page_size=2, window_pages=min(p.window_pages, 2))
        if p.source == "swa"
        else p
        for p in DSV4.pools
    ),
)


def plane(
    g: PoolGroup | None = RATIO2, caps: tuple[int, int, int] = (8, 8, 8), **kw: object
) -> ControlPlane:
    return ControlPlane(PS, caps, pools=g, **kw)  # type: ignore[arg-type]


def served(cp: ControlPlane, rid: int, n_pages: int, first: int = 0) -> TreeNode:
    """Request `rid` computes and inserts `n_pages` pages of its own prompt, and ends."""
    tokens = [first * 1000 + i for i in range(n_pages * PS + 1)]
    cp.begin_request(rid, tokens)
    cp.compute(rid, n_pages * PS)
    cp.insert(rid)
    node = cp.prefix_node(rid)
    cp.end_request(rid)
    return node


def backed_up(cp: ControlPlane, node: TreeNode) -> None:
    op = cp.issue(Direction.D2H, list(reversed(cp.tree.path_to_root(node))))
    cp.complete(op.op_id)


def owners(cp: ControlPlane) -> list[bytes]:
    """Every pool's owner codes in every tier (what a refused operation must not change)."""
    out = []
    for t in cp.tables:
        out.append(t.owner.tobytes())
        if isinstance(t, TierPools):
            out += [v.owner.tobytes() + v.held_by.tobytes() for v in t.pool_views()]
    return out


# -- TierPools -------------------------------------------------------------------------------------


def test_each_anchor_page_holds_ratio_side_pages_through_its_whole_lifecycle() -> None:
    t = TierPools("L2", RATIO2, {"kv": 6, "swa": 12})
    got = t.reserve(2)
    swa = t.pool_pages(got)["swa"]
    assert swa.size == 4 and (t.group_table.tables["swa"].owner[swa] == PRIVATE).all()
    t.publish(got)
    assert (t.owner[got] == TREE).all() and (t.group_table.tables["swa"].owner[swa] == TREE).all()
    t.free(got)
    assert t.free_pages_by_pool() == {"kv": 6, "swa": 12}
    assert (t.held_by["swa"] == -1).all()


def test_pool_pages_gives_derived_pools_their_sources_pages_in_anchor_order() -> None:
    t = TierPools("L1", RATIO2, {"kv": 4, "swa": 8})
    a = t.reserve(2)
    got = t.pool_pages(a[::-1])
    assert set(got) == {p.name for p in RATIO2.pools}
    assert list(got["c4"]) == list(a[::-1]) and list(got["c128"]) == list(a[::-1])
    assert list(got["c4_state"]) == list(got["swa"]) == list(t.held_by["swa"][a[::-1]].reshape(-1))
    with pytest.raises(IllegalTransition, match="FREE"):
        t.pool_pages(pages([3]))
    with pytest.raises(IllegalTransition, match="distinct"):
        t.pool_pages(pages([a[0], a[0]]))


def test_free_count_is_the_minimum_over_the_pools_in_anchor_pages() -> None:
    t = TierPools("L1", RATIO2, {"kv": 8, "swa": 6})
    assert t.free_count == 3  # 6 swa pages serve 3 anchor pages
    t.reserve(2)
    assert t.free_count == 1
    with pytest.raises(OutOfPages, match="L1.swa"):
        t.reserve(2)
    assert t.free_pages_by_pool() == {"kv": 6, "swa": 2}  # kv rolled back, as before


def test_a_refused_move_changes_no_pool() -> None:
    t = TierPools("L1", RATIO2, {"kv": 4, "swa": 8})
    a = t.reserve(2)
    t.publish(a[:1])

    def state() -> bytes:
        swa = t.group_table.tables["swa"]
        return t.owner.tobytes() + swa.owner.tobytes() + t.held_by["swa"].tobytes()

    before = state()
    for move, p in (
        (t.publish, a),
        (t.free, a),
        (t.release, pages([a[1], a[1]])),
        (t.free, pages([9])),
    ):
        with pytest.raises(IllegalTransition):
            move(p)
        assert state() == before


def test_reserve_exact_takes_the_anchor_pages_named_and_side_pages_as_reserve_does() -> None:
    t = TierPools("L1", RATIO2, {"kv": 4, "swa": 4})
    t.reserve_exact(pages([3, 1]))
    assert list(t.owner) == [FREE, PRIVATE, FREE, PRIVATE]
    assert (t.held_by["swa"][[1, 3]] >= 0).all()
    with pytest.raises(OutOfPages, match="L1.swa"):
        t.reserve_exact(pages([0]))  # swa is full: nothing changes
    assert t.owner[0] == FREE


# -- the control plane -----------------------------------------------------------------------------


def test_without_a_group_of_several_pools_each_tier_is_a_group_of_one() -> None:
    """A single pool's tier table is today's `PageTable` (its transitions and allocator)
    answering the group interface for one pool (`TierTable`), not a `TierPools`."""
    one = PoolGroup("one", (DSV4.anchor,))
    for g in (None, one):
        cp = plane(g)
        assert all(type(t) is TierTable and isinstance(t, PageTable) for t in cp.tables)
        assert all(t.pools == (DSV4.anchor.name,) for t in cp.tables)
        assert all(v.pools == () for v in cp.snapshot().tiers.values())
    assert all(isinstance(t, TierPools) for t in plane().tables)


def test_a_group_plane_emits_the_single_pool_planes_trace() -> None:
    """The tree's values are anchor pages: the same script gives the same events."""
    traces = []
    for g in (None, RATIO2, group("dsv41-tiny")):
        sink = ListSink()
        cp = plane(g, tracer=Tracer(sink))
        node = served(cp, 1, 3)
        backed_up(cp, node)
        cp.evict("L1", 8)
        traces.append([e.to_json() for e in sink.events])
    assert traces[0] == traces[1] == traces[2]


def test_side_pool_capacities_default_to_the_anchors_times_the_ratio_and_can_be_given() -> None:
    cp = plane(pool_capacities={"L2": {"swa": 6}})
    assert [t.free_pages_by_pool() for t in cp.tables] == [
        {"kv": 8, "swa": 16},
        {"kv": 8, "swa": 6},
        {"kv": 8, "swa": 16},
    ]
    assert cp.free_pages("L2") == 3


@pytest.mark.parametrize(
    "given, field",
    [
        ({"L4": {"swa": 2}}, "pool_capacities"),
        ({"L1": {"kv": 3}}, "pool_capacities.L1.kv"),
        ({"L1": {"c4": 3}}, "L1.c4.capacity_pages"),
    ],
)
def test_bad_pool_capacities_are_refused_naming_the_field(
    given: dict[str, dict[str, int]], field: str
) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        plane(pool_capacities=given)


def test_the_anchor_page_size_must_be_the_planes() -> None:
    with pytest.raises(ConfigError, match="kv.page_size"):
        ControlPlane(8, (8, 8, 8), pools=RATIO2)


# -- F1: pool k of n fails -------------------------------------------------------------------------


@pytest.mark.parametrize("g", [RATIO2, group("dsv41-tiny")], ids=["dsv4", "dsv41"])
def test_f1_the_second_pool_failing_refuses_the_issue_with_every_pool_unchanged(
    g: PoolGroup,
) -> None:
    """kv (first in sorted order) is reserved, swa fails: kv is rolled back, no op exists,
    every pool of every tier is as before; the next issue succeeds."""
    cp = plane(g, check_mode="every")
    node = served(cp, 1, 2)
    l2 = cp.tables[1]
    assert isinstance(l2, TierPools)
    l2.group_table.fault = PoolFaults({"swa": 1})
    before, generations = owners(cp), l2.generation.copy()
    with pytest.raises(InjectedShortage, match="L2.swa"):
        backed_up(cp, node)
    assert owners(cp) == before and np.array_equal(l2.generation, generations)
    assert cp.ops == {} and check_all(cp.snapshot()) == []
    backed_up(cp, node)
    assert cp.holds(node, "L2") and check_all(cp.snapshot()) == []


def test_f1_the_controller_drops_the_backup_when_a_pool_fails() -> None:
    from hicache.testing.adapters.controller import ControllerAdapter, Setup

    a = ControllerAdapter(Setup(pools="dsv4-tiny", write_policy="write_through"))
    try:
        l2 = a.ctl.cp.tables[1]
        assert isinstance(l2, TierPools)
        l2.group_table.fault = PoolFaults({"swa": 1})
        a.submit(1, tuple(range(13)))
        assert a.prefill(1)
        a.drain()
        assert a.ctl.metrics.dropped_tokens["host_pressure"] == 12
        assert l2.free_pages_by_pool() == {"kv": 8, "swa": 8} and a.check() == []
    finally:
        a.close()


# -- F2: a reclaim of one pool frees another's -----------------------------------------------------


def test_f2_a_reclaim_for_swa_evicts_a_node_and_frees_its_kv_pages_too() -> None:
    """L2's swa is the short pool: its reclaim evicts a node, which frees that node's kv and
    swa pages together; the reservation then succeeds and every pool is whole."""
    cp = plane(pool_capacities={"L2": {"swa": 4}}, check_mode="off")
    node = served(cp, 1, 2)
    backed_up(cp, node)
    l2 = cp.tables[1]
    assert isinstance(l2, TierPools) and l2.free_count == 0
    asked: list[tuple[str, int]] = []

    def reclaim(pool: str, short: int) -> None:
        asked.append((pool, short))
        cp.evict("L2", -(-short // l2.ratios["swa"]))

    got = l2.reserve(1, reclaim)
    assert asked == [("swa", 2)] and not cp.holds(node, "L2")
    assert l2.free_pages_by_pool() == {"kv": 7, "swa": 2}
    l2.release(got)
    assert check_all(cp.snapshot()) == []


def test_f2_make_room_from_the_group_minimum_frees_every_pool() -> None:
    """L1's swa holds 2 anchor pages' worth: a compute of 2 more pages is refused until an
    eviction of anchor pages (decided from `free_count`, the minimum) frees swa too."""
    cp = plane(pool_capacities={"L1": {"swa": 8}}, check_mode="every")
    served(cp, 1, 2)
    served(cp, 2, 2, first=1)
    cp.begin_request(3, list(range(2000, 2009)))
    before = owners(cp)
    with pytest.raises(OutOfPages):
        cp.compute(3, 8)
    assert owners(cp) == before
    assert cp.evict("L1", 2) == 2
    cp.compute(3, 8)
    assert check_all(cp.snapshot()) == []


# -- F3 (B10): a partial eviction ------------------------------------------------------------------


def test_f3_a_partial_eviction_is_caught_by_group_atomic() -> None:
    cp = plane(check_mode="every")
    node = served(cp, 1, 2)
    backed_up(cp, node)
    with mutants.activate("B10"):
        with pytest.raises(InvariantViolation) as e:
            cp.evict("L2", 2)
    found = [v for v in e.value.violations if isinstance(v, Violation)]
    assert [(v.invariant, v.tier) for v in found] == [("I9", "L2.swa")]
    assert "leaked" in str(e.value.violations[0])


def test_f3_the_whole_eviction_frees_every_pool() -> None:
    cp = plane(check_mode="every")
    node = served(cp, 1, 2)
    backed_up(cp, node)
    assert cp.evict("L2", 2) == 2
    assert cp.tables[1].free_pages_by_pool() == {"kv": 8, "swa": 16}


# -- F19: state and sidecar pools have no allocator ------------------------------------------------


@pytest.mark.parametrize(
    "pool, source", [("c4_state", "swa"), ("c4_indexer_state", "swa"), ("c128", "kv")]
)
def test_f19_derived_pools_refuse_alloc_free_and_available_and_metrics_skip_them(
    pool: str, source: str
) -> None:
    cp = plane()
    l1 = cp.tables[0]
    assert isinstance(l1, TierPools)
    before = owners(cp)
    for call in (
        lambda: l1.group_table.alloc(pool, 1),
        lambda: l1.group_table.free(pool, pages([0])),
        lambda: l1.group_table.available(pool),
    ):
        with pytest.raises(NoAllocator, match=source):
            call()
    assert owners(cp) == before
    assert set(l1.free_pages_by_pool()) == {"kv", "swa"}


def test_f19_the_controllers_status_lists_allocating_pools_only() -> None:
    from hicache.testing.adapters.controller import ControllerAdapter, Setup

    a = ControllerAdapter(Setup(pools="dsv4-tiny", l2_pages=6))
    try:
        a.submit(1, tuple(range(9)))
        a.prefill(1)
        tiers = a.ctl.status()["tiers"]
        assert isinstance(tiers, dict)
        l1, l2 = tiers["L1"], tiers["L2"]
        assert {k for k in l1 if k.startswith("free.")} == {"free.kv", "free.swa"}
        assert l1["free"] == l1["free.kv"] == l1["free.swa"] == 10 - 3  # 2 pages + the tail
        assert l2["capacity"] == 6 and l2["free.swa"] == 6 - l2["tree"] - l2["private"]
    finally:
        a.close()


# -- F22: after a close, every pool is whole -------------------------------------------------------


@pytest.mark.parametrize("preset", ["dsv4-tiny", "dsv41-tiny"])
def test_f22_after_close_no_pool_holds_a_private_page(preset: str) -> None:
    """Requests live and transfers in flight, then the controller closes: every pool of
    every tier holds no PRIVATE page, and every check (I6, I9) holds."""
    from hicache.testing.adapters.controller import ControllerAdapter, Setup

    a = ControllerAdapter(Setup(pools=preset))
    a.submit(1, tuple(range(13)))
    a.prefill(1)
    a.submit(2, tuple(range(100, 109)))
    a.ctl.tick()  # backups issued, not finished
    assert a.pending_ops()
    a.ctl.close()
    for t in a.ctl.cp.tables:
        assert isinstance(t, TierPools)
        assert t.count(PRIVATE) == 0
        assert all(v.owner.tolist().count(PRIVATE) == 0 for v in t.pool_views())
    assert a.check() == []


# -- the controller's configuration and the fuzz ---------------------------------------------------


def test_a_group_controller_with_bytes_maps_through_its_tier_pools() -> None:
    """An unknown preset names `pools`; a group's controller gets TierPools in every tier and
    the group data plane moving every pool through them (`pool_pages`)."""
    pytest.importorskip("torch")
    from hicache.controller.config import CacheConfig
    from hicache.controller.controller import CacheController

    with pytest.raises(ConfigError, match="pools"):
        CacheConfig(pools="dsv5")
    ctl = CacheController(CacheConfig(pools="dsv4-tiny", device="cpu", io_threads=0))
    try:
        assert all(isinstance(t, TierPools) for t in ctl.cp.tables)
        assert not ctl.byte_plane.one_pool  # the group path
        ctl.admit(1, tuple(range(40)))
        ctl.prefill(1)
        ctl.finish(1)
        ctl.drain()
        assert ctl.cp.tables[1].count(TREE) > 0  # backed up to L2, every pool with it
    finally:
        ctl.close()


@pytest.mark.parametrize("name", ["fuzz-dsv4", "fuzz-dsv41", "fuzz-cpu-dsv4"])
def test_the_fuzz_machine_runs_clean_on_a_group_plane_and_reaches_f1(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """300 steps a seed, every check after every transition: clean, and within seeds 0-4 at
    least one group reservation failed at `swa` after `kv` was taken (F1) and was rolled
    back. Which seed gets there first moves whenever a machine's draws change (seed 2 lost
    it when `illegal_calls` joined, seed 0 on fuzz-cpu-dsv4 when the wider draws did), so
    the test takes the first seed that does; every seed it runs must be clean."""
    if "cpu" in name:
        pytest.importorskip("torch", reason="the CPU plane moves bytes with torch")
    rolled: list[tuple[str, ...]] = []
    original = GroupTable._rollback

    def rollback(self: GroupTable, taken: Mapping[str, Pages]) -> None:
        rolled.append(tuple(n for n, p in taken.items() if p.size))
        original(self, taken)

    monkeypatch.setattr(GroupTable, "_rollback", rollback)
    for seed in range(5):
        steps, error = zoo.run_seed(zoo.load_machine(name), seed, 300)
        assert error is None and steps >= 300, f"{name} seed {seed}: {error!r}"
        if ("kv",) in rolled:
            break
    assert ("kv",) in rolled, f"{name}: no F1 rollback in 300 steps of seeds 0-4"


# -- the model checker's group configurations ------------------------------------------------------


def test_the_model_checkers_group_configs_build_group_planes() -> None:
    from hicache.oracle.modelcheck import get_config
    from hicache.oracle.modelcheck.search import initial_plane

    short = get_config("group-short")
    assert short.pool_capacities == (("L2", "swa", 2),)
    cp = initial_plane(short)
    assert all(isinstance(t, TierPools) for t in cp.tables)
    assert [cp.free_pages(t) for t in ("L1", "L2", "L3")] == [3, 2, 3]
    assert get_config("group").expected == get_config("tail").expected


def test_a_restore_served_over_freed_windows_is_verified_in_the_pools_it_holds() -> None:
    """Under anchor_recompute_swa a prefix is served with its trailing pools' window freed
    (they are recomputed). The verifier asked the group engine for every pool's pages and
    met the freed window's TOMBSTONE: InvalidPages out of prefill (found by FuzzCpuDsv4,
    whose shrunk steps these are). It compares each pool where the pool holds pages."""
    pytest.importorskip("torch", reason="the CPU plane moves bytes with torch")
    from hicache.testing.adapters.controller import Setup
    from hicache.testing.machines import FuzzCpuDsv4

    state: Any = FuzzCpuDsv4()  # the machine's rules, called as Hypothesis prints them
    state.start(
        setup=Setup(
            l1_pages=8,
            l2_pages=3,
            l3_slots=2,
            promotion=False,
            plane="cpu",
            pools="dsv4-tiny",
            hit_policy="anchor_recompute_swa",
            l1_window_pages=6,
        )
    )
    try:
        state.submit(serve=0, tokens=(1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007, 0))
        state.abort(pick=0)
        state.resubmit(abort_first=False, aim=None, deep=False, pick=0, settle=0, twice=False)
        state.finish(pick=0)
        state.tick(finish=0)
        state.submit(
            serve=2, tokens=(2000, 2001, 2002, 2003, 2004, 2005, 2006, 2007, 0, 1, 2, 3, 4)
        )
        state.drain()
        state.failed_restore_then_full_l1(pick=0)
        state.agrees_with_reference()
        assert state.cache.ctl.verifier.bytes_checked["c4"] > 0  # the restore was verified
    finally:
        state.teardown()
