"""D2H (L1 -> L2 backup) and H2D (L2 -> L1 load-back): one gather, one DMA, in chunks.

    D2H   compute stream: wait(caller) -> upload L1 indices -> gather chunk 0, 1, 2, ...
          copy stream:                     DMA chunk 0 (after gather 0), DMA chunk 1, ...
          into the L2 pool directly when the L2 pages are consecutive, else into a pinned
          staging buffer that is index_copy_'d into L2 as each chunk is seen landed.
    H2D   copy stream:    DMA chunk 0, DMA chunk 1, ...  (from L2 directly, or from pinned
                          staging filled on the CPU chunk by chunk when L2 is fragmented)
          compute stream: wait(caller) -> upload L1 indices -> scatter chunk 0 (after DMA 0),
                          scatter chunk 1, ...

Why the caller wait comes first (bug class B05): the caller's stream may still be producing
what the transfer reads (page contents, and the L1 pages an H2D overwrites); the transfer's
streams are private, so without it the kernels could race ahead of the caller's work.

Why chunks, and their sizes (`chunk_bounds`): a DMA cannot start before its bytes are packed,
so unchunked the whole gather is exposed before the DMA (LIMITS.md: 0.3 ms with the row
kernel, 1.6 ms with torch's index_select, against a 9.3 ms DMA for 219 Qwen3-8B pages).
Chunk k+1's gather runs while chunk k's DMA copies, so only the first gather is exposed. Each
DMA costs a fixed ~7 us (LIMITS.md: 1 MiB copies reach 41 GB/s, 16 MiB 54, >=128 MiB 55.3:
t = 7 us + bytes / 55.4 GB/s fits all three), so chunks should be few. Doubling sizes from
FIRST_CHUNK_BYTES gives both: the exposed first gather moves one 2.25 MiB page (~1-7 us), and
219 pages take 8 DMAs (~56 us of fixed cost, 0.6% of the DMA). Doubling stays DMA-bound while
packing outruns the DMA by 4x (gathering 2c bytes, read + written, must finish within the DMA
of c bytes: G_rw > 4 x 55 GB/s = 222 GB/s; torch's index_select measured 379-640 GB/s, the row
kernel ~3,400). H2D runs the sizes in descending order, so its exposed tail is one page's
scatter. A fixed `chunk_pages` overrides the schedule (benchmarks compare the two).

Completion is observed by polling CUDA events (`event.query()`), never by blocking; the
buffers a transfer holds go back to the workspace cache once its handle is final. On CPU the
same code runs with no streams, synchronously, and the handle completes on its first poll.
One thread issues and polls (not thread-safe).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from hicache.dataplane.faults import FaultInjector, FaultSite
from hicache.dataplane.handles import ReadyHandle, TransferHandle, TransferStatus
from hicache.dataplane.null import transfer_pages
from hicache.dataplane.pools import DevicePool, HostPool
from hicache.dataplane.workspace import Workspace, WorkspaceCache, WorkspaceKind
from hicache.errors import ConfigError, TransferError
from hicache.invariants.snapshot import Pages
from hicache.kernels import KernelSet
from hicache.tiers import Direction

FIRST_CHUNK_BYTES = 2 << 20  # first chunk of the doubling schedule (rounded up to whole pages)
INDEX_BUFFER_BYTES = 64 << 10  # index buffers hold at least 8,192 pages: one serves most transfers
INDEX_BUFFERS_IDLE = 8  # index buffers are small: keep enough for several transfers in flight

Event = torch.cuda.Event
Bounds = list[tuple[int, int]]


def chunk_bounds(
    n_pages: int, bytes_per_page: int, chunk_pages: int | None = None, *,
    descending: bool = False, first_bytes: int = FIRST_CHUNK_BYTES,
) -> Bounds:
    """[lo, hi) page ranges covering 0..n_pages in order. `chunk_pages` None: sizes double from
    ceil(first_bytes / bytes_per_page) pages (the last one takes what is left); else fixed
    `chunk_pages`. `descending` reverses the sizes (largest first)."""
    size = chunk_pages if chunk_pages is not None else max(1, -(-first_bytes // bytes_per_page))
    sizes: list[int] = []
    left = n_pages
    while left > 0:
        sizes.append(min(size, left))
        left -= sizes[-1]
        size = size if chunk_pages is not None else 2 * size
    if descending:
        sizes.reverse()
    ends = np.cumsum(sizes, dtype=np.int64).tolist()
    return [(hi - s, hi) for s, hi in zip(sizes, ends)]


def is_consecutive(ids: Pages) -> bool:
    """True when ids are n ascending consecutive pages (one slice of the pool)."""
    return ids.size > 0 and bool(np.all(np.diff(ids) == 1))


def _new_stream(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)  # type: ignore[no-untyped-call]


def landed(event: Event) -> bool:
    """Has the device passed `event`? (non-blocking)"""
    return bool(event.query())  # type: ignore[no-untyped-call]


class _Streams:
    """CUDA: private `compute` (index upload, kernels) and `copy` (DMA) streams, so one chunk's
    kernel overlaps another chunk's DMA. CPU: no streams; every step runs synchronously."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self.compute = _new_stream(device) if self.cuda else None
        self.copy = _new_stream(device) if self.cuda else None

    def on(self, stream: torch.cuda.Stream | None) -> contextlib.AbstractContextManager[object]:
        return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()

    def mark(self, stream: torch.cuda.Stream | None, *, timing: bool = False) -> Event | None:
        """An event recorded on `stream` now (None on CPU: the work is already done)."""
        if stream is None:
            return None
        event = torch.cuda.Event(enable_timing=timing)  # type: ignore[no-untyped-call]
        event.record(stream)
        return event

    def wait(self, stream: torch.cuda.Stream | None, event: Event | None) -> None:
        if stream is not None and event is not None:
            stream.wait_event(event)

    def wait_caller(self, stream: torch.cuda.Stream | None, after: torch.cuda.Stream | None) -> None:
        if stream is not None:
            stream.wait_stream(after if after is not None else torch.cuda.current_stream(self.device))


