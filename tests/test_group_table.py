"""Atomic group allocation (hicache/pools/table.py): a page table per allocating pool,
all-or-nothing group reservations in sorted pool order with reverse rollback, reclaim at most
once per pool, derived pools released only through their source, metrics that skip pools
without an allocator; the group invariants (invariants/groups.py) with violation tests; the
stateful machine over dsv4-like and dsv41-like groups; and bug class B09 caught by it.

The groups are built here from PoolSpec with the structure of SGLang's DeepSeek V4 host pool
group (anchor `kv` without bytes, allocating `swa`, three sidecars on `kv`, two state pools on
`swa`) and of V4.1's (anchor, `swa`, six sidecars on `kv`), at toy sizes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hicache.core.pages import PRIVATE, Pages, PageTable
from hicache.errors import (
    ConfigError,
    IllegalTransition,
    InvariantViolation,
    NoAllocator,
    OutOfPages,
)
from hicache.invariants import (
    GroupView,
    check_group_conservation,
    check_reserve_rolled_back,
    group_view,
)
from hicache.pools.spec import (
    ALLOCATING,
    ANCHOR,
    SIDECAR,
    STATE,
    TRAILING_PAGES,
    PoolGroup,
    PoolSpec,
)
from hicache.pools.table import GroupPages, GroupTable, InjectedShortage, PoolFaults
from hicache.testing import zoo


def _sidecar(name: str, source: str = "kv", page_size: int = 4) -> PoolSpec:
    return PoolSpec(name, SIDECAR, indices_from=source, page_size=page_size, row_bytes=4)


def _swa_state(name: str) -> PoolSpec:
    return PoolSpec(
        name,
        STATE,
        indices_from="swa",
        hit_policy=TRAILING_PAGES,
        window_pages=2,
        page_size=2,
        row_bytes=8,
    )


KV = PoolSpec("kv", ANCHOR, page_size=4, layers=0)
SWA = PoolSpec(
    "swa", ALLOCATING, hit_policy=TRAILING_PAGES, window_pages=2, page_size=2, row_bytes=8
)


def dsv4_like() -> PoolGroup:
    """Seven pools: kv, swa, c4 / c4_indexer / c128 on kv, two state pools on swa."""
    return PoolGroup(
        "dsv4-like",
        (
            KV,
            SWA,
            _sidecar("c4"),
            _sidecar("c4_indexer"),
            _sidecar("c128"),
            _swa_state("c4_state"),
            _swa_state("c4_indexer_state"),
        ),
    )


def dsv41_like() -> PoolGroup:
    """Eight pools: kv, swa and the six c1* / c2* sidecars on kv; no state pools."""
    sidecars = [
        _sidecar(f"c{r}{part}") for r in (1, 2) for part in ("", "_indexer", "_indexer_scale")
    ]
    return PoolGroup("dsv41-like", (KV, SWA, *sidecars))


def wide() -> PoolGroup:
    """Four allocating pools whose sorted order does not start at the anchor: a_side, kv,
    m_side, z_side; one sidecar on each side pool."""
    sides = [
        PoolSpec(n, ALLOCATING, page_size=4, row_bytes=4) for n in ("z_side", "m_side", "a_side")
    ]
    return PoolGroup("wide", (KV, *sides, *(_sidecar(f"{s.name}_c", s.name) for s in sides)))


GROUPS: dict[str, Callable[[], PoolGroup]] = {"dsv4": dsv4_like, "dsv41": dsv41_like, "wide": wide}


def table(group: PoolGroup, cap: int = 6, **fault: int) -> GroupTable:
    return GroupTable(
        "L2",
        group,
        {p.name: cap for p in group.allocating},
        PoolFaults(dict(fault)) if fault else None,
    )


def state(gt: GroupTable) -> dict[str, tuple[list[int], list[int]]]:
    """Every table's owner codes and generations: what 'nothing changed' compares."""
    return {n: (t.owner.tolist(), t.generation.tolist()) for n, t in gt.tables.items()}


def fill(gt: GroupTable, want: dict[str, int]) -> GroupPages:
    gp = gt.reserve_group(want)
    gt.publish_group(gp)
    return gp


# -- construction and the pools without an allocator -------------------------------------------


def test_only_allocating_pools_get_a_page_table() -> None:
    gt = table(dsv4_like())
    assert list(gt.tables) == ["kv", "swa"]
    assert [t.tier for t in gt.tables.values()] == ["L2.kv", "L2.swa"]
    assert all(isinstance(t, PageTable) for t in gt.tables.values())
    assert list(table(wide()).tables) == ["a_side", "kv", "m_side", "z_side"]


