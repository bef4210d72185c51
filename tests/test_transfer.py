"""L1 / L2 pools, the D2H / H2D mover, the engine façade and the null engine.

On CPU (CI) with the torch kernels; one test runs the Triton kernels under TRITON_INTERPRET=1
on tiny shapes; `gpu` tests repeat the round trips with pinned L2 and compiled Triton and check
stream ordering. Every destination is poisoned before a transfer, so bytes a path forgot to
write cannot pass for correct ones.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hicache.core.pages import Pages, pages
from hicache.core.tiers import Direction
from hicache.dataplane import pools
from hicache.dataplane.dma import DeviceHostMover, DmaHandle
from hicache.dataplane.engine import TransferEngine, one_pool
from hicache.dataplane.faults import FaultInjector, FaultSite
from hicache.dataplane.geometry import KVGeometry
from hicache.dataplane.handles import TransferHandle, TransferStatus
from hicache.dataplane.null import NullEngine
from hicache.dataplane.pools import DevicePool, HostPool, digest_rows, page_digest
from hicache.dataplane.routes import SINGLE_CHUNK_MAX_BYTES, DmaPlan
from hicache.dataplane.tags import FRESH
from hicache.dataplane.workspace import WorkspaceCache, WorkspaceKind
from hicache.errors import ConfigError, CorruptSlot, HiCacheError, InvalidPages, TransferError
from hicache.kernels import KernelSet
from tests.test_routes import sorted_runs

POISON = 0xA5
L1_PAGES, L2_PAGES, L3_SLOTS = 24, 32, 32


def tiny(dtype: str = "bf16", page_size: int = 16) -> KVGeometry:
    return KVGeometry(layers=2, kv_heads=2, head_dim=4, dtype=dtype, page_size=page_size)


def make_engine(
    geometry: KVGeometry | None = None,
    *,
    device: str = "cpu",
    backend: str = "torch",
    faults: FaultInjector | None = None,
    chunk_pages: int | None = None,
    l3_path: str | None = None,
) -> TransferEngine:
    engine = TransferEngine(
        one_pool(geometry or tiny()),
        L1_PAGES,
        L2_PAGES,
        L3_SLOTS,
        device=device,
        backend=backend,
        faults=faults,
        chunk_pages=chunk_pages,
        l3_path=l3_path,
        io_threads=2,
    )
    randomize(engine.l1.tensor, seed=1)
    return engine


def randomize(t: torch.Tensor, seed: int) -> None:
    raw = t.view(torch.uint8)
    g = torch.Generator().manual_seed(seed)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=g).to(raw.device))


def poison(t: torch.Tensor) -> None:
    t.view(torch.uint8).fill_(POISON)


def rows(packed: torch.Tensor) -> torch.Tensor:
    """Packed pages as uint8 [n, bytes_per_page] (n may be 0)."""
    return (
        packed.reshape(-1).view(torch.uint8).reshape(packed.shape[0], -1 if packed.shape[0] else 0)
    )


def l1_bytes(engine: TransferEngine, ids: Pages) -> torch.Tensor:
    return rows(engine.l1.packed(ids).cpu())


def l2_bytes(engine: TransferEngine, ids: Pages) -> torch.Tensor:
    return engine.l2.bytes_view()[torch.from_numpy(pages(ids))]


def done(handle: TransferHandle) -> None:
    status = handle.wait(timeout_s=30)
    # Verify the transfer completed: every check below reads its target bytes.
    assert status is TransferStatus.DONE, (status, handle.error)


def plan_of(handle: TransferHandle) -> DmaPlan:
    """How a D2H/H2D handle was issued (empty and failed issues return handles without one)."""
    assert isinstance(handle, DmaHandle), type(handle)
    return handle.plan


def layout(kind: str, n: int, capacity: int, rng: np.random.Generator) -> Pages:
    """n distinct pages: one consecutive run, a few runs, or a random set."""
    if kind == "consecutive":
        start = int(rng.integers(0, capacity - n + 1))
        return np.arange(start, start + n, dtype=np.int64)
    if kind == "fragmented":  # two runs, second before the first
        half = n // 2
        return np.concatenate(
            [np.arange(capacity - half, capacity), np.arange(0, n - half)]
        ).astype(np.int64)
    return rng.choice(capacity, size=n, replace=False).astype(np.int64)


@pytest.fixture
def engine() -> Iterator[TransferEngine]:
    e = make_engine()
    yield e
    e.close()


# -- round trips ------------------------------------------------------------------------------


def round_trip(engine: TransferEngine, kind: str, seed: int) -> None:
    """L1 -> L2 -> L3 -> L2 (other pages) -> L1 (other pages), byte-exact, digests equal."""
    rng = np.random.default_rng(seed)
    n = 9
    src = rng.choice(L1_PAGES, size=n, replace=False).astype(np.int64)
    l2_a = layout(kind, n, L2_PAGES, rng)
    slots = layout(kind, n, L3_SLOTS, rng)
    expect = l1_bytes(engine, src)

    poison(engine.l2.tensor)
    done(engine.d2h(src, l2_a))
    assert torch.equal(l2_bytes(engine, l2_a), expect)
    done(engine.h2s(l2_a, slots))

    l2_b = (
        np.setdiff1d(np.arange(L2_PAGES), l2_a)[:n]
        if kind != "consecutive"
        else (l2_a + n) % L2_PAGES
    )
    poison(engine.l2.tensor)
    done(engine.s2h(slots, l2_b))
    assert torch.equal(l2_bytes(engine, l2_b), expect)

    dst = np.setdiff1d(np.arange(L1_PAGES), src)[rng.permutation(L1_PAGES - n)[:n]]
    untouched = np.setdiff1d(np.arange(L1_PAGES), dst)
    before = l1_bytes(engine, untouched)
    for p in dst.tolist():
        engine.l1.tensor[:, :, p].view(torch.uint8).fill_(POISON)
    done(engine.h2d(l2_b, dst))
    assert torch.equal(l1_bytes(engine, dst), expect)
    assert torch.equal(l1_bytes(engine, untouched), before), "H2D wrote outside its target pages"

    digest = engine.digests("L1", src)
    for tier, ids in (("L1", dst), ("L2", l2_b), ("L3", slots)):
        assert np.array_equal(engine.digests(tier, ids), digest), tier


@pytest.mark.parametrize("kind", ["consecutive", "fragmented", "random"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32", "fp8"])
def test_round_trip_is_byte_exact(dtype: str, page_size: int, kind: str) -> None:
    engine = make_engine(tiny(dtype, page_size), chunk_pages=2)
    try:
        round_trip(engine, kind, seed=page_size)
    finally:
        engine.close()


@pytest.mark.parametrize("chunk_pages", [None, 1, 4, 100])
def test_round_trip_with_any_chunking(chunk_pages: int | None) -> None:
    engine = make_engine(chunk_pages=chunk_pages)
    try:
        round_trip(engine, "random", seed=3)
        round_trip(engine, "consecutive", seed=4)
    finally:
        engine.close()


@pytest.fixture(scope="module")
def shared_mover() -> DeviceHostMover:
    g = tiny("fp16", 2)
    l1, l2 = DevicePool(g, L1_PAGES, "cpu"), HostPool(g, L2_PAGES, pin=False)
    randomize(l1.tensor, seed=7)
    return DeviceHostMover(l1, l2, KernelSet.create(l1.tensor, "torch"), chunk_pages=3)


@settings(max_examples=40)
@given(data=st.data())
def test_any_mapping_moves_exactly_its_pages(
    shared_mover: DeviceHostMover, data: st.DataObject
) -> None:
    m = shared_mover
    n = data.draw(st.integers(0, 12))
    src = np.array(
        data.draw(st.lists(st.integers(0, L1_PAGES - 1), min_size=n, max_size=n)), dtype=np.int64
    )
    dst = np.array(data.draw(st.permutations(range(L2_PAGES)))[:n], dtype=np.int64)
    poison(m.l2.tensor)
    done(m.d2h(src, dst))
    expect = rows(m.l1.packed(src))
    got = rows(m.l2.tensor[torch.from_numpy(dst)])
    assert torch.equal(got, expect)
    rest = torch.from_numpy(np.setdiff1d(np.arange(L2_PAGES), dst))
    assert bool((m.l2.tensor[rest].view(torch.uint8) == POISON).all()), (
        "D2H wrote outside its targets"
    )

    back = np.array(data.draw(st.permutations(range(L1_PAGES)))[:n], dtype=np.int64)
    done(m.h2d(dst, back))
    assert torch.equal(rows(m.l1.packed(back)), expect)
    assert m.buffers_busy == 0 and m.in_flight == 0


@pytest.mark.parametrize("chunk_pages", [None, 2])
def test_an_h2d_queues_its_dmas_before_its_indices_and_a_d2h_after_them(
    monkeypatch: pytest.MonkeyPatch, chunk_pages: int | None
) -> None:
    """An H2D's DMAs need nothing from the caller, so they are queued first and the copy
    engine starts while the index upload and the scatters are issued; a D2H's DMAs move
    what its gathers packed, so its indices come first. Order of the mover's steps, on CPU
    (the same code as on CUDA)."""
    g = tiny("fp16", 2)
    l1, l2 = DevicePool(g, L1_PAGES, "cpu"), HostPool(g, L2_PAGES, pin=False)
    randomize(l1.tensor, seed=3)
    m = DeviceHostMover(l1, l2, KernelSet.create(l1.tensor, "torch"), chunk_pages=chunk_pages)
    steps: list[str] = []
    fill, copy_runs, kernels = DmaPlan.fill_index, m.copies.copy_runs, m.kernels

    def recorded(name: str, call: Callable[..., object]) -> Callable[..., object]:
        def step(*args: object, **kwargs: object) -> object:
            steps.append(name)
            return call(*args, **kwargs)

        return step

    class Kernels:  # the mover's KernelSet, each launch recorded
        gather = staticmethod(recorded("kernel", kernels.gather))
        scatter = staticmethod(recorded("kernel", kernels.scatter))

    monkeypatch.setattr(DmaPlan, "fill_index", recorded("indices", fill))
    monkeypatch.setattr(m.copies, "copy_runs", recorded("dma", copy_runs))
    monkeypatch.setattr(m, "kernels", Kernels())
    src, dst = np.array([5, 1, 7, 3], dtype=np.int64), np.arange(4, dtype=np.int64)
    chunks = len(m.plan(Direction.D2H, dst).bounds)
    done(m.d2h(src, dst))
    assert steps == ["indices"] + ["kernel", "dma"] * chunks
    steps.clear()
    back = np.array([2, 6, 0, 4], dtype=np.int64)
    done(m.h2d(dst, back))
    chunks = len(m.plan(Direction.H2D, dst).bounds)
    assert steps == ["dma"] * chunks + ["indices"] + ["kernel"] * chunks
    assert torch.equal(rows(l1.packed(back)), rows(l1.packed(src)))  # the bytes arrived


def test_host_pool_views_agree() -> None:
    g = tiny("bf16", 4)
    l2 = HostPool(g, 5, pin=False)
    randomize(l2.tensor, seed=2)
    l1_view = l2.l1_order_view()
    assert tuple(l1_view.shape) == (2, g.layers, 5, g.page_size, g.kv_heads, g.head_dim)
    assert torch.equal(l1_view[:, :, 3], l2.tensor[3])
    assert tuple(l2.bytes_view().shape) == (5, g.bytes_per_page)
    assert torch.equal(l2.bytes_view()[3], l2.tensor[3].reshape(-1).view(torch.uint8))


# -- workspaces and allocation --------------------------------------------------------------------


def test_mover_reuses_a_plan_only_for_the_same_consecutive_pages(engine: TransferEngine) -> None:
    m = engine.dma
    m.single_chunk_max_bytes, m.first_chunk_bytes = 0, engine.l1.geometry.bytes_per_page
    run = pages(range(5, 15))
    first = m.plan(Direction.D2H, run)
    assert m.plan(Direction.D2H, pages(range(5, 15))) is first  # remembered
    assert m.plan(Direction.H2D, run) is not first  # H2D orders its chunks the other way
    # Same size, first and last page, but not one ordered run: planned afresh.
    shuffled = m.plan(Direction.D2H, pages([5, 7, 6, 8, 9, 10, 11, 12, 13, 14]))
    assert shuffled is not first and shuffled.route.order is not None
    m.chunk_pages = 3  # a setting changed: planned afresh
    assert m.plan(Direction.D2H, run).bounds == [(0, 3), (3, 6), (6, 9), (9, 10)]


class PinnedShortage:
    """Stands in for `torch.empty`: the first `failures` pinned requests fail as pinned memory
    running out does; the rest (and every unpinned one) allocate plain memory."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.pinned_calls = 0
        self.real = torch.empty

    def __call__(self, *args: object, pin_memory: bool = False, **kwargs: object) -> torch.Tensor:
        if pin_memory:
            self.pinned_calls += 1
            if self.pinned_calls <= self.failures:
                raise RuntimeError("CUDA error: out of memory (cudaHostAlloc)")
        return self.real(*args, **kwargs)  # type: ignore[call-overload, no-any-return]


