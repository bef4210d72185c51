"""The group data plane in the controller: CacheConfig.pools selects it (mha stays the
single-pool TransferEngine), the group producer writes every pool from the token prefix, the
verifier and I4 compare pool by pool, and `hicache demo --preset` serves with 0 violations."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

import torch

from hicache.app import demo, demo_serve
from hicache.controller.config import CacheConfig
from hicache.controller.controller import CacheController
from hicache.controller.planes import choose_plane, tier_pool_pages
from hicache.controller.verify import RestoreMismatch, RestoreVerifier
from hicache.core.pages import Pages
from hicache.core.tiers import Tier
from hicache.dataplane.engine import TransferEngine
from hicache.dataplane.geometry import preset
from hicache.errors import ConfigError, ProducerError
from hicache.invariants import check_all
from hicache.pools.presets import group as preset_group
from hicache.pools.spec import ALLOCATING, ANCHOR, TRAILING_PAGES, PoolGroup, PoolSpec
from hicache.producers import GroupSyntheticProducer, SyntheticProducer

TOKENS = list(range(100, 116))  # 16 tokens: 4 anchor pages of 4


def same_index(tier: str, anchor: Pages) -> dict[str, object]:
    return {"kv": anchor, "swa": anchor}


def group_engine(name: str = "dsv4-tiny") -> tuple[TransferEngine, GroupSyntheticProducer]:
    e = TransferEngine(
        preset_group(name), 8, 8, 8, pool_pages=same_index, device="cpu", io_threads=0
    )
    return e, GroupSyntheticProducer(e, preset("tiny"))


def test_mha_keeps_the_single_pool_engine_and_a_group_name_selects_the_group_engine() -> None:
    mha = choose_plane(CacheConfig(device="cpu"), None, None, None)
    assert mha.byte_plane is mha.engine and mha.byte_plane.one_pool  # the fast path
    assert type(mha.producer) is SyntheticProducer
    assert CacheConfig().pools == "mha" and CacheConfig().group.typed == preset("tiny").typed
    mha.engine.close()
    group = choose_plane(CacheConfig(device="cpu", pools="dsv4-tiny"), None, None, None)
    assert group.byte_plane is group.engine and not group.byte_plane.one_pool
    assert isinstance(group.producer, GroupSyntheticProducer)
    assert isinstance(group.verifier, RestoreVerifier)
    group.engine.close()


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"pools": "dsv9"}, "pools"),
        ({"pools": "dsv4-tiny", "geometry": "qwen3-8b"}, "pools"),  # 16-token pages, anchor 4
        ({"pools": "mla-tiny", "l3_path": "/tmp/x"}, "l3_path"),
    ],
)
def test_a_bad_group_config_names_its_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as e:
        CacheConfig(**kwargs)
    assert e.value.field == field


def test_a_group_plane_refuses_a_single_pool_producer() -> None:
    config = CacheConfig(device="cpu", pools="mla-tiny")
    with pytest.raises(ConfigError) as e:
        choose_plane(config, None, SyntheticProducer(config.kv), None)
    assert e.value.field == "producer"


def test_the_producer_writes_every_pool_from_the_prefix_alone() -> None:
    e, producer = group_engine()
    new = np.array([5, 1, 6, 2], dtype=np.int64)
    producer.produce(TOKENS, 0, 16, e.l1_arena, np.zeros(0, np.int64), new)
    expected = producer.expected_pools(TOKENS, 0, 16)
    other = producer.expected_pools([99, *TOKENS[1:]], 0, 16)  # one token differs: the first
    firsts = set()
    for p in e.pools.pools:
        got = e.group_l1.packed(p.name, new).reshape(4, -1)
        assert torch.equal(got, expected[p.name]), p.name
        assert (expected[p.name] != other[p.name]).any(dim=1).all(), p.name  # every page changes
        firsts.add(bytes(expected[p.name][0, :8].tolist()))
    assert len(firsts) == len(e.pools.pools)  # no two pools hold the same bytes
    assert torch.equal(producer.expected(TOKENS, 0, 16), torch.cat(list(expected.values()), dim=1))
    e.close()


def test_the_producer_refuses_bad_arguments_writing_nothing() -> None:
    e, producer = group_engine()
    before = e.l1_arena.clone()
    with pytest.raises(ProducerError, match="l1"):
        producer.produce(TOKENS, 0, 16, before, np.zeros(0, np.int64), np.arange(4))
    with pytest.raises(ProducerError, match="new_pages"):
        producer.produce(TOKENS, 0, 16, e.l1_arena, np.zeros(0, np.int64), np.array([1, 1, 2, 3]))
    with pytest.raises(ProducerError, match="range"):
        producer.produce(TOKENS, 0, 6, e.l1_arena, np.zeros(0, np.int64), np.arange(2))
    assert torch.equal(e.l1_arena, before)
    e.close()


def test_the_verifier_catches_a_flipped_byte_in_any_pool() -> None:
    e, producer = group_engine()
    new = np.array([3, 4], dtype=np.int64)
    producer.produce(TOKENS, 8, 16, e.l1_arena, np.arange(2), new)
    verifier = RestoreVerifier(producer, e)
    assert verifier.verify(TOKENS, 8, 16, new) == 2
    assert verifier.bytes_checked == {p.name: 2 * p.bytes_per_page for p in e.pools.pools}
    for p in e.pools.pools:
        region = e.group_l1.region(p.name)  # [rows, pages, row_bytes]
        region[-1, 4, 0] ^= 0x80
        with pytest.raises(RestoreMismatch, match=f"pool {p.name}: .*anchor pages \\[4\\]"):
            verifier.verify(TOKENS, 8, 16, new)
        region[-1, 4, 0] ^= 0x80
    e.close()


def serve(ctl: CacheController, rid: int, tokens: list[int]) -> None:
    ctl.admit(rid, tokens)
    while not ctl.ready(rid):
        ctl.tick()
    ctl.prefill(rid)
    ctl.finish(rid)


@pytest.mark.parametrize("name", ["dsv4-tiny", "mla-tiny"])
def test_i4_in_the_controller_compares_every_pool(name: str) -> None:
    ctl = CacheController(
        CacheConfig(
            device="cpu",
            pools=name,
            l1_pages=16,
            l2_pages=16,
            l3_slots=16,
            io_threads=0,
            check_mode="off",
        )
    )
    serve(ctl, 1, TOKENS)
    ctl.drain()
    plane = ctl.byte_plane
    ctl.cp.digests = plane.digests  # uncached: the flips below happen behind the tables' back
    assert check_all(ctl.cp.snapshot()) == []
    for p in plane.pools.pools:
        view = plane.group_l2.bytes_view(p.name)
        view[:, -1] ^= 0x01  # one byte of every L2 page of this pool only
        found = check_all(ctl.cp.snapshot())
        assert [v.invariant for v in found] == ["I4"] and found[0].tier == "L2", p.name
        view[:, -1] ^= 0x01
    assert check_all(ctl.cp.snapshot()) == []
    assert ctl.transfer_engine is plane and not plane.one_pool
    with pytest.raises(ConfigError, match="single-pool engine"):
        _ = plane.l3  # a group's L3 is a file per pool (`group_storage`)
    ctl.close()


def test_tier_pool_pages_asks_the_tables_and_refuses_what_it_cannot_map() -> None:
    class Tables:
        def __init__(self, tier: str) -> None:
            self.tier = tier

        def pool_pages(self, anchor: Pages) -> dict[str, object]:
            return {"kv": anchor, "swa": anchor + 10, "tier": self.tier}

    mapping = tier_pool_pages(preset_group("dsv4-tiny"), [Tables("1"), Tables("2"), Tables("3")])
    assert mapping("L2", np.array([1]))["tier"] == "2"
    single = tier_pool_pages(preset_group("dsv4-tiny"), [object(), object(), object()])
    assert {k: list(v) for k, v in single("L3", np.array([4])).items()} == {"kv": [4], "swa": [4]}  # type: ignore[call-overload]
    ratio2 = PoolGroup(
        "r2",
        (
            PoolSpec("kv", ANCHOR, page_size=4, layers=0),
            PoolSpec(
                "swa",
                ALLOCATING,
                hit_policy=TRAILING_PAGES,
                window_pages=1,
                page_size=2,
                layers=1,
                rows_per_layer=1,
                row_bytes=8,
            ),
        ),
    )
    with pytest.raises(ConfigError, match="TierPools"):
        tier_pool_pages(ratio2, [object(), object(), object()])


def run_demo(tmp_path: Path, *args: str) -> dict[str, Any]:
    path = tmp_path / "demo.json"
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert demo.main([*args, "--quiet", "--json", str(path)]) == 0
    assert "verified bytes by pool" in out.getvalue()
    summary: dict[str, Any] = json.loads(path.read_text())
    return summary


@pytest.mark.torch
@pytest.mark.parametrize("name", ["dsv4-tiny", "mla-tiny", "dsv41-tiny"])
def test_the_demo_serves_a_group_with_every_pool_verified(tmp_path: Path, name: str) -> None:
    s = run_demo(tmp_path, "--preset", name, "--requests", "80", "--io-threads", "0")
    assert s["invariants"]["violations"] == 0 and s["invariants"]["run"] > 0
    assert s["verified_pages"] > 0 and s["restores"] > 0
    pools = [p.name for p in preset_group(name).pools if p.bytes_per_page and p.backupable]
    assert sorted(s["verified_pool_bytes"]) == sorted(pools)
    assert all(n > 0 for n in s["verified_pool_bytes"].values())
    assert s["config"]["preset"].startswith(f"{name}: {len(pools)} byte pools")
    assert Tier.L3.value in s["tiers"]


def test_freed_windows_on_the_byte_plane_are_skipped_by_i4_and_whole_again_once_revived() -> None:
    """Real bytes with L1 windows short (`l1_window_pages`): make-room frees windows; an L1
    page without its window digests UNSERVABLE (I4 skips that copy, not a whole group) and
    its generation moves, so I4's digest cache cannot serve the whole group's old digest;
    a request that recomputes the prompt revives the window, and the page digests as its L2
    copy again. Before: the engine mapped the TOMBSTONE entries as page numbers (InvalidPages
    on a digest miss) and the cache kept the whole group's digest."""
    cfg = CacheConfig(
        geometry="tiny",
        device="cpu",
        l1_pages=12,
        l2_pages=32,
        l3_slots=64,
        policy="always",
        pools="dsv4-tiny",
        l1_window_pages=6,
        check_mode="every",
        io_threads=0,
    )
    ctl = CacheController(cfg)
    try:
        prompt = list(range(100, 117))  # 4 whole pages and a tail
        serve(ctl, 1, prompt)
        ctl.drain()  # backed up: L1, L2 and L3 hold it
        node = ctl.cp.tree.match(prompt[:16], split=False, touch=False).path[-1]
        pages_l1 = node.value[0]
        digests = ctl.cp.digests
        assert pages_l1 is not None and ctl.cp.holds(node, Tier.L2) and digests is not None
        whole = digests("L1", pages_l1).copy()
        ctl.cp.tombstone(node)
        assert (digests("L1", pages_l1) == np.iinfo(np.uint64).max).all()
        assert check_all(ctl.cp.snapshot()) == []
        serve(ctl, 2, prompt[:8] + [900 + i for i in range(9)])  # shares the first 2 pages
        head = ctl.cp.tree.match(prompt[:8], split=False, touch=False).path[-1]  # split off
        assert ctl.cp.windows.freed(head) is False  # revived by request 2's recomputed copy
        assert ctl.cp.windows.freed(node) is True  # the other half: nobody recomputed it
        assert head.value[0] is not None and head.value[0].tolist() == pages_l1[:2].tolist()
        assert digests("L1", head.value[0]).tolist() == whole[:2].tolist()
        assert check_all(ctl.cp.snapshot()) == []
    finally:
        ctl.close()


