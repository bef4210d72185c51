"""Triton gather/scatter: one program per (row, chunk), moving raw integer words.

    grid = (rows, chunks)     rows = n * 2 * layers; row r is (i, kl) = divmod(r, 2 * layers)
    program (r, c)            loads pages[i] once, then copies words
                              [c * SPAN, min((c + 1) * SPAN, ROW_WORDS)) of row r in BLOCK steps
    L1 row                    starts at word (kl * num_pages + pages[i]) * ROW_WORDS
    packed row                starts at word r * ROW_WORDS

Each row is contiguous on both sides, so every step is a BLOCK-wide vector copy (16-byte loads
and stores when the row is a multiple of 16 bytes). Offsets are 64-bit: pools pass 2^31 words.
A row is split over several programs (chunks) only when there are too few rows to fill the
GPU; on the H200 a probe of this row-per-program shape moved 3,459 GB/s (read + written) over
219 Qwen3-8B pages, 83% of a 1 GiB device-to-device copy.

Kernels are compiled lazily, once per mode: Triton decides compiled vs interpreted
(TRITON_INTERPRET) when `triton.jit` runs, so deferring it lets the mode follow the
environment at the time of the call. CPU tensors need the interpreter. On a GPU, launches go
through `launch.CompiledCache` (Triton's dispatch once per specialization, then the compiled
kernel directly), and `prebuild` compiles every chunk-split variant of a pool up front, so no
transfer ever compiles inside its issuing call.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl
from triton.compiler.errors import CompilationError
from triton.runtime.errors import OutOfResources

try:  # Triton >= 3.4: one base for compile, resource, ptxas and interpreter errors
    from triton import TritonError
except ImportError:  # older Triton: its two compile-time failure types
    TritonError = CompilationError

from hicache.errors import BackendError, ConfigError, LayoutError
from hicache.kernels.launch import CompiledCache, arg_key, on_stream
from hicache.kernels.reference import RowLayout, check_operands, word_view

GRID_ROWS_MAX = 2**31 - 1  # CUDA grid.x limit
GRID_CHUNKS_MAX = 65535  # CUDA grid.y limit
# Split rows into chunks until there are this many programs per SM: 4-warp programs fit 16
# to an SM, so this is about two full waves, enough to hide the tail of the last one.
PROGRAMS_PER_SM = 32
NUM_WARPS_ALLOWED = (1, 2, 4, 8, 16)
# What a failing compile or launch raises (driver and toolchain problems surface as
# RuntimeError or OSError); anything else is a bug and propagates as is.
LAUNCH_FAILURES: tuple[type[BaseException], ...] = (
    TritonError,
    CompilationError,
    OutOfResources,
    RuntimeError,
    OSError,
)


def _copy_rows(  # type: ignore[no-untyped-def]
    src,
    dst,
    pages,
    pages_stride,
    rows_per_page,
    l1_pages,
    ROW_WORDS: tl.constexpr,
    SPAN: tl.constexpr,
    BLOCK: tl.constexpr,
    EVEN: tl.constexpr,
    GATHER: tl.constexpr,
):
    """Copy SPAN words of one row between L1 and packed (direction: GATHER)."""
    row = tl.program_id(0).to(tl.int64)
    start = tl.program_id(1).to(tl.int64) * SPAN
    i = row // rows_per_page
    kl = row - i * rows_per_page
    page = tl.load(pages + i * pages_stride).to(tl.int64)
    l1_base = (kl * l1_pages + page) * ROW_WORDS
    packed_base = row * ROW_WORDS
    if GATHER:
        src_row = src + l1_base
        dst_row = dst + packed_base
    else:
        src_row = src + packed_base
        dst_row = dst + l1_base
    for step in range(0, SPAN, BLOCK):
        offsets = start + step + tl.arange(0, BLOCK)
        if EVEN:
            tl.store(dst_row + offsets, tl.load(src_row + offsets))
        else:
            inside = offsets < ROW_WORDS
            tl.store(dst_row + offsets, tl.load(src_row + offsets, mask=inside), mask=inside)


_JITTED: dict[bool, Any] = {}  # interpreted? -> the jitted `_copy_rows`


def interpreter_enabled() -> bool:
    """True when TRITON_INTERPRET is set the way Triton reads it (1/true/on/yes)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