@pytest.mark.parametrize("failures", [1, 2])
def test_pinned_shortage_releases_torchs_cached_blocks_then_retries_once(
    monkeypatch: pytest.MonkeyPatch, failures: int
) -> None:
    """Workspaces allocate through torch's pinned allocator, which caches freed blocks."""
    shortage, released = PinnedShortage(failures), []
    monkeypatch.setattr(torch, "empty", shortage)
    monkeypatch.setattr(pools, "release_cached_pinned", lambda: released.append(True))
    if failures == 1:
        t = pools.empty_retrying(384, torch.uint8, torch.device("cpu"), pin=True)
        assert tuple(t.shape) == (384,)
    else:
        with pytest.raises(RuntimeError, match="out of memory"):
            pools.empty_retrying(384, torch.uint8, torch.device("cpu"), pin=True)
    assert released == [True] and shortage.pinned_calls == 2


class FakeCudart:
    """Records cudaHostRegister / cudaHostUnregister; `status` is what register returns."""

    def __init__(self, status: int = 0) -> None:
        self.status = status
        self.registered: list[tuple[int, int, int]] = []
        self.unregistered: list[int] = []

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:  # CUDA's name
        self.registered.append((ptr, size, flags))
        return self.status

    def cudaHostUnregister(self, ptr: int) -> int:
        self.unregistered.append(ptr)
        return 0


