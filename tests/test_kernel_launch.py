"""The compiled-kernel cache (`kernels/launch.py`): dispatch once per specialization key, then
launch the compiled kernel directly; turn itself off when Triton hands back no launcher.

CPU tests drive `CompiledCache` with a recording stand-in for a jitted function (Triton cannot
compile here). GPU tests (`gpu` marker) check the real kernels: operands Triton would compile
differently get different cache entries, each moves the right bytes, and after `prebuild` no
transfer size dispatches (so none can compile inside an issuing call).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")
pytest.importorskip("triton", reason="runs the Triton kernels: pip install -e '.[gpu]'")

import torch

from hicache.kernels import KernelSet, gather_torch, scatter_torch, triton_rows
from hicache.kernels.launch import CompiledCache, arg_key


class FakeCompiled:
    """A compiled kernel: `[grid](*args)` launches (recorded)."""

    def __init__(self, log: list[tuple[str, object]]) -> None:
        self.log = log
        self.run = object()  # Triton's launcher attribute; only its presence is checked

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        def runner(*args: object, stream: int | None = None) -> None:
            self.log.append(("direct", (grid, args)))

        return runner


class FakeJitted:
    """A jitted function: `[grid](*args, **options)` dispatches and returns what it compiled."""

    def __init__(self, compiled: object | None = None) -> None:
        self.log: list[tuple[str, object]] = []
        self.compiled = FakeCompiled(self.log) if compiled is None else compiled

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        def dispatch(*args: object, **options: object) -> object:
            self.log.append(("dispatch", (grid, args, options)))
            return self.compiled

        return dispatch

    def warmup(self, *args: object, grid: tuple[int, ...], **options: object) -> object:
        self.log.append(("warmup", (args, options)))
        return self.compiled


def test_first_call_dispatches_then_launches_directly() -> None:
    jitted = FakeJitted()
    cache = CompiledCache(jitted)
    cache.launch("k", (4, 1), (1, 2), {"num_warps": 4})
    cache.launch("k", (8, 2), (3, 4), {"num_warps": 4})
    cache.launch("other", (8, 2), (3, 4), {"num_warps": 4})
    assert [kind for kind, _ in jitted.log] == ["dispatch", "direct", "dispatch"]
    assert jitted.log[1][1] == ((8, 2, 1), (3, 4))  # the new grid (3-d) and args reach it
    assert cache.dispatches == 2


def test_prebuild_compiles_without_launching() -> None:
    jitted = FakeJitted()
    cache = CompiledCache(jitted)
    cache.prebuild("k", (1, 2), {"num_warps": 2})
    cache.prebuild("k", (1, 2), {"num_warps": 2})  # already built: nothing to do
    cache.launch("k", (4,), (1, 2), {"num_warps": 2})
    assert [kind for kind, _ in jitted.log] == ["warmup", "direct"]


def test_a_kernel_without_launcher_turns_the_fast_path_off() -> None:
    jitted = FakeJitted(compiled="not a kernel")
    cache = CompiledCache(jitted)
    for _ in range(3):
        cache.launch("k", (1,), (), {})
    assert [kind for kind, _ in jitted.log] == ["dispatch"] * 3  # every call still launches
    assert not cache.enabled and "launching through kernel[grid]" in cache.disabled_because


def test_a_future_is_resolved_before_it_is_kept() -> None:
    log: list[tuple[str, object]] = []
    compiled = FakeCompiled(log)

    class Future:
        def result(self) -> FakeCompiled:
            return compiled

    jitted = FakeJitted(compiled=Future())
    cache = CompiledCache(jitted)
    cache.launch("k", (1,), (), {})
    cache.launch("k", (2,), (), {})
    assert log == [("direct", ((2, 1, 1), ()))]


def test_arg_key_separates_alignment_dtype_and_values() -> None:
    words = torch.zeros(8, dtype=torch.int64)
    assert arg_key(words) == arg_key(words[2:])  # 16 bytes in: still aligned
    assert arg_key(words) != arg_key(words[1:])  # 8 bytes in: not
    assert arg_key(words) != arg_key(words.view(torch.int32))
    assert arg_key(1) != arg_key(2) and arg_key(True) != arg_key(1)
    with pytest.raises(TypeError, match="float"):
        arg_key(1.5)


@pytest.fixture
def compiled_mode(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    yield


def _pool(pages: int, device: str = "cuda") -> torch.Tensor:
    l1 = torch.empty((2, 4, pages, 16, 8, 128), dtype=torch.bfloat16, device=device)
    l1.view(torch.uint8).random_(0, 256)
    return l1


@pytest.mark.gpu
def test_gpu_each_specialization_gets_its_own_kernel(compiled_mode: None) -> None:
    """Aligned and 8-byte-misaligned index slices (and int32 indices) are different Triton
    specializations: each gets its own cache entry and each moves the right bytes."""
    l1 = _pool(64)
    base = torch.randperm(64, device="cuda")[:21]
    cache = triton_rows._compiled()
    variants = {"aligned": base[:20], "misaligned": base[1:], "int32": base[:20].int()}
    for name, pages in variants.items():
        for _ in range(2):  # the second call goes through the cached kernel
            out = torch.full((20, 2, 4, 16, 8, 128), float("nan"), dtype=l1.dtype, device="cuda")
            expected = torch.empty_like(out)
            triton_rows.gather_rows(l1, pages, out)
            gather_torch(l1, pages, expected)
            torch.cuda.synchronize()
            assert torch.equal(out.view(torch.uint8), expected.view(torch.uint8)), name
    keys = [
        triton_rows._specialization((l1, l1, pages, 1, 8, 64, 0, 0, 0, True, True), 4, l1.device)
        for pages in variants.values()
    ]
    assert len(set(keys)) == 3
    assert cache.enabled, cache.disabled_because


@pytest.mark.gpu
def test_gpu_no_transfer_size_dispatches_after_prebuild(compiled_mode: None) -> None:
    """After KernelSet.create, gathers and scatters of every size (every chunk split) launch
    compiled kernels only: nothing compiles inside a transfer."""
    l1 = _pool(600)
    KernelSet.create(l1, "triton")
    cache = triton_rows._compiled()
    before = cache.dispatches
    for n in (1, 2, 3, 7, 30, 64, 300, 600):
        pages = torch.randperm(600, device="cuda")[:n]
        packed = torch.empty((n, 2, 4, 16, 8, 128), dtype=l1.dtype, device="cuda")
        packed.view(torch.uint8).random_(0, 256)
        reference = l1.clone()
        scatter_torch(packed, pages, reference)
        triton_rows.scatter_rows(packed, pages, l1)
        back = torch.empty_like(packed)
        triton_rows.gather_rows(l1, pages, back)
        torch.cuda.synchronize()
        assert torch.equal(l1.view(torch.uint8), reference.view(torch.uint8)), n
        assert torch.equal(back.view(torch.uint8), packed.view(torch.uint8)), n
    assert cache.dispatches == before
