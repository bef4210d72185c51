"""The group transfer engine on CPU, through an injected anchor -> pool pages mapping: round
trips in all four directions, per-pool I4 digests, faults per group transfer, and refusals
that issue nothing."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

import torch

from hicache.core.pages import Pages
from hicache.core.snapshot import UNSERVABLE
from hicache.core.tiers import Tier
from hicache.dataplane.engine import TransferEngine
from hicache.dataplane.faults import FaultInjector, FaultSite
from hicache.dataplane.geometry import preset
from hicache.dataplane.handles import TransferStatus
from hicache.dataplane.null import NullEngine
from hicache.errors import ConfigError, CorruptSlot, InvalidPages, TransferError
from hicache.pools.presets import group as preset_group
from hicache.pools.spec import (
    ALLOCATING,
    ANCHOR,
    SIDECAR,
    STATE,
    TRAILING_PAGES,
    PoolGroup,
    PoolSpec,
)

CAPS = {"L1": 8, "L2": 10, "L3": 12}  # anchor pages (L3: slots) per tier


class Reversed:
    """A mapping the control plane could give: the anchor maps to itself, every side pool's
    `ratio` pages of anchor page a run backwards from the top of the pool (so a side pool's
    pages never equal the anchor's, and a mix-up of the two shows)."""

    def __init__(self, group: PoolGroup) -> None:
        anchor = group.anchor
        self.anchor = anchor.name
        self.ratios = {
            p.name: anchor.page_size // p.page_size for p in group.allocating if p.backupable
        }
        self.calls: list[tuple[str, list[int]]] = []

    def __call__(self, tier: str, anchor_pages: Pages) -> Mapping[str, object]:
        self.calls.append((tier, anchor_pages.tolist()))
        out: dict[str, object] = {self.anchor: anchor_pages}
        for name, r in self.ratios.items():
            if name != self.anchor:
                own = (anchor_pages[:, None] * r + np.arange(r)).reshape(-1)
                out[name] = CAPS[tier] * r - 1 - own
        return out


def ratio_two() -> PoolGroup:
    """A group whose side pool has 2-token pages under a 4-token anchor (ratio 2), with a
    sidecar, a state pool and a request-scoped pool (left out of every tier but L1's use)."""
    return PoolGroup(
        "ratio2",
        (
            PoolSpec("kv", ANCHOR, page_size=4, layers=0),
            PoolSpec(
                "swa",
                ALLOCATING,
                hit_policy=TRAILING_PAGES,
                window_pages=2,
                page_size=2,
                layers=2,
                rows_per_layer=1,
                row_bytes=24,
            ),
            PoolSpec(
                "c4",
                SIDECAR,
                indices_from="kv",
                page_size=4,
                layers=1,
                rows_per_layer=1,
                row_bytes=40,
            ),
            PoolSpec(
                "state",
                STATE,
                indices_from="swa",
                hit_policy=TRAILING_PAGES,
                window_pages=1,
                page_size=2,
                layers=1,
                rows_per_layer=1,
                row_bytes=8,
            ),
            PoolSpec(
                "ring",
                ALLOCATING,
                hit_policy=TRAILING_PAGES,
                window_pages=1,
                page_size=4,
                layers=1,
                rows_per_layer=1,
                row_bytes=16,
                backupable=False,
            ),
        ),
    )


def make(group: PoolGroup, faults: FaultInjector | None = None) -> tuple[TransferEngine, Reversed]:
    mapping = Reversed(group)
    engine = TransferEngine(
        group,
        CAPS["L1"],
        CAPS["L2"],
        CAPS["L3"],
        pool_pages=mapping,
        device="cpu",
        io_threads=0,
        faults=faults,
    )
    engine.group_l1.tensor.random_(0, 256, generator=torch.Generator().manual_seed(7))
    return engine, mapping


@pytest.fixture(params=["dsv4-tiny", "dsv41-tiny", "mla-tiny", "ratio2"])
def engine(request: pytest.FixtureRequest) -> Iterator[TransferEngine]:
    group = ratio_two() if request.param == "ratio2" else preset_group(request.param)
    e, _ = make(group)
    yield e
    e.close()


def pages(*ids: int) -> Pages:
    return np.array(ids, dtype=np.int64)


def held(e: TransferEngine, tier: Tier, anchor: Pages) -> dict[str, torch.Tensor]:
    """Every byte pool's bytes for `anchor` pages of L1 or L2, page-major, per anchor page."""
    mapped = e.pool_pages(tier, anchor)
    pool = e.group_l1 if tier is Tier.L1 else e.group_l2
    return {
        p.name: pool.packed(p.name, mapped[p.source]).reshape(anchor.size, -1).cpu()
        for p in e.pools.pools
    }


def same(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def round_trip(e: TransferEngine) -> None:
    """L1 1,3,5 -> L2 0,2,4 -> L3 7,8,9 -> L2 6,7,8 -> L1 0,2,4, each checked on arrival."""
    original = held(e, Tier.L1, pages(1, 3, 5))
    assert e.d2h(pages(1, 3, 5), pages(0, 2, 4)).wait() is TransferStatus.DONE
    assert same(held(e, Tier.L2, pages(0, 2, 4)), original)
    assert e.h2s(pages(0, 2, 4), pages(7, 8, 9)).wait() is TransferStatus.DONE
    assert e.s2h(pages(7, 8, 9), pages(6, 7, 8)).wait() is TransferStatus.DONE
    assert same(held(e, Tier.L2, pages(6, 7, 8)), original)
    assert e.h2d(pages(6, 7, 8), pages(0, 2, 4)).wait() is TransferStatus.DONE
    assert same(held(e, Tier.L1, pages(0, 2, 4)), original)


def test_every_pool_round_trips_through_all_four_directions(engine: TransferEngine) -> None:
    round_trip(engine)
    d = engine.digests("L1", pages(1, 3, 5))
    for tier, p in (
        ("L2", pages(0, 2, 4)),
        ("L3", pages(7, 8, 9)),
        ("L2", pages(6, 7, 8)),
        ("L1", pages(0, 2, 4)),
    ):
        assert np.array_equal(engine.digests(tier, p), d), tier
    assert len(set(d.tolist())) == 3  # three different pages, three digests


def test_request_scoped_pools_are_not_moved() -> None:
    e, mapping = make(ratio_two())
    assert "ring" not in [p.name for p in e.pools.pools] and "ring" not in e.ratios
    e.d2h(pages(1), pages(2)).wait()
    assert e.ratios == {"kv": 1, "swa": 2}
    assert [t for t, _ in mapping.calls] == ["L1", "L2"]  # one mapping per side, per transfer
    e.close()
    v41, _ = make(preset_group("dsv41-tiny"))  # SGLang's V4.1 pair ring: request-scoped
    assert "pair_ring" not in [p.name for p in v41.pools.pools] + list(v41.ratios)
    v41.close()


def test_moves_use_the_mapped_pages_of_each_pool(engine: TransferEngine) -> None:
    engine.d2h(pages(1), pages(2)).wait()
    mapped = engine.pool_pages(Tier.L2, pages(2))
    for p in engine.pools.pools:
        own = engine.group_l2.packed(p.name, mapped[p.source])
        assert own.any()  # the pool's own mapped pages received the random bytes
        if p.source != "kv":  # a side pool's pages are not the anchor's
            assert not np.array_equal(mapped[p.source][:1], pages(2))


def test_a_flipped_byte_in_any_pool_changes_that_pool_and_the_group_digest(
    engine: TransferEngine,
) -> None:
    engine.d2h(pages(1, 3), pages(0, 2)).wait()
    l1 = engine.digests("L1", pages(1, 3))
    mapped = engine.pool_pages(Tier.L2, pages(2))
    for p in engine.pools.pools:
        view = engine.group_l2.bytes_view(p.name)[int(mapped[p.source][-1])]
        view[len(view) // 2] ^= 0x01  # one bit of one byte of anchor page 2's part of pool p
        per_pool = engine.pool_digests("L2", pages(0, 2))
        changed = [
            q
            for q, d in per_pool.items()
            if not np.array_equal(d, engine.pool_digests("L1", pages(1, 3))[q])
        ]
        assert changed == [p.name]
        l2 = engine.digests("L2", pages(0, 2))
        assert l2[0] == l1[0] and l2[1] != l1[1], p.name  # I4 sees it at that page only
        view[len(view) // 2] ^= 0x01
    assert np.array_equal(engine.digests("L2", pages(0, 2)), l1)


def test_an_l3_slot_of_any_pool_that_fails_its_checksum_is_unservable(
    engine: TransferEngine,
) -> None:
    engine.d2h(pages(1, 3), pages(0, 2)).wait()
    engine.h2s(pages(0, 2), pages(4, 5)).wait()
    good = engine.digests("L3", pages(4, 5))
    assert not (good == UNSERVABLE).any()
    slots = engine.pool_pages(Tier.L3, pages(5))
    for p in engine.pools.pools:
        engine.group_storage.movers[p.name].flip_byte(int(slots[p.source][0]))
        d = engine.digests("L3", pages(4, 5))
        assert d[0] == good[0] and d[1] == UNSERVABLE, p.name
        engine.group_storage.movers[p.name].flip_byte(int(slots[p.source][0]))  # flipped back


def test_completion_faults_fail_the_whole_group_transfer_once() -> None:
    faults = FaultInjector()
    e, _ = make(preset_group("dsv4-tiny"), faults)
    faults.once(FaultSite.D2H_COMPLETE)
    h = e.d2h(pages(1), pages(2))
    assert h.wait() is TransferStatus.FAILED and isinstance(h.error, TransferError)
    assert faults.reached[FaultSite.D2H_COMPLETE] == 1  # one draw for six pools
    assert e.d2h(pages(1), pages(2)).wait() is TransferStatus.DONE
    faults.once(FaultSite.H2D_COMPLETE)
    h = e.h2d(pages(2), pages(4))
    assert h.wait() is TransferStatus.FAILED and "H2D_COMPLETE" in str(h.error)
    assert e.mover.buffers_busy == 0  # the failed transfers gave their workspaces back
    e.close()


def test_delay_and_workspace_faults_per_group_transfer() -> None:
    faults = FaultInjector(delay_polls=2)
    e, _ = make(preset_group("dsv4-tiny"), faults)
    faults.once(FaultSite.DEVICE_ALLOC)  # the first transfer needs a new workspace
    h = e.d2h(pages(1), pages(2))
    assert h.poll() is TransferStatus.FAILED and "workspace" in str(h.error).lower()
    faults.once(FaultSite.DELAY)
    h = e.d2h(pages(1), pages(2))
    assert [h.poll(), h.poll(), h.poll()] == [TransferStatus.PENDING] * 2 + [TransferStatus.DONE]
    e.close()


def test_a_corrupt_side_pool_slot_fails_the_read_naming_the_anchor_slot() -> None:
    faults = FaultInjector()
    e, _ = make(preset_group("dsv4-tiny"), faults)
    e.d2h(pages(1, 3), pages(0, 2)).wait()
    faults.once(FaultSite.CORRUPT_SLOT)  # the first slot written: swa's pool slot 12-1-4 = 7
    assert e.h2s(pages(0), pages(4)).wait() is TransferStatus.DONE
    assert e.pool_pages(Tier.L3, pages(4))["swa"].tolist() == [7]
    h = e.s2h(pages(4), pages(6))
    assert h.wait() is TransferStatus.FAILED
    assert isinstance(h.error, CorruptSlot) and h.error.slots == (4,)  # the anchor slot, not 7
    assert e.h2s(pages(2), pages(5)).wait() is TransferStatus.DONE
    e.corrupt_slot(5)  # aimed: the anchor slot's first byte pool
    h = e.s2h(pages(5), pages(8))
    assert h.wait() is TransferStatus.FAILED and isinstance(h.error, CorruptSlot)
    assert h.error.slots == (5,)
    e.close()


def test_io_faults_reach_every_pool_and_fail_the_group() -> None:
    faults = FaultInjector()
    e, _ = make(preset_group("dsv4-tiny"), faults)
    e.d2h(pages(1), pages(0)).wait()
    faults.once(FaultSite.IO_EIO)
    h = e.h2s(pages(0), pages(3))
    assert h.wait() is TransferStatus.FAILED and isinstance(h.error, TransferError)
    assert faults.reached[FaultSite.IO_EIO] == len(e.pools.pools)  # a draw per pool's piece
    e.close()


BAD_ARGUMENTS = [
    (pages(8), pages(0)),  # an L1 page out of range
    (pages(1, 2), pages(0)),  # lengths differ
    (pages(1, 2), pages(3, 3)),  # a target named twice
    (np.array([1.0]), pages(0)),  # not integers
]


@pytest.mark.parametrize("source,target", BAD_ARGUMENTS)
def test_invalid_pages_are_refused_as_the_single_pool_engine_refuses_them(
    source: Pages, target: Pages
) -> None:
    e, mapping = make(preset_group("dsv4-tiny"))
    null = NullEngine(preset("tiny"), CAPS["L1"], CAPS["L2"], CAPS["L3"])
    with pytest.raises(InvalidPages) as expected:
        null.d2h(source, target)
    l2 = e.group_l2.tensor.clone()
    with pytest.raises(InvalidPages) as got:
        e.d2h(source, target)
    assert got.value.field == expected.value.field
    assert mapping.calls == [] and all(c.ops == 0 for c in e.mover.counters.values())
    assert torch.equal(e.group_l2.tensor, l2)
    e.close()


def broken(mapping: Reversed, how: str) -> Reversed:
    def call(tier: str, anchor: Pages) -> Mapping[str, object]:
        out = dict(mapping(tier, anchor))
        if how == "missing":
            del out["swa"]
        elif how == "short":
            out["swa"] = np.asarray(out["swa"])[:-1]
        elif how == "anchor":
            out["kv"] = anchor + 1
        else:
            out["swa"] = np.asarray(out["swa"]) + 100
        return out

    return call  # type: ignore[return-value]


@pytest.mark.parametrize(
    "how,field",
    [
        ("missing", "L1.pool_pages.swa"),
        ("short", "L1.pool_pages.swa"),
        ("anchor", "L1.pool_pages.kv"),
        ("range", "L1.pool_pages.swa"),
    ],
)
def test_a_mapping_that_breaks_the_contract_is_refused_with_nothing_issued(
    how: str, field: str
) -> None:
    e, mapping = make(preset_group("dsv4-tiny"))
    e.bind(broken(mapping, how))
    l2 = e.group_l2.tensor.clone()
    with pytest.raises(InvalidPages) as got:
        e.d2h(pages(1, 2), pages(3, 4))
    assert got.value.field == field
    assert all(c.ops == 0 for c in e.mover.counters.values())
    assert torch.equal(e.group_l2.tensor, l2)
    e.close()


def test_an_unbound_engine_says_to_bind_it() -> None:
    e = TransferEngine(preset_group("dsv4-tiny"), 4, 4, 4, device="cpu", io_threads=0)
    with pytest.raises(ConfigError, match="bind"):
        e.d2h(pages(0), pages(0))
    assert np.array_equal(e.digests("L1", pages()), np.zeros(0, dtype=np.uint64))
    e.close()
    e.close()  # idempotent


def test_a_one_pool_group_digests_like_its_pool() -> None:
    e, _ = make(preset_group("mla-tiny"))
    from hicache.dataplane.grouppools import pool_digest

    assert np.array_equal(e.digests("L1", pages(0, 1)), pool_digest(e.group_l1, "kv", pages(0, 1)))
    round_trip(e)
    e.close()


def test_side_pool_capacities_follow_the_control_plane_option() -> None:
    group = preset_group("dsv4-tiny")
    e = TransferEngine(
        group,
        4,
        4,
        4,
        device="cpu",
        io_threads=0,
        pool_capacities={"L2": {"swa": 9}},
        pool_pages=lambda tier, a: {"kv": a, "swa": a + (5 if tier == "L2" else 0)},
    )
    assert e.group_l2.capacity("swa") == 9 and e.group_l1.capacity("swa") == 4
    assert e.d2h(pages(0, 3), pages(1, 3)).wait() is TransferStatus.DONE  # swa L2 pages 6, 8
    assert np.array_equal(e.digests("L1", pages(0, 3)), e.digests("L2", pages(1, 3)))
    e.close()
    with pytest.raises(ConfigError) as bad:
        TransferEngine(group, 4, 4, 4, device="cpu", pool_capacities={"L2": {"c4": 9}})
    assert bad.value.field == "pool_capacities.L2"
    with pytest.raises(ConfigError) as anchor:  # the tier's own capacity, as the plane says
        TransferEngine(group, 4, 4, 4, device="cpu", pool_capacities={"L1": {"kv": 6}})
    assert anchor.value.field == "pool_capacities.L1.kv"


def test_an_h2d_whose_operand_buffer_fails_after_its_dmas_gives_everything_back() -> None:
    """A group H2D queues its DMAs before it builds and borrows its operands: when the
    operand buffer then cannot be had (PINNED_ALLOC), the transfer fails with nothing in
    flight or borrowed, L1 is untouched, and the next H2D moves its bytes."""
    faults = FaultInjector()
    e, _ = make(preset_group("dsv4-tiny"), faults)
    l1_pages, l2_pages = pages(1), pages(2)
    assert e.d2h(l1_pages, l2_pages).wait() is TransferStatus.DONE
    e.mover.operand_buffers.clear_idle()  # the next operands need a new host buffer
    target = pages(3)
    before = e.digests("L1", target)
    faults.once(FaultSite.PINNED_ALLOC)
    h = e.h2d(l2_pages, target)
    assert h.poll() is TransferStatus.FAILED and "PINNED_ALLOC" in str(h.error)
    assert e.mover.buffers_busy == 0 and e.mover.workspaces.idle >= 1
    assert e.digests("L1", target) == before, "no scatter ran"
    assert e.h2d(l2_pages, target).wait() is TransferStatus.DONE
    assert e.digests("L1", target) == e.digests("L1", l1_pages)
    e.close()