def test_l2_pool_is_registered_at_its_exact_size_and_unregistered_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not torch's pinned allocator (power-of-two blocks, cached after free): the pool's own
    memory, page-locked in place, released when the pool goes."""
    cudart = FakeCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    shape = (3, 2, 1, 4, 1, 8)  # 384 bytes of fp16: a power of two would be 512
    t = pools.allocate(shape, torch.float16, torch.device("cpu"), pin=True, field="l2_pages")
    ptr = t.data_ptr()
    assert cudart.registered == [(ptr, 384, 0)] and not t.view(torch.uint8).any()
    del t
    gc.collect()
    assert cudart.unregistered == [ptr]


def test_l2_pool_registration_failure_names_the_field_and_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "cudart", lambda: FakeCudart(status=2))
    with pytest.raises(
        ConfigError, match="l2_pages.*384 bytes of pinned host.*cudaError 2.*ulimit"
    ):
        pools.allocate(
            (3, 2, 1, 4, 1, 8), torch.float16, torch.device("cpu"), pin=True, field="l2_pages"
        )


def test_consecutive_path_allocates_no_host_memory_after_warmup(engine: TransferEngine) -> None:
    m = engine.dma
    done(engine.d2h(pages([5, 1, 9]), pages([10, 11, 12])))  # warm-up
    done(engine.h2d(pages([10, 11, 12]), pages([0, 2, 3])))
    warm = {d: (c.pinned_allocations, c.device_allocations) for d, c in m.counters.items()}
    for _ in range(3):
        done(engine.d2h(pages([4, 6]), pages([20, 21])))
        done(engine.h2d(pages([20, 21]), pages([7, 8])))
    assert {d: (c.pinned_allocations, c.device_allocations) for d, c in m.counters.items()} == warm
    assert m.workspaces.counters.pinned_allocations == 0, (
        "consecutive L2 pages need no host staging"
    )
    # The fragmented path allocates its host staging lazily, once, then reuses it.
    done(engine.d2h(pages([1, 2, 3]), pages([30, 0, 15])))
    assert m.workspaces.counters.pinned_allocations == 1
    done(engine.h2d(pages([30, 0]), pages([9, 10])))
    assert m.workspaces.counters.pinned_allocations == 1
    assert m.counters[Direction.D2H].fragmented == 1 and m.counters[Direction.H2D].fragmented == 1


def test_workspace_cache_is_best_fit_and_keeps_the_largest_idle() -> None:
    cache = WorkspaceCache(torch.device("cpu"), pin=False)
    a, _ = cache.acquire(WorkspaceKind.DEVICE, 100)
    b, _ = cache.acquire(WorkspaceKind.DEVICE, 300)
    c, _ = cache.acquire(WorkspaceKind.DEVICE, 200)
    for ws in (a, b, c):
        cache.release(ws)
    assert cache.idle == 1 and cache.held_bytes == 300, "only the largest idle buffer stays"
    d, setup_s = cache.acquire(WorkspaceKind.DEVICE, 250)
    assert d is b and setup_s == 0.0 and cache.counters.reuses == 1
    e, _ = cache.acquire(WorkspaceKind.DEVICE, 50)  # b is busy: a new one
    assert e is not b and cache.counters.allocations == 4
    cache.release(e)
    f, _ = cache.acquire(WorkspaceKind.DEVICE, 40)
    assert f is e, "best fit: the smallest idle buffer that holds the request"
    g, _ = cache.acquire(WorkspaceKind.HOST, 10)
    assert cache.counters.pinned_allocations == 1 and g.kind is WorkspaceKind.HOST
    for ws in (d, f, g):
        cache.release(ws)
    assert cache.busy == 0
    with pytest.raises(AssertionError):
        cache.release(g)


# -- per-run routes through the mover ------------------------------------------------------------


@st.composite
def runs_of_mixed_lengths(draw: st.DrawFn, capacity: int) -> Pages:
    """L2 pages made of runs of 1-6 consecutive pages with gaps between them (so they stay
    separate runs), in a random order; a run may also be listed backwards."""
    lengths = draw(st.lists(st.integers(1, 6), min_size=1, max_size=6))
    gaps = draw(st.lists(st.integers(1, 3), min_size=len(lengths), max_size=len(lengths)))
    start = draw(st.integers(0, max(0, capacity - sum(lengths) - sum(gaps))))
    ids: list[int] = []
    for k, gap in zip(lengths, gaps):
        run = list(range(start, start + k))
        ids += run[::-1] if draw(st.booleans()) else run
        start += k + gap
    assert start <= capacity + gaps[-1]
    return pages(draw(st.permutations(ids)))


ROUTE_L1, ROUTE_L2 = 40, 64


@pytest.fixture(scope="module")
def route_mover() -> DeviceHostMover:
    g = tiny("fp8", 4)  # 256-byte pages
    l1, l2 = DevicePool(g, ROUTE_L1, "cpu"), HostPool(g, ROUTE_L2, pin=False)
    randomize(l1.tensor, seed=8)
    return DeviceHostMover(l1, l2, KernelSet.create(l1.tensor, "torch"))


@settings(max_examples=60)
@given(data=st.data())
def test_per_run_path_is_byte_exact(route_mover: DeviceHostMover, data: st.DataObject) -> None:
    """Random fragmented L2 sets with runs of mixed lengths, some direct, some staged, chunks
    cutting through runs; both sides poisoned first. D2H then H2D to other L1 pages."""
    m = route_mover
    l2_ids = data.draw(runs_of_mixed_lengths(ROUTE_L2))
    n = l2_ids.size
    m.direct_min_bytes = data.draw(st.sampled_from([0, 2, 3, 4, 1 << 20])) * m.bytes_per_page
    m.chunk_pages = data.draw(st.sampled_from([None, 1, 2, 5]))
    m.single_chunk_max_bytes = data.draw(st.sampled_from([0, 1 << 30]))  # doubling, or one chunk
    src = pages(data.draw(st.permutations(range(ROUTE_L1)))[:n])
    poison(m.l2.tensor)
    handle = m.d2h(src, l2_ids)
    done(handle)
    expect = rows(m.l1.packed(src))
    assert torch.equal(rows(m.l2.tensor[torch.from_numpy(l2_ids)]), expect)
    rest = torch.from_numpy(np.setdiff1d(np.arange(ROUTE_L2), l2_ids))
    assert bool((m.l2.tensor[rest].view(torch.uint8) == POISON).all()), (
        "D2H wrote outside its targets"
    )
    small = [k for _, k in sorted_runs(l2_ids) if k * m.bytes_per_page < m.direct_min_bytes]
    plan = plan_of(handle)
    assert plan.route.staged_pages == (sum(small) if len(small) >= 2 else 0), str(plan)

    dst = pages(data.draw(st.permutations(range(ROUTE_L1)))[:n])
    untouched = torch.from_numpy(np.setdiff1d(np.arange(ROUTE_L1), dst))
    before = m.l1.tensor.view(torch.uint8)[:, :, untouched].clone()
    m.l1.tensor.view(torch.uint8)[:, :, torch.from_numpy(dst)] = POISON
    done(m.h2d(l2_ids, dst))
    assert torch.equal(rows(m.l1.packed(dst)), expect)
    after = m.l1.tensor.view(torch.uint8)[:, :, untouched]
    assert torch.equal(after, before), "H2D wrote outside its targets"
    assert m.buffers_busy == 0 and m.in_flight == 0


class AlignmentRecorder:
    """Stands in for a mover's KernelSet: runs the real kernels, and records for every launch
    the byte offset of its index slice and whether the pointer is 16-byte aligned."""

    def __init__(self, kernels: KernelSet) -> None:
        self.kernels = kernels
        self.launches: list[tuple[str, int, bool]] = []

    def _record(self, kind: str, index: torch.Tensor) -> None:
        offset = int(index.storage_offset()) * index.element_size()
        self.launches.append((kind, offset, index.data_ptr() % 16 == 0))

    def gather(
        self,
        l1: torch.Tensor,
        index: torch.Tensor,
        out: torch.Tensor,
        *,
        stream: torch.cuda.Stream | None = None,
    ) -> None:
        self._record("gather", index)
        self.kernels.gather(l1, index, out, stream=stream)

    def scatter(
        self,
        packed: torch.Tensor,
        index: torch.Tensor,
        l1: torch.Tensor,
        *,
        stream: torch.cuda.Stream | None = None,
    ) -> None:
        self._record("scatter", index)
        self.kernels.scatter(packed, index, l1, stream=stream)


@pytest.mark.parametrize("chunk_pages", [1, 3, 5])
def test_every_chunk_hands_the_kernels_a_16_byte_aligned_index_slice(chunk_pages: int) -> None:
    """Triton compiles one kernel per pointer alignment; a chunk whose indices start at an odd
    int64 would compile (and load, which waits for the device) inside the issuing call -- the
    GPU failure of test_gpu_done_only_once_every_byte_landed[3]. Same configuration on CPU:
    every launch's index slice must start 16-byte aligned, and the bytes must still be right."""
    g = KVGeometry(layers=1, kv_heads=1, head_dim=4, dtype="fp8", page_size=4)  # 32-byte pages
    engine = TransferEngine(
        one_pool(g), 40, 64, 4, device="cpu", backend="torch", chunk_pages=chunk_pages
    )
    try:
        randomize(engine.l1.tensor, seed=12)
        m = engine.dma
        recorder = AlignmentRecorder(m.kernels)
        m.kernels = recorder  # type: ignore[assignment]
        m.direct_min_bytes = 2 * g.bytes_per_page
        l2_ids = pages([40, 0, 1, 2, 9, 30, 31, 32, 33, 34, 50, 20, 21, 5, 60, 61, 62, 63, 12, 44])
        src = pages(np.random.default_rng(3).permutation(40)[: l2_ids.size])
        expect = l1_bytes(engine, src)
        poison(engine.l2.tensor)
        handle = engine.d2h(src, l2_ids)
        assert plan_of(handle).route.kind == "mixed", str(plan_of(handle))
        done(handle)
        assert torch.equal(l2_bytes(engine, l2_ids), expect)
        dst = pages(np.random.default_rng(4).permutation(40)[: l2_ids.size])
        engine.l1.tensor[:, :, torch.from_numpy(dst)] = 0
        done(engine.h2d(l2_ids, dst))
        assert torch.equal(l1_bytes(engine, dst), expect)
        chunks = -(-l2_ids.size // chunk_pages)
        assert [k for k, _, _ in recorder.launches] == ["gather"] * chunks + ["scatter"] * chunks
        misaligned = [(k, off) for k, off, ok in recorder.launches if off % 16 or not ok]
        assert not misaligned, f"index slices not 16-byte aligned (kind, byte offset): {misaligned}"
        assert_nothing_held(engine)
    finally:
        engine.close()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_direct_fragmented_path_allocates_no_host_memory_after_warmup(device: str) -> None:
    engine = make_engine(device=device, backend="torch")
    try:
        direct_fragmented_allocates_nothing(engine)
    finally:
        engine.close()


def direct_fragmented_allocates_nothing(engine: TransferEngine) -> None:
    m = engine.dma
    m.direct_min_bytes = 0  # every run direct, as 2.25 MiB Qwen3-8B pages are
    l2_ids = pages([30, 4, 5, 6, 17, 16, 0])
    done(engine.d2h(pages([1, 2, 3, 7, 8, 9, 10]), l2_ids))  # warm-up: device buffers, indices
    done(engine.h2d(l2_ids, pages([11, 12, 13, 14, 15, 16, 17])))
    warm = {d: (c.pinned_allocations, c.device_allocations) for d, c in m.counters.items()}
    for shift in (0, 1, 2):
        handle = engine.d2h(pages([5, 6, 7, 1, 2]), pages([20, 9, 10, 25, 26]) + shift)
        assert str(plan_of(handle)).startswith("direct: 3 runs"), str(plan_of(handle))
        done(handle)
        done(engine.h2d(pages([20, 9, 10, 25, 26]) + shift, pages([0, 1, 2, 3, 4])))
    assert {d: (c.pinned_allocations, c.device_allocations) for d, c in m.counters.items()} == warm
    assert m.workspaces.counters.pinned_allocations == 0, "direct runs need no host staging"
    for c in m.counters.values():
        assert c.fragmented == 4 and c.staged == 0 and c.staged_pages == 0
    assert m.counters[Direction.D2H].direct_dmas == 4 + 3 * 3


def test_small_runs_share_one_staged_dma(engine: TransferEngine) -> None:
    m = engine.dma
    m.direct_min_bytes = 3 * m.bytes_per_page  # runs of 1-2 pages staged, 3+ direct
    m.single_chunk_max_bytes = 1 << 30
    handle = engine.d2h(pages([1, 2, 3, 4, 5, 6, 7, 8]), pages([9, 0, 1, 20, 21, 22, 23, 5]))
    assert str(plan_of(handle)) == "mixed: 4 runs, 1 chunks, 2 DMAs, 4 pages staged"
    assert plan_of(handle).route.staged_lo == 0, (
        "D2H: staged pages first (their host copies start early)"
    )
    done(handle)
    handle = engine.h2d(
        pages([9, 0, 1, 20, 21, 22, 23, 5]), pages([10, 11, 12, 13, 14, 15, 16, 17])
    )
    assert plan_of(handle).route.staged_hi == 8, "H2D: staged pages last"
    done(handle)
    assert torch.equal(
        l1_bytes(engine, pages([10, 11, 12, 13, 14, 15, 16, 17])),
        l1_bytes(engine, pages([1, 2, 3, 4, 5, 6, 7, 8])),
    )
    one_small = engine.d2h(pages([1, 2, 3, 4]), pages([9, 20, 21, 22]))  # one small run: no saving
    assert plan_of(one_small).route.kind == "direct"
    done(one_small)
    assert m.counters[Direction.D2H].staged == 1 and m.counters[Direction.D2H].staged_pages == 4


# -- faults, cancel, fail -------------------------------------------------------------------------


def assert_nothing_held(engine: TransferEngine) -> None:
    assert engine.dma.buffers_busy == 0 and engine.dma.in_flight == 0


@pytest.mark.parametrize(
    "site, direction",
    [
        (FaultSite.DEVICE_ALLOC, "d2h"),
        (FaultSite.DEVICE_ALLOC, "h2d"),
        (FaultSite.PINNED_ALLOC, "d2h"),
        (FaultSite.PINNED_ALLOC, "h2d"),
        (FaultSite.D2H_COMPLETE, "d2h"),
        (FaultSite.H2D_COMPLETE, "h2d"),
        (FaultSite.IO_EIO, "h2s"),
        (FaultSite.IO_EIO, "s2h"),
        (FaultSite.IO_ENOSPC, "h2s"),
        (FaultSite.CORRUPT_SLOT, "s2h"),
    ],
)
def test_every_fault_fails_the_handle_and_leaks_nothing(site: FaultSite, direction: str) -> None:
    faults = FaultInjector()
    engine = make_engine(faults=faults)
    try:
        l1, l2, slots = pages([3, 4, 8]), pages([5, 6, 7]), pages([1, 2, 9])
        if direction in ("h2s", "s2h") or site is FaultSite.PINNED_ALLOC:
            done(engine.d2h(l1, l2))  # consecutive: no host staging yet, index buffers warm
        if direction == "s2h":
            if site is FaultSite.CORRUPT_SLOT:
                faults.once(site)  # fires when the slot is written; S2H reads it back
            done(engine.h2s(l2, slots))
        if site is not FaultSite.CORRUPT_SLOT:
            faults.once(site)
        calls: dict[str, Callable[[], TransferHandle]] = {
            "d2h": lambda: engine.d2h(l1, pages([20, 2, 11])),  # fragmented: needs host staging
            "h2d": lambda: engine.h2d(pages([5, 9, 1]), pages([0, 1, 2])),
            "h2s": lambda: engine.h2s(l2, slots),
            "s2h": lambda: engine.s2h(slots, pages([20, 21, 22])),
        }
        handle = calls[direction]()
        assert handle.wait(timeout_s=30) is TransferStatus.FAILED
        assert isinstance(handle.error, (TransferError, CorruptSlot)), handle.error
        assert faults.fired.get(site, 0) >= 1
        if site is FaultSite.PINNED_ALLOC:  # the lazily allocated staging for fragmented L2
            assert f"{3 * engine.geometry.bytes_per_page}-byte host" in str(handle.error)
        assert_nothing_held(engine)
        retry = calls[direction]()  # nothing broken: the same transfer now succeeds
        if direction == "s2h" and site is FaultSite.CORRUPT_SLOT:
            assert retry.wait(timeout_s=30) is TransferStatus.FAILED  # the slot stays corrupt
        else:
            done(retry)
        assert_nothing_held(engine)
    finally:
        engine.close()


def test_alloc_failure_names_the_size(engine: TransferEngine) -> None:
    faults = FaultInjector().once(FaultSite.DEVICE_ALLOC)
    engine.dma.workspaces.faults = faults
    handle = engine.d2h(pages([1, 2]), pages([3, 4]))
    assert handle.poll() is TransferStatus.FAILED
    assert str(2 * engine.geometry.bytes_per_page) in str(handle.error)
    assert engine.dma.counters[handle.direction].failed == 1


@pytest.mark.parametrize("direction", ["d2h", "h2d"])
def test_delay_keeps_the_handle_pending(direction: str) -> None:
    faults = FaultInjector(delay_polls=3).once(FaultSite.DELAY)
    engine = make_engine(faults=faults)
    try:
        handle = (
            engine.d2h(pages([1]), pages([2]))
            if direction == "d2h"
            else engine.h2d(pages([2]), pages([1]))
        )
        assert [handle.poll() for _ in range(3)] == [TransferStatus.PENDING] * 3
        assert engine.dma.buffers_busy > 0, "a pending transfer keeps its buffers"
        assert handle.poll() is TransferStatus.DONE
        assert_nothing_held(engine)
    finally:
        engine.close()


@pytest.mark.parametrize("action", ["cancel", "fail"])
def test_cancel_and_fail_leave_a_final_status(engine: TransferEngine, action: str) -> None:
    faults = FaultInjector(delay_polls=5).once(FaultSite.DELAY)
    engine.dma.faults = faults
    handle = engine.d2h(pages([1, 2]), pages([3, 9]))
    assert handle.poll() is TransferStatus.PENDING
    if action == "cancel":
        handle.cancel()
        final = TransferStatus.CANCELLED
    else:
        handle.fail()
        final = TransferStatus.FAILED
        assert isinstance(handle.error, TransferError)
    assert handle.status is final and handle.poll() is final
    handle.cancel()
    handle.fail()
    assert handle.status is final, "a final status never changes"
    assert_nothing_held(engine)
    counters = engine.dma.counters[handle.direction]
    assert (counters.cancelled, counters.failed, counters.done) == (
        (1, 0, 0) if action == "cancel" else (0, 1, 0)
    )


def test_close_cancels_what_is_in_flight() -> None:
    engine = make_engine(faults=FaultInjector(delay_polls=50).once(FaultSite.DELAY))
    handle = engine.d2h(pages([1]), pages([2]))
    engine.close()
    assert handle.status is TransferStatus.CANCELLED
    assert_nothing_held(engine)
    with pytest.raises(TransferError):
        engine.d2h(pages([1]), pages([2]))


# -- digests --------------------------------------------------------------------------------------


def test_digests_differ_for_different_bytes(engine: TransferEngine) -> None:
    done(engine.d2h(pages([0, 1]), pages([0, 1])))
    base = engine.digests("L2", pages([0, 1]))
    assert base[0] != base[1]
    assert np.array_equal(engine.digests("L1", pages([0, 1])), base)
    raw = engine.l2.bytes_view()
    for offset in range(0, engine.geometry.bytes_per_page, 37):  # every single-byte change shows
        raw[0, offset] ^= 0x01
        assert engine.digests("L2", pages([0]))[0] != base[0], offset
        raw[0, offset] ^= 0x01
    assert engine.digests("L2", pages([0]))[0] == base[0]
    swapped = raw[0].clone()
    swapped[:8], swapped[8:16] = raw[0, 8:16].clone(), raw[0, :8].clone()
    assert digest_rows(swapped[None])[0] != base[0], "moved words change the digest"


def test_a_word_with_every_bit_flipped_changes_the_digest() -> None:
    """Every bit of one 8-byte word flipped, of every word, or of a word's sign bit and the
    bits it would smear over: each changes the digest. Seen failing: the word mix used an
    arithmetic right shift on int64, so f(~x) = f(x) and a page (or a word) with every bit
    inverted digested like the original (a rank whose replicated pool held the complement
    of rank 0's bytes passed I8)."""
    rows = torch.randint(
        0, 256, (4, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(7)
    )
    base = digest_rows(rows)
    assert len(set(base.tolist())) == 4
    assert not (digest_rows(rows.bitwise_not()) == base).any(), "every bit of every word"
    for word in range(8):
        one = rows.clone()
        one[:, 8 * word : 8 * word + 8] = one[:, 8 * word : 8 * word + 8].bitwise_not()
        assert not (digest_rows(one) == base).any(), f"every bit of word {word}"
    high = rows.clone()
    high[:, 7] ^= 0x80  # the sign bit of word 0 (little-endian)
    assert not (digest_rows(high) == base).any()


@given(
    seed=st.integers(0, 2**32 - 1),
    word=st.integers(0, 7),
    mask=st.integers(1, 2**64 - 1) | st.just(2**64 - 1) | st.just(1 << 63),
)
def test_any_change_confined_to_one_word_changes_the_digest(
    seed: int, word: int, mask: int
) -> None:
    """What `digest_rows` promises: the word mix is a bijection and the weights are odd, so
    XOR-ing any non-zero mask into one word changes the digest, whatever the mask (every
    bit, the sign bit alone, ...)."""
    rows = torch.randint(
        0, 256, (1, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)
    )
    changed = rows.clone()
    flip = torch.tensor(list(mask.to_bytes(8, "little")), dtype=torch.uint8)
    changed[0, 8 * word : 8 * word + 8] ^= flip
    assert digest_rows(changed)[0] != digest_rows(rows)[0]


def test_digest_handles_rows_not_a_multiple_of_eight() -> None:
    g = KVGeometry(layers=1, kv_heads=1, head_dim=3, dtype="fp8", page_size=1)  # 6-byte pages
    pool = HostPool(g, 3, pin=False)
    randomize(pool.tensor, seed=5)
    d = page_digest(pool, pages([0, 1, 2]))
    pool.bytes_view()[1, 5] ^= 0x80
    assert page_digest(pool, pages([0, 1, 2])).tolist() == [
        d[0],
        page_digest(pool, pages([1]))[0],
        d[2],
    ]
    assert page_digest(pool, pages([1]))[0] != d[1]


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"l1_pages": 0}, "l1_pages"),
        ({"l2_pages": -1}, "l2_pages"),
        ({"l3_slots": 0}, "l3_slots"),
        ({"chunk_pages": 0}, "chunk_pages"),
        ({"device": "mps"}, "device"),
        ({"io_threads": -1}, "io_threads"),
        ({"backend": "fast"}, "kernels.backend"),
        ({"l1_pages": 1 << 44}, "l1_pages"),
    ],
)
def test_bad_config_names_the_field(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {
        "l1_pages": 4,
        "l2_pages": 4,
        "l3_slots": 4,
        "device": "cpu",
    } | kwargs
    with pytest.raises(ConfigError) as info:
        TransferEngine(one_pool(tiny()), **args)  # type: ignore[arg-type]
    assert info.value.field == field
    if kwargs.get("l1_pages") == 1 << 44:
        assert str((1 << 44) * tiny().bytes_per_page) in str(info.value), "the size asked for"


def test_pool_configs_are_checked() -> None:
    with pytest.raises(ConfigError, match="l2_pages"):
        HostPool(tiny(), 0, pin=False)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="l2.pin"):
            HostPool(tiny(), 2, pin=True)
        with pytest.raises(ConfigError, match="device"):
            DevicePool(tiny(), 2, "cuda")
    l1 = DevicePool(tiny(), 2, "cpu")
    kernels = KernelSet.create(l1.tensor, "torch")
    with pytest.raises(ConfigError, match="l2.geometry"):
        DeviceHostMover(l1, HostPool(tiny("fp16"), 2, pin=False), kernels)
    l2 = HostPool(tiny(), 2, pin=False)
    for bad in (
        {"direct_min_bytes": -1},
        {"single_chunk_max_bytes": True},
        {"direct_min_bytes": 1.5},
    ):
        with pytest.raises(ConfigError) as info:
            DeviceHostMover(l1, l2, kernels, **bad)
        assert info.value.field == next(iter(bad))


