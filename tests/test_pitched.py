"""The pitched route: a small D2H/H2D as one 2D DMA per page between its L1 rows and its L2
page, in place (routes.py, copy2d.py). On CPU the same 2D copies run by memmove per row
(asked for by HICACHE_PITCHED_DMA=1 or `pitched=True`); on a GPU, cudaMemcpy2DAsync into pinned
L2 and back. Each test names what a wrong pitch, page or order would break."""

from __future__ import annotations

import os
from unittest import mock

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hicache.core.pages import pages
from hicache.core.tiers import Direction
from hicache.dataplane.dma import DeviceHostMover
from hicache.dataplane.faults import FaultInjector, FaultSite
from hicache.dataplane.geometry import KVGeometry
from hicache.dataplane.handles import TransferStatus
from hicache.dataplane.pools import DevicePool, HostPool, page_digest
from hicache.dataplane.routes import (
    EVERY,
    MAPPED_ENV,
    PITCHED_ENV,
    PITCHED_MAX_PAGES,
    route_choice,
)
from hicache.errors import ConfigError
from hicache.kernels import KernelSet
from tests.test_transfer import POISON, done, plan_of, poison, randomize, tiny

L1_PAGES, L2_PAGES = 80, 96  # room for a transfer past PITCHED_MAX_PAGES


def mover(
    *,
    pitched: bool | None = True,
    faults: FaultInjector | None = None,
    dtype: str = "fp16",
    every: bool = False,
) -> DeviceHostMover:
    """A CPU mover; `every`: HICACHE_PITCHED_DMA=all (D2Hs and one run of pages too)."""
    g = tiny(dtype, 2)
    l1, l2 = DevicePool(g, L1_PAGES, "cpu"), HostPool(g, L2_PAGES, pin=False)
    randomize(l1.tensor, seed=7)
    kernels = KernelSet.create(l1.tensor, "torch")
    with mock.patch.dict(os.environ, {PITCHED_ENV: "all"} if every else {}):
        return DeviceHostMover(l1, l2, kernels, faults=faults, mapped_d2h=False, pitched=pitched)


def untouched(t: torch.Tensor, written: np.ndarray, axis: int) -> bool:
    """Every page of `t` (pages on `axis`) outside `written` still holds the poison."""
    rest = torch.from_numpy(np.setdiff1d(np.arange(t.shape[axis]), written))
    return bool((t.index_select(axis, rest).view(torch.uint8) == POISON).all())


@settings(max_examples=40, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(["fp16", "fp8"]))
def test_a_pitched_transfer_moves_exactly_its_pages(data: st.DataObject, dtype: str) -> None:
    """Both ways, any order: L1 page src[i] lands in L2 page dst[i] and back into L1 page
    back[i]; no other L2 or L1 page changes, nothing is borrowed, no other route ran."""
    m = mover(dtype=dtype, every=True)
    n = data.draw(st.integers(1, 12))
    src = pages(data.draw(st.lists(st.integers(0, L1_PAGES - 1), min_size=n, max_size=n)))
    dst = pages(data.draw(st.permutations(range(L2_PAGES)))[:n])
    poison(m.l2.tensor)
    handle = m.d2h(src, dst)
    done(handle)
    plan = plan_of(handle)
    assert plan.pitched and plan.dmas == n and str(plan).startswith("pitched:"), plan
    assert np.array_equal(page_digest(m.l1, src), page_digest(m.l2, dst))
    assert untouched(m.l2.tensor, dst, 0)
    back = pages(data.draw(st.permutations(range(L1_PAGES)))[:n])
    expected = page_digest(m.l2, dst)
    poison(m.l1.tensor)
    done(m.h2d(dst, back))
    assert np.array_equal(page_digest(m.l1, back), expected)
    assert untouched(m.l1.tensor, back, 2)  # L1 is [K/V, layer, page, ...]
    for d in (Direction.D2H, Direction.H2D):
        c = m.counters[d]
        assert c.pitched == 1 and c.direct_dmas == 0 and c.mapped == 0 and c.staged == 0, c
    assert m.buffers_busy == 0 and m.in_flight == 0


