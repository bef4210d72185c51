"""Real bytes for pool groups on CPU (torch path): per-pool geometry, L1/L2 regions and
digests, and group D2H/H2D moving every pool in one operation, bit-exact."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

import torch
from hypothesis import given
from hypothesis import strategies as st

from hicache.core.pages import Pages
from hicache.dataplane.geometry import preset
from hicache.dataplane.groupgeometry import GroupGeometry, kv_pool_spec, mla_pool_spec
from hicache.dataplane.grouppools import GroupDevicePool, GroupHostPool, group_digest, pool_digest
from hicache.dataplane.grouptransfer import GroupMover
from hicache.dataplane.pools import DevicePool, page_digest
from hicache.errors import ConfigError, InvalidPages
from hicache.pools import presets
from hicache.pools.spec import PoolGroup

CAP = {"kv": 8, "swa": 6}
L2_CAP = {"kv": 10, "swa": 7}


def dsv4_tiny() -> tuple[GroupGeometry, GroupDevicePool, GroupHostPool]:
    geometry = GroupGeometry.from_group(presets.group("dsv4-tiny"))
    l1 = GroupDevicePool(geometry, CAP, "cpu")
    l1.tensor.random_(0, 256, generator=torch.Generator().manual_seed(0))
    return geometry, l1, GroupHostPool(geometry, L2_CAP, pin=False)


def test_kv_geometry_is_the_mha_case() -> None:
    g = preset("qwen3-8b")
    pool = kv_pool_spec(g)
    assert (pool.rows_per_page, pool.row_bytes) == (g.rows_per_page, g.row_bytes)
    assert pool.bytes_per_page == g.bytes_per_page == 2_359_296


def test_mla_is_one_latent_row_per_layer() -> None:
    pool = mla_pool_spec(61, 512 + 64, "bf16", 64)
    assert pool.rows_per_page == 61
    assert pool.bytes_per_page // 64 == 61 * 576 * 2  # 70,272 bytes per token
    with pytest.raises(ConfigError, match="geometry.dtype"):
        mla_pool_spec(2, 8, "int3", 4)


def test_dsv4_anchor_holds_nothing_and_sidecars_follow_sources() -> None:
    geometry = GroupGeometry.from_group(presets.group("dsv4"))
    assert "kv" not in [p.name for p in geometry.pools]  # no bytes: no region
    assert {p.name for p in geometry.on("kv")} == {"c4", "c4_indexer", "c128"}
    assert {p.name for p in geometry.on("swa")} == {"swa", "c4_state", "c4_indexer_state"}
    assert geometry.pool("swa").bytes_per_page == 61 * 149_760
    assert geometry.bytes_per_page("kv") == 30 * 55_296 + 30 * 8_448 + 31 * 1_728
    with pytest.raises(ConfigError, match="no byte-holding pool 'kv'"):
        geometry.pool("kv")


def test_capacities_are_per_allocating_pool() -> None:
    geometry = GroupGeometry.from_group(presets.group("dsv4-tiny"))
    with pytest.raises(ConfigError, match=r"l1_pages\.swa"):
        GroupDevicePool(geometry, {"kv": 4}, "cpu")
    with pytest.raises(ConfigError, match="not allocating pools"):
        GroupHostPool(geometry, {"kv": 4, "swa": 4, "c4": 4}, pin=False)


def test_l2_page_is_one_contiguous_run_per_pool() -> None:
    geometry, l1, l2 = dsv4_tiny()
    mover = GroupMover(l1, l2, "torch")
    mover.d2h({"kv": ([3], [5]), "swa": ([2], [1])}).wait()
    for p in geometry.pools:
        page = 5 if p.source == "kv" else 1
        start = l2.arena.offsets[p.name] + page * p.bytes_per_page
        run = l2.tensor[start : start + p.bytes_per_page]
        l1_page = 3 if p.source == "kv" else 2
        # page-major: row r of the page is L1 row (r, page)
        expected = l1.region(p.name)[:, l1_page].reshape(-1)
        assert torch.equal(run, expected), p.name


def test_mha_pool_digests_like_the_single_pool() -> None:
    g = preset("tiny")
    group = GroupGeometry.from_group(PoolGroup("mha", (kv_pool_spec(g),)))
    single = DevicePool(g, 5, "cpu")
    single.tensor.view(torch.uint8).random_(0, 256, generator=torch.Generator().manual_seed(1))
    l1 = GroupDevicePool(group, {"kv": 5}, "cpu")
    l1.tensor[: single.nbytes].copy_(single.tensor.reshape(-1).view(torch.uint8))
    ids = np.array([4, 0, 2])
    assert np.array_equal(pool_digest(l1, "kv", ids), page_digest(single, ids))


Request = dict[str, tuple[Pages, Pages]]


def request_pages(rng: np.random.Generator, n_kv: int, n_swa: int) -> tuple[Request, Request]:
    d2h: Request = {}
    h2d: Request = {}
    for src, n in (("kv", n_kv), ("swa", n_swa)):
        l1 = rng.choice(CAP[src], size=2 * n, replace=False).astype(np.int64)
        l2 = rng.choice(L2_CAP[src], size=n, replace=False).astype(np.int64)
        d2h[src] = (l1[:n], l2)
        h2d[src] = (l2, l1[n:])
    return d2h, h2d


@given(st.integers(0, 4), st.integers(0, 3), st.integers(0, 2**32 - 1))
def test_round_trip_is_bit_exact_for_every_pool(n_kv: int, n_swa: int, seed: int) -> None:
    geometry, l1, l2 = dsv4_tiny()
    mover = GroupMover(l1, l2, "torch")
    d2h, h2d = request_pages(np.random.default_rng(seed), n_kv, n_swa)
    l2_before = l2.tensor.clone()
    assert mover.d2h(d2h).wait().value == "DONE"
    assert mover.h2d(h2d).wait().value == "DONE"
    written = {}
    for p in geometry.pools:
        src_l1, l2_ids = d2h[p.source]
        back = h2d[p.source][1]
        assert np.array_equal(pool_digest(l1, p.name, src_l1), pool_digest(l2, p.name, l2_ids))
        assert np.array_equal(pool_digest(l1, p.name, src_l1), pool_digest(l1, p.name, back))
        written[p.name] = set(np.asarray(l2_ids).tolist())
    for p in geometry.pools:  # every other L2 page of every pool is untouched
        view, before = l2.bytes_view(p.name), l2_before[l2.arena.offsets[p.name] :]
        others = [i for i in range(view.shape[0]) if i not in written[p.name]]
        before_pages = before[: view.numel()].view(view.shape)
        assert torch.equal(view[others], before_pages[others]), p.name
    assert mover.buffers_busy == 0


def test_a_group_h2d_queues_every_dma_before_its_first_scatter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A group H2D's DMAs need nothing from the caller: every stage's are queued before the
    operands are uploaded and the scatters launched (the copy engine starts at once); a
    D2H gathers a stage before its DMAs. On CPU, the same code as on CUDA."""
    _, l1, l2 = dsv4_tiny()
    mover = GroupMover(l1, l2, "torch")
    steps: list[str] = []
    dmas, kernels = mover._dmas, mover.kernels

    def dma(*args: Any, **kwargs: Any) -> int:
        steps.append("dma")
        return dmas(*args, **kwargs)

    class Kernels:  # the mover's GroupKernels, each stage's launch recorded
        stages, operands = staticmethod(kernels.stages), staticmethod(kernels.operands)

        @staticmethod
        def copy(*args: Any, **kwargs: Any) -> int:
            steps.append("kernel")
            return kernels.copy(*args, **kwargs)

    monkeypatch.setattr(mover, "_dmas", dma)
    monkeypatch.setattr(mover, "kernels", Kernels())
    d2h, h2d = request_pages(np.random.default_rng(1), 3, 2)
    assert mover.d2h(d2h).wait().value == "DONE"
    stages = steps.count("dma")
    assert stages > 1 and steps == ["kernel", "dma"] * stages
    steps.clear()
    assert mover.h2d(h2d).wait().value == "DONE"
    assert steps == ["dma"] * stages + ["kernel"] * stages
    for p in l1.geometry.pools:  # and the bytes arrived
        src_l1, back = d2h[p.source][0], h2d[p.source][1]
        assert np.array_equal(pool_digest(l1, p.name, src_l1), pool_digest(l1, p.name, back))