@pytest.mark.parametrize("plane", ["real", "null"])
def test_bad_pages_raise_the_same_error_on_both_planes(plane: str) -> None:
    e: TransferEngine | NullEngine = (
        make_engine() if plane == "real" else NullEngine(tiny(), L1_PAGES, L2_PAGES, L3_SLOTS)
    )
    try:
        bad: list[tuple[str, object, object]] = [
            ("d2h", pages([L1_PAGES]), pages([0])),  # source out of range
            ("h2d", pages([0, 1]), pages([3, 3])),  # target named twice
            ("h2s", pages([0, 1]), pages([2])),  # lengths differ
            ("s2h", np.array([0.5]), pages([1])),  # not integers
            ("d2h", pages([-1]), pages([1])),
        ]
        for method, src, dst in bad:
            with pytest.raises(InvalidPages):
                getattr(e, method)(src, dst)
        assert not any(h.status is TransferStatus.PENDING for h in getattr(e, "handles", [])), (
            "nothing issued"
        )
    finally:
        e.close()


# -- the null engine ------------------------------------------------------------------------------


def test_null_engine_completes_when_told() -> None:
    e = NullEngine(tiny(), L1_PAGES, L2_PAGES, L3_SLOTS)
    a = e.d2h(pages([1, 2]), pages([3, 4]))
    b = e.s2h(pages([0]), pages([5]))
    assert e.handles == [a, b] and a.poll() is TransferStatus.PENDING
    assert a.nbytes == 2 * tiny().bytes_per_page
    e.handles[0].finish(True)
    e.handles[1].finish(False)
    assert a.poll() is TransferStatus.DONE and b.poll() is TransferStatus.FAILED
    assert isinstance(b.error, HiCacheError) and e.pending() == []
    assert e.has_bytes is False and TransferEngine.has_bytes is True
    # No bytes, but content tags: the landed D2H's L2 targets carry its L1 sources' tags,
    # the failed S2H's target keeps the fresh tag its reservation gave it.
    assert e.digests("L2", pages([3, 4])).tolist() == e.digests("L1", pages([1, 2])).tolist()
    assert int(e.digests("L2", pages([5]))[0]) >= FRESH
    c = e.h2d(pages([1]), pages([1]))
    e.close()
    assert c.status is TransferStatus.CANCELLED


