"""The mapped D2H: one kernel writes L1's rows into their L2 pages in place.

The definition (`copy_mapped_torch`) against hand-built pages; the Triton kernel against it
(interpreted on CPU, compiled on a GPU with pinned L2); the operand checks; and the mover's
route: which D2Hs go mapped, their bytes, counters, faults, and that nothing stays borrowed.
Every destination is poisoned first, so a path that moved nothing fails.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from unittest import mock

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hicache.core.pages import pages
from hicache.core.tiers import Direction
from hicache.dataplane.dma import DeviceHostMover
from hicache.dataplane.faults import FaultInjector, FaultSite
from hicache.dataplane.grouppools import pool_digest
from hicache.dataplane.grouptransfer import GroupHandle, GroupMover
from hicache.dataplane.handles import TransferStatus
from hicache.dataplane.pools import DevicePool, HostPool, page_digest
from hicache.dataplane.routes import MAPPED_ENV, count_runs
from hicache.errors import ConfigError, LayoutError
from hicache.kernels import KernelSet
from hicache.kernels.reference import copy_mapped_torch
from tests.test_group_bytes import dsv4_tiny, request_pages
from tests.test_transfer import done, plan_of, poison, randomize, rows, tiny

POISON = 0xA5
L1_PAGES, L2_PAGES = 12, 16


@pytest.fixture
def interpreted(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield


def pools(dtype: str = "bf16", page_size: int = 4) -> tuple[DevicePool, HostPool]:
    g = tiny(dtype, page_size)
    l1, l2 = DevicePool(g, L1_PAGES, "cpu"), HostPool(g, L2_PAGES, pin=False)
    randomize(l1.tensor, seed=3)
    return l1, l2


def idx(xs: list[int]) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64)


# -- the definition and the kernel ---------------------------------------------------------------


def test_definition_writes_each_page_at_its_slot_and_nothing_else() -> None:
    l1, l2 = pools()
    poison(l2.tensor)
    src, slots = [5, 0, 5, 9], [3, 14, 7, 0]  # an L1 page may be read twice
    copy_mapped_torch(l1.tensor, idx(src), l2.tensor, idx(slots), to_pool=True)
    for s, d in zip(src, slots):
        assert torch.equal(rows(l2.tensor[d : d + 1]), rows(l1.packed(pages([s]))))
    rest = sorted(set(range(L2_PAGES)) - set(slots))
    assert bool((l2.tensor[rest].view(torch.uint8) == POISON).all())
    back = DevicePool(l1.geometry, L1_PAGES, "cpu")
    poison(back.tensor)
    copy_mapped_torch(back.tensor, idx([1, 2]), l2.tensor, idx([3, 14]), to_pool=False)
    assert torch.equal(rows(back.packed(pages([1, 2]))), rows(l1.packed(pages([5, 0]))))
    assert bool((back.packed(pages([0, 3])).view(torch.uint8) == POISON).all())


@pytest.mark.parametrize(
    ("src", "slots", "dtype", "shape", "message"),
    [
        ([0, 1], [1, 2, 3], None, None, "slots: 3 of them"),
        ([0, 1], [1, 99], None, None, "values must lie in"),
        ([0, 1], [4, 4], None, None, "distinct slots"),
        ([0, 77], [2, 3], None, None, "values must lie in"),
        ([0, 1], [2, 3], torch.float16, None, "dtype"),
        ([0, 1], [2, 3], None, (L2_PAGES, 2, 2, 4, 2, 8), "expected shape"),
    ],
)
def test_operands_are_checked(
    src: list[int],
    slots: list[int],
    dtype: torch.dtype | None,
    shape: tuple[int, ...] | None,
    message: str,
) -> None:
    l1, l2 = pools()
    pool = l2.tensor if dtype is None else l2.tensor.view(dtype)
    if shape is not None:
        pool = torch.empty(shape, dtype=pool.dtype)
    with pytest.raises(LayoutError, match=message):
        copy_mapped_torch(l1.tensor, idx(src), pool, idx(slots), to_pool=True)


def test_a_host_pool_must_be_pinned_or_on_l1s_device() -> None:
    l1, _ = pools()
    meta = torch.empty((L2_PAGES, 2, 2, 4, 2, 4), dtype=torch.bfloat16, device="meta")
    with pytest.raises(LayoutError, match="pinned"):
        copy_mapped_torch(l1.tensor, idx([0]), meta, idx([0]), to_pool=True)


@pytest.mark.parametrize("dtype", ["bf16", "fp8", "fp32"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_triton_kernel_matches_the_definition(
    interpreted: None, dtype: str, page_size: int
) -> None:
    from hicache.kernels import triton_mapped

    l1, l2 = pools(dtype, page_size)
    want = l2.tensor.clone()
    poison(want)
    poison(l2.tensor)
    src, slots = idx([7, 2, 2, 11, 0]), idx([15, 0, 8, 3, 9])
    copy_mapped_torch(l1.tensor, src, want, slots, to_pool=True)
    for programs in (1, 3, None):  # fewer programs than rows: each loops over several
        poison(l2.tensor)
        triton_mapped.copy_mapped(l1.tensor, src, l2.tensor, slots, to_pool=True, programs=programs)
        assert torch.equal(l2.tensor.view(torch.uint8), want.view(torch.uint8))
    back = torch.empty_like(l1.tensor)
    poison(back)
    dst = idx([1, 4, 5, 6, 10])
    triton_mapped.copy_mapped(back, dst, l2.tensor, slots, to_pool=False, programs=2)
    expect = torch.empty_like(back)
    poison(expect)
    copy_mapped_torch(expect, dst, want, slots, to_pool=False)
    assert torch.equal(back.view(torch.uint8), expect.view(torch.uint8))


# -- the mover's route ---------------------------------------------------------------------------


def mover(*, mapped: bool | None = True, faults: FaultInjector | None = None) -> DeviceHostMover:
    l1, l2 = pools("fp16", 2)
    return DeviceHostMover(
        l1, l2, KernelSet.create(l1.tensor, "torch"), faults=faults, mapped_d2h=mapped
    )


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_mapped_d2h_moves_exactly_its_pages(data: st.DataObject) -> None:
    m = mover()
    n = data.draw(st.integers(2, L1_PAGES))
    src = pages(data.draw(st.lists(st.integers(0, L1_PAGES - 1), min_size=n, max_size=n)))
    dst = pages(data.draw(st.permutations(range(L2_PAGES)))[:n])
    assume(not bool((np.diff(np.sort(dst)) == 1).all()))  # one run goes by DMA (below)
    poison(m.l2.tensor)
    handle = m.d2h(src, dst)
    done(handle)
    plan = plan_of(handle)
    assert plan.mapped and plan.dmas == 0 and str(plan).startswith("mapped:")
    assert np.array_equal(page_digest(m.l1, src), page_digest(m.l2, dst))
    rest = torch.from_numpy(np.setdiff1d(np.arange(L2_PAGES), dst))
    assert bool((m.l2.tensor[rest].view(torch.uint8) == POISON).all())
    c = m.counters[Direction.D2H]
    assert c.mapped == 1 and c.direct_dmas == 0 and c.staged == 0
    assert c.fragmented == 1 == (plan.route.runs > 1)
    assert m.buffers_busy == 0 and m.in_flight == 0


def test_an_h2d_never_goes_mapped() -> None:
    m = mover()
    dst = pages([3, 9, 4])
    done(m.d2h(pages([0, 1, 2]), dst))
    handle = m.h2d(dst, pages([5, 6, 7]))
    done(handle)
    assert not plan_of(handle).mapped and m.counters[Direction.H2D].mapped == 0
    assert np.array_equal(page_digest(m.l1, pages([0, 1, 2])), page_digest(m.l1, pages([5, 6, 7])))


def test_one_run_of_l2_pages_goes_by_dma() -> None:
    """One run is one DMA from the packed buffer: nothing for a mapped copy to save."""
    m = mover()
    src = pages([0, 1, 2, 3])
    for dst, mapped in ((pages([4, 5, 6, 7]), False), (pages([8, 10, 11, 12]), True)):
        poison(m.l2.tensor)
        handle = m.d2h(src, dst)
        done(handle)
        assert plan_of(handle).mapped is mapped, (dst, plan_of(handle))
        assert np.array_equal(page_digest(m.l1, src), page_digest(m.l2, dst))


@pytest.mark.parametrize("site", [FaultSite.PINNED_ALLOC, FaultSite.DEVICE_ALLOC])
def test_a_failed_buffer_fails_the_d2h_and_leaves_nothing_borrowed(site: FaultSite) -> None:
    m = mover(faults=FaultInjector().once(site))
    poison(m.l2.tensor)
    handle = m.d2h(pages([0, 1]), pages([4, 9]))
    assert handle.poll() is TransferStatus.FAILED and handle.error is not None
    assert m.buffers_busy == 0 and m.in_flight == 0
    assert bool((m.l2.tensor.view(torch.uint8) == POISON).all()), "a failed issue wrote L2"


def test_a_completion_fault_fails_the_mapped_d2h_and_returns_its_buffers() -> None:
    m = mover(faults=FaultInjector().once(FaultSite.D2H_COMPLETE))
    handle = m.d2h(pages([0, 1]), pages([4, 9]))
    assert handle.wait(timeout_s=5) is TransferStatus.FAILED
    assert m.counters[Direction.D2H].failed == 1
    assert m.buffers_busy == 0 and m.in_flight == 0


# -- GPU: compiled, pinned L2 addressed in place -------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_gpu_mapped_d2h_writes_pinned_l2_in_place(dtype: str) -> None:
    g = tiny(dtype, 16)
    l1, l2 = DevicePool(g, 64, "cuda"), HostPool(g, 64, pin=True)
    l1.tensor.view(torch.uint8).random_(0, 256)
    m = DeviceHostMover(l1, l2, KernelSet.create(l1.tensor, "triton"))
    assert m.mapped_d2h, m.mapped_reason
    from hicache.kernels import triton_mapped

    compiled = triton_mapped._compiled().dispatches  # prebuilt by the mover's constructor
    rng = np.random.default_rng(5)
    for n in (1, 5, 22, 40):  # one page is one run: its one DMA (routes.py)
        src = pages(rng.choice(64, size=n, replace=False))
        dst = pages(rng.choice(64, size=n, replace=False))
        for _ in range(3):  # eager, captured, replayed
            poison(l2.tensor)
            handle = m.d2h(src, dst)
            done(handle)
            assert plan_of(handle).mapped == (count_runs(dst) > 1), plan_of(handle)
            assert np.array_equal(page_digest(l1, src), page_digest(l2, dst))
            rest = torch.from_numpy(np.setdiff1d(np.arange(64), dst))
            assert bool((l2.tensor[rest].view(torch.uint8) == POISON).all())
    assert triton_mapped._compiled().dispatches == compiled, "an issue compiled a kernel"
    assert m.graphs.replays > 0 and m.buffers_busy == 0


def test_the_probe_passes_when_every_word_lands(interpreted: None) -> None:
    from hicache.kernels import triton_mapped

    l1, l2 = pools()
    scratch = torch.full_like(l2.tensor[:1], 0)
    assert triton_mapped.probe(l1.tensor, scratch) == ""
    page = l1.tensor[:, :, 0].contiguous()  # L1 page 0, page-major; as bits (random: NaNs)
    assert torch.equal(scratch[0].view(torch.int16), page.view(torch.int16))


@pytest.mark.parametrize(
    "planted", ["nothing written", "nothing written over zeros", "launch refused", "one row short"]
)
def test_the_probe_names_what_went_wrong(interpreted: None, planted: str) -> None:
    """A platform whose GPU cannot write pinned memory in place shows up as a launch Triton
    refuses or as words that never land; the probe turns either into a reason. Also where
    the source page and the scratch page already hold the same words (a fresh pool and a
    zeroed scratch page: an H100 found the probe passing with nothing written there)."""
    from hicache.errors import BackendError
    from hicache.kernels import triton_mapped

    real = triton_mapped.launch_mapped

    def launch(*args: object, **kwargs: object) -> None:
        if planted == "launch refused":
            raise BackendError("Pointer argument (at 1) cannot be accessed from Triton")
        if planted == "one row short":
            real(*args, **kwargs)  # type: ignore[arg-type]
            scratch = args[2]
            assert isinstance(scratch, torch.Tensor)
            scratch[-1] ^= 1  # the last word of the last row is off

    l1, l2 = pools()
    if planted == "nothing written over zeros":
        l1.tensor.zero_()
    scratch = torch.zeros_like(l2.tensor[:1])
    with mock.patch.object(triton_mapped, "launch_mapped", launch):
        why = triton_mapped.probe(l1.tensor, scratch)
    expected = "failed \\(BackendError" if planted == "launch refused" else "did not land"
    assert why and re.search(expected, why), why


def test_an_interpreter_that_cannot_run_the_kernel_turns_the_route_off(
    interpreted: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a CPU with the Triton kernels the interpreted kernel is probed as a GPU's is: where
    Triton's interpreter cannot run it (Triton 3.6's could not, before the kernel's `while`),
    both movers go by DMA and say why, and a route asked for by name is a ConfigError -- not
    a BackendError from the first D2H."""
    from hicache.dataplane.groupgeometry import GroupGeometry
    from hicache.dataplane.grouppools import GroupDevicePool, GroupHostPool
    from hicache.errors import BackendError
    from hicache.kernels import triton_mapped
    from hicache.pools import presets

    l1, l2 = pools()
    kernels = KernelSet.create(l1.tensor, "triton")

    def refused(*args: object, **kwargs: object) -> None:
        raise BackendError("InterpreterError: TypeError('only 0-dimensional arrays ...')")

    monkeypatch.setattr(triton_mapped, "launch_mapped", refused)
    monkeypatch.setenv(MAPPED_ENV, "1")
    m = DeviceHostMover(l1, l2, kernels)
    assert not m.mapped_d2h and "0-dimensional" in m.mapped_reason, m.mapped_reason
    with pytest.raises(ConfigError, match="mapped_d2h.*0-dimensional"):
        DeviceHostMover(l1, l2, kernels, mapped_d2h="every")
    geometry = GroupGeometry.from_group(presets.group("dsv4-tiny"))
    caps = {s: 8 for s in geometry.sources}
    gl1, gl2 = GroupDevicePool(geometry, caps, "cpu"), GroupHostPool(geometry, caps, pin=False)
    group = GroupMover(gl1, gl2, "per_pool")
    assert not group.mapped_d2h and "0-dimensional" in group.mapped_reason, group.mapped_reason


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_a_failed_probe_turns_the_route_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the probe's page does not land the movers go by DMA and say why; asked for by
    name, the route is a ConfigError."""
    from hicache.dataplane.groupgeometry import GroupGeometry
    from hicache.dataplane.grouppools import GroupDevicePool, GroupHostPool
    from hicache.kernels import triton_mapped
    from hicache.pools import presets

    g = tiny("bf16", 16)
    l1, l2 = DevicePool(g, 16, "cuda"), HostPool(g, 16, pin=True)
    l1.tensor.view(torch.uint8).random_(0, 256)
    kernels = KernelSet.create(l1.tensor, "triton")
    monkeypatch.setattr(triton_mapped, "launch_mapped", lambda *a, **k: None)  # nothing lands
    m = DeviceHostMover(l1, l2, kernels)
    assert not m.mapped_d2h and "did not land" in m.mapped_reason, m.mapped_reason
    src, dst = pages([0, 1, 2]), pages([9, 2, 5])
    done(m.d2h(src, dst))  # by DMA
    assert np.array_equal(page_digest(l1, src), page_digest(l2, dst))
    assert m.counters[Direction.D2H].mapped == 0
    with pytest.raises(ConfigError, match="did not land"):
        DeviceHostMover(l1, l2, kernels, mapped_d2h=True)
    geometry = GroupGeometry.from_group(presets.group("dsv4-tiny"))
    caps = {s: 8 for s in geometry.sources}
    gl1, gl2 = GroupDevicePool(geometry, caps, "cuda"), GroupHostPool(geometry, caps, pin=True)
    group = GroupMover(gl1, gl2, "per_pool")
    assert not group.mapped_d2h and "did not land" in group.mapped_reason, group.mapped_reason


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_mapped_needs_the_triton_gather() -> None:
    g = tiny("bf16", 16)
    l1, l2 = DevicePool(g, 8, "cuda"), HostPool(g, 8, pin=True)
    torch_kernels = KernelSet.create(l1.tensor, "torch")
    assert not DeviceHostMover(l1, l2, torch_kernels).mapped_d2h
    with pytest.raises(ConfigError, match="mapped_d2h"):
        DeviceHostMover(l1, l2, torch_kernels, mapped_d2h=True)


# -- the group mover: one mapped copy per pool ---------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 4), st.integers(0, 3), st.integers(0, 2**32 - 1), st.booleans())
def test_a_mapped_group_d2h_writes_every_pool_in_place(
    n_kv: int, n_swa: int, seed: int, triton: bool
) -> None:
    """Torch's index ops, or the Triton kernel per pool (interpreted): each pool's pages land
    in its L2 pages, no other L2 byte changes, no workspace or DMA is used."""
    with mock.patch.dict(os.environ, {"TRITON_INTERPRET": "1"} if triton else {}):
        geometry, l1, l2 = dsv4_tiny()
        mover = GroupMover(l1, l2, "per_pool" if triton else "torch", mapped_d2h=True)
        d2h, _ = request_pages(np.random.default_rng(seed), n_kv, n_swa)
        l2.tensor.fill_(POISON)
        handle = mover.d2h(d2h)
        assert handle.wait(timeout_s=30) is TransferStatus.DONE
        c = mover.counters[Direction.D2H]
        moves = handle.plan.moves if isinstance(handle, GroupHandle) else ()
        several = len(moves) > 1 or (len(moves) == 1 and len(moves[0].runs()) > 1)
        assert c.mapped == several and c.dmas == (0 if several else len(moves))  # 1 DMA: by DMA
        assert mover.workspaces.busy == 0
        for p in geometry.pools:
            src, dst = d2h[p.source]
            assert np.array_equal(pool_digest(l1, p.name, src), pool_digest(l2, p.name, dst))
            view = l2.bytes_view(p.name)
            rest = sorted(set(range(view.shape[0])) - set(np.asarray(dst).tolist()))
            assert bool((view[rest] == POISON).all()), p.name
        assert mover.buffers_busy == 0 and not mover.in_flight


def test_the_group_mapped_route_is_chosen_as_the_single_pools(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, l1, l2 = dsv4_tiny()
    monkeypatch.delenv(MAPPED_ENV, raising=False)
    assert not GroupMover(l1, l2, "torch").mapped_d2h  # CPU: by DMA unless asked
    monkeypatch.setenv(MAPPED_ENV, "1")
    mover = GroupMover(l1, l2, "torch")
    assert mover.mapped_d2h and mover.status()["mapped_d2h"] == mover.mapped_reason
    h = mover.h2d({"kv": ([0, 1], [2, 3])})  # an H2D keeps its DMAs
    assert h.wait(timeout_s=5) is TransferStatus.DONE
    assert mover.counters[Direction.H2D].mapped == 0 and mover.counters[Direction.H2D].dmas > 0


def test_a_failed_operand_buffer_fails_the_group_d2h_with_nothing_borrowed() -> None:
    _, l1, l2 = dsv4_tiny()
    faults = FaultInjector().once(FaultSite.PINNED_ALLOC)
    mover = GroupMover(l1, l2, "torch", faults=faults, mapped_d2h=True)
    handle = mover.d2h({"kv": ([0, 1], [2, 3])})
    assert handle.poll() is TransferStatus.FAILED and handle.error is not None
    assert mover.buffers_busy == 0 and not mover.in_flight


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["dsv4-tiny", "mla-tiny"])
def test_gpu_mapped_group_d2h_writes_pinned_l2_in_place(name: str) -> None:
    from hicache.dataplane.groupgeometry import GroupGeometry
    from hicache.dataplane.grouppools import GroupDevicePool, GroupHostPool
    from hicache.kernels import triton_mapped
    from hicache.pools import presets

    geometry = GroupGeometry.from_group(presets.group(name))
    caps = {src: 32 for src in geometry.sources}
    l1, l2 = GroupDevicePool(geometry, caps, "cuda"), GroupHostPool(geometry, caps, pin=True)
    l1.tensor.random_(0, 256)
    mover = GroupMover(l1, l2, "per_pool")
    assert mover.mapped_d2h, mover.mapped_reason
    compiled = triton_mapped._compiled().dispatches
    rng = np.random.default_rng(2)
    for n in (1, 7, 20):
        request = {
            src: (rng.choice(32, size=n, replace=False), rng.choice(32, size=n, replace=False))
            for src in geometry.sources
        }
        for _ in range(3):  # eager, captured, replayed
            l2.tensor.fill_(POISON)
            assert mover.d2h(request).wait(timeout_s=30) is TransferStatus.DONE
            for p in geometry.pools:
                src, dst = request[p.source]
                assert np.array_equal(pool_digest(l1, p.name, src), pool_digest(l2, p.name, dst))
    c = mover.counters[Direction.D2H]
    # mla's one pool at one page is one DMA: by DMA; every other request needs several.
    one_dma = 3 if name == "mla-tiny" else 0
    assert c.mapped == 9 - one_dma and c.dmas == one_dma and c.replays > 0, c
    assert triton_mapped._compiled().dispatches == compiled, "an issue compiled a kernel"
    assert mover.buffers_busy == 0
