"""Gather/scatter kernels: torch reference vs an obvious loop, Triton vs the reference.

Triton runs here in its interpreter on CPU tensors (the `interpreted` fixture sets
TRITON_INTERPRET=1; `hicache.kernels.triton_rows` jits lazily, once per mode, so the variable
only has to be set before the first launch, not before `import triton`). The interpreter runs
every program in Python: shapes stay tiny. GPU tests (`gpu` marker) compile the real kernels.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator

import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")
pytest.importorskip("triton", reason="runs the Triton kernels: pip install -e '.[gpu]'")

import torch
from hypothesis import given
from hypothesis import strategies as st

from hicache.errors import BackendError, ConfigError, LayoutError
from hicache.kernels import KernelSet, gather, gather_torch, scatter, scatter_torch, triton_rows
from hicache.kernels.reference import RowLayout, check_operands
from hicache.kernels.triton_rows import LaunchConfig, plan_launch

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn]
PAGE_SIZES = [1, 16, 64]
POISON = 0xA5
LAYERS, KV_HEADS, HEAD_DIM, L1_PAGES, MOVED = 2, 2, 8, 7, 4


@pytest.fixture
def interpreted(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield


@pytest.fixture
def compiled(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    yield


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def random_kv(
    shape: tuple[int, ...], dtype: torch.dtype, seed: int, device: str = "cpu"
) -> torch.Tensor:
    """Random bytes seen as `dtype`: NaN and odd fp8 patterns included, on purpose."""
    t = torch.empty(shape, dtype=dtype, device=device)
    gen = torch.Generator().manual_seed(seed)
    as_bytes(t).copy_(
        torch.randint(0, 256, (as_bytes(t).numel(),), generator=gen, dtype=torch.uint8)
    )
    return t


def poisoned(shape: tuple[int, ...], dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
    t = torch.empty(shape, dtype=dtype, device=device)
    as_bytes(t).fill_(POISON)
    return t


def l1_shape(
    page_size: int,
    pages: int = L1_PAGES,
    layers: int = LAYERS,
    heads: int = KV_HEADS,
    dim: int = HEAD_DIM,
) -> tuple[int, ...]:
    return (2, layers, pages, page_size, heads, dim)


def packed_shape(l1: torch.Tensor | tuple[int, ...], n: int) -> tuple[int, ...]:
    """The packed shape for `n` pages of an L1 tensor (or L1 shape)."""
    shape = tuple(l1.shape) if isinstance(l1, torch.Tensor) else l1
    return (n, *shape[:2], *shape[3:])


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.equal(as_bytes(a), as_bytes(b)))


def random_pages(
    l1_pages: int, n: int, seed: int, dtype: torch.dtype = torch.int64, device: str = "cpu"
) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(l1_pages, generator=gen)[:n].to(dtype).to(device)


def loop_gather(l1: torch.Tensor, pages: list[int]) -> torch.Tensor:
    """The definition, one row at a time, on byte views (so NaN payloads compare exactly)."""
    src = l1.view(torch.uint8)
    out = torch.empty((len(pages), *src.shape[:2], *src.shape[3:]), dtype=torch.uint8)
    for i, page in enumerate(pages):
        for kv in range(2):
            for layer in range(src.shape[1]):
                out[i, kv, layer] = src[kv, layer, page]
    return out


def loop_scatter(packed: torch.Tensor, pages: list[int], l1: torch.Tensor) -> torch.Tensor:
    dst = l1.view(torch.uint8).clone()
    src = packed.view(torch.uint8)
    for i, page in enumerate(pages):
        for kv in range(2):
            for layer in range(dst.shape[1]):
                dst[kv, layer, page] = src[i, kv, layer]
    return dst


# --- torch reference vs the loop -------------------------------------------------------------

geometries = st.tuples(
    st.integers(1, 3),
    st.integers(1, 5),
    st.integers(1, 2),
    st.integers(1, 4),
    st.sampled_from(DTYPES),
    st.integers(1, 6),
)


@given(geometry=geometries, data=st.data())
def test_reference_gather_matches_loop(
    geometry: tuple[int, int, int, int, torch.dtype, int], data: st.DataObject
) -> None:
    layers, page_size, heads, dim, dtype, l1_pages = geometry
    l1 = random_kv(l1_shape(page_size, l1_pages, layers, heads, dim), dtype, seed=1)
    pages = data.draw(st.lists(st.integers(0, l1_pages - 1), max_size=8), label="pages")
    out = poisoned(packed_shape(l1, len(pages)), dtype)
    gather_torch(l1, torch.tensor(pages, dtype=torch.int64), out)
    assert torch.equal(out.view(torch.uint8), loop_gather(l1, pages))


@given(geometry=geometries, data=st.data())
def test_reference_scatter_matches_loop(
    geometry: tuple[int, int, int, int, torch.dtype, int], data: st.DataObject
) -> None:
    layers, page_size, heads, dim, dtype, l1_pages = geometry
    l1 = poisoned(l1_shape(page_size, l1_pages, layers, heads, dim), dtype)
    pages = data.draw(st.permutations(range(l1_pages)), label="order")
    pages = pages[: data.draw(st.integers(0, l1_pages), label="n")]
    packed = random_kv(packed_shape(l1, len(pages)), dtype, seed=2)
    expected = loop_scatter(packed, pages, l1)
    scatter_torch(packed, torch.tensor(pages, dtype=torch.int32), l1)
    assert torch.equal(l1.view(torch.uint8), expected)


# --- Triton (interpreted) vs the reference --------------------------------------------------


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_triton_gather_matches_reference(
    interpreted: None, dtype: torch.dtype, page_size: int
) -> None:
    l1 = random_kv(l1_shape(page_size), dtype, seed=page_size)
    index_dtype = torch.int32 if page_size == 16 else torch.int64
    pages = random_pages(L1_PAGES, MOVED, seed=page_size + 1, dtype=index_dtype)
    expected = poisoned(packed_shape(l1, MOVED), dtype)
    gather_torch(l1, pages, expected)
    out = poisoned(packed_shape(l1, MOVED), dtype)
    gather(l1, pages, out, backend="triton")
    assert same_bytes(out, expected)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_triton_scatter_matches_reference(
    interpreted: None, dtype: torch.dtype, page_size: int
) -> None:
    packed = random_kv(packed_shape(l1_shape(page_size), MOVED), dtype, seed=3)
    pages = random_pages(L1_PAGES, MOVED, seed=page_size)
    expected = poisoned(l1_shape(page_size), dtype)
    scatter_torch(packed, pages, expected)
    l1 = poisoned(l1_shape(page_size), dtype)
    scatter(packed, pages, l1, backend="triton")
    assert same_bytes(l1, expected)
    # Verify the pages not listed kept every poisoned byte (the comparison above covers them
    # too; this names the property).
    others = sorted(set(range(L1_PAGES)) - set(pages.tolist()))
    assert bool((as_bytes(l1[:, :, others].contiguous()) == POISON).all())


@pytest.mark.parametrize(
    "config",
    [LaunchConfig(64, 1, chunks=3), LaunchConfig(16, 2, chunks=3), LaunchConfig(8192, 4, chunks=1)],
    ids=lambda c: c.label,
)
@pytest.mark.parametrize(
    "geometry",
    [(4, 2, 8, torch.float16), (1, 1, 3, torch.float8_e4m3fn), (3, 1, 5, torch.bfloat16)],
    ids=str,
)
def test_triton_split_rows_and_masked_tails(
    interpreted: None, config: LaunchConfig, geometry: tuple[int, int, int, torch.dtype]
) -> None:
    """Rows split over several programs, spans that do not divide the row, and rows of odd
    byte counts (moved as 1- or 2-byte words) still copy every byte exactly once."""
    page_size, heads, dim, dtype = geometry
    l1 = random_kv(l1_shape(page_size, heads=heads, dim=dim), dtype, seed=5)
    pages = random_pages(L1_PAGES, MOVED, seed=6)
    out = poisoned(packed_shape(l1, MOVED), dtype)
    triton_rows.gather_rows(l1, pages, out, config)
    expected = poisoned(out.shape, dtype)
    gather_torch(l1, pages, expected)
    assert same_bytes(out, expected)
    target = poisoned(l1.shape, dtype)
    triton_rows.scatter_rows(out, pages, target, config)
    reference = poisoned(l1.shape, dtype)
    scatter_torch(out, pages, reference)
    assert same_bytes(target, reference)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_repeated_strided_and_empty_pages(interpreted: None, backend: str) -> None:
    l1 = random_kv(l1_shape(4), torch.bfloat16, seed=7)
    strided = torch.tensor([5, -1, 5, -1, 0, -1], dtype=torch.int64)[::2]  # stride 2, repeats
    out = poisoned(packed_shape(l1, 3), torch.bfloat16)
    gather(l1, strided, out, backend=backend)
    assert torch.equal(out.view(torch.uint8), loop_gather(l1, [5, 5, 0]))
    empty = torch.empty(0, dtype=torch.int64)
    before = l1.clone()
    gather(l1, empty, torch.empty(packed_shape(l1, 0), dtype=l1.dtype), backend=backend)
    scatter(torch.empty(packed_shape(l1, 0), dtype=l1.dtype), empty, l1, backend=backend)
    assert same_bytes(l1, before)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_misaligned_packed_falls_back_to_narrow_words(interpreted: None, backend: str) -> None:
    """A packed tensor starting 2 bytes into its storage cannot be read as int64 words."""
    l1 = random_kv(l1_shape(4), torch.float16, seed=8)
    pages = random_pages(L1_PAGES, 3, seed=9)
    storage = poisoned((math.prod(packed_shape(l1, 3)) + 1,), torch.float16)
    out = storage[1:].view(packed_shape(l1, 3))
    assert check_operands(l1, pages, out, scatter=False).word_bytes == 2
    gather(l1, pages, out, backend=backend)
    assert torch.equal(out.view(torch.uint8), loop_gather(l1, pages.tolist()))
    assert bool((as_bytes(storage[:1]) == POISON).all())


@given(
    row_words=st.integers(1, 1 << 13),
    word=st.sampled_from([1, 2, 4, 8]),
    rows=st.integers(1, 5000),
    block=st.sampled_from([16, 256, 4096, 8192, 16384]),
    chunks=st.one_of(st.none(), st.integers(1, 70)),
    target=st.integers(1, 10000),
)
def test_launch_plan_covers_each_row_once(
    row_words: int, word: int, rows: int, block: int, chunks: int | None, target: int
) -> None:
    """Whatever the config, programs (r, c) tile words [0, row_words) of each row exactly:
    spans are whole blocks, no program starts past the row, and the last one reaches its end."""
    layout = RowLayout(layers=1, l1_pages=1, n=rows, row_bytes=row_words * word, word_bytes=word)
    plan = plan_launch(layout, LaunchConfig(block, 4, chunks), target)
    n_rows, n_chunks = plan.grid
    assert n_rows == 2 * rows and n_chunks >= 1
    assert plan.block_words & (plan.block_words - 1) == 0
    assert plan.span_words % plan.block_words == 0
    assert (n_chunks - 1) * plan.span_words < layout.row_words <= n_chunks * plan.span_words
    assert plan.even == (layout.row_words % plan.span_words == 0)


def test_default_plan_for_qwen3_8b() -> None:
    """32 KiB rows move as 8 KiB int64 blocks; few rows (22 pages) are split to fill an H200
    (132 SMs), many (219 pages) are not."""
    few = RowLayout(layers=36, l1_pages=4096, n=22, row_bytes=32768, word_bytes=8)
    many = RowLayout(layers=36, l1_pages=4096, n=219, row_bytes=32768, word_bytes=8)
    config = triton_rows.default_config(32768)
    assert (config.block_bytes, config.num_warps) == (8192, 4)
    split, whole = plan_launch(few, config, 132 * 32), plan_launch(many, config, 132 * 32)
    assert split.grid == (22 * 72, 4) and split.span_words == 1024 and split.even
    assert whole.grid == (219 * 72, 1) and whole.span_words == 4096 and whole.even


# --- errors ------------------------------------------------------------------------------------


def bad_calls() -> list[tuple[str, dict[str, torch.Tensor]]]:
    l1 = random_kv(l1_shape(4), torch.float32, seed=10)
    out = poisoned(packed_shape(l1, 2), torch.float32)
    pages = torch.tensor([1, 3])
    return [
        ("out shape", {"out": poisoned(packed_shape(l1, 3), torch.float32)}),
        ("out dtype", {"out": poisoned(packed_shape(l1, 2), torch.float16)}),
        (
            "out layout",
            {"out": poisoned((2, 2, *packed_shape(l1, 2)[2:]), torch.float32).transpose(0, 1)},
        ),
        ("out device", {"out": torch.empty(out.shape, dtype=out.dtype, device="meta")}),
        ("pages dtype", {"pages": pages.float()}),
        ("pages dim", {"pages": pages.view(1, 2)}),
        ("pages device", {"pages": torch.empty(2, dtype=torch.int64, device="meta")}),
        ("pages range", {"pages": torch.tensor([1, L1_PAGES])}),
        ("pages negative", {"pages": torch.tensor([-1, 2])}),
        ("l1 dims", {"l1": l1[0]}),
        ("l1 dtype", {"l1": l1.view(torch.int32)}),
        ("l1 layout", {"l1": l1.transpose(1, 2)}),
        ("base", {"l1": l1, "pages": pages, "out": out}),
    ]


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize(
    "case", range(len(bad_calls()) - 1), ids=[name for name, _ in bad_calls()[:-1]]
)
def test_bad_operands_raise_and_touch_nothing(interpreted: None, backend: str, case: int) -> None:
    base = bad_calls()[-1][1]
    name, change = bad_calls()[case]
    args = {**base, **change}
    before = [t.clone() for t in base.values()]
    with pytest.raises(LayoutError):
        gather(args["l1"], args["pages"], args["out"], backend=backend)
    with pytest.raises(LayoutError):
        scatter(args["out"], args["pages"], args["l1"], backend=backend)
    assert all(same_bytes(t, b) for t, b in zip(base.values(), before)), name


def test_scatter_rejects_repeated_pages_and_unknown_backends() -> None:
    l1 = poisoned(l1_shape(4), torch.float32)
    packed = random_kv(packed_shape(l1, 2), torch.float32, seed=11)
    with pytest.raises(LayoutError, match="distinct"):
        scatter(packed, torch.tensor([3, 3]), l1, backend="torch")
    assert bool((as_bytes(l1) == POISON).all())
    with pytest.raises(ConfigError, match="backend"):
        gather(l1, torch.tensor([3, 4]), packed, backend="cuda")
    with pytest.raises(ValueError):  # LayoutError and ConfigError are both ValueErrors
        scatter(packed, torch.tensor([3, 4]), l1, backend="fast")


# --- backend choice ----------------------------------------------------------------------------


def test_triton_on_cpu_without_interpreter_raises(compiled: None) -> None:
    l1 = random_kv(l1_shape(4), torch.bfloat16, seed=12)
    with pytest.raises(BackendError, match="TRITON_INTERPRET=1"):
        KernelSet.create(l1, "triton")
    with pytest.raises(BackendError, match="TRITON_INTERPRET=1"):
        gather(l1, torch.tensor([0]), torch.empty(packed_shape(l1, 1), dtype=l1.dtype))


def test_auto_on_cpu_says_why_it_picks_torch(
    compiled: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    l1 = random_kv(l1_shape(4), torch.bfloat16, seed=13)
    plain = KernelSet.create(l1)
    assert (plain.gather_backend, plain.scatter_backend) == ("torch", "torch")
    assert "TRITON_INTERPRET" in plain.reason
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    checked = KernelSet.create(l1, "auto")
    assert (checked.gather_backend, checked.scatter_backend) == ("torch", "torch")
    assert "interpreted Triton kernels ran" in checked.reason
    assert KernelSet.create(l1, "torch").reason == "torch requested"


def test_interpreter_mode_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert type(triton_rows._kernel()).__name__ == "InterpretedFunction"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert type(triton_rows._kernel()).__name__ == "JITFunction"


def test_explicit_triton_kernel_set_moves_bytes(interpreted: None) -> None:
    l1 = random_kv(l1_shape(16), torch.float8_e4m3fn, seed=14)
    kernels = KernelSet.create(l1, "triton", probe_pages=3)
    assert (kernels.gather_backend, kernels.scatter_backend) == ("triton", "triton")
    pages = random_pages(L1_PAGES, 3, seed=15)
    out = poisoned(packed_shape(l1, 3), l1.dtype)
    kernels.gather(l1, pages, out)
    target = poisoned(l1.shape, l1.dtype)
    kernels.scatter(out, pages, target)
    assert torch.equal(out.view(torch.uint8), loop_gather(l1, pages.tolist()))
    assert torch.equal(
        target.view(torch.uint8), loop_scatter(out, pages.tolist(), poisoned(l1.shape, l1.dtype))
    )


def test_auto_falls_back_when_triton_fails(
    interpreted: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    l1 = random_kv(l1_shape(4), torch.float16, seed=16)

    def broken(*args: object) -> None:
        raise BackendError("Triton gather failed to compile: simulated ptxas crash")

    def lazy(*args: object) -> None:  # runs, but writes nothing
        return None

    monkeypatch.setattr(triton_rows, "gather_rows", broken)
    fallback = KernelSet.create(l1, "auto")
    assert fallback.gather_backend == fallback.scatter_backend == "torch"
    assert "simulated ptxas crash" in fallback.reason
    with pytest.raises(BackendError, match="simulated ptxas crash"):
        KernelSet.create(l1, "triton")
    monkeypatch.setattr(triton_rows, "gather_rows", lazy)
    wrong = KernelSet.create(l1, "auto")
    assert wrong.gather_backend == "torch" and "different from torch" in wrong.reason


def test_without_triton_auto_uses_torch_and_triton_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch-only install: `auto` says why it uses torch, explicit `triton` raises."""
    import hicache.kernels as package

    monkeypatch.delattr(package, "triton_rows")
    monkeypatch.setitem(sys.modules, "hicache.kernels.triton_rows", None)  # import fails
    l1 = random_kv(l1_shape(4), torch.float16, seed=18)
    kernels = KernelSet.create(l1, "auto")
    assert (kernels.gather_backend, kernels.scatter_backend) == ("torch", "torch")
    assert "triton is not importable" in kernels.reason
    out = poisoned(packed_shape(l1, 2), l1.dtype)
    with pytest.raises(BackendError, match="not importable"):
        gather(l1, torch.tensor([1, 2]), out, backend="triton")
    kernels.gather(l1, torch.tensor([1, 2]), out)
    assert torch.equal(out.view(torch.uint8), loop_gather(l1, [1, 2]))