# -- Triton (interpreted on CPU) ------------------------------------------------------------------


def test_triton_kernels_round_trip_interpreted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    g = KVGeometry(layers=1, kv_heads=1, head_dim=8, dtype="bf16", page_size=2)
    engine = TransferEngine(one_pool(g), 6, 6, 6, device="cpu", backend="triton", chunk_pages=2)
    try:
        assert (engine.kernels.gather_backend, engine.kernels.scatter_backend) == (
            "triton",
            "triton",
        )
        randomize(engine.l1.tensor, seed=9)
        src, l2_ids, dst = pages([4, 0, 2]), pages([5, 1, 3]), pages([1, 3, 5])
        expect = l1_bytes(engine, src)
        poison(engine.l2.tensor)
        done(engine.d2h(src, l2_ids))
        for p in dst.tolist():
            engine.l1.tensor[:, :, p].view(torch.uint8).fill_(POISON)
        done(engine.h2d(l2_ids, dst))
        assert torch.equal(l1_bytes(engine, dst), expect)
    finally:
        engine.close()


# -- GPU ------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("kind", ["consecutive", "fragmented", "random"])
@pytest.mark.parametrize("direct_min_bytes", [0, 1 << 20])  # every run direct; small runs staged
def test_gpu_round_trip(dtype: str, kind: str, direct_min_bytes: int, tmp_path: Path) -> None:
    engine = make_engine(
        tiny(dtype, 16), device="cuda", backend="triton", l3_path=str(tmp_path / "l3")
    )
    try:
        assert engine.l2.tensor.is_pinned()
        engine.dma.direct_min_bytes = direct_min_bytes
        assert engine.dma.mapped_d2h, engine.dma.mapped_reason  # the default on CUDA
        for mapped, chunking in ((True, None), (False, None), (False, 2)):
            engine.dma.mapped_d2h, engine.dma.chunk_pages = mapped, chunking
            round_trip(engine, kind, seed=11)
        assert_nothing_held(engine)
    finally:
        engine.close()


