"""Group transfer kernels: the row table against an obvious loop, and the Triton modes (row
table, one launch per pool) against torch, bit-exact, in Triton's interpreter on CPU (tiny
groups: the interpreter runs every program in Python). GPU tests (`gpu` marker) compile them.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")
pytest.importorskip("triton", reason="runs the Triton kernels: pip install -e '.[gpu]'")

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hicache.dataplane import groupkernels
from hicache.dataplane.groupgeometry import GroupGeometry
from hicache.dataplane.grouppools import GroupDevicePool, GroupHostPool
from hicache.dataplane.grouptransfer import GroupMover
from hicache.errors import BackendError, ConfigError
from hicache.kernels.row_table import (
    Segment,
    TableConfig,
    build_table,
    copy_table_torch,
    unit_bytes_for,
)
from hicache.pools import presets
from tests.test_kernels import compiled, interpreted  # noqa: F401  (the fixtures, shared)

GPU = "cuda" if torch.cuda.is_available() else "cpu"


@given(
    st.lists(
        st.tuples(st.integers(1, 3), st.sampled_from([3, 8, 16, 40]), st.integers(0, 3)),
        min_size=1,
        max_size=3,
    ),
    st.sampled_from([16, 32]),
    st.integers(0, 2**32 - 1),
)
@settings(max_examples=40)
def test_row_table_copies_every_row_once(
    pools: list[tuple[int, int, int]], piece: int, seed: int
) -> None:
    """copy_table_torch over build_table == a loop over (pool, page, row) copying bytes."""
    rng = np.random.default_rng(seed)
    side = torch.from_numpy(rng.integers(0, 256, 4096, dtype=np.uint8))
    packed = torch.zeros(4096, dtype=torch.uint8)
    segments, side_at, packed_at, cap = [], 0, 0, 5
    for rows, row_bytes, n in pools:
        ids = rng.choice(cap, size=n, replace=False).astype(np.int64)
        segments.append(Segment(side_at, cap, rows, row_bytes, ids, packed_at))
        side_at += rows * cap * row_bytes
        packed_at += n * rows * row_bytes
    copy_table_torch(side, packed, build_table(segments, TableConfig(piece, 16)))
    expected = torch.zeros(4096, dtype=torch.uint8)
    for s in segments:
        for i, page in enumerate(s.page_ids):
            for r in range(s.rows_per_page):
                a = s.side_base + (r * s.side_pages + page) * s.row_bytes
                b = s.packed_base + (i * s.rows_per_page + r) * s.row_bytes
                expected[b : b + s.row_bytes] = side[a : a + s.row_bytes]
    assert torch.equal(packed, expected)


def test_unit_is_the_widest_dividing_every_offset() -> None:
    ids = np.zeros(1, dtype=np.int64)
    assert unit_bytes_for([Segment(256, 1, 1, 149_760, ids, 0)]) == (8, 2)  # 16-byte units
    assert unit_bytes_for([Segment(256, 1, 1, 1_732, ids, 0)]) == (4, 1)
    assert unit_bytes_for([Segment(0, 1, 1, 3, ids, 0)]) == (1, 1)


def moved(mode: str, name: str, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, int]:
    """L1 and L2 bytes after a fixed D2H then H2D on `name` with `mode`; launches used."""
    geometry = GroupGeometry.from_group(presets.group(name))
    caps = {s: 6 for s in geometry.sources}
    l1 = GroupDevicePool(geometry, caps, device)
    l1.tensor.copy_(
        torch.randint(
            0, 256, l1.tensor.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(3)
        )
    )
    l2 = GroupHostPool(geometry, caps, pin=device == "cuda")
    mover = GroupMover(l1, l2, mode)
    assert mover.kernels.mode == mode
    d2h = {s: ([4, 0, 5], [1, 2, 3]) for s in geometry.sources}
    h2d = {s: ([3, 1], [2, 1]) for s in geometry.sources}
    mover.d2h(d2h).wait()
    mover.h2d(h2d).wait()
    launches = sum(c.launches for c in mover.counters.values())
    return l1.tensor.cpu(), l2.tensor.clone(), launches


@pytest.mark.parametrize("name", ["dsv4-tiny", "mla-tiny"])
@pytest.mark.parametrize("mode", ["table", "per_pool"])
def test_triton_modes_match_torch(interpreted: None, mode: str, name: str) -> None:
    l1_ref, l2_ref, _ = moved("torch", name)
    l1, l2, launches = moved(mode, name)
    assert torch.equal(l1, l1_ref) and torch.equal(l2, l2_ref)
    pools = len(GroupGeometry.from_group(presets.group(name)).pools)
    assert launches == (2 if mode == "table" else 2 * pools)  # one D2H, one H2D


def test_choice_on_cpu_and_bad_requests(compiled: None) -> None:
    geometry = GroupGeometry.from_group(presets.group("mla-tiny"))
    l1 = GroupDevicePool(geometry, {"kv": 2}, "cpu")
    l2 = GroupHostPool(geometry, {"kv": 2}, pin=False)
    auto = groupkernels.choose("auto", l1, l2)
    assert auto.mode == "torch" and "interpreted" in auto.reason
    with pytest.raises(BackendError, match="TRITON_INTERPRET=1"):
        groupkernels.choose("table", l1, l2)
    with pytest.raises(ConfigError, match="kernels.group_mode"):
        groupkernels.choose("cuda-magic", l1, l2)


def test_verify_refuses_a_kernel_that_moves_wrong_bytes(
    interpreted: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hicache.kernels import triton_table

    geometry = GroupGeometry.from_group(presets.group("dsv4-tiny"))
    l1 = GroupDevicePool(geometry, {"kv": 2, "swa": 2}, "cpu")
    l1.tensor.fill_(7)
    l2 = GroupHostPool(geometry, {"kv": 2, "swa": 2}, pin=False)
    monkeypatch.setattr(triton_table, "copy_table_triton", lambda *a, **k: None)
    with pytest.raises(BackendError, match="table gather"):
        groupkernels.choose("table", l1, l2)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["dsv4-tiny", "mla-tiny", "dsv4"])
@pytest.mark.parametrize("mode", ["table", "per_pool"])
def test_gpu_modes_match_torch(compiled: None, mode: str, name: str) -> None:
    l1_ref, l2_ref, _ = moved("torch", name, GPU)
    l1, l2, _ = moved(mode, name, GPU)
    assert torch.equal(l1, l1_ref) and torch.equal(l2, l2_ref)


@pytest.mark.gpu
def test_gpu_auto_picks_the_verified_per_pool_kernels(compiled: None) -> None:
    geometry = GroupGeometry.from_group(presets.group("dsv4-tiny"))
    caps = {s: 4 for s in geometry.sources}
    l1 = GroupDevicePool(geometry, caps, GPU)
    mover = GroupMover(l1, GroupHostPool(geometry, caps, pin=True))
    assert mover.kernels.mode == "per_pool", mover.kernels.reason