@pytest.mark.parametrize("name", ["dsv4-tiny", "dsv41-tiny"])
def test_bytes_per_anchor_page_in_all_is_the_width_the_producer_writes_and_both_commands_say_it(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`hicache pools` gave 88 B per anchor page for dsv4-tiny (the anchor's indices only) and
    the demo 280 (every byte pool) under the same words; dsv41-tiny's request-scoped ring
    counted in neither the same way. Now both print both figures, named."""
    from hicache.pools import command

    g = preset_group(name)
    made = choose_plane(CacheConfig(device="cpu", pools=name), None, None, None)
    try:
        assert isinstance(made.producer, GroupSyntheticProducer)
        width = made.producer.expected(TOKENS, 0, len(TOKENS)).shape[1]
    finally:
        made.engine.close()
    assert width == g.value_bytes_per_anchor_page > g.bytes_per_anchor_page
    said = f"{width:,} B per anchor page in all, {g.bytes_per_anchor_page:,} on kv's indices"
    assert command.main([]) == 0
    assert said in next(
        ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(name + " ")
    )
    assert said in demo_serve._preset_echo(CacheConfig(device="cpu", pools=name))


def test_a_group_whose_anchor_page_no_geometry_preset_has_says_what_can_run() -> None:
    """`demo --preset dsv4` said "choose a geometry of the anchor's page size", which no
    --geometry offers (256-token pages); the advice is now one the CLI or Python can follow."""
    from hicache.dataplane.geometry import KVGeometry

    with pytest.raises(ConfigError) as refused:
        CacheConfig(device="cpu", pools="dsv4")
    why = str(refused.value)
    assert "no geometry preset has 256-token pages" in why and "dsv4-tiny" in why
    assert "KVGeometry(page_size=256" in why
    with pytest.raises(ConfigError, match="choose --geometry tiny"):
        CacheConfig(device="cpu", geometry="qwen3-8b", pools="dsv4-tiny")
    # The Python way it names builds and runs a controller.
    geo = KVGeometry(layers=2, kv_heads=2, head_dim=16, dtype="fp32", page_size=256)
    ctl = CacheController(
        CacheConfig(geometry=geo, pools="dsv4", l1_pages=4, l2_pages=4, l3_slots=4, device="cpu")
    )
    ctl.close()