SLEEP_CYCLES = 1_000_000_000
"""GPU clock cycles the caller's stream sleeps before an issue (~0.5 s on an H200): longer
than any issue takes once its kernels are compiled, so a handle polled right after its issue
is PENDING unless it reported completion before the device work ran."""


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("chunk_pages", "route"), [(None, "dma"), (3, "dma"), (None, "mapped"), (None, "pitched")]
)
def test_gpu_done_only_once_every_byte_landed(chunk_pages: int | None, route: str) -> None:
    """Mixed routes (direct runs and staged pages) over several chunks -- or the D2H as one
    mapped copy, or both ways one 2D DMA per page -- issued behind a long sleep on the
    caller's stream: the handle must stay PENDING, and once it says DONE the bytes must be
    there -- read with no synchronization but the handle's own."""
    g = KVGeometry(layers=4, kv_heads=8, head_dim=128, dtype="bf16", page_size=16)  # 256 KiB pages
    engine = TransferEngine(
        one_pool(g), 40, 64, 4, device="cuda", backend="triton", chunk_pages=chunk_pages
    )
    try:
        randomize(engine.l1.tensor, seed=12)
        m = engine.dma
        m.direct_min_bytes, m.single_chunk_max_bytes = 2 * g.bytes_per_page, 0
        m.first_chunk_bytes = g.bytes_per_page  # chunks of 1, 2, 4, ... pages: several
        m.mapped_d2h, m.pitched = route == "mapped", route == "pitched"
        m.pitched_every = m.pitched  # the D2H too (a D2H goes pitched only when told to)
        if m.pitched and m._copy2d is None:
            pytest.skip(m.pitched_reason)
        l2_ids = pages([40, 0, 1, 2, 9, 30, 31, 32, 33, 34, 50, 20, 21, 5, 60, 61, 62, 63, 12, 44])
        src = pages(np.random.default_rng(3).permutation(40)[: l2_ids.size])
        dst = pages(np.random.default_rng(4).permutation(40)[: l2_ids.size])
        # The same routes once first: the kernels' first launch compiles them (seconds on a
        # busy host, e.g. under pytest -n 8), which would outlast the sleep below and let the
        # device finish before the poll, a pass the test cannot tell from a bug.
        done(engine.d2h(src, l2_ids))
        done(engine.h2d(l2_ids, dst))
        expect = l1_bytes(engine, src)  # synchronizes: L1 holds its bytes before the issue
        poison(engine.l2.tensor)
        torch.cuda._sleep(SLEEP_CYCLES)  # type: ignore[no-untyped-call]  # the caller is still busy
        issued = time.perf_counter()
        handle = engine.d2h(src, l2_ids)
        issue_s = time.perf_counter() - issued
        plan = plan_of(handle)
        if route != "dma":
            assert plan.mapped or plan.pitched, str(plan)
        else:
            assert plan.route.kind == "mixed" and len(plan.bounds) > 1, str(plan)
        # Issue took ~the caller's sleep (~0.5 s): the issue blocked on the device. Issue was
        # quick but DONE anyway: completion was reported before the device work ran (B01/B05).
        assert handle.poll() is TransferStatus.PENDING, f"D2H issue took {issue_s:.4f} s; {plan}"
        done(handle)
        assert torch.equal(l2_bytes(engine, l2_ids), expect), "DONE before every byte reached L2"

        engine.l1.tensor[:, :, torch.from_numpy(dst).cuda()] = 0
        torch.cuda._sleep(SLEEP_CYCLES)  # type: ignore[no-untyped-call]
        issued = time.perf_counter()
        handle = engine.h2d(l2_ids, dst)
        issue_s = time.perf_counter() - issued
        assert plan_of(handle).pitched == (route == "pitched"), str(plan_of(handle))
        assert handle.poll() is TransferStatus.PENDING, (
            f"H2D issue took {issue_s:.4f} s; {plan_of(handle)}"
        )
        done(handle)
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # ordered after nothing of ours
        with torch.cuda.stream(side):
            got = l1_bytes(engine, dst)
        assert torch.equal(got, expect), "DONE before every byte reached L1"
        assert_nothing_held(engine)
    finally:
        engine.close()