@dataclass
class DirectionCounters:
    """Per direction, cumulative. `bytes` counts transfers observed DONE."""

    ops: int = 0  # issued (empty transfers included)
    done: int = 0
    failed: int = 0
    cancelled: int = 0
    bytes: int = 0
    fragmented: int = 0  # issued with non-consecutive L2 pages (staging + host copy)
    pinned_allocations: int = 0  # host buffers allocated while issuing (pinned on CUDA)
    device_allocations: int = 0
    workspace_setup_s: float = 0.0


@dataclass
class _Staging:
    """The buffers one transfer holds until its handle is final."""

    held: list[tuple[WorkspaceCache, Workspace]]
    packed: torch.Tensor  # device, [n, 2, layers, page_size, kv_heads, head_dim]
    index_host: torch.Tensor  # int64 [n], pinned on CUDA: the L1 pages
    index_device: torch.Tensor  # int64 [n] on the device
    host: torch.Tensor | None  # host packing buffer (fragmented L2 only), like `packed`
    setup_s: float


@dataclass
class _HostScatter:
    """Fragmented D2H: chunk k of the staging buffer belongs at L2 pages index[lo:hi]; it is
    copied there once chunk k's DMA is seen landed (`landed[k]`; None: already landed).
    Both sides are uint8 `[pages, bytes_per_page]`: host copies move bytes (CPU index_copy_
    has no fp8 kernel, and bytes are what must arrive)."""

    l2: torch.Tensor
    index: torch.Tensor
    staged: torch.Tensor
    bounds: Bounds
    landed: list[Event | None]
    next_chunk: int = 0

    def advance(self) -> None:
        while self.next_chunk < len(self.bounds):
            event = self.landed[self.next_chunk]
            if event is not None and not landed(event):
                return
            lo, hi = self.bounds[self.next_chunk]
            self.l2.index_copy_(0, self.index[lo:hi], self.staged[lo:hi])
            self.next_chunk += 1


@dataclass
class _Completion:
    start: Event | None  # timing events bracketing the device work (None on CPU)
    end: Event | None  # recorded after the last DMA / kernel: the transfer's completion
    scatter: _HostScatter | None = None
    keep: tuple[torch.Tensor, ...] = field(default_factory=tuple)  # alive until final


