"""Pool groups: the presets of spec/pools.toml load as stated, and every group rule of
spec/pools.md refuses a group that breaks it, naming the field."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hicache.dataplane.geometry import preset as geometry
from hicache.errors import ConfigError
from hicache.pools import (
    ALL_PAGES,
    ALLOCATING,
    ANCHOR,
    SIDECAR,
    STATE,
    TRAILING_PAGES,
    PoolGroup,
    PoolSpec,
    group,
    names,
)
from hicache.pools.presets import read_presets, structure
from hicache.spec import POOLS_TOML

KV = PoolSpec("kv", page_size=4, layers=0, rows_per_layer=1)
SWA = PoolSpec(
    "swa", ALLOCATING, hit_policy=TRAILING_PAGES, window_pages=2, page_size=4, row_bytes=8
)


def sidecar(name: str, source: str = "kv", **changes: Any) -> PoolSpec:
    """A valid sidecar on `source`, then `changes` (which may break a rule)."""
    base = PoolSpec(name, SIDECAR, indices_from=source, page_size=4, row_bytes=8)
    return dataclasses.replace(base, **changes)


def state(name: str, source: str = "swa", **changes: Any) -> PoolSpec:
    """A valid state pool on `source`, then `changes` (which may break a rule)."""
    base = PoolSpec(
        name,
        STATE,
        indices_from=source,
        hit_policy=TRAILING_PAGES,
        window_pages=1,
        page_size=4,
        row_bytes=8,
    )
    return dataclasses.replace(base, **changes)


@contextlib.contextmanager
def refused(field: str) -> Iterator[None]:
    """The block raises the ConfigError a broken rule raises, naming exactly `field`."""
    with pytest.raises(ConfigError) as raised:
        yield
    assert raised.value.field == field, str(raised.value)


# -- the presets -------------------------------------------------------------------------


def test_presets_are_the_four_groups_and_their_tiny_variants() -> None:
    assert names() == (
        "mha",
        "mha-tiny",
        "mla",
        "mla-tiny",
        "dsv4",
        "dsv4-tiny",
        "dsv41",
        "dsv41-tiny",
    )


def test_unknown_preset_names_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"pools\.preset: unknown preset 'dsv5'.*dsv4-tiny"):
        group("dsv5")


def test_dsv4_is_seven_pools_with_their_roles_and_sources() -> None:
    g = group("dsv4")
    shape = [(p.name, p.role, p.source, p.hit_policy) for p in g.pools]
    assert shape == [
        ("kv", ANCHOR, "kv", ALL_PAGES),
        ("swa", ALLOCATING, "swa", TRAILING_PAGES),
        ("c4", SIDECAR, "kv", ALL_PAGES),
        ("c4_indexer", SIDECAR, "kv", ALL_PAGES),
        ("c128", SIDECAR, "kv", ALL_PAGES),
        ("c4_state", STATE, "swa", TRAILING_PAGES),
        ("c4_indexer_state", STATE, "swa", TRAILING_PAGES),
    ]
    assert g.anchor.bytes_per_page == 0
    assert [p.name for p in g.allocating] == ["kv", "swa"]
    assert [p.name for p in g.derived("swa")] == ["c4_state", "c4_indexer_state"]


def test_dsv4_measured_sizes_are_not_guesses() -> None:
    g = group("dsv4")
    measured = {
        "swa": (61, 149_760),
        "c128": (31, 1_728),
        "c4_state": (30, 65_536),
        "c4_indexer_state": (30, 16_384),
    }
    for name, (layers, row_bytes) in measured.items():
        p = g.pool(name)
        assert (p.layers, p.row_bytes, p.page_size) == (layers, row_bytes, 256)
        assert not {"layers", "row_bytes"} & set(p.guesses), name
    assert {"row_bytes"} <= set(g.pool("c4").guesses)


def test_dsv41_has_six_sidecars_no_state_pool_and_a_request_scoped_ring() -> None:
    g = group("dsv41")
    assert [p.name for p in g.derived("kv")] == [
        "c1",
        "c1_indexer",
        "c1_indexer_scale",
        "c2",
        "c2_indexer",
        "c2_indexer_scale",
    ]
    assert not [p for p in g.pools if p.role == STATE]
    assert [p.name for p in g.pools if not p.backupable] == ["pair_ring"]
    assert "pair_ring" not in [p.name for p in g.backup_pools()]
    assert all(p.upstream == f"deepseek_v4_{p.name}" for p in g.derived("kv"))


def test_mla_is_one_latent_row_per_layer() -> None:
    p = group("mla").anchor
    assert (p.layers, p.rows_per_layer, p.row_bytes) == (61, 1, p.page_size * (512 + 64) * 2)
    assert p.bytes_per_page // p.page_size == 70_272  # B a token


@pytest.mark.parametrize(("pool_preset", "kv_preset"), [("mha", "qwen3-8b"), ("mha-tiny", "tiny")])
def test_mha_matches_the_kv_geometry(pool_preset: str, kv_preset: str) -> None:
    p, geo = group(pool_preset).anchor, geometry(kv_preset)
    assert (p.page_size, p.layers, p.rows_per_layer, p.row_bytes) == (
        geo.page_size,
        geo.layers,
        2,
        geo.row_bytes,
    )
    assert group(pool_preset).bytes_per_anchor_page == geo.bytes_per_page


@pytest.mark.parametrize("base", ["mha", "mla", "dsv4", "dsv41"])
def test_tiny_variant_has_the_same_structure_at_cpu_size(base: str) -> None:
    real, tiny = group(base), group(base + "-tiny")
    assert structure(real) == structure(tiny)
    assert all(p.page_size <= 4 and p.layers <= 2 and p.row_bytes <= 512 for p in tiny.pools)
    assert not any(p.guesses for p in tiny.pools)


def test_tiny_variant_of_another_structure_does_not_load(tmp_path: Path) -> None:
    text = POOLS_TOML.read_text(encoding="utf-8")
    block = text.index('[[presets.dsv4-tiny.pools]]\nname = "c128"')
    c128 = (
        text[block:]
        .replace('role = "sidecar"', 'role = "state"', 1)
        .replace(  # c128 only
            'indices_from = "kv"\nhit_policy = "ALL_PAGES"\nwindow_pages = 0\npage_size = 4\n'
            "layers = 1",
            'indices_from = "swa"\nhit_policy = "TRAILING_PAGES"\nwindow_pages = 1\npage_size = 4\n'
            "layers = 1",
            1,
        )
    )
    (tmp_path / "pools.toml").write_text(text[:block] + c128, encoding="utf-8")
    with refused("presets.dsv4-tiny.pools"):
        read_presets(tmp_path / "pools.toml")


def test_pool_row_missing_or_unknown_field_does_not_load(tmp_path: Path) -> None:
    text = POOLS_TOML.read_text(encoding="utf-8")
    (tmp_path / "a.toml").write_text(text.replace('upstream = ""\n', "", 1), encoding="utf-8")
    with refused("presets.mha.pools[0].upstream"):
        read_presets(tmp_path / "a.toml")
    (tmp_path / "b.toml").write_text(
        text.replace('upstream = ""\n', 'upstream = ""\ndtype = "bf16"\n', 1), encoding="utf-8"
    )
    with refused("presets.mha.pools[0].dtype"):
        read_presets(tmp_path / "b.toml")


# -- the group rules, one test each ----------------------------------------------------------


def test_valid_group_builds() -> None:
    g = PoolGroup("g", (KV, SWA, sidecar("c4"), state("c4_state")))
    assert [p.name for p in g.allocating] == ["kv", "swa"]


def test_two_anchors() -> None:
    with refused("presets.g.pools"):
        PoolGroup("g", (KV, PoolSpec("kv2", page_size=4)))


def test_duplicate_pool_names() -> None:
    with refused("presets.g.pools"):
        PoolGroup("g", (KV, sidecar("c4"), sidecar("c4")))


def test_sidecar_whose_source_is_missing() -> None:
    with refused("presets.g.c4.indices_from"):
        PoolGroup("g", (KV, sidecar("c4", source="full")))


def test_sidecar_on_a_derived_pool() -> None:
    with refused("presets.g.c4b.indices_from"):
        PoolGroup("g", (KV, sidecar("c4"), sidecar("c4b", source="c4")))


def test_state_pool_with_its_own_indices() -> None:
    with refused("pools.c4_state.indices_from"):
        PoolSpec("c4_state", STATE, hit_policy=TRAILING_PAGES, window_pages=1)
    with refused("pools.c4_state.indices_from"):
        PoolSpec(
            "c4_state", STATE, indices_from="c4_state", hit_policy=TRAILING_PAGES, window_pages=1
        )


def test_allocating_pool_with_another_pools_indices() -> None:
    with refused("pools.swa.indices_from"):
        PoolSpec("swa", ALLOCATING, indices_from="kv")


def test_state_pool_on_the_anchor() -> None:
    with refused("presets.g.c4_state.indices_from"):
        PoolGroup("g", (KV, SWA, state("c4_state", source="kv")))


def test_derived_page_size_differs_from_its_source() -> None:
    with refused("presets.g.c4_state.page_size"):
        PoolGroup("g", (KV, SWA, state("c4_state", page_size=8)))
    with refused("presets.g.c4.page_size"):
        PoolGroup("g", (KV, sidecar("c4", page_size=2)))


def test_allocating_page_size_must_divide_the_anchors() -> None:
    with refused("presets.g.swa.page_size"):
        PoolGroup("g", (KV, dataclasses.replace(SWA, page_size=3)))


def test_window_exactly_for_trailing_pages() -> None:
    with refused("pools.c4.window_pages"):
        sidecar("c4", window_pages=2)
    with refused("pools.c4_state.window_pages"):
        state("c4_state", window_pages=0)


def test_anchor_must_be_backupable() -> None:
    with refused("presets.g.kv.backupable"):
        PoolGroup("g", (dataclasses.replace(KV, backupable=False),))


def test_derived_pool_of_a_request_scoped_source_is_request_scoped() -> None:
    ring = dataclasses.replace(SWA, name="ring", backupable=False)
    with refused("presets.g.ring_state.backupable"):
        PoolGroup("g", (KV, ring, state("ring_state", source="ring")))
    PoolGroup("g", (KV, ring, state("ring_state", source="ring", backupable=False)))


def test_trailing_window_larger_than_the_pool() -> None:
    g = PoolGroup("g", (KV, SWA, state("c4_state", window_pages=1)))
    g.check_capacity({"kv": 8, "swa": 2})
    with refused("presets.g.swa.window_pages"):
        g.check_capacity({"kv": 8, "swa": 1})
    g3 = PoolGroup(
        "g", (KV, dataclasses.replace(SWA, window_pages=1), state("c4_state", window_pages=3))
    )
    with refused("presets.g.c4_state.window_pages"):  # a derived pool's window: its source's pages
        g3.check_capacity({"kv": 8, "swa": 2})


def test_capacity_for_every_allocating_pool_and_no_other() -> None:
    g = PoolGroup("g", (KV, SWA, sidecar("c4")))
    with refused("presets.g.swa.capacity_pages"):
        g.check_capacity({"kv": 8})
    with refused("presets.g.kv.capacity_pages"):
        g.check_capacity({"kv": 0, "swa": 4})
    with refused("presets.g.c4.capacity_pages"):
        g.check_capacity({"kv": 8, "swa": 4, "c4": 8})


def test_preset_windows_fit_their_tiny_capacity() -> None:
    group("dsv4-tiny").check_capacity({"kv": 8, "swa": 2})
    with refused("presets.dsv4-tiny.swa.window_pages"):
        group("dsv4-tiny").check_capacity({"kv": 8, "swa": 1})


def test_non_backupable_pool_on_a_backup_path() -> None:
    g = group("dsv41-tiny")
    with refused("presets.dsv41-tiny.pair_ring.backupable"):
        g.backup_pools(["kv", "swa", "pair_ring"])
    assert [p.name for p in g.backup_pools(["swa", "kv"])] == ["kv", "swa"]  # table order
    with refused("presets.dsv41-tiny"):
        g.backup_pools(["kv", "c4"])


def test_backupable_must_be_a_boolean() -> None:
    with refused("pools.kv.backupable"):
        PoolSpec("kv", backupable=1)  # type: ignore[arg-type]
