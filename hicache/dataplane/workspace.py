"""Reusable staging buffers for transfers: best-fit reuse, few idle buffers kept.

A transfer borrows its buffers at issue and returns them when its handle reaches a final
status (DONE, FAILED or CANCELLED), i.e. only once the hardware no longer touches them.

    kind     where                                 used by
    -------  ------------------------------------  ------------------------------------------
    DEVICE   the mover's device (GPU, else CPU)   packed page-major pages; uploaded indices
    HOST     host memory, pinned where CUDA is    staged L2 pages (small runs); index staging

`TransferBuffers.borrow` takes the set one D2H/H2D transfer needs from two caches (pages,
and indices) in one step, and gives all of them back in one step.

Why reuse at all: a pinned allocation is the expensive part of a transfer's setup (tens of ms
for tens of MiB, against tens of microseconds for the DMA of one page; benchmarks/results/
HISTORY.md). Why so few idle buffers: a long prefix would otherwise leave a large pinned block
held forever. Acquire takes the *smallest* idle buffer that fits (best fit); release keeps
the `max_idle` *largest* idle buffers of each kind and drops the rest.

The time spent allocating is returned to the caller, which reports it as
`TransferTimings.workspace_setup_s` (the cost model excludes it: it is paid once).
Not thread-safe: one thread issues and observes transfers.
"""

from __future__ import annotations

import contextlib
import enum
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from hicache.dataplane.faults import FaultInjector, FaultSite
from hicache.dataplane.pools import empty_retrying
from hicache.errors import TransferError

VIEWS_KEPT = 8  # views remembered per buffer (transfer sizes recur: a prefix, its pages)


class WorkspaceKind(str, enum.Enum):
    DEVICE = "device"
    HOST = "host"