class DmaHandle(TransferHandle):
    """A D2H or H2D transfer issued by `DeviceHostMover`; returns its buffers when final."""

    def __init__(
        self, mover: DeviceHostMover, direction: Direction, nbytes: int, staging: _Staging,
        completion: _Completion, delay_polls: int,
    ) -> None:
        super().__init__(direction, nbytes)
        self._mover = mover
        self._staging = staging
        self._completion = completion
        self._delay_polls = delay_polls

    def _landed(self) -> bool:
        end = self._completion.end
        return end is None or landed(end)

    def _probe(self) -> TransferStatus:
        scatter = self._completion.scatter
        if scatter is not None:
            scatter.advance()  # chunks that landed go to L2 while later chunks still copy
        if not self._landed():
            return TransferStatus.PENDING
        if self._delay_polls > 0:  # DELAY fault: the completion is observed late
            self._delay_polls -= 1
            return TransferStatus.PENDING
        site = FaultSite.D2H_COMPLETE if self.direction is Direction.D2H else FaultSite.H2D_COMPLETE
        faults = self._mover.faults
        if faults is not None and faults.fire(site):
            self.error = TransferError(
                f"{self.direction}: completion failed ({site.value} injected); release the target pages"
            )
            return TransferStatus.FAILED
        if scatter is not None:
            scatter.advance()
            # Verify every chunk reached L2: DONE publishes the target pages.
            assert scatter.next_chunk == len(scatter.bounds), (scatter.next_chunk, len(scatter.bounds))
        return TransferStatus.DONE

    def _quiesce(self) -> None:
        end = self._completion.end
        if end is not None:
            end.synchronize()

    def _finish(self, status: TransferStatus) -> None:
        """Final: the hardware is quiet (landed, or quiesced), so the buffers can go back."""
        super()._finish(status)
        c = self._completion
        if c.start is not None and c.end is not None:
            self.timings.service_s = c.start.elapsed_time(c.end) / 1e3
        self._mover._retire(self, self._staging, status)
        self._completion = _Completion(None, None)


