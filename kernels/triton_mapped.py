"""Rows between L1 and a page-major pool the device addresses in place (mapped L2).

    program p     rows r = p, p + P, p + 2P, ... of rows = n * 2 * layers (P programs)
    row r         (i, kl) = divmod(r, 2 * layers)
    L1 row        (kl, pages[i]) at word (kl * l1_pages + pages[i]) * ROW_WORDS
    pool row      (slots[i], kl) at word (slots[i] * 2 * layers + kl) * ROW_WORDS

Pinned host memory is mapped into the GPU's address space (unified addressing: the device
pointer is the host pointer, for `cudaHostAlloc` and `cudaHostRegister` memory alike), so one
kernel can write L1's rows straight into their L2 pages: no packed device buffer, no DMA, no
per-run driver call -- one launch whatever the L2 pages' order. The stores cross the host link
as posted writes; on one H100 a fragmented 22-page Qwen3-8B D2H this way reached 92% of one
pinned copy (the gather + batched DMAs: 84%), 94.7% at 219 pages (benchmarks/zero_copy.py).
Reads of host memory are not posted: the same kernel the other way (L2 -> L1) reached 62% on
that host (88-91% on a second one): H2D keeps its DMAs; the kernel moves both ways for tests
and the probe.

The programs loop over rows, so a launch occupies at most PROGRAMS programs of NUM_WARPS warps:
a D2H runs beside the model's kernels, and a copy that waits on the host link needs few SMs to
keep it full. On the second H100 host 16 programs of 8 warps moved 22 pages at 90.1% and 219 at
94.2% of the pinned copy, one program per SM of 4 warps 85.9% and 91.1% (on the first host
grids of 132 to 1,584 programs were all within 0.5 points). Compiled lazily per mode like
`triton_rows`; `n_rows` is not specialized on, so no transfer size compiles a new variant, and
`prebuild` compiles the variants a mover needs before its first issue. `probe` runs one page into
pinned scratch memory when a mover is built: a GPU that cannot write pinned memory in place turns
the route off, with the reason, instead of failing the first D2H.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from typing import Any

import torch
import triton
import triton.language as tl

from hicache.errors import BackendError
from hicache.kernels.launch import CompiledCache, arg_key, on_stream
from hicache.kernels.reference import RowLayout, check_mapped, word_view
from hicache.kernels.triton_rows import LAUNCH_FAILURES, check_runnable, interpreter_enabled

STEP_BYTES = 8192  # one loop step of a program: 32 bytes per thread of 8 warps
NUM_WARPS = 8
PROGRAMS = 16  # programs per launch (module docstring; benchmarks/zero_copy.py)


def _copy_mapped(  # type: ignore[no-untyped-def]
    l1,
    pool,
    pages,
    slots,
    n_rows,
    rows_per_page,
    l1_pages,
    ROW_WORDS: tl.constexpr,
    BLOCK: tl.constexpr,
    EVEN: tl.constexpr,
    TO_POOL: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    """Rows (i, kl) between L1 row (kl, pages[i]) and pool row (slots[i], kl)."""
    first = tl.program_id(0).to(tl.int64)
    if INTERPRETED:
        # Triton 3.6's interpreter holds a program id or a scalar argument as a 1-element
        # array, which `range` cannot take as a bound ("only 0-dimensional arrays can be
        # converted to Python scalars"); a `while` compares it instead (as triton_table.py
        # does). Compiled, the `for` stays. The two bodies are the same.
        r = first
        while r < n_rows:
            i = r // rows_per_page
            kl = r - i * rows_per_page
            a = l1 + (kl * l1_pages + tl.load(pages + i).to(tl.int64)) * ROW_WORDS
            b = pool + (tl.load(slots + i).to(tl.int64) * rows_per_page + kl) * ROW_WORDS
            if TO_POOL:
                src, dst = a, b
            else:
                src, dst = b, a
            for step in range(0, ROW_WORDS, BLOCK):
                offsets = step + tl.arange(0, BLOCK)
                if EVEN:
                    tl.store(dst + offsets, tl.load(src + offsets))
                else:
                    inside = offsets < ROW_WORDS
                    tl.store(dst + offsets, tl.load(src + offsets, mask=inside), mask=inside)
            r += tl.num_programs(0)
    else:
        for r in range(first, n_rows, tl.num_programs(0)):
            i = r // rows_per_page
            kl = r - i * rows_per_page
            a = l1 + (kl * l1_pages + tl.load(pages + i).to(tl.int64)) * ROW_WORDS
            b = pool + (tl.load(slots + i).to(tl.int64) * rows_per_page + kl) * ROW_WORDS
            if TO_POOL:
                src, dst = a, b
            else:
                src, dst = b, a
            for step in range(0, ROW_WORDS, BLOCK):
                offsets = step + tl.arange(0, BLOCK)
                if EVEN:
                    tl.store(dst + offsets, tl.load(src + offsets))
                else:
                    inside = offsets < ROW_WORDS
                    tl.store(dst + offsets, tl.load(src + offsets, mask=inside), mask=inside)


_JITTED: dict[bool, Any] = {}  # interpreted? -> the jitted kernel
_COMPILED: list[CompiledCache] = []


def _kernel() -> Any:
    mode = interpreter_enabled()
    if mode not in _JITTED:
        _JITTED[mode] = triton.jit(_copy_mapped, do_not_specialize=["n_rows"])
    return _JITTED[mode]


@functools.lru_cache(maxsize=64)  # per row shape, not per transfer size
def _constants(row_words: int, word_bytes: int) -> tuple[int, int, bool]:
    """(ROW_WORDS, BLOCK, EVEN) of a row: STEP_BYTES steps, capped at the row."""
    block = max(1, min(STEP_BYTES // word_bytes, 1 << max(0, row_words - 1).bit_length()))
    return row_words, block, row_words % block == 0


def default_programs(device: torch.device) -> int:
    """PROGRAMS on a GPU; 1 off it, where the interpreter runs programs one by one."""
    return PROGRAMS if device.type == "cuda" else 1


def copy_mapped(
    l1: torch.Tensor,
    pages: torch.Tensor,
    pool: torch.Tensor,
    slots: torch.Tensor,
    *,
    to_pool: bool,
    programs: int | None = None,
    stream: torch.cuda.Stream | None = None,
) -> None:
    """pool[slots[i], kv, l] = l1[kv, l, pages[i]] (`to_pool`), or the reverse, enqueued on
    `stream` with no sync. `pool`: a page-major pool, on l1's device or -- l1 on CUDA --
    pinned host memory (`reference.check_mapped`). At most `programs` programs (None:
    `default_programs`). BackendError when Triton cannot compile or launch it."""
    layout = check_mapped(l1, pages, pool, slots, to_pool=to_pool)
    if layout.n == 0:
        return
    launch_mapped(
        layout,
        word_view(l1, layout),
        word_view(pool, layout),
        pages,
        slots,
        to_pool=to_pool,
        programs=programs,
        stream=stream,
    )


def launch_mapped(
    layout: RowLayout,
    l1_words: torch.Tensor,
    pool_words: torch.Tensor,
    pages: torch.Tensor,
    slots: torch.Tensor,
    *,
    to_pool: bool,
    programs: int | None = None,
    stream: torch.cuda.Stream | None = None,
) -> None:
    """The launch behind `copy_mapped` for operands already checked against `layout`:
    `l1_words` holds `layout.rows_per_page` rows of `layout.l1_pages` pages (row (kl, p) at
    word (kl * l1_pages + p) * row_words), `pool_words` page-major pages of as many rows.
    Pool groups call it per pool with their own row counts (`RowLayout.rows_per_layer`)."""
    device = l1_words.device
    interpreted = interpreter_enabled()
    check_runnable(device, interpreted)
    grid = (max(1, min(layout.rows, programs or default_programs(device))),)
    args = _args(layout, l1_words, pool_words, pages, slots, to_pool)
    try:
        if device.type != "cuda" or interpreted:
            with on_stream(stream):
                _kernel()[grid](*args, num_warps=NUM_WARPS)
            return
        _compiled().launch(_key(args, device), grid, args, _OPTIONS, stream=stream)
    except LAUNCH_FAILURES as exc:
        raise BackendError(
            f"Triton mapped copy failed to compile or launch ({layout.row_bytes}-byte rows): "
            f"{type(exc).__name__}: {exc}; turn the mapped route off (HICACHE_MAPPED_D2H=0)"
        ) from exc


_OPTIONS = {"num_warps": NUM_WARPS}


def _args(
    layout: RowLayout,
    l1_words: torch.Tensor,
    pool_words: torch.Tensor,
    pages: torch.Tensor,
    slots: torch.Tensor,
    to_pool: bool,
) -> tuple[Any, ...]:
    """The kernel's parameters in order, compile-time constants included (the launcher's)."""
    row_words, block, even = _constants(layout.row_words, layout.word_bytes)
    scalars = (layout.rows, layout.rows_per_page, layout.l1_pages, row_words, block, even)
    return (l1_words, pool_words, pages, slots, *scalars, to_pool, interpreter_enabled())


def _key(args: tuple[Any, ...], device: torch.device) -> Hashable:
    """`launch.CompiledCache`'s key: what Triton specializes on, `n_rows` excepted (it is
    not specialized on: every transfer size runs the same kernel)."""
    l1, pool, pages, slots, _n_rows, *scalars = args
    index = device.index if device.index is not None else torch.cuda.current_device()
    tensors = (arg_key(l1), arg_key(pool), arg_key(pages), arg_key(slots))
    return ("mapped", index, NUM_WARPS, *tensors, *scalars)


def _compiled() -> CompiledCache:
    if not _COMPILED:
        assert not interpreter_enabled(), "the interpreter has no compiled kernels"
        _COMPILED.append(CompiledCache(_kernel()))
    return _COMPILED[0]


def prebuild(l1: torch.Tensor, pool: torch.Tensor, *, to_pool: bool = True) -> int:
    """Compile and load, without running, the variant a mover's mapped copies between `l1`
    (a CUDA pool) and `pool` need: 16-byte aligned int64 index slices. Returns the number of
    variants compiled now (0 when built before, or off the GPU)."""
    if l1.device.type != "cuda" or interpreter_enabled():
        return 0
    index = torch.zeros(2, dtype=torch.int64, device=l1.device)
    layout = check_mapped(l1, index[:1], pool, index[1:], to_pool=to_pool, values=False)
    return prebuild_layout(layout, word_view(l1, layout), word_view(pool, layout), to_pool=to_pool)


def prebuild_layout(
    layout: RowLayout, l1_words: torch.Tensor, pool_words: torch.Tensor, *, to_pool: bool = True
) -> int:
    """`prebuild` for operands already in words (a pool group's region and L2 part)."""
    device = l1_words.device
    if device.type != "cuda" or interpreter_enabled():
        return 0
    cache = _compiled()
    before = cache.dispatches
    index = torch.zeros(4, dtype=torch.int64, device=device)  # both slices 16-byte aligned
    args = _args(layout, l1_words, pool_words, index[:2], index[2:], to_pool)
    with torch.cuda.device(device):
        cache.prebuild(_key(args, device), args, _OPTIONS)
    return cache.dispatches - before


def probe(l1: torch.Tensor, scratch: torch.Tensor) -> str:
    """`probe_layout` for a single pool: `scratch` one page shaped like the page-major pool
    (`reference.check_mapped`), pinned the way the pool is."""
    index = torch.zeros(2, dtype=torch.int64, device=l1.device)
    layout = check_mapped(l1, index[:1], scratch, index[1:], to_pool=True, values=False)
    return probe_layout(layout, word_view(l1, layout), word_view(scratch, layout))


def probe_layout(layout: RowLayout, l1_words: torch.Tensor, scratch_words: torch.Tensor) -> str:
    """Does the GPU write pinned host memory in place? One launch copies L1 page 0's rows
    (`layout`'s rows of `l1_words`: read only) into `scratch_words`, one pool page of rows in
    pinned memory allocated the way L2 is, first filled with their complement (so that every
    word must be written to compare equal); then the device is synchronized and every word
    compared. "" when they all landed, else why not (a launch Triton refused -- a host pointer
    it cannot translate -- or words that differ). Synchronizes: run it once, when a mover is
    built, with nothing of its own in flight."""
    rows, row_words = layout.rows_per_page, layout.row_words
    assert scratch_words.numel() >= rows * row_words, "scratch: one pool page of rows"
    device = l1_words.device
    one = layout._replace(n=1)
    index = torch.zeros(4, dtype=torch.int64, device=device)  # page 0 -> slot 0, 16-byte slices
    page = l1_words[: rows * layout.l1_pages * row_words].view(rows, layout.l1_pages, row_words)
    landed = scratch_words[: rows * row_words].view(rows, row_words)
    # Every scratch word differs from its source before the copy: a word already equal (a
    # zeroed scratch page and a fresh pool) would pass the comparison unwritten.
    landed.copy_(page[:, 0])
    landed.bitwise_not_()
    try:
        launch_mapped(one, l1_words, scratch_words, index[:1], index[2:3], to_pool=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except (BackendError, RuntimeError) as exc:
        return f"the probe's mapped copy of one page failed ({type(exc).__name__}: {exc})"
    if not torch.equal(landed.cpu(), page[:, 0].cpu()):
        return "the probe's mapped copy of one page did not land in pinned memory"
    return ""