def test_kernel_set_rejects_bad_requests() -> None:
    l1 = random_kv(l1_shape(4), torch.float32, seed=17)
    with pytest.raises(ConfigError, match="backend"):
        KernelSet.create(l1, "fastest")
    with pytest.raises(ConfigError, match="probe_pages"):
        KernelSet.create(l1, "auto", probe_pages=0)
    with pytest.raises(LayoutError):
        KernelSet.create(l1[0], "torch")
    with pytest.raises(LayoutError, match="no pages"):
        KernelSet.create(l1[:, :, :0], "auto")


# --- benchmark code path (numbers are meaningless off-GPU) -------------------------------------


def test_bench_runs_on_cpu_and_checks_every_variant(interpreted: None) -> None:
    from hicache.bench.kernels import bench_kernels, format_table

    result = bench_kernels(
        preset_name="tiny",
        pool_pages=6,
        tokens=(7,),
        iters=1,
        warmup=0,
        ceiling_bytes=1 << 12,
        device="cpu",
        configs=[LaunchConfig(16, 1)],
    )
    case = result["cases"][0]  # type: ignore[index]
    assert case["pages"] == 2
    for direction in ("gather", "scatter"):
        assert set(case[direction]) == {"torch", "triton", "triton 16B/1w/cauto"}
        assert all(row["correct"] for row in case[direction].values())
    assert "triton 16B/1w/cauto" in format_table(result)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA exit")
