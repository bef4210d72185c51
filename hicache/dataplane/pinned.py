"""Pinned host memory a pool owns: allocated at its exact size, page-locked in place.

`torch.empty(..., pin_memory=True)` goes through torch's caching host allocator, which rounds
every block up to a power of two (a 20.4 GiB request pins 32 GiB) and keeps freed blocks
cached for reuse instead of returning them (benchmarks/results/HISTORY.md). For the
L2 pool -- one large block per engine, most of the host's memory -- both hurt: the rounding
can pin up to twice what was asked for, and a process that builds several engines (the
serving benchmark builds ~30) runs out of pinned memory with most of it cached and idle.

`pinned_empty` allocates ordinary host memory of the exact size and registers it with CUDA
(`cudaHostRegister`): DMAs to and from it are asynchronous like any pinned memory, and
`is_pinned()` says so. It is unregistered when the returned tensor object is collected; the
pool that owns it must therefore outlive every transfer that uses it (the movers hold their
pools, and handles hold their movers). A view that outlives the tensor sees ordinary
(pageable) memory: copies from it stay correct, only synchronous.

Collection can happen at any allocation, on any thread -- also while a CUDA graph is being
captured, where `cudaHostUnregister` would invalidate the capture. So the unregister goes
through `capture.outside_capture`: during a capture window it waits until the window closes
(capture.py states what may run during a capture). The memory is kept until it is unregistered:
page-locked memory must not be freed while registered.
"""

from __future__ import annotations

import functools
import weakref

import torch

from hicache.dataplane.capture import outside_capture

REGISTER_DEFAULT = 0  # cudaHostRegisterDefault: page-locked, usable by every context (UVA)


def pinned_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized host tensor of exactly `shape`, page-locked for CUDA DMA.

    RuntimeError (naming the size and the CUDA error) when host memory or the page-lock limit
    (`ulimit -l`) runs out.
    """
    tensor = torch.empty(shape, dtype=dtype, device="cpu")
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return tensor
    ptr = tensor.data_ptr()
    cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
    status = int(cudart.cudaHostRegister(ptr, nbytes, REGISTER_DEFAULT))
    if status != 0:
        raise RuntimeError(
            f"cudaHostRegister of {nbytes} bytes failed (cudaError {status}); "
            f"host memory or the locked-memory limit (ulimit -l) is short"
        )
    # The finalizer holds the storage, so the memory outlives the tensor until unregistered.
    unregister = functools.partial(_unregister, ptr, tensor.untyped_storage())
    weakref.finalize(tensor, outside_capture, unregister)
    return tensor


def _unregister(ptr: int, memory: torch.UntypedStorage) -> None:
    """Unlock `ptr`; `memory` (its storage) is freed by the caller dropping it afterwards."""
    # Why the status is ignored: this runs after collection or at interpreter exit, where
    # raising helps nobody; a failure means the context is already gone, and the pages with it.
    torch.cuda.cudart().cudaHostUnregister(ptr)  # type: ignore[no-untyped-call]