@pytest.mark.parametrize("every", [False, True])
def test_fragmented_h2ds_up_to_pitched_max_pages_go_pitched(every: bool) -> None:
    """Up to PITCHED_MAX_PAGES L2 pages not in one run in order, an H2D goes pitched; one run
    in order (one DMA), more pages, or a D2H: the other routes -- all but more pages pitched
    with HICACHE_PITCHED_DMA=all."""
    m = mover(every=every)
    for n, in_order, pitched in (
        (2, False, True),
        (PITCHED_MAX_PAGES, False, True),
        (PITCHED_MAX_PAGES + 1, False, False),
        (1, True, every),
        (5, True, every),
    ):
        l1_ids = pages(np.arange(n))
        l2_ids = pages(np.arange(n) if in_order else np.arange(n)[::-1].copy())
        poison(m.l2.tensor)
        d2h = m.d2h(l1_ids, l2_ids)
        done(d2h)
        assert plan_of(d2h).pitched is (pitched and every), (n, plan_of(d2h))
        back = pages(np.arange(n) + 40)
        h2d = m.h2d(l2_ids, back)
        done(h2d)
        assert plan_of(h2d).pitched is pitched, (n, plan_of(h2d))
        assert np.array_equal(page_digest(m.l1, l1_ids), page_digest(m.l1, back))


@pytest.mark.parametrize(
    ("env", "setting", "reason"),
    [(PITCHED_ENV, "pitched", "pitched_reason"), (MAPPED_ENV, "mapped_d2h", "mapped_reason")],
)
def test_an_optional_route_is_off_on_cpu_unless_asked(
    monkeypatch: pytest.MonkeyPatch, env: str, setting: str, reason: str
) -> None:
    """Both optional routes (pitched, mapped) by one rule (routes.route_choice): off on CPU
    unless the environment says 1; 0 turns the default off; a setting by name wins."""
    g = tiny("fp16", 2)
    l1, l2 = DevicePool(g, 4, "cpu"), HostPool(g, 4, pin=False)
    kernels = KernelSet.create(l1.tensor, "torch")

    def on(requested: bool | None) -> bool:
        m = DeviceHostMover(l1, l2, kernels, **{setting: requested})  # type: ignore[arg-type]
        assert m.status()[setting] == getattr(m, reason)
        return bool(getattr(m, setting))

    monkeypatch.delenv(env, raising=False)
    assert not on(None)
    monkeypatch.setenv(env, "1")
    assert on(None)
    monkeypatch.setenv(env, "0")
    assert not on(None)
    assert on(True)  # asked for by name: the environment does not veto
    assert not on(False)


def test_a_route_that_cannot_run_is_off_with_why_or_refused_by_name() -> None:
    def choice(requested: bool | None, why_not: str) -> tuple[bool, bool, str]:
        return route_choice(
            requested, env=PITCHED_ENV, field="pitched", cuda=True, why_not=why_not, on="on"
        )

    assert choice(None, "no 2D copy") == (False, False, "off: no 2D copy")
    assert choice(None, "") == (True, False, "on")
    with pytest.raises(ConfigError, match="pitched.*no 2D copy"):
        choice(True, "no 2D copy")


def test_a_completion_fault_fails_the_pitched_transfer_and_holds_nothing() -> None:
    m = mover(faults=FaultInjector().once(FaultSite.H2D_COMPLETE))
    handle = m.h2d(pages([9, 4]), pages([0, 1]))
    assert handle.wait(timeout_s=5) is TransferStatus.FAILED
    assert m.counters[Direction.H2D].failed == 1 and m.counters[Direction.H2D].pitched == 1
    assert m.buffers_busy == 0 and m.in_flight == 0


def test_the_2d_copy_passes_its_pitches_and_raises_on_a_driver_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """cuda.bindings' cudaMemcpy2DAsync, faked: the arguments go in the driver's order with
    the stream wrapped once per handle; a nonzero status is a TransferError naming the copy;
    without the bindings the route says so."""
    import sys
    import types

    from hicache.dataplane.copy2d import runtime_copy2d
    from hicache.errors import TransferError

    calls: list[tuple[object, ...]] = []
    wrapped: list[int] = []

    def memcpy2d(*args: object) -> tuple[int]:
        calls.append(args)
        return (700 if args[0] == 13 else 0,)

    def stream_t(handle: int) -> tuple[str, int]:
        wrapped.append(handle)
        return ("stream", handle)

    runtime = types.SimpleNamespace(
        cudaMemcpyKind=types.SimpleNamespace(cudaMemcpyDefault="default"),
        cudaStream_t=stream_t,
        cudaMemcpy2DAsync=memcpy2d,
    )
    bindings = types.ModuleType("cuda.bindings")
    bindings.runtime = runtime  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cuda", types.ModuleType("cuda"))
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    copy2d, why = runtime_copy2d()
    assert copy2d is not None and "cudaMemcpy2DAsync" in why
    copy2d(1, 2, 3, 4, 5, 6, 7)
    copy2d(8, 2, 3, 4, 5, 6, 7)
    assert calls[0] == (1, 2, 3, 4, 5, 6, "default", ("stream", 7)) and wrapped == [7]
    with pytest.raises(TransferError, match="6 x 5 bytes"):
        copy2d(13, 2, 3, 4, 5, 6, 7)
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # not installed
    assert runtime_copy2d() == (None, "cuda.bindings is not installed")