def _kernel() -> Any:
    mode = interpreter_enabled()
    if mode not in _JITTED:
        _JITTED[mode] = triton.jit(_copy_rows)
    return _JITTED[mode]


@dataclass(frozen=True)
class LaunchConfig:
    """How rows are cut into programs.

    block_bytes  bytes one program copies per loop step (a power of two; capped at the row)
    num_warps    warps per program
    chunks       programs sharing one row; None picks it from the row count and SM count
    """

    block_bytes: int = 8192
    num_warps: int = 4
    chunks: int | None = None

    def __post_init__(self) -> None:
        if self.block_bytes < 1 or self.block_bytes & (self.block_bytes - 1):
            raise ConfigError("kernels.block_bytes", f"a power of two, got {self.block_bytes}")
        if self.num_warps not in NUM_WARPS_ALLOWED:
            raise ConfigError(
                "kernels.num_warps", f"one of {NUM_WARPS_ALLOWED}, got {self.num_warps}"
            )
        if self.chunks is not None and not 1 <= self.chunks <= GRID_CHUNKS_MAX:
            raise ConfigError("kernels.chunks", f"None or 1..{GRID_CHUNKS_MAX}, got {self.chunks}")

    @property
    def label(self) -> str:
        chunks = "auto" if self.chunks is None else str(self.chunks)
        return f"{self.block_bytes}B/{self.num_warps}w/c{chunks}"


