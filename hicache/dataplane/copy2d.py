"""Pitched DMAs: `cudaMemcpy2DAsync` through `cuda.bindings`, in either direction.

One 2D copy moves `height` rows of `width` bytes, row r from `src + r * spitch` to
`dst + r * dpitch`, as one DMA. The copy kind is `cudaMemcpyDefault`: with unified addressing
(every pinned allocation on 64-bit Linux) the driver tells host from device by the pointers,
so one function serves D2H and H2D (`host_copy2d` is the same copy between CPU addresses, for
the route off the GPU). Two users: the layer-wise H2D (layerwise.py: one layer's
K or V of a run of pages) and the pitched route of small D2H/H2Ds (dma.py, routes.py: one page,
its rows strided in L1, contiguous in its L2 page).

A call costs ~14 us of Python on an H100 host (cuda.bindings' argument conversion), against
~43 us for the copy engine to move one 2.25 MiB page: the engine stays ahead of the issuing
thread page after page.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import torch

from hicache.core.pages import Pages
from hicache.errors import TransferError

# copy2d(dst, dpitch, src, spitch, width, height, stream): byte addresses and sizes, and the
# CUDA stream's handle (`torch.cuda.Stream.cuda_stream`) the DMA is queued on.
Copy2D = Callable[[int, int, int, int, int, int, int], None]


def runtime_copy2d() -> tuple[Copy2D | None, str]:
    """The 2D copy, or None and why not (cuda.bindings not installed)."""
    try:
        from cuda.bindings import runtime  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None, "cuda.bindings is not installed"
    kind = runtime.cudaMemcpyKind.cudaMemcpyDefault
    streams: dict[int, Any] = {}  # handle -> cudaStream_t (built once per stream)

    def copy2d(
        dst: int, dpitch: int, src: int, spitch: int, width: int, height: int, s: int
    ) -> None:
        stream = streams.get(s)
        if stream is None:
            stream = streams[s] = runtime.cudaStream_t(s)
        out: Any = runtime.cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, stream)
        err = out[0] if isinstance(out, tuple) else out
        if int(err) != 0:
            raise TransferError(f"cudaMemcpy2DAsync of {height} x {width} bytes failed: {err}")

    return copy2d, "cudaMemcpy2DAsync (cuda.bindings)"


def host_copy2d(
    dst: int, dpitch: int, src: int, spitch: int, width: int, height: int, s: int
) -> None:
    """The same copy between CPU addresses, now (`s` unused): `ctypes.memmove` per row. Off the
    GPU the pitched route runs `copy_pages` with it, the GPU's address arithmetic included."""
    for r in range(height):
        ctypes.memmove(dst + r * dpitch, src + r * spitch, width)


def copy_pages(
    copy2d: Copy2D,
    l1: torch.Tensor,
    l2: torch.Tensor,
    l1_ids: Pages,
    l2_ids: Pages,
    *,
    to_l2: bool,
    stream: int,
) -> None:
    """Per page i one 2D copy between L1 page l1_ids[i] and L2 page l2_ids[i] (`to_l2`: L1 ->
    L2, else L2 -> L1), queued on `stream`. `l1`: contiguous `[2, layers, pages, ...]`, so a
    page's 2 x layers rows (one per K/V and layer) lie `pages` rows apart; `l2`: contiguous
    page-major `[capacity, 2, layers, ...]`, a page's rows back to back. Pages must be in
    range (the caller validated them; an AssertionError otherwise)."""
    rows = l1.shape[0] * l1.shape[1]
    row = l1[0, 0, 0].numel() * l1.element_size()  # one K or V of one layer of one page
    page, pitch = rows * row, l1.shape[2] * row
    # Verify the layouts the addresses assume: a wrong pitch or page size writes past a pool.
    assert l1.is_contiguous() and l2.is_contiguous()
    assert rows * pitch == l1.numel() * l1.element_size(), (rows, pitch, l1.shape)
    assert page * l2.shape[0] == l2.numel() * l2.element_size(), (page, l2.shape)
    a, b = l1.data_ptr(), l2.data_ptr()
    xs, ys = l1_ids.tolist(), l2_ids.tolist()
    # Verify every page is inside its pool: a raw address past the end writes someone's memory.
    assert not xs or (
        0 <= min(xs) and max(xs) < l1.shape[2] and 0 <= min(ys) < l2.shape[0] > max(ys)
    )
    for x, y in zip(xs, ys):
        if to_l2:
            copy2d(b + y * page, row, a + x * row, pitch, row, rows, stream)
        else:
            copy2d(a + x * row, pitch, b + y * page, row, row, rows, stream)
