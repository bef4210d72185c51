"""Pitched DMAs: `cudaMemcpy2DAsync` through `cuda.bindings`, in either direction.

One 2D copy moves `height` rows of `width` bytes, row r from `src + r * spitch` to
`dst + r * dpitch`, as one DMA. The copy kind is `cudaMemcpyDefault`: with unified addressing
(every pinned allocation on 64-bit Linux) the driver tells host from device by the pointers,
so one function serves D2H and H2D. Two users: the layer-wise H2D (layerwise.py: one layer's
K or V of a run of pages) and the pitched route of small D2H/H2Ds (dma.py, routes.py: one page,
its rows strided in L1, contiguous in its L2 page).

A call costs ~14 us of Python on an H100 host (cuda.bindings' argument conversion), against
~43 us for the copy engine to move one 2.25 MiB page: the engine stays ahead of the issuing
thread page after page.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
