"""Launching compiled Triton kernels without Triton's per-call dispatch.

`kernel[grid](...)` re-derives on every call what it must compile for: it specializes each
argument (pointer alignment, integer value class, dtype), hashes that into a cache key, looks
the compiled kernel up, and checks the kernel's globals. For a 516 MB gather that takes about
0.25 ms on the device, those tens of microseconds of host time decide whether one synced call
reaches 80% of device-copy bandwidth. `CompiledCache` does the dispatch once per
*specialization key* -- our own, computed from what Triton specializes on -- and afterwards
calls the compiled kernel directly (`CompiledKernel[grid](*args)`, the launcher Triton itself
ends in).

The key must separate every pair of calls Triton would compile differently, or a call would
run a kernel compiled for another specialization (say, 16-byte alignment it does not have).
It therefore holds, beyond the compile-time constants and options:

    tensors    dtype, and whether data_ptr() is a multiple of 16 (Triton's alignment rule)
    integers   the exact value (Triton only looks at == 1, % 16 and the int32 range; an
               exact key is stricter, costs a few more entries, and never collides)
    device     the CUDA device index (kernels are loaded per device)

Anything unexpected from Triton's internals (a version whose `CompiledKernel` has no
launcher) turns the fast path off for the process and every call goes through `kernel[grid]`:
slower, never wrong. `prebuild` compiles and loads a kernel without running it, so the first
real launch of a transfer cannot compile inside an issuing call (routes.py says why that
would block on the device).
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable
from typing import Any

import torch

ALIGN_BYTES = 16  # Triton marks a pointer argument divisible by 16 bytes, or not
CACHE_MAX = 256  # specialization keys kept; past this the cache is cleared (never seen in use)


def on_stream(stream: torch.cuda.Stream | None) -> contextlib.AbstractContextManager[object]:
    """Make `stream` current for a block (nothing to do for None: the current stream)."""
    return contextlib.nullcontext() if stream is None else torch.cuda.stream(stream)


def arg_key(value: object) -> Hashable:
    """The part of the specialization key one kernel argument contributes (see the module)."""
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.data_ptr() % ALIGN_BYTES == 0)
    if isinstance(value, (bool, int)):
        return (type(value), value)
    raise TypeError(f"no specialization key for a {type(value).__name__} argument")


class CompiledCache:
    """Compiled kernels of one `triton.jit` function, by specialization key.

    `launch(key, grid, args, options)`: `args` are every parameter of the kernel in order
    (compile-time constants included, as Triton's launcher takes them); `options` are launch
    options such as `num_warps`. The caller builds `key` with `arg_key` over `args` plus the
    options and the device index.
    """

    def __init__(self, jitted: Any) -> None:
        self.jitted = jitted
        self.compiled: dict[Hashable, Any] = {}
        self.enabled = True
        self.disabled_because = ""
        self.dispatches = 0  # calls that went through kernel[grid] (compile or first use)

    def launch(
        self,
        key: Hashable,
        grid: tuple[int, ...],
        args: tuple[object, ...],
        options: dict[str, Any],
        *,
        stream: torch.cuda.Stream | None = None,
    ) -> None:
        """Launch on `stream` (None: the current stream)."""
        compiled = self.compiled.get(key) if self.enabled else None
        if compiled is not None:
            # The launcher takes exactly three grid sizes; with no stream it looks one up.
            handle = None if stream is None else stream.cuda_stream
            compiled[(*grid, 1, 1)[:3]](*args, stream=handle)
            return
        self.dispatches += 1
        with on_stream(stream):  # Triton's dispatch launches on the current stream
            kernel = self.jitted[grid](*args, **options)
        if self.enabled:
            self._keep(key, kernel)

    def prebuild(self, key: Hashable, args: tuple[object, ...], options: dict[str, Any]) -> None:
        """Compile and load the kernel for `key` without running it (no device work)."""
        if not self.enabled or key in self.compiled:
            return
        self.dispatches += 1
        kernel = self.jitted.warmup(*args, grid=(1,), **options)
        self._keep(key, kernel)
        if key in self.compiled:
            _loaded = self.compiled[key][(1, 1, 1)]  # loads the module now; no launch

    def _keep(self, key: Hashable, kernel: Any) -> None:
        if hasattr(kernel, "result"):  # a future, where Triton compiles asynchronously
            kernel = kernel.result()
        if not callable(getattr(type(kernel), "__getitem__", None)) or not hasattr(kernel, "run"):
            self.enabled = False
            self.disabled_because = (
                f"Triton returned a {type(kernel).__name__} without a "
                f"launcher; launching through kernel[grid]"
            )
            self.compiled.clear()
            return
        if len(self.compiled) >= CACHE_MAX:
            self.compiled.clear()
        self.compiled[key] = kernel