class DeviceHostMover:
    """Moves pages between `l1` and `l2` with `kernels`; see the module docstring.

    Page arguments are int64 arrays (InvalidPages otherwise, nothing issued). A failed buffer
    allocation (DEVICE_ALLOC / PINNED_ALLOC, or real memory exhaustion) returns a handle that
    reports FAILED with a TransferError naming the size; nothing was enqueued.
    """

    def __init__(
        self, l1: DevicePool, l2: HostPool, kernels: KernelSet, *,
        faults: FaultInjector | None = None, chunk_pages: int | None = None,
    ) -> None:
        if l2.geometry != l1.geometry:
            raise ConfigError("l2.geometry", f"L2 pool has {l2.geometry}, L1 has {l1.geometry}")
        if chunk_pages is not None and (not isinstance(chunk_pages, int) or chunk_pages < 1):
            raise ConfigError("chunk_pages", f"a positive number of pages or None, got {chunk_pages!r}")
        self.l1, self.l2, self.kernels, self.faults = l1, l2, kernels, faults
        self.chunk_pages = chunk_pages
        self.bytes_per_page = l1.geometry.bytes_per_page
        self._streams = _Streams(l1.device)
        pin = self._streams.cuda
        private = self._streams.compute
        self.workspaces = WorkspaceCache(l1.device, pin=pin, faults=faults, alloc_stream=private)
        self.index_buffers = WorkspaceCache(
            l1.device, pin=pin, faults=faults, alloc_stream=private,
            max_idle=INDEX_BUFFERS_IDLE, min_bytes=INDEX_BUFFER_BYTES,
        )
        self.counters = {Direction.D2H: DirectionCounters(), Direction.H2D: DirectionCounters()}
        self._in_flight: set[DmaHandle] = set()
        self._closed = False

    # -- issuing ------------------------------------------------------------------------------

    def d2h(self, l1_pages: Pages, l2_pages: Pages, *, after: torch.cuda.Stream | None = None) -> TransferHandle:
        """Copy L1 pages to L2 pages (l1_pages[i] -> l2_pages[i]); DONE once in L2."""
        src, dst = transfer_pages(
            Direction.D2H, l1_pages, l2_pages, self.l1.capacity_pages, self.l2.capacity_pages
        )
        return self._issue(Direction.D2H, src, dst, after)

    def h2d(self, l2_pages: Pages, l1_pages: Pages, *, after: torch.cuda.Stream | None = None) -> TransferHandle:
        """Copy L2 pages to L1 pages (l2_pages[i] -> l1_pages[i]); DONE once in L1."""
        src, dst = transfer_pages(
            Direction.H2D, l2_pages, l1_pages, self.l2.capacity_pages, self.l1.capacity_pages
        )
        return self._issue(Direction.H2D, dst, src, after)

    def _issue(
        self, direction: Direction, l1_ids: Pages, l2_ids: Pages, after: torch.cuda.Stream | None
    ) -> TransferHandle:
        entered = time.perf_counter()
        if self._closed:
            raise TransferError(f"{direction}: the mover is closed; make a new one")
        counters = self.counters[direction]
        counters.ops += 1
        n = int(l1_ids.size)
        if n == 0:
            counters.done += 1
            return ReadyHandle(direction, 0)
        fragmented = not is_consecutive(l2_ids)
        counters.fragmented += int(fragmented)
        try:
            staging = self._borrow(counters, n, fragmented)
        except TransferError as e:
            counters.failed += 1
            return ReadyHandle(direction, n * self.bytes_per_page, error=e)
        staging.index_host.copy_(torch.from_numpy(l1_ids))
        delay = 0
        if self.faults is not None and self.faults.fire(FaultSite.DELAY):
            delay = self.faults.delay_polls
        bounds = chunk_bounds(n, self.bytes_per_page, self.chunk_pages, descending=direction is Direction.H2D)
        enqueued = False
        try:
            work_started = time.perf_counter()
            enqueue = self._enqueue_d2h if direction is Direction.D2H else self._enqueue_h2d
            completion = enqueue(staging, l2_ids, bounds, after)
            work_s = time.perf_counter() - work_started
            enqueued = True
        finally:
            if not enqueued:  # a kernel refused its operands: nothing may stay borrowed
                self._abandon(staging)
        handle = DmaHandle(self, direction, n * self.bytes_per_page, staging, completion, delay)
        t = handle.timings
        t.issued_at, t.workspace_setup_s = entered, staging.setup_s
        t.enqueue_s = time.perf_counter() - entered - staging.setup_s
        if not self._streams.cuda:  # CPU: the copies ran inside the call
            t.service_s, t.enqueue_s = work_s, t.enqueue_s - work_s
        self._in_flight.add(handle)
        return handle

    def _borrow(self, counters: DirectionCounters, n: int, fragmented: bool) -> _Staging:
        """Every buffer the transfer needs, or TransferError with none kept."""
        held: list[tuple[WorkspaceCache, Workspace]] = []
        setup_s = 0.0
        before = self._allocation_counts()

        def take(cache: WorkspaceCache, kind: WorkspaceKind, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
            nonlocal setup_s
            nbytes = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
            ws, seconds = cache.acquire(kind, nbytes)
            held.append((cache, ws))
            setup_s += seconds
            return ws.view(dtype, shape)

        page_shape = (n, *self.l1.tensor.shape[:2], *self.l1.tensor.shape[3:])
        dtype = self.l1.tensor.dtype
        try:
            packed = take(self.workspaces, WorkspaceKind.DEVICE, dtype, page_shape)
            index_host = take(self.index_buffers, WorkspaceKind.HOST, torch.int64, (n,))
            index_device = take(self.index_buffers, WorkspaceKind.DEVICE, torch.int64, (n,))
            host = take(self.workspaces, WorkspaceKind.HOST, dtype, page_shape) if fragmented else None
        except TransferError:
            self._release(held)
            raise
        finally:
            pinned, device = self._allocation_counts()
            counters.pinned_allocations += pinned - before[0]
            counters.device_allocations += device - before[1]
            counters.workspace_setup_s += setup_s
        return _Staging(held, packed, index_host, index_device, host, setup_s)

    def _enqueue_d2h(
        self, st: _Staging, l2_ids: Pages, bounds: Bounds, after: torch.cuda.Stream | None
    ) -> _Completion:
        s = self._streams
        s.wait_caller(s.compute, after)  # before anything reads L1 or the indices (B05)
        start = s.mark(s.compute, timing=True)
        with s.on(s.compute):
            st.index_device.copy_(st.index_host, non_blocking=True)
        first = int(l2_ids[0])
        target = self.l2.tensor[first : first + l2_ids.size] if st.host is None else st.host
        landed: list[Event | None] = []
        for lo, hi in bounds:
            with s.on(s.compute):
                self.kernels.gather(self.l1.tensor, st.index_device[lo:hi], st.packed[lo:hi])
            s.wait(s.copy, s.mark(s.compute))
            with s.on(s.copy):
                target[lo:hi].copy_(st.packed[lo:hi], non_blocking=True)
            if st.host is not None:
                landed.append(s.mark(s.copy))
        end = s.mark(s.copy, timing=True)
        if st.host is None:
            return _Completion(start, end)
        staged = st.host.view(st.host.shape[0], -1).view(torch.uint8)
        scatter = _HostScatter(self.l2.bytes_view(), torch.from_numpy(l2_ids), staged, bounds, landed)
        return _Completion(start, end, scatter)

    def _enqueue_h2d(
        self, st: _Staging, l2_ids: Pages, bounds: Bounds, after: torch.cuda.Stream | None
    ) -> _Completion:
        s = self._streams
        # The DMAs read locked L2 pages into a private buffer: they need not wait for the
        # caller. The scatter reads the indices and overwrites L1 pages: it must (B05).
        start = s.mark(s.copy, timing=True)
        s.wait_caller(s.compute, after)
        with s.on(s.compute):
            st.index_device.copy_(st.index_host, non_blocking=True)
        l2_index = torch.from_numpy(l2_ids)
        first = int(l2_ids[0])
        source = self.l2.tensor[first : first + l2_ids.size] if st.host is None else st.host
        l2_rows = self.l2.bytes_view()
        for lo, hi in bounds:
            if st.host is not None:  # pack this chunk on the CPU while the previous one copies
                rows = st.host[lo:hi].view(hi - lo, -1).view(torch.uint8)
                torch.index_select(l2_rows, 0, l2_index[lo:hi], out=rows)
            with s.on(s.copy):
                st.packed[lo:hi].copy_(source[lo:hi], non_blocking=True)
            s.wait(s.compute, s.mark(s.copy))
            with s.on(s.compute):
                self.kernels.scatter(st.packed[lo:hi], st.index_device[lo:hi], self.l1.tensor)
        end = s.mark(s.compute, timing=True)
        return _Completion(start, end, keep=(l2_index,))

    # -- completion and lifetime --------------------------------------------------------------

    def _retire(self, handle: DmaHandle, staging: _Staging, status: TransferStatus) -> None:
        """Called once per handle when it turns final: buffers back, counters."""
        self._release(staging.held)
        self._in_flight.discard(handle)
        counters = self.counters[handle.direction]
        if status is TransferStatus.DONE:
            counters.done += 1
            counters.bytes += handle.nbytes
        elif status is TransferStatus.FAILED:
            counters.failed += 1
        else:
            counters.cancelled += 1

    def _abandon(self, staging: _Staging) -> None:
        """Issue failed half-way: wait for whatever was enqueued, then return the buffers."""
        if self._streams.cuda:
            torch.cuda.synchronize(self.l1.device)
        self._release(staging.held)

    @staticmethod
    def _release(held: list[tuple[WorkspaceCache, Workspace]]) -> None:
        """Return borrowed buffers (emptying `held`, so none goes back twice)."""
        for cache, ws in held:
            cache.release(ws)
        held.clear()

    def _allocation_counts(self) -> tuple[int, int]:
        """(host allocations, device allocations) over both caches, cumulative."""
        caches = (self.workspaces, self.index_buffers)
        pinned = sum(c.counters.pinned_allocations for c in caches)
        return pinned, sum(c.counters.allocations for c in caches) - pinned

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def buffers_busy(self) -> int:
        """Buffers held by transfers not yet final (0 when idle: nothing leaked)."""
        return self.workspaces.busy + self.index_buffers.busy

    def status(self) -> dict[str, object]:
        return {
            "device": str(self.l1.device),
            "l2_pinned": self.l2.pinned,
            "chunk_pages": self.chunk_pages if self.chunk_pages is not None else f"doubling from {FIRST_CHUNK_BYTES} bytes",
            "in_flight": self.in_flight,
            "buffers_busy": self.buffers_busy,
            "workspace_bytes_held": self.workspaces.held_bytes + self.index_buffers.held_bytes,
            **{str(d): vars(c).copy() for d, c in self.counters.items()},
        }

    def close(self) -> None:
        """Cancel every transfer still in flight (waiting for its hardware), drop idle
        buffers. Idempotent; later issues raise TransferError."""
        for handle in list(self._in_flight):
            handle.cancel()
        self.workspaces.clear_idle()
        self.index_buffers.clear_idle()
        self._closed = True