@pytest.mark.gpu
def test_gpu_mover_needs_pinned_l2() -> None:
    g = tiny()
    l1 = DevicePool(g, 2, "cuda")
    with pytest.raises(ConfigError) as info:
        DeviceHostMover(l1, HostPool(g, 2, pin=False), KernelSet.create(l1.tensor, "torch"))
    assert info.value.field == "l2.pin"


@pytest.mark.gpu
@pytest.mark.parametrize("explicit", [False, True])
@pytest.mark.parametrize("route", ["consecutive", "direct runs", "staged runs"])
def test_gpu_transfer_waits_for_the_callers_stream(explicit: bool, route: str) -> None:
    """The producer writes on a side stream after a long sleep; the transfer is issued right
    away. Without the wait on the caller's stream (B05) the transfer reads stale bytes."""
    engine = make_engine(tiny("bf16", 16), device="cuda", backend="triton")
    try:
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        src, dst = pages([3, 7, 1]), pages([0, 4, 9])
        l2_ids = pages([10, 11, 12]) if route == "consecutive" else pages([12, 10, 14])
        engine.dma.direct_min_bytes = 0 if route == "direct runs" else 1 << 20
        with torch.cuda.stream(side):
            torch.cuda._sleep(50_000_000)  # type: ignore[no-untyped-call]  # ~tens of ms
            for p in src.tolist():
                engine.l1.tensor[:, :, p].fill_(float(p + 1))
        if not explicit:
            torch.cuda.current_stream().wait_stream(side)
        done(engine.d2h(src, l2_ids, after=side if explicit else None))
        for p, got in zip(src.tolist(), engine.l2.tensor[torch.from_numpy(l2_ids)]):
            assert bool((got.float() == p + 1).all()), (
                f"D2H read page {p} before the producer wrote it"
            )

        # H2D: the caller's stream still writes the target pages; the restore must land after.
        with torch.cuda.stream(side):
            torch.cuda._sleep(50_000_000)  # type: ignore[no-untyped-call]
            for p in dst.tolist():
                engine.l1.tensor[:, :, p].zero_()
        if not explicit:
            torch.cuda.current_stream().wait_stream(side)
        done(engine.h2d(l2_ids, dst, after=side if explicit else None))
        for p, want in zip(dst.tolist(), src.tolist()):
            assert bool((engine.l1.tensor[:, :, p].float() == want + 1).all()), (
                "H2D landed before the caller's write"
            )
    finally:
        engine.close()


