"""A single pool is a group of one (issue 34): `TierTable`, a single pool's tier table, answers
the group interface `TierPools` answers, so that no caller outside hicache/pools/ asks which
kind it holds (tests/test_layering.py holds that)."""

from __future__ import annotations

import pytest

from hicache.core.control import ControlPlane
from hicache.core.pages import FREE, PRIVATE, TREE, PageTable, pages
from hicache.errors import ConfigError, OutOfPages
from hicache.pools.presets import SINGLE_POOL, group
from hicache.pools.table import InjectedShortage
from hicache.pools.tierpools import TierPools, tier_tables
from hicache.pools.tiertable import SINGLE_POOL_NAME, TierTable

DSV4 = group("dsv4-tiny")


def test_the_single_pool_is_named_as_the_single_pool_presets_anchor() -> None:
    assert SINGLE_POOL_NAME == group(SINGLE_POOL).anchor.name
    assert TierTable("L1", 4).pool == SINGLE_POOL_NAME


def test_a_single_pool_answers_as_a_group_of_one() -> None:
    t = TierTable("L2", 6, "kv")
    p = t.reserve(2)
    t.publish(p)
    assert t.pools == ("kv",)
    assert t.group_name == ""
    assert dict(t.pool_tables()) == {"kv": t}
    assert t.free_pages_by_pool() == {"kv": 4} and t.free_count == 4
    assert dict(t.held_by) == {} and t.window == ()
    assert t.window_present(p).tolist() == [True, True]
    assert t.window_present(pages()).tolist() == []
    assert t.pool_views() == () and t.side_key() == ()


def test_a_group_of_several_pools_answers_the_same_questions() -> None:
    t = TierPools("L1", DSV4, {"kv": 4, "swa": 4})
    assert t.pools == tuple(p.name for p in DSV4.backed_up().pools)
    assert t.pool == "kv" and t.group_name == DSV4.name
    assert set(t.pool_tables()) == {"kv", "swa"}
    assert t.pool_tables()["kv"].owner is t.owner  # the anchor's own table
    assert t.free_pages_by_pool() == {name: 4 for name in t.pool_tables()}
    assert [v.pool for v in t.pool_views()] == list(t.held_by)
    assert [k[0] for k in t.side_key()] == list(t.held_by)  # type: ignore[index]


def test_a_single_pool_table_is_todays_page_table() -> None:
    """The same transitions and allocator: equal calls leave equal owner and generation
    arrays in a `PageTable` and a `TierTable`."""
    plain, table = PageTable("L1", 16), TierTable("L1", 16)
    for t in (plain, table):
        a = t.reserve(3)
        b = t.reserve(5)
        t.publish(a)
        t.release(b)
        t.reserve_exact(pages([15]))
        t.free(a)
        t.reserve(4)
    assert plain.owner.tolist() == table.owner.tolist()
    assert plain.generation.tolist() == table.generation.tolist()


def test_the_reserve_fault_is_asked_first_and_changes_nothing() -> None:
    t = TierTable("L2", 4)
    asked: list[str] = []

    def fault(pool: str) -> bool:
        asked.append(pool)
        return True

    t.set_reserve_fault(fault)
    owner = t.owner.copy()
    with pytest.raises(InjectedShortage, match="L2"):
        t.reserve(2)
    assert asked == ["kv"] and t.owner.tolist() == owner.tolist()
    assert t.reserve(0).size == 0 and asked == ["kv"]  # nothing to run out of: not asked
    with pytest.raises(InjectedShortage):
        t.reserve(9)  # asked before the shortage, as a group asks
    t.set_reserve_fault(None)
    with pytest.raises(OutOfPages) as e:
        t.reserve(9)
    assert not isinstance(e.value, InjectedShortage)
    assert t.reserve(4).size == 4


def test_a_groups_reserve_fault_is_its_group_tables() -> None:
    t = TierPools("L2", DSV4, {"kv": 4, "swa": 4})
    t.set_reserve_fault(lambda pool: pool == "swa")
    with pytest.raises(InjectedShortage, match="L2.swa"):
        t.reserve(1)
    assert t.free_pages_by_pool() == {"kv": 4, "swa": 4}  # the anchor's rolled back


def test_a_clone_keeps_the_class_and_its_pool() -> None:
    t = TierTable("L1", 4, "latent")
    t.publish(t.reserve(1))
    c = t.clone()
    assert type(c) is TierTable and c.pool == "latent" and c.pools == ("latent",)
    c.reserve(1)
    assert t.count(PRIVATE) == 0 and c.count(PRIVATE) == 1 and c.count(TREE) == 1


def test_tier_tables_name_the_single_pool_after_the_groups_anchor() -> None:
    assert {t.pool for t in tier_tables(["L1", "L2"], [4, 4], 16)} == {SINGLE_POOL_NAME}
    mla = group("mla-tiny")
    tables = tier_tables(["L1"], [4], mla.anchor.page_size, mla)
    assert [type(t) for t in tables] == [TierTable] and tables[0].pool == mla.anchor.name
    with pytest.raises(ConfigError, match="pool"):
        TierTable("L1", 4, "")


def test_a_single_pool_planes_records_name_no_group() -> None:
    """What names a group stays empty for a group of one: the header's pools, usage's
    per-pool counts, the snapshot's side pools, the state key's side part."""
    cp = ControlPlane(4, (4, 4, 4))
    assert cp.trace_header().pools == {}
    assert not any(k.startswith("free.") for k in cp.usage("L1"))
    assert all(v.pools == () for v in cp.snapshot().tiers.values())
    assert all(t.side_key() == () for t in cp.tables)
    assert int(cp.tables[0].owner[0]) == FREE