@pytest.mark.parametrize(
    "pool, source", [("c4", "kv"), ("c128", "kv"), ("c4_state", "swa"), ("c4_indexer_state", "swa")]
)
def test_a_derived_pool_refuses_alloc_free_and_available_naming_its_source(
    pool: str, source: str
) -> None:
    """F19: a state (or sidecar) pool asked for alloc, free or available raises NoAllocator
    naming its source, with nothing changed."""
    gt = table(dsv4_like())
    gp = fill(gt, {"kv": 2, "swa": 2})
    before = state(gt)
    calls: list[tuple[str, Callable[[], object]]] = [
        ("alloc", lambda: gt.alloc(pool, 1)),
        ("free", lambda: gt.free(pool, gp.by_pool[source])),
        ("available", lambda: gt.available(pool)),
    ]
    for operation, call in calls:
        with pytest.raises(NoAllocator) as e:
            call()
        assert (e.value.pool, e.value.operation, e.value.source) == (pool, operation, source)
    assert state(gt) == before
    assert np.array_equal(gt.indices(pool, gp), gp.by_pool[source])


def test_metrics_skip_the_pools_without_an_allocator() -> None:
    """SGLang #39436: a metrics path asked a state pool for its available size and raised."""
    gt = table(dsv4_like(), cap=5)
    fill(gt, {"kv": 2, "swa": 1})
    gt.reserve_group({"swa": 3})
    assert gt.free_pages_by_pool() == {"kv": 3, "swa": 1}
    assert gt.used_pages_by_pool() == {"kv": 2, "swa": 4}
    assert (gt.available("kv"), gt.available("swa")) == (3, 1)


def test_capacities_name_the_pool_they_are_wrong_for() -> None:
    group = dsv4_like()
    with pytest.raises(ConfigError) as e:
        GroupTable("L2", group, {"kv": 4})
    assert e.value.field == "L2.swa.capacity_pages"
    with pytest.raises(ConfigError) as e:
        GroupTable("L2", group, {"kv": 4, "swa": 4, "c4_state": 4})
    assert e.value.field == "L2.c4_state.capacity_pages" and "'swa'" in str(e.value)
    with pytest.raises(ConfigError) as e:
        GroupTable("L2", group, {"kv": 4, "swa": 0})
    assert e.value.field == "L2.swa.capacity_pages"


def test_a_trailing_window_larger_than_its_pool_is_refused() -> None:
    """The state pools' and swa's window of 2 pages is counted in swa's pages."""
    with pytest.raises(ConfigError) as e:
        GroupTable("L2", dsv4_like(), {"kv": 8, "swa": 1})
    assert e.value.field == "pools.swa.window_pages"
    only_states = PoolGroup(
        "states", (KV, PoolSpec("swa", ALLOCATING, page_size=2), _swa_state("c4_state"))
    )
    with pytest.raises(ConfigError) as e:
        GroupTable("L2", only_states, {"kv": 8, "swa": 1})
    assert e.value.field == "pools.c4_state.window_pages"
    GroupTable("L2", only_states, {"kv": 8, "swa": 2})  # a window that just fits


# -- reserve_group -----------------------------------------------------------------------------


def test_a_reservation_takes_every_allocating_pool_in_sorted_order() -> None:
    seen: list[str] = []

    def watch(pool: str) -> bool:
        seen.append(pool)
        return False

    gt = GroupTable("L2", wide(), {"kv": 6, "a_side": 6, "m_side": 6, "z_side": 6}, watch)
    gp = gt.reserve_group({"kv": 2, "z_side": 1, "a_side": 3})
    assert seen == ["a_side", "kv", "z_side"]  # m_side wants nothing: not asked
    assert gp.num_pages == {"a_side": 3, "kv": 2, "m_side": 0, "z_side": 1}
    assert gt.used_pages_by_pool() == {"a_side": 3, "kv": 2, "m_side": 0, "z_side": 1}
    assert all(
        int(gt.tables[n].owner[p].max(initial=PRIVATE)) == PRIVATE for n, p in gp.by_pool.items()
    )