def test_bench_main_without_cuda_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    from hicache.bench.kernels import main

    assert main([]) == 2
    assert "no CUDA device" in capsys.readouterr().err


# --- GPU ---------------------------------------------------------------------------------------


def assert_triton_matches_torch(l1: torch.Tensor, pages: torch.Tensor) -> None:
    """Both backends gather the same bytes from `l1`, and scatter the same bytes into it
    (rows of other pages included). Leaves fresh random bytes on the listed pages of `l1`."""
    n, device = pages.numel(), str(l1.device)
    expected, out = (poisoned(packed_shape(l1, n), l1.dtype, device) for _ in range(2))
    gather_torch(l1, pages, expected)
    gather(l1, pages, out)
    incoming = random_kv(packed_shape(l1, n), l1.dtype, seed=n, device=device)
    reference = l1.clone()
    scatter_torch(incoming, pages, reference)
    scatter(incoming, pages, l1)
    torch.cuda.synchronize()
    assert same_bytes(out, expected)
    assert same_bytes(l1, reference)


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_triton_matches_reference(compiled: None, dtype: torch.dtype, page_size: int) -> None:
    shape = l1_shape(page_size, pages=96, layers=4, heads=8, dim=128)
    l1 = random_kv(shape, dtype, seed=page_size, device="cuda")
    assert_triton_matches_torch(l1, random_pages(96, 40, seed=1, dtype=torch.int32, device="cuda"))