@dataclass(eq=False)
class Workspace:
    """One flat uint8 buffer; `busy` while a transfer holds it."""

    kind: WorkspaceKind
    data: torch.Tensor
    busy: bool = True
    nbytes: int = field(init=False)  # fixed: read on every acquire, so computed once
    # Views handed out before, by (dtype, shape): a transfer of the same size reuses its view
    # instead of three torch calls (a few us each on the issuing thread).
    _views: dict[tuple[torch.dtype, tuple[int, ...]], torch.Tensor] = field(
        init=False, default_factory=dict
    )
    _arrays: dict[tuple[torch.dtype, tuple[int, ...]], npt.NDArray[Any]] = field(
        init=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        self.nbytes = int(self.data.numel())

    def view(self, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        """The first `prod(shape)` elements of `dtype` as a contiguous tensor (no copy)."""
        key = (dtype, shape)
        view = self._views.get(key)
        if view is not None:
            return view
        nbytes = math.prod(shape) * dtype.itemsize
        # Verify the view fits: a short buffer would let two transfers' bytes overlap.
        assert nbytes <= self.nbytes, (nbytes, self.nbytes)
        view = self.data[:nbytes].view(dtype).view(shape)
        if len(self._views) >= VIEWS_KEPT:
            self._views.clear()
            self._arrays.clear()
        self._views[key] = view
        return view

    def array(self, dtype: torch.dtype, shape: tuple[int, ...]) -> npt.NDArray[Any]:
        """`view(dtype, shape)` as a numpy array on the same memory (HOST buffers only),
        remembered like the view: `.numpy()` costs ~13 us a call on the issuing thread."""
        key = (dtype, shape)
        array = self._arrays.get(key)
        if array is None:
            # Verify host memory: numpy cannot see device buffers.
            assert self.kind is WorkspaceKind.HOST, self.kind
            array = self.view(dtype, shape).numpy()
            self._arrays[key] = array
        return array


@dataclass
class WorkspaceCounters:
    """Cumulative. `pinned_allocations` counts HOST allocations (pinned where CUDA is)."""

    allocations: int = 0
    pinned_allocations: int = 0
    bytes_allocated: int = 0
    reuses: int = 0
    setup_s: float = 0.0


@dataclass
class WorkspaceCache:
    """Buffers on `device` (DEVICE) and in host memory (HOST, pinned when `pin`).

    `max_idle`: idle buffers kept per kind (the largest ones). `min_bytes`: the smallest buffer
    ever allocated, so that small requests (index lists) share one buffer.
    DEVICE_ALLOC / PINNED_ALLOC faults fire when a new buffer would be allocated (never on
    reuse); they and real allocation failures raise TransferError with the size asked for.

    `alloc_stream`: the (private) CUDA stream device buffers are allocated on. Why: torch's
    caching allocator may hand out a block the *allocating* stream freed while that stream's
    queued work still reads it; a transfer that writes the buffer on another stream without
    waiting for the caller (H2D's DMA) would then race the caller. Blocks from a private
    stream's pool were only ever used by transfers already complete.
    """

    device: torch.device
    pin: bool
    faults: FaultInjector | None = None
    alloc_stream: torch.cuda.Stream | None = None
    max_idle: int = 1
    min_bytes: int = 0
    counters: WorkspaceCounters = field(default_factory=WorkspaceCounters)
    _buffers: list[Workspace] = field(default_factory=list)

    def acquire(self, kind: WorkspaceKind, nbytes: int) -> tuple[Workspace, float]:
        """A buffer of at least `nbytes`, marked busy, and the seconds spent allocating it
        (0.0 when an idle buffer was reused)."""
        # Verify a real size: a zero or negative request is a caller bug, not an empty transfer.
        assert nbytes > 0, nbytes
        fitting = [w for w in self._buffers if w.kind is kind and not w.busy and w.nbytes >= nbytes]
        if fitting:
            best = min(fitting, key=lambda w: w.nbytes)
            best.busy = True
            self.counters.reuses += 1
            return best, 0.0
        started = time.perf_counter()
        ws = Workspace(kind, self._allocate(kind, max(nbytes, self.min_bytes)))
        setup_s = time.perf_counter() - started
        self._buffers.append(ws)
        self.counters.allocations += 1
        self.counters.pinned_allocations += kind is WorkspaceKind.HOST
        self.counters.bytes_allocated += ws.nbytes
        self.counters.setup_s += setup_s
        return ws, setup_s

    def release(self, ws: Workspace) -> None:
        """Return a buffer; keeps the `max_idle` largest idle buffers of its kind."""
        # Verify a busy buffer of ours: releasing twice would hand one buffer to two transfers.
        assert ws.busy and any(w is ws for w in self._buffers), "released a workspace twice"
        ws.busy = False
        idle = sorted(
            (w for w in self._buffers if w.kind is ws.kind and not w.busy), key=lambda w: -w.nbytes
        )
        for extra in idle[self.max_idle :]:
            self._buffers.remove(extra)

    def clear_idle(self) -> None:
        """Drop every idle buffer (close, or to give memory back)."""
        self._buffers = [w for w in self._buffers if w.busy]

    @property
    def busy(self) -> int:
        return sum(w.busy for w in self._buffers)

    @property
    def idle(self) -> int:
        return sum(not w.busy for w in self._buffers)

    @property
    def held_bytes(self) -> int:
        return sum(w.nbytes for w in self._buffers)

    def _allocate(self, kind: WorkspaceKind, nbytes: int) -> torch.Tensor:
        device = self.device if kind is WorkspaceKind.DEVICE else torch.device("cpu")
        pin = self.pin and kind is WorkspaceKind.HOST
        site = FaultSite.DEVICE_ALLOC if kind is WorkspaceKind.DEVICE else FaultSite.PINNED_ALLOC
        where = "pinned host" if pin else f"{kind.value} ({device})"
        if self.faults is not None and self.faults.fire(site):
            raise TransferError(
                f"cannot allocate a {nbytes}-byte {where} workspace ({site.value} injected)"
            )
        on_stream = self.alloc_stream is not None and device.type == "cuda"
        try:
            with torch.cuda.stream(self.alloc_stream) if on_stream else contextlib.nullcontext():
                return empty_retrying(nbytes, torch.uint8, device, pin=pin)
        except RuntimeError as e:  # torch.cuda.OutOfMemoryError, the CPU/pinned allocators
            raise TransferError(
                f"cannot allocate a {nbytes}-byte {where} workspace ({e}); transfer fewer pages"
            ) from None


_NO_INDEX = torch.empty(0, dtype=torch.int64)  # `TransferBuffers.none`'s index buffers
_NO_INDEX_ARRAY: npt.NDArray[np.int64] = _NO_INDEX.numpy()


@dataclass
class TransferBuffers:
    """The buffers one D2H/H2D transfer holds until its handle is final.

    packed        DEVICE  [n, *page_shape]          the pages, packed page-major; None for
                                                    a mapped D2H (it writes L2 in place)
    index_host    HOST    int64 [n_index]           L1 pages in packed order (upload source),
                                                    each chunk at its aligned slot (routes.py)
    index_device  DEVICE  int64 [n_index]           the same, on the device
    host          HOST    [n_staged, *page_shape]   staged pages; None when none is staged
    """

    held: list[tuple[WorkspaceCache, Workspace]]
    packed: torch.Tensor | None
    index_host: torch.Tensor
    index_device: torch.Tensor
    host: torch.Tensor | None
    setup_s: float  # seconds spent allocating (0.0 when every buffer was reused)
    index_array: npt.NDArray[np.int64]  # index_host as numpy (where the indices are written)

    @classmethod
    def borrow(
        cls,
        pages: WorkspaceCache,
        indices: WorkspaceCache,
        dtype: torch.dtype,
        page_shape: tuple[int, ...],
        n: int,
        n_staged: int,
        *,
        n_index: int | None = None,
        packed: bool = True,
    ) -> TransferBuffers:
        """Every buffer for `n` pages (`n_staged` of them staged; `n_index` index entries, at
        least n, default n; no packed buffer unless `packed`), or TransferError with none
        kept. Host staging only when `n_staged` > 0: a transfer without staged pages
        allocates no host memory once the index buffers are warm."""
        n_index = n if n_index is None else n_index
        # Verify room for every page's index: a short buffer would drop pages from the kernels.
        assert n_index >= n, (n_index, n)
        held: list[tuple[WorkspaceCache, Workspace]] = []
        setup_s = 0.0

        def take(
            cache: WorkspaceCache, kind: WorkspaceKind, dt: torch.dtype, shape: tuple[int, ...]
        ) -> torch.Tensor:
            nonlocal setup_s
            ws, seconds = cache.acquire(kind, math.prod(shape) * dt.itemsize)
            held.append((cache, ws))
            setup_s += seconds
            return ws.view(dt, shape)

        try:
            packed_pages = (
                take(pages, WorkspaceKind.DEVICE, dtype, (n, *page_shape)) if packed else None
            )
            index_host = take(indices, WorkspaceKind.HOST, torch.int64, (n_index,))
            index_array = held[-1][1].array(torch.int64, (n_index,))
            index_device = take(indices, WorkspaceKind.DEVICE, torch.int64, (n_index,))
            host = (
                take(pages, WorkspaceKind.HOST, dtype, (n_staged, *page_shape))
                if n_staged
                else None
            )
        except TransferError:
            for cache, ws in held:
                cache.release(ws)
            raise
        return cls(held, packed_pages, index_host, index_device, host, setup_s, index_array)

    @classmethod
    def none(cls) -> TransferBuffers:
        """No buffers: a transfer that moves between L1 and L2 in place (a pitched one). The
        empty index views are shared: nothing reads or writes zero entries."""
        return cls([], None, _NO_INDEX, _NO_INDEX, None, 0.0, _NO_INDEX_ARRAY)

    def release(self) -> None:
        """Give every buffer back; a second call returns nothing twice (`held` is emptied)."""
        for cache, ws in self.held:
            cache.release(ws)
        self.held.clear()