# -- GPU: cudaMemcpy2DAsync between L1 and pinned L2 ------------------------------------------


def long_rows() -> KVGeometry:
    """32 KiB rows (16 tokens x 8 heads x 128 x bf16), as Qwen3-8B's: the route's minimum."""
    return KVGeometry(layers=3, kv_heads=8, head_dim=128, dtype="bf16", page_size=16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rows", ["long", "short"])
def test_gpu_pitched_moves_pinned_l2_in_place(rows: str) -> None:
    """32 KiB rows (the rule's) with HICACHE_PITCHED_DMA=all, and 256-byte rows, which the
    rule leaves off, asked for as transfer_route=pitched asks (`pitched=EVERY`)."""
    g = long_rows() if rows == "long" else tiny("bf16", 16)
    l1, l2 = DevicePool(g, 70, "cuda"), HostPool(g, 80, pin=True)
    l1.tensor.view(torch.uint8).random_(0, 256)
    kernels = KernelSet.create(l1.tensor, "triton")
    assert not DeviceHostMover(l1, l2, kernels).pitched_every  # D2Hs mapped by default
    if rows == "long":
        with mock.patch.dict(os.environ, {PITCHED_ENV: "all"}):  # D2Hs pitched too
            m = DeviceHostMover(l1, l2, kernels)
    else:
        m = DeviceHostMover(l1, l2, kernels, pitched=EVERY)
    if m._copy2d is None:
        pytest.skip(m.pitched_reason)
    assert m.pitched and m.pitched_every, m.pitched_reason
    rng = np.random.default_rng(3)
    for n in (2, 5, 22, PITCHED_MAX_PAGES):
        src = pages(rng.choice(70, size=n, replace=False))
        dst = pages(rng.choice(80, size=n, replace=False))
        poison(l2.tensor)
        handle = m.d2h(src, dst)
        done(handle)
        assert plan_of(handle).pitched, plan_of(handle)  # random pages: never one run
        assert np.array_equal(page_digest(l1, src), page_digest(l2, dst))
        assert untouched(l2.tensor, dst, 0)
        back = pages(rng.choice(70, size=n, replace=False))
        expected = page_digest(l2, dst)
        handle = m.h2d(dst, back)
        done(handle)
        assert plan_of(handle).pitched and np.array_equal(page_digest(l1, back), expected)
    assert m.buffers_busy == 0 and m.counters[Direction.D2H].pitched == 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_an_h2d_gate_waits_for_every_pitched_page() -> None:
    """A reader on another stream that waits on the gate sees every page, even behind a
    caller stream kept busy (the DMAs wait for it: they overwrite L1)."""
    g = long_rows()
    l1, l2 = DevicePool(g, 8, "cuda"), HostPool(g, 8, pin=True)
    l2.tensor.view(torch.uint8).random_(0, 256)
    m = DeviceHostMover(l1, l2, KernelSet.create(l1.tensor, "triton"))
    if not m.pitched:
        pytest.skip(m.pitched_reason)
    busy = torch.empty(1 << 26, device="cuda")
    for _ in range(20):
        busy.mul_(1.0)  # the caller's stream is busy when the H2D is issued
    handle = m.h2d(pages([5, 1, 6]), pages([0, 3, 7]))
    assert plan_of(handle).pitched, plan_of(handle)
    reader = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    with torch.cuda.stream(reader):
        assert handle.gate is not None
        for layer in range(g.layers):
            handle.gate.wait(layer)
        got = l1.tensor[:, :, [0, 3, 7]].clone()
    reader.synchronize()
    want = l2.tensor[[5, 1, 6]].permute(1, 2, 0, 3, 4, 5).cuda()
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    done(handle)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_short_rows_stay_off_the_pitched_route_unless_asked() -> None:
    """Rows under PITCHED_MIN_ROW_BYTES were never measured: the rule leaves them off, a
    request takes them (they run: test_gpu_pitched_moves_pinned_l2_in_place)."""
    g = tiny("bf16", 16)  # 256-byte rows
    l1, l2 = DevicePool(g, 8, "cuda"), HostPool(g, 8, pin=True)
    kernels = KernelSet.create(l1.tensor, "triton")
    m = DeviceHostMover(l1, l2, kernels)
    assert not m.pitched and "rows of" in m.pitched_reason, m.pitched_reason
    if m._copy2d is not None:
        assert DeviceHostMover(l1, l2, kernels, pitched=True).pitched