@pytest.mark.parametrize(
    "site, direction", [(FaultSite.SHORT_WRITE, "h2s"), (FaultSite.SHORT_READ, "s2h")]
)
def test_short_io_is_resumed_through_the_engine(site: FaultSite, direction: str) -> None:
    faults = FaultInjector()
    engine = make_engine(faults=faults)
    try:
        l2, slots = pages([5, 6, 7]), pages([1, 2, 9])
        done(engine.d2h(pages([3, 4, 8]), l2))
        if direction == "s2h":
            done(engine.h2s(l2, slots))
        faults.once(site, 3)
        done(
            engine.h2s(l2, slots) if direction == "h2s" else engine.s2h(slots, pages([20, 21, 22]))
        )
        assert faults.fired[site] == 3 and engine.storage.counters.short_io_resumed >= 3
        assert np.array_equal(engine.digests("L3", slots), engine.digests("L1", pages([3, 4, 8])))
    finally:
        engine.close()


def test_digests_reject_an_unknown_tier(engine: TransferEngine) -> None:
    with pytest.raises(InvalidPages, match="tier"):
        engine.digests("L4", pages([0]))


def test_transfer_benchmark_runs_quick_on_cpu(tmp_path: Path) -> None:
    """The benchmark's plumbing (not its numbers): every path moves the right bytes and the
    mover allocates nothing after warm-up; both reports are written."""
    from hicache.bench.transfer import main

    assert main(["--out", str(tmp_path), "--quick", "--repeats", "1", "--tokens", "16"]) == 0
    result = json.loads((tmp_path / "transfer.json").read_text())
    rows = result["dma"]["rows"]
    mover_rows = [r for r in rows if r["path"].startswith("hicache")]
    # Per direction: 6 variants on consecutive L2 pages (the default, the DMA route and its
    # 4 chunkings), those and "hicache staged" and "hicache per-run DMAs" on fragmented.
    assert len(mover_rows) == 2 * (6 + 8) and all(r["correct"] for r in mover_rows)
    assert all(
        r["pinned_allocations_after_warmup"] == 0 == r["device_allocations_after_warmup"]
        for r in mover_rows
    )
    assert all(r["issue_ms"] > 0 and r["device_ms"] > 0 for r in mover_rows)
    routes = {(r["l2"], r["path"]): r["route"] for r in mover_rows}
    assert routes["consecutive", "hicache"] == "direct: 1 runs, 1 chunks, 1 DMAs"
    assert routes["fragmented", "hicache staged"].startswith("staged:"), (
        "tiny pages: every run staged"
    )
    assert "NOT MEASURED" not in (tmp_path / "transfer.md").read_text()


def test_transfer_benchmark_times_the_ceiling_with_each_cases_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end-to-end ceiling takes turns with the paths it rates (a slow moment of the host
    shifts both), and each case's rows are rated against the ceiling timed with them; the
    ceiling is not reported as a path."""
    from hicache.bench import timing, transfer

    answers: list[float] = []
    timed = timing.e2e_ms_interleaved

    def recording(starts: dict[str, Any], s: Any) -> dict[str, float]:
        assert transfer.CEILING_PATH in starts and len(starts) > 1, sorted(starts)
        medians = timed(starts, s)
        medians[transfer.CEILING_PATH] = 1.0 + len(answers)  # each case its own ceiling
        answers.append(medians[transfer.CEILING_PATH])
        return medians

    monkeypatch.setattr(transfer, "e2e_ms_interleaved", recording)
    assert (
        transfer.main(["--out", str(tmp_path), "--quick", "--repeats", "1", "--tokens", "16"]) == 0
    )
    rows = json.loads((tmp_path / "transfer.json").read_text())["dma"]["rows"]
    assert len(answers) == 4  # (consecutive, fragmented) x (D2H, H2D)
    cases = {(r["l2"], r["direction"]): r["ceiling_e2e_ms"] for r in rows}
    assert sorted(cases.values()) == answers and len(set(cases.values())) == 4
    for r in rows:
        assert r["of_dma_ceiling_e2e"] == r["ceiling_e2e_ms"] / r["median_ms"]
    assert transfer.CEILING_PATH not in {r["path"] for r in rows}


def test_an_h2d_of_one_run_is_chunked_with_its_smallest_chunk_last() -> None:
    """An H2D of one run of L2 pages goes in descending chunks even under the one-chunk limit
    (its last scatter is what stays exposed after the DMA); a D2H, or an H2D of several runs,
    of the same size is one chunk; run_h2d_single_max_bytes at the one-chunk limit turns the
    rule off, and the bytes arrive either way."""
    g = tiny()
    l1, l2 = DevicePool(g, 32, "cpu"), HostPool(g, 32, pin=False)
    randomize(l1.tensor, seed=4)
    bpp = g.bytes_per_page
    m = DeviceHostMover(l1, l2, KernelSet.create(l1.tensor, "torch"), first_chunk_bytes=8 * bpp)
    run, scattered = np.arange(4, 26, dtype=np.int64), np.arange(26, 4, -1, dtype=np.int64)
    assert m.plan(Direction.H2D, run).bounds == [(0, 14), (14, 22)]
    assert m.plan(Direction.D2H, run).bounds == [(0, 22)]
    assert m.plan(Direction.H2D, pages([5, 9, 13])).bounds == [(0, 3)], "three runs, small"
    assert m.plan(Direction.H2D, scattered).bounds == [(0, 14), (14, 22)], "one run, reversed"
    src = np.array([0, 3, 1, 2] * 5 + [30, 31], dtype=np.int64)
    done(m.d2h(src, run))
    back = np.arange(4, 26, dtype=np.int64)[::-1].copy()  # apart from src
    done(m.h2d(run, back))
    assert torch.equal(rows(l1.packed(back)), rows(l1.packed(src)))
    off = DeviceHostMover(
        l1,
        l2,
        KernelSet.create(l1.tensor, "torch"),
        first_chunk_bytes=8 * bpp,
        run_h2d_single_max_bytes=SINGLE_CHUNK_MAX_BYTES,
    )
    assert off.plan(Direction.H2D, run).bounds == [(0, 22)]
