"""Issues replayed as captured graphs (issuegraphs.py): a one-chunk D2H's index upload and
gather in the single-pool mover; a one-stage group D2H's upload and gathers.

What must hold on a GPU: every replay moves the pages of the transfer that replays it (its
own indices, read from the pinned buffer when the replay runs), it waits for the caller's
stream like the eager issue (B05), a shape whose buffers differ is not replayed on the wrong
addresses, and with graphs off the mover captures nothing. The counters say which path ran.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

import torch

from hicache.core.tiers import Direction
from hicache.dataplane.dma import DeviceHostMover
from hicache.dataplane.geometry import KVGeometry
from hicache.dataplane.groupgeometry import GroupGeometry
from hicache.dataplane.grouppools import GroupDevicePool, GroupHostPool, group_digest
from hicache.dataplane.grouptransfer import GroupMover
from hicache.dataplane.issuegraphs import CAPTURE_AT
from hicache.dataplane.pools import DevicePool, HostPool, page_digest
from hicache.kernels import KernelSet
from hicache.pools import presets
from tests.cuda_streams import HOLD_CYCLES, caller_stream  # noqa: F401  (autouse)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

GEOMETRY = KVGeometry(layers=4, kv_heads=2, head_dim=32, dtype="bf16", page_size=16)
L1_PAGES, L2_PAGES = 64, 64


def rig(*, issue_graphs: bool | None = None, mapped: bool = False) -> DeviceHostMover:
    """A mover whose D2Hs go by the DMA route (packed, gathered: `mapped` False) or mapped."""
    l1 = DevicePool(GEOMETRY, L1_PAGES, "cuda")
    l1.tensor.view(torch.uint8).random_(0, 256)
    l2 = HostPool(GEOMETRY, L2_PAGES, pin=True)
    kernels = KernelSet.create(l1.tensor, "triton" if mapped else "auto")
    return DeviceHostMover(l1, l2, kernels, issue_graphs=issue_graphs, mapped_d2h=mapped)


MAPPED = pytest.mark.parametrize("mapped", [False, True], ids=["dma", "mapped"])


def d2h_checked(m: DeviceHostMover, src: np.ndarray, dst: np.ndarray) -> None:
    m.l2.tensor.view(torch.uint8)[torch.from_numpy(dst)] = 0xA5  # a path that moved nothing fails
    assert m.d2h(src, dst).wait().value == "DONE"
    assert np.array_equal(page_digest(m.l1, src), page_digest(m.l2, dst))


@MAPPED
def test_gpu_every_replay_moves_its_own_pages(mapped: bool) -> None:
    m = rig(mapped=mapped)
    rng = np.random.default_rng(0)
    dst = np.arange(8, 16, dtype=np.int64)  # one run of L2 pages: one chunk
    for _ in range(6):  # the same shape, other L1 pages every time
        d2h_checked(m, rng.choice(L1_PAGES, size=8, replace=False).astype(np.int64), dst)
    g = m.graphs
    assert g.captures == 1, g.status()
    assert g.replays == 6 - (CAPTURE_AT - 1), g.status()  # every sight from the capture on
    assert m.buffers_busy == 0 and m.in_flight == 0


@MAPPED
def test_gpu_a_replay_waits_for_the_callers_stream(mapped: bool) -> None:
    """B05: the caller's stream still writes the L1 pages the D2H reads; the replayed
    upload and gather must come after it, as the eager issue's do."""
    m = rig(mapped=mapped)
    src, dst = np.arange(4, dtype=np.int64), np.arange(4, dtype=np.int64)
    for _ in range(CAPTURE_AT):  # captured now
        d2h_checked(m, src, dst)
    caller = torch.cuda.current_stream()
    torch.cuda._sleep(HOLD_CYCLES)  # type: ignore[no-untyped-call]
    idx = torch.from_numpy(src).cuda()
    m.l1.tensor.view(torch.uint8)[:, :, idx] = 0x3C  # written by the caller, after the hold
    handle = m.d2h(src, dst, after=caller)
    assert handle.wait().value == "DONE"
    assert m.graphs.replays >= 1
    assert bool((m.l2.tensor[torch.from_numpy(dst)].view(torch.uint8) == 0x3C).all())


@MAPPED
def test_gpu_other_buffers_are_not_replayed_on_the_captured_addresses(mapped: bool) -> None:
    """Two transfers of one shape in flight borrow two sets of buffers: the second must not
    replay the first's graph (its indices and packed bytes live elsewhere)."""
    m = rig(mapped=mapped)
    dst_a, dst_b = np.arange(0, 6, dtype=np.int64), np.arange(10, 16, dtype=np.int64)
    src_a, src_b = np.arange(20, 26, dtype=np.int64), np.arange(40, 46, dtype=np.int64)
    for _ in range(CAPTURE_AT):
        d2h_checked(m, src_a, dst_a)
    for dst in (dst_a, dst_b):
        m.l2.tensor.view(torch.uint8)[torch.from_numpy(dst)] = 0xA5
    torch.cuda._sleep(HOLD_CYCLES)  # type: ignore[no-untyped-call]
    a = m.d2h(src_a, dst_a)  # still in flight: its buffers stay borrowed
    b = m.d2h(src_b, dst_b)  # same shape, other buffers
    assert a.wait().value == "DONE" and b.wait().value == "DONE"
    assert np.array_equal(page_digest(m.l1, src_a), page_digest(m.l2, dst_a))
    assert np.array_equal(page_digest(m.l1, src_b), page_digest(m.l2, dst_b))