@pytest.mark.gpu
def test_gpu_pages_written_on_a_side_stream(compiled: None) -> None:
    """The kernel on the current stream reads `pages` only after current.wait_stream(side)."""
    l1 = random_kv(
        l1_shape(16, pages=64, layers=8, heads=8, dim=128), torch.bfloat16, seed=3, device="cuda"
    )
    truth = random_pages(64, 20, seed=4, device="cuda")
    pages = torch.zeros(20, dtype=torch.int64, device="cuda")  # stale until the side writes
    current = torch.cuda.current_stream()
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(current)
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # type: ignore[no-untyped-call]  # a missed wait shows
        pages.copy_(truth)
    current.wait_stream(side)
    out = poisoned(packed_shape(l1, 20), torch.bfloat16, "cuda")
    gather(l1, pages, out)
    expected = poisoned(packed_shape(l1, 20), torch.bfloat16, "cuda")
    gather_torch(l1, truth, expected)
    torch.cuda.synchronize()
    assert same_bytes(out, expected)


@pytest.mark.gpu
def test_gpu_offsets_past_2_to_the_31(compiled: None) -> None:
    """A pool over 2^31 words (odd 4,095-byte fp8 rows move as 1-byte words): the last pages'
    offsets need 64-bit arithmetic."""
    l1_pages = (1 << 31) // (2 * 4095) + 8
    l1 = torch.empty(
        l1_shape(1, pages=l1_pages, layers=1, heads=1, dim=4095),
        dtype=torch.float8_e4m3fn,
        device="cuda",
    )
    as_bytes(l1).random_(0, 256)
    assert_triton_matches_torch(l1, torch.arange(l1_pages - 6, l1_pages, device="cuda").flip(0))