@functools.lru_cache(maxsize=64)
def default_config(row_bytes: int) -> LaunchConfig:
    """8 KiB steps on 4 warps (64 bytes, four 16-byte vectors, per thread per step) for rows of
    8 KiB and more -- the shape of the H200 probe (module docstring); smaller rows take one
    step of the whole row with fewer warps, keeping at least 16 bytes per thread."""
    block_bytes = min(8192, _next_pow2(row_bytes))
    return LaunchConfig(block_bytes, max(1, min(4, block_bytes // 2048)))


@dataclass(frozen=True)
class LaunchPlan:
    """The concrete grid and compile-time constants of one launch (sizes in words)."""

    grid: tuple[int, int]
    block_words: int
    span_words: int
    even: bool  # every program's span lies wholly inside its row: no masks
    num_warps: int


@functools.lru_cache(maxsize=256)  # pure; caching saves a launch some Python time
def plan_launch(layout: RowLayout, config: LaunchConfig, target_programs: int) -> LaunchPlan:
    """Cut `layout.rows` rows into programs; chunks double until `target_programs` is met."""
    block_words = max(1, min(config.block_bytes // layout.word_bytes, _next_pow2(layout.row_words)))
    steps = -(-layout.row_words // block_words)  # loop steps for a whole row
    chunks = config.chunks
    if chunks is None:
        chunks = 1
        while chunks < steps and layout.rows * chunks < target_programs:
            chunks *= 2
    span_words = -(-steps // min(chunks, steps)) * block_words
    chunks = -(-layout.row_words // span_words)  # no program starts past the row's end
    # Verify the grid fits CUDA's limits before anything is launched.
    if layout.rows > GRID_ROWS_MAX:
        raise LayoutError(
            f"pages: {layout.n} pages make {layout.rows} rows, over the grid "
            f"limit {GRID_ROWS_MAX}; split the transfer"
        )
    return LaunchPlan(
        grid=(layout.rows, chunks),
        block_words=block_words,
        span_words=span_words,
        even=layout.row_words % span_words == 0,
        num_warps=config.num_warps,
    )


def gather_rows(
    l1: torch.Tensor,
    pages: torch.Tensor,
    out: torch.Tensor,
    config: LaunchConfig | None = None,
    *,
    stream: torch.cuda.Stream | None = None,
) -> None:
    """out[i, kv, l] = l1[kv, l, pages[i]], enqueued on `stream` (default: the current
    stream) with no sync. Passing the stream saves the caller a stream switch."""
    _launch(l1, pages, out, gather=True, config=config, stream=stream)


def scatter_rows(
    packed: torch.Tensor,
    pages: torch.Tensor,
    l1: torch.Tensor,
    config: LaunchConfig | None = None,
    *,
    stream: torch.cuda.Stream | None = None,
) -> None:
    """l1[kv, l, pages[i]] = packed[i, kv, l] (pages distinct), enqueued on `stream`."""
    _launch(l1, pages, packed, gather=False, config=config, stream=stream)


def _launch(
    l1: torch.Tensor,
    pages: torch.Tensor,
    packed: torch.Tensor,
    *,
    gather: bool,
    config: LaunchConfig | None,
    stream: torch.cuda.Stream | None,
) -> None:
    layout = check_operands(l1, pages, packed, scatter=not gather)
    if layout.n == 0:
        return
    # The kernel computes every offset itself: it needs the word pointers, not the shapes.
    launch_layout(
        layout,
        word_view(l1, layout),
        word_view(packed, layout),
        pages,
        gather=gather,
        config=config,
        stream=stream,
    )


def launch_layout(
    layout: RowLayout,
    l1_words: torch.Tensor,
    packed_words: torch.Tensor,
    pages: torch.Tensor,
    *,
    gather: bool,
    config: LaunchConfig | None = None,
    stream: torch.cuda.Stream | None = None,
) -> None:
    """The launch behind `gather_rows`/`scatter_rows` for operands already checked against
    `layout`: `l1_words` holds `layout.rows_per_page` rows of `layout.l1_pages` pages (row
    (kl, p) at word (kl * l1_pages + p) * row_words), `packed_words` n pages of rows. Pool
    groups call it per pool with their own row counts (`RowLayout.rows_per_layer`)."""
    device = l1_words.device
    interpreted = interpreter_enabled()
    check_runnable(device, interpreted)
    plan, constants = _plan_for(layout, config, device)
    src, dst = (l1_words, packed_words) if gather else (packed_words, l1_words)
    args = (
        src,
        dst,
        pages,
        pages.stride(0),
        layout.rows_per_page,
        layout.l1_pages,
        *constants,
        gather,
    )
    try:
        if device.type != "cuda" or interpreted:
            with on_stream(stream):
                _kernel()[plan.grid](*args, num_warps=plan.num_warps)
        elif _one_gpu() or device.index == torch.cuda.current_device():
            _launch_compiled(plan, args, device, stream)
        else:  # kernels are loaded per device: launch with l1's device current
            with torch.cuda.device(device):
                _launch_compiled(plan, args, device, stream)
    except LAUNCH_FAILURES as exc:
        what = "gather" if gather else "scatter"
        raise BackendError(
            f"Triton {what} failed to compile or launch ({layout.row_bytes}-byte rows, "
            f"{plan.block_words}x{layout.word_bytes}-byte blocks): {type(exc).__name__}: {exc}; "
            f"use backend 'torch' or 'auto'"
        ) from exc


def _launch_compiled(
    plan: LaunchPlan, args: tuple[Any, ...], device: torch.device, stream: torch.cuda.Stream | None
) -> None:
    """Through the compiled-kernel cache (kernels/launch.py), on `stream` or the current one."""
    key = _specialization(args, plan.num_warps, device)
    _compiled().launch(key, plan.grid, args, {"num_warps": plan.num_warps}, stream=stream)


@functools.cache
def _one_gpu() -> bool:
    """One visible CUDA device: no launch can target another, so no device check is needed."""
    return torch.cuda.device_count() == 1


def _specialization(args: tuple[Any, ...], num_warps: int, device: torch.device) -> Hashable:
    """`launch.CompiledCache`'s key: what Triton specializes on (see kernels/launch.py)."""
    src, dst, pages, *scalars = args
    index = device.index if device.index is not None else torch.cuda.current_device()
    return (index, num_warps, arg_key(src), arg_key(dst), arg_key(pages), *scalars)


_COMPILED: list[CompiledCache] = []  # the compiled-mode cache, made on first GPU launch


def _compiled() -> CompiledCache:
    """The compiled-kernel cache (call only while the interpreter is off)."""
    if not _COMPILED:
        assert not interpreter_enabled(), "the interpreter has no compiled kernels"
        _COMPILED.append(CompiledCache(_kernel()))
    return _COMPILED[0]


def prebuild(l1: torch.Tensor, pages_dtype: torch.dtype = torch.int64) -> int:
    """Compile and load, without running, every kernel variant a default-config gather or
    scatter on `l1` (a CUDA pool) can need: each chunk split, with 16-byte aligned operands
    and contiguous `pages_dtype` indices -- what the transfer engine passes. Returns the
    number of variants compiled now (0 when all were built before)."""
    if l1.device.type != "cuda" or interpreter_enabled():
        return 0
    cache = _compiled()
    before = cache.dispatches
    one = torch.empty((1, *l1.shape[:2], *l1.shape[3:]), dtype=l1.dtype, device=l1.device)
    pages = torch.zeros(1, dtype=pages_dtype, device=l1.device)
    layout = check_operands(l1, pages, one, scatter=False)
    base = default_config(layout.row_bytes)
    words = (word_view(l1, layout), word_view(one, layout))
    for chunks in _chunk_splits(layout, base):
        plan, constants = _plan_for(
            layout, LaunchConfig(base.block_bytes, base.num_warps, chunks), l1.device
        )
        for gather in (True, False):
            src, dst = words if gather else words[::-1]
            args = (src, dst, pages, 1, layout.rows_per_page, layout.l1_pages, *constants, gather)
            with torch.cuda.device(l1.device):
                cache.prebuild(
                    _specialization(args, plan.num_warps, l1.device),
                    args,
                    {"num_warps": plan.num_warps},
                )
    return cache.dispatches - before


def _chunk_splits(layout: RowLayout, config: LaunchConfig) -> list[int]:
    """Every chunk count `plan_launch` can pick for rows of this layout: 1, 2, 4, ... up to
    the first power of two covering a row's loop steps."""
    block_words = max(1, min(config.block_bytes // layout.word_bytes, _next_pow2(layout.row_words)))
    steps = -(-layout.row_words // block_words)
    splits = [1]
    while splits[-1] < steps:
        splits.append(2 * splits[-1])
    return splits


@functools.lru_cache(maxsize=256)  # pure per (geometry, config, device): one lookup a launch
def _plan_for(
    layout: RowLayout, config: LaunchConfig | None, device: torch.device
) -> tuple[LaunchPlan, tuple[int, int, int, bool]]:
    """The launch plan and the kernel's compile-time constants but GATHER, in parameter
    order: (ROW_WORDS, SPAN, BLOCK, EVEN)."""
    plan = plan_launch(layout, config or default_config(layout.row_bytes), programs_target(device))
    return plan, (layout.row_words, plan.span_words, plan.block_words, plan.even)


def check_runnable(device: torch.device, interpreted: bool | None = None) -> None:
    """Raise BackendError unless Triton can run on `device` in the current mode
    (`interpreted`: the mode, when the caller has just read it)."""
    if device.type == "cuda" or (interpreter_enabled() if interpreted is None else interpreted):
        return
    raise BackendError(
        f"Triton cannot run on {device.type} tensors: it compiles for GPUs only. Set "
        f"TRITON_INTERPRET=1 to run it in Triton's (slow) interpreter, or use backend 'torch'"
    )


_SM_COUNT: dict[int, int] = {}


def programs_target(device: torch.device) -> int:
    """Programs wanted in one launch; 1 off-GPU, where the interpreter runs them one by one."""
    if device.type != "cuda":
        return 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index] * PROGRAMS_PER_SM


def _next_pow2(value: int) -> int:
    return 1 << max(0, value - 1).bit_length()