@MAPPED
def test_gpu_graphs_off_captures_nothing(mapped: bool) -> None:
    m = rig(issue_graphs=False, mapped=mapped)
    src, dst = np.arange(4, dtype=np.int64), np.arange(4, dtype=np.int64)
    for _ in range(CAPTURE_AT + 1):
        d2h_checked(m, src, dst)
    assert m.graphs.captures == 0 and m.graphs.replays == 0, m.graphs.status()


# -- the group mover (grouptransfer.py): one stage, its upload and kernels replayed -------


def group_rig(name: str, mode: str = "per_pool", caps: int = 16) -> tuple[Any, GroupMover]:
    geometry = GroupGeometry.from_group(presets.group(name))
    pages = {s: caps for s in geometry.sources}
    l1 = GroupDevicePool(geometry, pages, "cuda")
    l1.tensor.random_(0, 256)
    return geometry, GroupMover(l1, GroupHostPool(geometry, pages, pin=True), mode)


@pytest.mark.parametrize("name", ["dsv4-tiny", "dsv4", "mla"])
@pytest.mark.parametrize("mode", ["per_pool", "table"])
def test_gpu_group_replays_move_their_own_bytes(name: str, mode: str) -> None:
    geometry, m = group_rig(name, mode)
    rng = np.random.default_rng(0)
    sights = 5
    for _ in range(sights):  # one shape, other pages every time, both ways
        a = {s: rng.choice(16, size=4, replace=False).astype(np.int64) for s in geometry.sources}
        b = {s: rng.choice(16, size=4, replace=False).astype(np.int64) for s in geometry.sources}
        m.l2.tensor.fill_(0xA5)
        assert m.d2h({s: (a[s], b[s]) for s in a}).wait().value == "DONE"
        assert group_digest(m.l1, a) == group_digest(m.l2, b)
        m.l2.tensor.random_(0, 256)
        assert m.h2d({s: (b[s], a[s]) for s in a}).wait().value == "DONE"
        assert group_digest(m.l2, b) == group_digest(m.l1, a)
    assert m.counters[Direction.D2H].replays == sights - (CAPTURE_AT - 1), m.graphs.status()
    assert m.counters[Direction.H2D].replays == 0  # an H2D keeps its stages
    assert m.graphs.captures == 1 and m.buffers_busy == 0


def test_gpu_group_replays_wait_for_the_callers_stream() -> None:
    """B05: a replayed D2H gathers what the caller's stream wrote before it."""
    geometry, m = group_rig("dsv4-tiny")
    request = {
        s: (np.arange(4, dtype=np.int64), np.arange(4, dtype=np.int64)) for s in geometry.sources
    }
    for _ in range(CAPTURE_AT):  # captured now
        m.d2h(request).wait()
    caller = torch.cuda.current_stream()
    torch.cuda._sleep(HOLD_CYCLES)  # type: ignore[no-untyped-call]
    m.l1.tensor.fill_(0x3C)  # the caller writes L1 after the hold
    assert m.d2h(request, after=caller).wait().value == "DONE"
    assert m.counters[Direction.D2H].replays == CAPTURE_AT
    pages = {s: np.arange(4, dtype=np.int64) for s in geometry.sources}
    assert group_digest(m.l1, pages) == group_digest(m.l2, pages)
    assert bool((m.l2.tensor == 0x3C).any())


def test_gpu_a_failed_group_h2d_waits_for_its_queued_dmas_and_gives_all_back() -> None:
    """The group H2D queues its DMAs before it borrows its operand buffers; when that borrow
    fails (PINNED_ALLOC), the DMAs already queued are waited for before the workspace goes
    back, and the next H2D lands its bytes."""
    from hicache.dataplane.faults import FaultInjector, FaultSite

    geometry = GroupGeometry.from_group(presets.group("dsv4"))
    pages = {s: 16 for s in geometry.sources}
    l1 = GroupDevicePool(geometry, pages, "cuda")
    l1.tensor.random_(0, 256)
    faults = FaultInjector()
    m = GroupMover(l1, GroupHostPool(geometry, pages, pin=True), "per_pool", faults=faults)
    a = {s: np.arange(4, dtype=np.int64) for s in geometry.sources}
    b = {s: np.arange(8, 12, dtype=np.int64) for s in geometry.sources}
    assert m.d2h({s: (a[s], b[s]) for s in a}).wait().value == "DONE"
    m.operand_buffers.clear_idle()
    faults.once(FaultSite.PINNED_ALLOC)
    back = {s: np.arange(12, 16, dtype=np.int64) for s in geometry.sources}
    handle = m.h2d({s: (b[s], back[s]) for s in a})
    assert handle.wait().value == "FAILED" and m.buffers_busy == 0
    assert m.h2d({s: (b[s], back[s]) for s in a}).wait().value == "DONE"
    assert group_digest(m.l1, back) == group_digest(m.l1, a)