def test_derived_pools_are_skipped_without_their_source() -> None:
    geometry, l1, l2 = dsv4_tiny()
    handle = GroupMover(l1, l2, "torch").d2h({"kv": ([1, 2], [0, 1])})
    handle.wait()
    assert handle.nbytes == 2 * geometry.bytes_per_page("kv")
    for p in geometry.on("swa"):
        assert int(l2.bytes_view(p.name).count_nonzero()) == 0, p.name
    for p in geometry.on("kv"):
        assert int(l2.bytes_view(p.name)[:2].count_nonzero()) > 0, p.name


@pytest.mark.parametrize(
    "request_, field",
    [
        ({"c4": ([0], [0])}, "D2H.pools"),  # a sidecar has no pages of its own
        ({"kv": ([0], [0]), "swa": ([9], [0])}, "swa.D2H.L1_pages"),  # out of swa's L1 range
        ({"kv": ([0, 1], [3, 3])}, "kv.D2H.L2_pages"),  # a target named twice
        ({"kv": ([0, 1], [3])}, "kv.D2H.L2_pages"),  # lengths differ
    ],
)
def test_rejected_transfer_names_the_field_and_changes_nothing(
    request_: dict[str, tuple[object, object]], field: str
) -> None:
    _, l1, l2 = dsv4_tiny()
    mover = GroupMover(l1, l2, "torch")
    l1_before, l2_before = l1.tensor.clone(), l2.tensor.clone()
    with pytest.raises(InvalidPages) as info:
        mover.d2h(request_)
    assert info.value.field == field
    assert torch.equal(l1.tensor, l1_before) and torch.equal(l2.tensor, l2_before)
    assert all(c.ops == 0 for c in mover.counters.values())
    assert mover.buffers_busy == 0