@pytest.mark.parametrize("failing", ["a_side", "kv", "m_side", "z_side"])
def test_pool_k_of_n_failing_rolls_back_the_pools_before_it_in_reverse(
    failing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """F1: the k-th pool (sorted order) fails after pools 1..k-1 were reserved: they are
    released in reverse order, OutOfPages names the pool, and every table is as before
    (owner codes and generations)."""
    gt = table(wide(), cap=4)
    fill(gt, {"kv": 1, "a_side": 1, "m_side": 1, "z_side": 1})
    gt.fault = PoolFaults({failing: 1})
    before, view = state(gt), group_view(gt.tables)
    released = _record(monkeypatch, "release")
    with pytest.raises(InjectedShortage) as e:
        gt.reserve_group({"kv": 2, "a_side": 2, "m_side": 2, "z_side": 2})
    assert isinstance(e.value, OutOfPages) and e.value.tier == f"L2.{failing}"
    order = list(gt.tables)
    assert released == [f"L2.{n}" for n in reversed(order[: order.index(failing)])]
    assert state(gt) == before
    assert check_reserve_rolled_back(view, group_view(gt.tables)) == []


def test_a_real_shortage_fails_like_an_injected_one() -> None:
    gt = table(dsv4_like(), cap=3)
    before = state(gt)
    with pytest.raises(OutOfPages) as e:
        gt.reserve_group({"kv": 3, "swa": 4})
    assert not isinstance(e.value, InjectedShortage)
    assert (e.value.tier, e.value.wanted, e.value.free) == ("L2.swa", 4, 3)
    assert state(gt) == before


def test_each_pool_reclaims_at_most_once_then_fails() -> None:
    gt = table(dsv4_like(), cap=4)
    asked: list[tuple[str, int]] = []
    gp = gt.reserve_group({"kv": 2, "swa": 3}, lambda pool, short: asked.append((pool, short)))
    assert asked == [] and gp.num_pages == {"kv": 2, "swa": 3}
    with pytest.raises(OutOfPages) as e:
        gt.reserve_group({"kv": 2, "swa": 2}, lambda pool, short: asked.append((pool, short)))
    assert asked == [("swa", 1)] and e.value.tier == "L2.swa"
    assert gt.used_pages_by_pool() == {"kv": 2, "swa": 3}


def test_one_injected_failure_is_healed_by_the_reclaim_and_the_retry() -> None:
    gt = table(dsv4_like(), cap=4, swa=1)
    asked: list[tuple[str, int]] = []
    gp = gt.reserve_group({"kv": 1, "swa": 2}, lambda pool, short: asked.append((pool, short)))
    assert asked == [("swa", 2)] and gp.num_pages == {"kv": 1, "swa": 2}


def test_a_reclaim_of_one_pool_may_free_another_pools_pages() -> None:
    """F2: kv is short; the caller's eviction frees a whole published group, swa's pages
    included, so swa is served without a reclaim of its own."""
    gt = table(dsv4_like(), cap=4)
    old = fill(gt, {"kv": 4, "swa": 4})
    asked: list[str] = []

    def evict(pool: str, short: int) -> None:
        asked.append(pool)
        gt.free_group(old)

    gp = gt.reserve_group({"kv": 2, "swa": 3}, evict)
    assert asked == ["kv"] and gp.num_pages == {"kv": 2, "swa": 3}
    assert check_group_conservation(group_view(gt.tables, [gp.by_pool])) == []


def test_a_reclaim_that_raises_still_rolls_back() -> None:
    gt = table(dsv4_like(), cap=4)
    fill(gt, {"swa": 3})
    before = state(gt)

    def broken(pool: str, short: int) -> None:
        raise RuntimeError(f"eviction of {pool} failed")

    with pytest.raises(RuntimeError, match="eviction of swa"):
        gt.reserve_group({"kv": 2, "swa": 2}, broken)
    assert state(gt) == before


@pytest.mark.parametrize(
    "want, error",
    [
        ({"c4": 1}, NoAllocator),
        ({"nope": 1}, ConfigError),
        ({"kv": -1}, ValueError),
        ({"swa": 1.5}, ValueError),
    ],
)
def test_a_bad_request_is_refused_before_any_pool_is_touched(
    want: dict[str, Any], error: type[Exception]
) -> None:
    gt = table(dsv4_like(), cap=4, kv=1)
    before = state(gt)
    with pytest.raises(error):
        gt.reserve_group({"kv": 1, **want})
    assert state(gt) == before and gt.fault is not None and gt.fault("kv")  # hook not asked


# -- publish, release, free --------------------------------------------------------------------


@pytest.mark.parametrize("event", ["publish", "release", "free"])
def test_each_allocating_pool_moves_once_and_derived_pools_never(
    event: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    gt = table(dsv4_like())
    gp = gt.reserve_group({"kv": 2, "swa": 3})
    if event == "free":
        gt.publish_group(gp)
    moved = _record(monkeypatch, event)
    getattr(gt, f"{event}_group")(gp)
    assert moved == ["L2.kv", "L2.swa"]


def test_a_refused_group_move_changes_no_pool() -> None:
    """swa's pages were released behind the group's back: publishing the group is refused at
    swa, and kv (first in sorted order) is not published either."""
    gt = table(dsv4_like())
    gp = gt.reserve_group({"kv": 2, "swa": 3})
    gt.table("swa").release(gp.by_pool["swa"])
    before = state(gt)
    with pytest.raises(IllegalTransition) as e:
        gt.publish_group(gp)
    assert e.value.tier == "L2.swa"
    assert state(gt) == before


def test_group_pages_naming_a_derived_pool_or_missing_one_are_refused() -> None:
    gt = table(dsv4_like())
    gp = gt.reserve_group({"kv": 1, "swa": 1})
    before = state(gt)
    with pytest.raises(NoAllocator):
        gt.release_group(GroupPages("L2", {**gp.by_pool, "c4_state": gp.by_pool["swa"]}))
    with pytest.raises(ConfigError, match="by_pool"):
        gt.release_group(GroupPages("L2", {"kv": gp.by_pool["kv"]}))
    with pytest.raises(ConfigError, match="tier"):
        gt.release_group(GroupPages("L1", gp.by_pool))
    assert state(gt) == before
    gt.release_group(gp)
    assert gt.used_pages_by_pool() == {"kv": 0, "swa": 0}


def _record(monkeypatch: pytest.MonkeyPatch, event: str) -> list[str]:
    """The tiers ("L2.<pool>") whose PageTable.`event` runs from now on, in call order."""
    seen: list[str] = []
    original = getattr(PageTable, event)

    def recording(self: PageTable, p: Pages) -> None:
        seen.append(self.tier)
        original(self, p)

    monkeypatch.setattr(PageTable, event, recording)
    return seen


# -- the invariants, each with a violation ----------------------------------------------------


def test_group_conservation_holds_and_finds_a_leak_in_one_pool() -> None:
    gt = table(dsv41_like())
    held = gt.reserve_group({"kv": 2, "swa": 1})
    published = fill(gt, {"kv": 1, "swa": 2})
    assert (
        check_group_conservation(group_view(gt.tables, [held.by_pool], [published.by_pool])) == []
    )
    gt.alloc("swa", 2)  # two swa pages PRIVATE, held by no record
    found = check_group_conservation(group_view(gt.tables, [held.by_pool], [published.by_pool]))
    assert [(v.invariant, v.name, v.tier) for v in found] == [("I6", "page_conservation", "L2.swa")]
    assert "leaked" in found[0].message and len(found[0].pages) == 2


def test_group_conservation_finds_a_record_the_table_disagrees_with() -> None:
    gt = table(dsv4_like())
    gp = gt.reserve_group({"kv": 2, "swa": 1})
    found = check_group_conservation(group_view(gt.tables, [], [gp.by_pool]))  # not published
    assert {v.tier for v in found} == {"L2.kv", "L2.swa"}
    assert all(v.name == "page_conservation" for v in found)


def test_reserve_rolled_back_finds_a_pool_left_private() -> None:
    gt = table(dsv4_like())
    gt.reserve_group({"swa": 1})  # PRIVATE before: not the failed call's
    before = group_view(gt.tables)
    left = gt.alloc("kv", 2)  # what a reservation that was not rolled back leaves
    found = check_reserve_rolled_back(before, group_view(gt.tables))
    assert [(v.invariant, v.name, v.tier, v.pages) for v in found] == [
        ("I6", "reserve_group_rolled_back", "L2.kv", tuple(left.tolist()))
    ]
    other = GroupView({"kv": before.pools["kv"]})
    assert check_reserve_rolled_back(other, before)[0].name == "reserve_group_rolled_back"


# -- the state machine -------------------------------------------------------------------------


class GroupTableMachine(RuleBasedStateMachine):
    """Reserve (with per-pool faults and a reclaim that evicts whole published groups),
    publish, release and free over one group table; after every step I6 holds in every pool
    against the machine's records, and a failed reservation left nothing of its own."""

    @initialize(shape=st.sampled_from(sorted(GROUPS)), data=st.data())
    def setup(self, shape: str, data: st.DataObject) -> None:
        self.group = GROUPS[shape]()
        self.names = [p.name for p in self.group.allocating]
        caps = {n: data.draw(st.integers(2, 8), label=f"capacity {n}") for n in self.names}
        self.gt = GroupTable("L2", self.group, caps)
        self.reserved: list[GroupPages] = []
        self.published: list[GroupPages] = []

    def view(self) -> GroupView:
        return group_view(
            self.gt.tables, [g.by_pool for g in self.reserved], [g.by_pool for g in self.published]
        )

    def _evict(self, pool: str, short: int) -> None:
        """The caller's eviction: free published groups, oldest first, until `pool` gained
        `short` pages (every pool of an evicted group is freed: F2)."""
        goal = self.gt.tables[pool].free_count + short
        while self.published and self.gt.tables[pool].free_count < goal:
            self.gt.free_group(self.published.pop(0))

    @rule(data=st.data())
    def reserve(self, data: st.DataObject) -> None:
        want = {n: data.draw(st.integers(0, 4), label=f"want {n}") for n in self.names}
        fail = data.draw(
            st.dictionaries(st.sampled_from(self.names), st.integers(1, 2)), label="faults"
        )
        reclaim = self._evict if data.draw(st.booleans(), label="reclaim") else None
        self.gt.fault = PoolFaults(fail)
        before, published = self.view(), len(self.published)
        try:
            gp = self.gt.reserve_group(want, reclaim)
        except OutOfPages as e:
            found = check_reserve_rolled_back(before, self.view())
            if found:
                raise InvariantViolation(tuple(found), "failed reserve_group") from e
            assert e.tier in {f"L2.{n}" for n in self.names if want[n] > 0}
            if len(self.published) == published:  # no reclaim evicted anything
                assert _owners(self.view()) == _owners(before)
        else:
            assert gp.num_pages == want
            self.reserved.append(gp)
        finally:
            self.gt.fault = None

    @precondition(lambda self: bool(self.reserved))
    @rule(data=st.data(), publish=st.booleans())
    def end_reservation(self, data: st.DataObject, publish: bool) -> None:
        gp = self.reserved.pop(data.draw(st.integers(0, len(self.reserved) - 1)))
        if publish:
            self.gt.publish_group(gp)
            self.published.append(gp)
        else:
            self.gt.release_group(gp)

    @precondition(lambda self: bool(self.published))
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        self.gt.free_group(self.published.pop(data.draw(st.integers(0, len(self.published) - 1))))

    @rule(data=st.data())
    def derived_pool_refuses(self, data: st.DataObject) -> None:
        derived = [p for p in self.group.pools if not p.has_allocator]
        spec = data.draw(st.sampled_from(derived))
        before = _owners(self.view())
        with pytest.raises(NoAllocator):
            self.gt.available(spec.name)
        with pytest.raises(NoAllocator):
            self.gt.alloc(spec.name, 1)
        assert _owners(self.view()) == before
        for gp in self.reserved + self.published:
            assert gp.by_pool[spec.source] is self.gt.indices(spec.name, gp)

    @invariant()
    def every_pool_conserves_its_pages(self) -> None:
        if not hasattr(self, "gt"):
            return
        found = check_group_conservation(self.view())
        if found:
            raise InvariantViolation(tuple(found), "group table step")

    @invariant()
    def metrics_count_allocating_pools_only(self) -> None:
        if not hasattr(self, "gt"):
            return
        free, used = self.gt.free_pages_by_pool(), self.gt.used_pages_by_pool()
        assert list(free) == list(used) == self.names
        assert all(free[n] + used[n] == self.gt.tables[n].capacity for n in self.names)


def _owners(view: GroupView) -> dict[str, list[int]]:
    return {n: rows.owner.tolist() for n, rows in view.pools.items()}


_profile = settings()  # the loaded profile (dev, ci or fuzz); the zoo runs this machine longer
GroupTableMachine.TestCase.settings = settings(
    _profile,
    max_examples=min(_profile.max_examples, 50)
    if _profile.max_examples < 1000
    else _profile.max_examples,
    stateful_step_count=30,
    deadline=None,
)
TestGroupTableMachine = GroupTableMachine.TestCase


# -- B09 in the zoo ----------------------------------------------------------------------------


def test_the_machine_catches_b09_and_passes_without_it() -> None:
    """B09 (a failed group reservation keeps the pools it took) is caught by the machine
    alone, naming the rollback check; the unmutated machine runs the same budget clean."""
    result = zoo.catch("B09", GroupTableMachine, [0], 1000)
    assert result.caught, "B09 escaped the group-table machine"
    assert result.failures[0].check == "I6 reserve_group_rolled_back"
    steps, error = zoo.run_seed(GroupTableMachine, 0, 1000)
    assert error is None and steps == 1000, f"the clean machine failed: {error!r}"
    assert zoo.load_machine(zoo.DEFAULT_MACHINE["B09"]).__name__ == "GroupTableMachine"