@pytest.mark.gpu
def test_gpu_auto_times_both_backends(compiled: None) -> None:
    l1 = random_kv(
        l1_shape(16, pages=256, layers=8, heads=8, dim=128), torch.bfloat16, seed=5, device="cuda"
    )
    kernels = KernelSet.create(l1, "auto", probe_pages=64)
    assert kernels.gather_backend in ("triton", "torch")
    assert kernels.scatter_backend in ("triton", "torch")
    assert "gather triton" in kernels.reason and "scatter torch" in kernels.reason


@pytest.mark.gpu
def test_gpu_auto_on_a_second_gpu_times_its_kernels_on_that_gpu(
    compiled: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank on cuda:1 whose thread's current device is cuda:0 (the TP fuzz's ranks are
    threads of one process): the auto probe's events are recorded on cuda:1, where its
    kernels run, not on the current device's stream. Needs two GPUs."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    torch.cuda.set_device(0)
    recorded: list[int] = []
    original = torch.cuda.Event.record

    def record(self: torch.cuda.Event, stream: torch.cuda.Stream | None = None) -> None:
        recorded.append(torch.cuda.current_device())
        original(self, stream)

    monkeypatch.setattr(torch.cuda.Event, "record", record)
    l1 = random_kv(
        l1_shape(16, pages=64, layers=2, heads=2, dim=64), torch.bfloat16, seed=6, device="cuda:1"
    )
    kernels = KernelSet.create(l1, "auto", probe_pages=16)
    assert recorded and set(recorded) == {1}, recorded[:4]
    assert "gather triton" in kernels.reason