def test_group_digest_sees_one_byte_of_one_pool() -> None:
    _geometry, l1, _l2 = dsv4_tiny()
    pages = {"kv": np.array([0, 1]), "swa": np.array([2])}
    before = group_digest(l1, pages)
    assert group_digest(l1, pages) == before
    region = l1.region("c4_indexer_state")  # a state pool, on swa's page 2
    region[1, 2, 0] ^= 1
    assert group_digest(l1, pages) != before
    assert group_digest(l1, {"kv": pages["kv"]}) == group_digest(l1, {"kv": pages["kv"]})


def test_empty_and_anchor_only_transfers_move_nothing() -> None:
    mla = GroupGeometry.from_group(presets.group("mla-tiny"))
    l1 = GroupDevicePool(mla, {"kv": 3}, "cpu")
    l2 = GroupHostPool(mla, {"kv": 3}, pin=False)
    handle = GroupMover(l1, l2, "torch").h2d({"kv": ([], [])})
    assert handle.poll().value == "DONE" and handle.nbytes == 0


def test_bench_preset_quick_runs_on_cpu_and_checks_every_pool(tmp_path: object) -> None:
    import json
    import os

    from hicache.bench import transfer

    out = str(tmp_path)
    assert transfer.main(["--preset", "dsv4,mla", "--quick", "--repeats", "1", "--out", out]) == 0
    with open(os.path.join(out, "multipool.json"), encoding="utf-8") as f:
        rows = json.load(f)["rows"]
    assert {r["preset"] for r in rows} == {"dsv4-tiny", "mla-tiny"}
    assert {r["direction"] for r in rows} == {"D2H", "H2D"}
    dsv4 = [r for r in rows if r["preset"] == "dsv4-tiny"]
    assert all(len(r["bytes_ok"]) == 6 and all(r["bytes_ok"].values()) for r in dsv4)
    assert transfer.main(["--preset", "dsv5", "--quick", "--out", out]) == 2


def test_group_storage_round_trip_keys_slots_by_pool() -> None:
    from hicache.dataplane.groupstorage import GroupStorageMover

    geometry, l1, l2 = dsv4_tiny()
    GroupMover(l1, l2, "torch").d2h({"kv": ([1, 2, 3], [0, 1, 2]), "swa": ([4], [3])}).wait()
    storage = GroupStorageMover(l2, {"kv": 4, "swa": 5}, io_threads=0)
    try:
        h2s = storage.h2s({"kv": ([0, 1, 2], [3, 0, 1]), "swa": ([3], [4])})
        assert h2s.wait().value == "DONE" and set(h2s.parts) == {p.name for p in geometry.pools}
        l2_before = l2.tensor.clone()
        with pytest.raises(InvalidPages, match="holds no written page"):  # slot 2 never written
            storage.s2h({"kv": ([3, 2], [5, 6])})
        assert torch.equal(l2.tensor, l2_before)  # rejected: nothing issued
        s2h = storage.s2h({"kv": ([3, 0, 1], [7, 8, 9]), "swa": ([4], [6])})
        assert s2h.wait().value == "DONE"
        for p in geometry.pools:
            a, b = (
                (np.array([0, 1, 2]), np.array([7, 8, 9]))
                if p.source == "kv"
                else (np.array([3]), np.array([6]))
            )
            assert np.array_equal(pool_digest(l2, p.name, a), pool_digest(l2, p.name, b)), p.name
    finally:
        storage.close()


def test_one_failed_pool_fails_the_group_storage_transfer() -> None:
    from hicache.dataplane.groupstorage import GroupStorageMover

    _, _, l2 = dsv4_tiny()
    storage = GroupStorageMover(l2, {"kv": 4, "swa": 5}, io_threads=0)
    try:
        handle = storage.h2s({"kv": ([0, 1], [0, 1]), "swa": ([2], [2])})
        handle.parts["c128"].fail()
        assert handle.wait().value == "FAILED" and handle.error is not None
        assert all(p.status.final for p in handle.parts.values())
    finally:
        storage.close()
