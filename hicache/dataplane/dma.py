"""D2H (L1 -> L2 backup) and H2D (L2 -> L1 load-back): one gather, DMAs per L2 run, in chunks.

    D2H   compute stream: wait(caller) -> upload L1 indices -> gather chunk 0, 1, 2, ...
          d2h stream:     (after gather k) chunk k's DMAs: one per run of consecutive L2
                          pages straight into the L2 pool (a chunk's DMAs one batched
                          driver call where it can: batchcopy.py); runs too small for a DMA
                          go as one DMA into pinned staging, copied into L2 on the CPU as
                          each chunk is seen landed.
    H2D   h2d stream:     chunk k's DMAs: one per L2 run straight from the pool; small runs
                          packed on the CPU into pinned staging first, then one DMA
          compute stream: wait(caller) -> upload L1 indices -> scatter chunk 0 (after its
                          DMAs), scatter chunk 1, ...
                          (every chunk's DMAs are queued before the upload: the copy engine
                          starts while the rest of the transfer is issued)

Each direction has its own DMA stream, so a load-back never waits behind a backup's DMAs.
The host enqueues chunk by chunk (gather k, then its DMAs) with the DMA stream current and
the kernels launched onto the compute stream by argument: two stream switches per transfer.

Why the caller wait comes first (bug class B05): the caller's stream may still be producing
what the transfer reads (page contents, and the L1 pages an H2D overwrites); the transfer's
streams are private, so without it the kernels could race ahead of the caller's work.

Routes, chunks and index slots are planned in routes.py (`DmaPlan`; its docstring says why
256 KiB runs, why one chunk up to 64 MiB, and why every chunk's index slice starts 16-byte
aligned: so that issuing never compiles a kernel, which would wait for the device).

Completion is observed by polling CUDA events (`event.query()`), never by blocking. Every
tensor the device touches asynchronously (packed buffer, index buffers, pinned staging, L2
pool slices) is a workspace the handle holds, or the pool itself, and goes back to the
workspace cache only once the handle is final (its last event passed, or quiesced). On CPU
the same code runs with no streams, synchronously, and the handle completes on its first
poll. One thread issues and polls (not thread-safe), and never while it captures a CUDA graph:
issuing allocates and records events, polling queries them -- calls a capture refuses
(capture.py). Work already queued may stay in flight across a capture.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from hicache.core.pages import Pages
from hicache.core.tiers import Direction
from hicache.dataplane.batchcopy import BatchedCopies
from hicache.dataplane.copy2d import Copy2D, copy_pages, host_copy2d, runtime_copy2d
from hicache.dataplane.faults import FaultInjector, FaultSite, completion_fault
from hicache.dataplane.handles import (
    OutcomeCounters,
    ReadyHandle,
    TransferHandle,
    TransferStatus,
    event_passed,
)
from hicache.dataplane.issuegraphs import GraphKey, IssueGraphs
from hicache.dataplane.layerwise import EventGate
from hicache.dataplane.null import transfer_pages
from hicache.dataplane.pools import DevicePool, HostPool, allocate
from hicache.dataplane.routes import (
    DIRECT_MIN_BYTES,
    FIRST_CHUNK_BYTES,
    PITCHED_ENV,
    PITCHED_MAX_PAGES,
    PITCHED_MIN_ROW_BYTES,
    RUN_H2D_SINGLE_MAX_BYTES,
    SINGLE_CHUNK_MAX_BYTES,
    DmaPlan,
    RouteRequest,
    chunk_bounds,
    is_run,
    mapped_choice,
    mapped_plan,
    pitched_plan,
    plan_route,
    route_choice,
    split_runs,
)
from hicache.dataplane.streams import Event, Streams, landed
from hicache.dataplane.workspace import TransferBuffers, WorkspaceCache
from hicache.errors import ConfigError, TransferError
from hicache.kernels import KernelSet

INDEX_BUFFER_BYTES = 64 << 10  # index buffers hold at least 8,192 pages: one serves most transfers
INDEX_BUFFERS_IDLE = 8  # index buffers are small: keep enough for several transfers in flight
PLANS_KEPT = 256  # remembered consecutive-run plans (a serving loop repeats a few sizes)


@dataclass
class DirectionCounters(OutcomeCounters):
    """Per direction, cumulative: the outcomes, and how the transfers were issued."""

    fragmented: int = 0  # issued with L2 pages that are not one run of consecutive pages
    staged: int = 0  # issued with some pages through host staging (+ a host copy)
    staged_pages: int = 0
    direct_dmas: int = 0  # DMAs straight between the packed buffer and the L2 pool
    mapped: int = 0  # issued as one mapped copy (L1 rows written into L2 in place, no DMA)
    pitched: int = 0  # issued as one 2D DMA per page (L1 read or written in place)
    pinned_allocations: int = 0  # host buffers allocated while issuing (pinned on CUDA)
    device_allocations: int = 0
    workspace_setup_s: float = 0.0


def _byte_rows(t: torch.Tensor) -> torch.Tensor:
    """Pages as uint8 `[pages, bytes_per_page]`: host copies move bytes (CPU index_copy_ has
    no fp8 kernel, and bytes are what must arrive)."""
    return t.view(t.shape[0], -1).view(torch.uint8)


@dataclass
class _HostScatter:
    """Staged D2H: staging rows [lo, hi) belong at L2 pages index[lo:hi]; they are copied
    there once their DMA is seen landed (`pieces`: (lo, hi, event); event None: landed)."""

    l2: torch.Tensor
    index: torch.Tensor
    staged: torch.Tensor
    pieces: list[tuple[int, int, Event | None]]
    next_piece: int = 0

    def advance(self) -> None:
        while self.next_piece < len(self.pieces):
            lo, hi, event = self.pieces[self.next_piece]
            if event is not None and not landed(event):
                return
            self.l2.index_copy_(0, self.index[lo:hi], self.staged[lo:hi])
            self.next_piece += 1

    @property
    def finished(self) -> bool:
        return self.next_piece == len(self.pieces)


@dataclass
class _Completion:
    start: Event | None  # timing events bracketing the device work (None on CPU)
    end: Event | None  # recorded after the last DMA / kernel: the transfer's completion
    scatter: _HostScatter | None = None


class DmaHandle(TransferHandle):
    """A D2H or H2D transfer issued by `DeviceHostMover`; returns its buffers when final.
    `plan` says how it was issued."""

    def __init__(
        self,
        mover: DeviceHostMover,
        direction: Direction,
        nbytes: int,
        buffers: TransferBuffers,
        completion: _Completion,
        delay_polls: int,
        plan: DmaPlan,
    ) -> None:
        super().__init__(direction, nbytes)
        self._mover = mover
        self._buffers: TransferBuffers | None = buffers  # None once final: nothing kept alive
        self._completion = completion
        self._delay_polls = delay_polls
        self.plan = plan

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
        self.error = completion_fault(self._mover.faults, self.direction)
        if self.error is not None:
            return TransferStatus.FAILED
        if scatter is not None:
            scatter.advance()
            # Verify every staged piece reached L2: DONE publishes the target pages.
            assert scatter.finished, (scatter.next_piece, len(scatter.pieces))
        return TransferStatus.DONE

    def _quiesce(self, timeout_s: float | None) -> bool:
        return event_passed(self._completion.end, timeout_s)

    def _finish(self, status: TransferStatus) -> None:
        """Final: the hardware is quiet (landed, or quiesced), so the buffers can go back."""
        super()._finish(status)
        c = self._completion
        if c.start is not None and c.end is not None:
            self.timings.service_s = c.start.elapsed_time(c.end) / 1e3
        buffers, self._buffers = self._buffers, None
        # Verify the buffers go back once: a second return would hand them to two transfers.
        assert buffers is not None, "a DMA handle finished twice"
        self._mover._retire(self, buffers, status)
        # The timing events are the mover's again (an H2D's end is its gate's: not reused).
        self._mover._streams.recycle(c.start, c.end if self.direction is Direction.D2H else None)
        self._completion = _Completion(None, None)


class DeviceHostMover:
    """Moves pages between `l1` and `l2` with `kernels`; see the module docstring.

    Page arguments are int64 arrays (InvalidPages otherwise, nothing issued). A failed buffer
    allocation (DEVICE_ALLOC / PINNED_ALLOC, or real memory exhaustion) returns a handle that
    reports FAILED with a TransferError naming the size; nothing was enqueued. On CUDA, L2
    must be pinned: the DMAs are asynchronous and read or write the pool in place.
    `chunk_pages`, `single_chunk_max_bytes`, `run_h2d_single_max_bytes` (the same limit for
    an H2D of one run of L2 pages: the smaller applies), `first_chunk_bytes` and
    `direct_min_bytes` tune chunks and routes (routes.py; the measurements behind the
    defaults are in benchmarks/results/HISTORY.md). `batched`: a chunk's DMAs as one
    cuMemcpyBatchAsync where the driver has it (batchcopy.py; None: unless
    HICACHE_BATCHED_COPIES=0).
    `issue_graphs`: a one-chunk D2H's index upload and gather replayed as one captured CUDA
    graph (issuegraphs.py; None: on CUDA unless HICACHE_ISSUE_GRAPHS=0).
    `mapped_d2h`: a D2H as one kernel writing L1's rows into their L2 pages in place
    (routes.py, kernels/triton_mapped.py) -- unless its L2 pages are one run (one DMA). None:
    on CUDA with the Triton gather and pinned L2 whose probe page landed (triton_mapped.probe)
    unless HICACHE_MAPPED_D2H=0, off on CPU unless
    HICACHE_MAPPED_D2H=1 (with the Triton gather, its interpreted kernel probed the same way);
    True where it cannot run raises ConfigError; "every" (routes.EVERY,
    as HICACHE_MAPPED_D2H=all) every D2H, one run too. `mapped_reason` says which and why.
    `pitched`: an H2D of up to PITCHED_MAX_PAGES pages as one 2D DMA per page from its L2
    page into its L1 rows, in place (routes.py, copy2d.py) -- unless its L2 pages are one run
    in order (one DMA); with HICACHE_PITCHED_DMA=all every transfer up to that size, D2H and
    one run too. None: on
    CUDA with cuda.bindings and rows of at least PITCHED_MIN_ROW_BYTES unless
    HICACHE_PITCHED_DMA=0, off on CPU unless HICACHE_PITCHED_DMA=1 (host_copy2d);
    True where it cannot run raises ConfigError (shorter rows run when asked); "every" as
    HICACHE_PITCHED_DMA=all. `pitched_reason` says which and why.
    """

    def __init__(
        self,
        l1: DevicePool,
        l2: HostPool,
        kernels: KernelSet,
        *,
        faults: FaultInjector | None = None,
        chunk_pages: int | None = None,
        single_chunk_max_bytes: int = SINGLE_CHUNK_MAX_BYTES,
        run_h2d_single_max_bytes: int = RUN_H2D_SINGLE_MAX_BYTES,
        direct_min_bytes: int = DIRECT_MIN_BYTES,
        first_chunk_bytes: int = FIRST_CHUNK_BYTES,
        batched: bool | None = None,
        issue_graphs: bool | None = None,
        mapped_d2h: RouteRequest = None,
        pitched: RouteRequest = None,
    ) -> None:
        if l2.geometry != l1.geometry:
            raise ConfigError("l2.geometry", f"L2 pool has {l2.geometry}, L1 has {l1.geometry}")
        if l1.device.type == "cuda" and not l2.pinned:
            raise ConfigError("l2.pin", "L1 is on CUDA: L2 must be pinned for asynchronous DMA")
        if chunk_pages is not None and (not isinstance(chunk_pages, int) or chunk_pages < 1):
            raise ConfigError(
                "chunk_pages", f"a positive number of pages or None, got {chunk_pages!r}"
            )
        sizes = {
            "single_chunk_max_bytes": single_chunk_max_bytes,
            "run_h2d_single_max_bytes": run_h2d_single_max_bytes,
            "direct_min_bytes": direct_min_bytes,
            "first_chunk_bytes": first_chunk_bytes,
        }
        for name, value in sizes.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(name, f"a number of bytes >= 0, got {value!r}")
        self.l1, self.l2, self.kernels, self.faults = l1, l2, kernels, faults
        self.chunk_pages = chunk_pages
        self.single_chunk_max_bytes = single_chunk_max_bytes
        self.run_h2d_single_max_bytes = run_h2d_single_max_bytes
        self.direct_min_bytes = direct_min_bytes
        self.first_chunk_bytes = first_chunk_bytes
        self.bytes_per_page = l1.geometry.bytes_per_page
        self._page_shape = (*l1.tensor.shape[:2], *l1.tensor.shape[3:])  # one packed page
        self._streams = Streams(l1.device)
        self.copies = BatchedCopies(l1.device, enabled=batched)
        self.graphs = IssueGraphs(l1.device, enabled=issue_graphs)
        pin = self._streams.cuda
        private = self._streams.compute
        self.workspaces = WorkspaceCache(l1.device, pin=pin, faults=faults, alloc_stream=private)
        self.index_buffers = WorkspaceCache(
            l1.device,
            pin=pin,
            faults=faults,
            alloc_stream=private,
            max_idle=INDEX_BUFFERS_IDLE,
            min_bytes=INDEX_BUFFER_BYTES,
        )
        self.counters = {Direction.D2H: DirectionCounters(), Direction.H2D: DirectionCounters()}
        # `mapped_every`: one run too (HICACHE_MAPPED_D2H=all: the route on every D2H).
        self.mapped_d2h, self.mapped_every, self.mapped_reason = self._mapped_choice(mapped_d2h)
        self._copy2d: Copy2D | None = None
        # `pitched_every`: one run in order too (HICACHE_PITCHED_DMA=all).
        self.pitched, self.pitched_every, self.pitched_reason = self._pitched_choice(pitched)
        self._in_flight: set[DmaHandle] = set()
        self._plans: dict[tuple[object, ...], DmaPlan] = {}  # consecutive-run plans (`plan`)
        self._closed = False

    def _mapped_choice(self, requested: RouteRequest) -> tuple[bool, bool, str]:
        """(on, every, why) for the mapped D2H route (class docstring; routes.mapped_choice)."""
        cuda = self._streams.cuda
        why_not = ""
        if cuda and self.kernels.gather_backend != "triton":
            why_not = "the gather backend is torch (only the Triton kernel addresses L2 in place)"
        elif cuda and not self.l2.pinned:
            why_not = "L2 is not pinned"
        on = "on: a D2H is one mapped copy unless its L2 pages are one run (one DMA)"
        choice = mapped_choice(requested, cuda=cuda, why_not=why_not, on=on)
        if choice[0] and (cuda or self.kernels.gather_backend == "triton"):
            # The Triton kernel must run here: on a GPU writing pinned L2 in place; on a CPU in
            # Triton's interpreter, which some Triton and numpy pairs cannot run it in.
            from hicache.kernels.select import load_mapped

            mapped = load_mapped()
            if cuda:
                mapped.prebuild(self.l1.tensor, self.l2.tensor)  # never inside an issue
            shape, cpu = (1, *self.l2.tensor.shape[1:]), torch.device("cpu")
            scratch = allocate(shape, self.l2.tensor.dtype, cpu, pin=self.l2.pinned, field="l2")
            if failed := mapped.probe(self.l1.tensor, scratch):  # one page written in place?
                choice = mapped_choice(requested, cuda=cuda, why_not=failed, on=on)
        return choice

    def _pitched_choice(self, requested: RouteRequest) -> tuple[bool, bool, str]:
        """(on, every, why) for the pitched route (class docstring; routes.route_choice)."""
        cuda, why_not, prefer_not = self._streams.cuda, "", ""
        row_bytes = self.bytes_per_page // (2 * self.l1.geometry.layers)
        if cuda:
            self._copy2d, why = runtime_copy2d()
            if self._copy2d is None:
                why_not = why
            elif row_bytes < PITCHED_MIN_ROW_BYTES:  # runs; only never measured
                prefer_not = f"rows of {row_bytes} bytes (< {PITCHED_MIN_ROW_BYTES}: not measured)"
        on = f"on: fragmented H2Ds of up to {PITCHED_MAX_PAGES} pages, a 2D DMA per page"
        return route_choice(
            requested,
            env=PITCHED_ENV,
            field="pitched",
            cuda=cuda,
            why_not=why_not,
            on=on,
            prefer_not=prefer_not,
        )

    # -- issuing ------------------------------------------------------------------------------

    def d2h(
        self, l1_pages: Pages, l2_pages: Pages, *, after: torch.cuda.Stream | None = None
    ) -> TransferHandle:
        """Copy L1 pages to L2 pages (l1_pages[i] -> l2_pages[i]); DONE once in L2."""
        src, dst = transfer_pages(
            Direction.D2H, l1_pages, l2_pages, self.l1.capacity_pages, self.l2.capacity_pages
        )
        return self._issue(Direction.D2H, src, dst, after)

    def h2d(
        self, l2_pages: Pages, l1_pages: Pages, *, after: torch.cuda.Stream | None = None
    ) -> TransferHandle:
        """Copy L2 pages to L1 pages (l2_pages[i] -> l1_pages[i]); DONE once in L1."""
        src, dst = transfer_pages(
            Direction.H2D, l2_pages, l1_pages, self.l2.capacity_pages, self.l1.capacity_pages
        )
        return self._issue(Direction.H2D, dst, src, after)

    def plan(self, direction: Direction, l2_ids: Pages) -> DmaPlan:
        """Route and chunks of a transfer touching `l2_ids` (validated, n >= 1).

        Plans of one run of consecutive L2 pages depend only on (direction, n, first page)
        and the mover's settings: they are remembered (planning costs tens of microseconds of
        the issuing thread, before any device work can start)."""
        n, first = int(l2_ids.size), int(l2_ids[0])
        settings = (
            self.chunk_pages,
            self.first_chunk_bytes,
            self.single_chunk_max_bytes,
            self.run_h2d_single_max_bytes,
            self.direct_min_bytes,
        )
        key = (direction, n, first, settings)
        cached = self._plans.get(key)
        # Same size and first page is not enough: [5, 7, 6] is no run.
        if cached is not None and is_run(l2_ids):
            return cached
        d2h = direction is Direction.D2H
        route = plan_route(l2_ids, self.bytes_per_page, self.direct_min_bytes, staged_first=d2h)
        single_max = self.single_chunk_max_bytes
        if not d2h and route.runs == 1:  # one run back to L1: its tail chunk small (routes.py)
            single_max = min(single_max, self.run_h2d_single_max_bytes)
        bounds = chunk_bounds(
            n,
            self.bytes_per_page,
            self.chunk_pages,
            descending=not d2h,
            first_bytes=self.first_chunk_bytes,
            single_max_bytes=single_max,
        )
        plan = DmaPlan(route, bounds, split_runs(route.direct, bounds))
        if route.order is None and route.runs == 1:  # in order and consecutive: reusable
            if len(self._plans) >= PLANS_KEPT:
                self._plans.clear()
            self._plans[key] = plan
        return plan

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
        plan = self._pitched_plan(direction, l2_ids)
        if plan is None and direction is Direction.D2H:
            plan = self._mapped_plan(l2_ids)
        plan = plan or self.plan(direction, l2_ids)
        route = plan.route
        try:
            buffers = (
                TransferBuffers.none()
                if plan.pitched
                else self._borrow(
                    counters, n, route.staged_pages, plan.index_len, packed=not plan.mapped
                )
            )
        except TransferError as e:
            counters.failed += 1
            return ReadyHandle(direction, n * self.bytes_per_page, error=e)
        delay = 0
        if self.faults is not None and self.faults.fire(FaultSite.DELAY):
            delay = self.faults.delay_polls
        enqueued = False
        try:
            work_started = time.perf_counter()
            if plan.pitched:
                completion = self._enqueue_pitched(direction, l1_ids, l2_ids, after)
            elif plan.mapped:
                completion = self._enqueue_mapped(buffers, plan, l1_ids, l2_ids, after)
            elif direction is Direction.D2H:
                completion = self._enqueue_d2h(buffers, plan, l1_ids, after)
            else:
                completion = self._enqueue_h2d(buffers, plan, l1_ids, after)
            work_s = time.perf_counter() - work_started
            enqueued = True
        finally:
            if not enqueued:  # a kernel refused its operands: nothing may stay borrowed
                self._abandon(buffers)
        counters.fragmented += route.runs > 1
        counters.staged += route.staged_pages > 0
        counters.staged_pages += route.staged_pages
        counters.direct_dmas += sum(map(len, plan.pieces))
        counters.mapped += plan.mapped
        counters.pitched += plan.pitched
        handle = DmaHandle(
            self, direction, n * self.bytes_per_page, buffers, completion, delay, plan
        )
        if direction is Direction.H2D:  # its layers all land at its end
            handle.gate = EventGate(self.l1.geometry.layers, completion.end, self.l1.device)
        t = handle.timings
        t.issued_at, t.workspace_setup_s = entered, buffers.setup_s
        t.enqueue_s = time.perf_counter() - entered - buffers.setup_s
        if not self._streams.cuda:  # CPU: the copies ran inside the call
            t.service_s, t.enqueue_s = work_s, t.enqueue_s - work_s
        self._in_flight.add(handle)
        return handle

    def _pitched_plan(self, direction: Direction, l2_ids: Pages) -> DmaPlan | None:
        """A pitched plan, or None when the transfer takes another route (class docstring)."""
        if not self.pitched or l2_ids.size > PITCHED_MAX_PAGES:
            return None
        if not self.pitched_every and (direction is Direction.D2H or is_run(l2_ids)):
            return None  # a D2H mapped or packed; one run in order: one DMA (routes.py)
        return pitched_plan(l2_ids)

    def _mapped_plan(self, l2_ids: Pages) -> DmaPlan | None:
        """A D2H's mapped plan, or None when it goes by DMA (class docstring)."""
        if not self.mapped_d2h or (is_run(l2_ids) and not self.mapped_every):
            return None  # a run in order: one DMA, known without sorting (the common case)
        plan = mapped_plan(l2_ids)
        if plan.route.runs == 1 and not self.mapped_every:  # one DMA: nothing to save
            return None
        return plan

    def _borrow(
        self, counters: DirectionCounters, n: int, n_staged: int, n_index: int, *, packed: bool
    ) -> TransferBuffers:
        """`TransferBuffers.borrow`, counting what it allocated."""
        before = self._allocation_counts()
        try:
            buffers = TransferBuffers.borrow(
                self.workspaces,
                self.index_buffers,
                self.l1.tensor.dtype,
                self._page_shape,
                n,
                n_staged,
                n_index=n_index,
                packed=packed,
            )
        finally:  # a failed borrow may have allocated (and released) some buffers first
            pinned, device = self._allocation_counts()
            counters.pinned_allocations += pinned - before[0]
            counters.device_allocations += device - before[1]
        counters.workspace_setup_s += buffers.setup_s
        return buffers

    def _enqueue_d2h(
        self, buf: TransferBuffers, plan: DmaPlan, l1_ids: Pages, after: torch.cuda.Stream | None
    ) -> _Completion:
        s = self._streams
        # Pinned on CUDA: the upload reads it asynchronously. Each chunk at its aligned slot.
        plan.fill_index(l1_ids, buf.index_array)
        caller = s.current()
        s.wait_for(s.compute, after if after is not None else caller)  # before L1 is read (B05)
        start = s.timer(s.compute)
        l1, l2, packed, host = self.l1.tensor, self.l2.tensor, buf.packed, buf.host
        assert packed is not None, "a DMA-route D2H packs"
        bpp = self.bytes_per_page
        staged: list[tuple[int, int, Event | None]] = []
        gathered = False  # the one chunk's gather ran in the upload's graph
        with s.use(s.compute, caller):
            if self.graphs.enabled and len(plan.bounds) == 1 and host is None:
                gathered = self._upload_and_gather(buf, plan)
            if not gathered:
                buf.index_device.copy_(buf.index_host, non_blocking=True)
        with s.use(s.d2h, caller):  # DMAs are `copy_` calls: they run on the current stream
            for (lo, hi), runs, at in zip(plan.bounds, plan.pieces, plan.index_at):
                if not gathered:
                    self.kernels.gather(
                        l1, buf.index_device[at : at + hi - lo], packed[lo:hi], stream=s.compute
                    )
                s.wait_for(s.d2h, s.compute)  # chunk k's DMAs after its gather
                spans = [(first * bpp, a * bpp, (b - a) * bpp) for a, b, first in runs]
                a, b = plan.staged_in(lo, hi) if host is not None else (0, 0)
                more = []
                if host is not None and a < b:
                    offset = plan.route.staged_lo
                    more.append((host[a:b], packed[offset + a : offset + b]))
                self.copies.copy_runs(l2, packed, spans, more, stream=s.d2h)  # batched
                if host is not None and a < b:
                    staged.append((a, b, s.mark(s.d2h)))
        end = s.timer(s.d2h)  # the DMA stream ran every DMA before this
        if host is None:
            return _Completion(start, end)
        index = torch.from_numpy(plan.route.l2_staged)
        return _Completion(
            start, end, _HostScatter(self.l2.bytes_view(), index, _byte_rows(host), staged)
        )

    def _upload_and_gather(self, buf: TransferBuffers, plan: DmaPlan) -> bool:
        """The one chunk's index upload and gather as a replayed graph, on the current stream
        (issuegraphs.py); False when they are still to be run eagerly."""
        (lo, hi), at = plan.bounds[0], plan.index_at[0]
        l1, packed, index = self.l1.tensor, buf.packed, buf.index_device
        assert packed is not None, "a DMA-route D2H packs"
        key = GraphKey(
            buf.index_host.data_ptr(),
            index.data_ptr(),
            int(index.numel()),
            at,
            packed.data_ptr(),
            hi - lo,
        )
        assert lo == 0, plan.bounds  # one chunk starts at the first page

        def work() -> None:  # exactly the eager path's calls, on the current stream
            index.copy_(buf.index_host, non_blocking=True)
            self.kernels.gather(l1, index[at : at + hi - lo], packed[lo:hi])

        return self.graphs.run(key, work)

    def _enqueue_h2d(
        self, buf: TransferBuffers, plan: DmaPlan, l1_ids: Pages, after: torch.cuda.Stream | None
    ) -> _Completion:
        s = self._streams
        # The DMAs read locked L2 pages into a private buffer: they need not wait for the
        # caller, so they are queued first -- the copy engine starts while the rest is issued
        # (the index upload, the caller wait, the scatter launches). The scatters read the
        # indices and overwrite L1 pages: they wait for the caller (B05) and each for its
        # chunk's DMAs.
        caller = s.current()
        start = s.timer(s.h2d)
        l1, l2, packed, host = self.l1.tensor, self.l2.tensor, buf.packed, buf.host
        assert packed is not None, "an H2D packs"
        bpp = self.bytes_per_page
        offset = plan.route.staged_lo
        dmas_done: list[Event | None] = []
        with s.use(s.h2d, caller):  # DMAs are `copy_` calls: they run on the current stream
            for k, ((lo, hi), runs) in enumerate(zip(plan.bounds, plan.pieces)):
                a, b = plan.staged_in(lo, hi) if host is not None else (0, 0)
                if host is not None and a < b:  # packed on the CPU while earlier DMAs copy
                    rows, staged_index = self.l2.bytes_view(), plan.route.l2_staged[a:b]
                    torch.index_select(
                        rows, 0, torch.from_numpy(staged_index), out=_byte_rows(host[a:b])
                    )
                spans = [(p * bpp, first * bpp, (q - p) * bpp) for p, q, first in runs]
                more = []
                if host is not None and a < b:
                    more.append((packed[offset + a : offset + b], host[a:b]))
                self.copies.copy_runs(packed, l2, spans, more, stream=s.h2d)  # batched
                dmas_done.append(s.relay(s.h2d, k))  # waited on below, in this issue
        # Pinned on CUDA: the upload reads it asynchronously. Each chunk at its aligned slot.
        plan.fill_index(l1_ids, buf.index_array)
        s.wait_for(s.compute, after if after is not None else caller)
        with s.use(s.compute, caller):
            buf.index_device.copy_(buf.index_host, non_blocking=True)
        for (lo, hi), at, done in zip(plan.bounds, plan.index_at, dmas_done):
            s.wait(s.compute, done)  # chunk k's scatter after its DMAs
            self.kernels.scatter(
                packed[lo:hi], buf.index_device[at : at + hi - lo], l1, stream=s.compute
            )
        # After the last scatter, which waited every DMA; a new event: the gate hands it out.
        end = s.mark(s.compute, timing=True)
        return _Completion(start, end)

    def _enqueue_mapped(
        self,
        buf: TransferBuffers,
        plan: DmaPlan,
        l1_ids: Pages,
        l2_ids: Pages,
        after: torch.cuda.Stream | None,
    ) -> _Completion:
        """A mapped D2H: upload both page lists, one kernel writes every L1 row into its L2
        page, on the D2H stream after the caller's work (B05: it reads L1)."""
        s = self._streams
        plan.fill_mapped(l1_ids, l2_ids, buf.index_array)  # pinned: the upload reads it later
        caller = s.current()
        s.wait_for(s.d2h, after if after is not None else caller)
        start = s.timer(s.d2h)
        n, at = int(l1_ids.size), plan.slots_at
        l1, l2, index = self.l1.tensor, self.l2.tensor, buf.index_device

        def work() -> None:  # on the current stream, eagerly or captured
            index.copy_(buf.index_host, non_blocking=True)
            self.kernels.copy_mapped(l1, index[:n], l2, index[at : at + n], to_pool=True)

        with s.use(s.d2h, caller):
            key = GraphKey(
                buf.index_host.data_ptr(),
                index.data_ptr(),
                int(index.numel()),
                at,
                l2.data_ptr(),
                n,
                mapped=True,
            )
            if not (self.graphs.enabled and self.graphs.run(key, work)):
                work()
        return _Completion(start, s.timer(s.d2h))

    def _enqueue_pitched(
        self, direction: Direction, l1_ids: Pages, l2_ids: Pages, after: torch.cuda.Stream | None
    ) -> _Completion:
        """A pitched transfer: per page one 2D DMA between its L1 rows (`l1_pages` rows apart)
        and its L2 page, on the direction's stream after the caller's work (B05: a D2H reads
        L1, an H2D overwrites it). CPU: the same copies by `host_copy2d`, in the call."""
        l1, l2, to_l2 = self.l1.tensor, self.l2.tensor, direction is Direction.D2H
        if not self._streams.cuda:  # the same address arithmetic, the copies done now
            copy_pages(host_copy2d, l1, l2, l1_ids, l2_ids, to_l2=to_l2, stream=0)
            return _Completion(None, None)
        s, copy2d = self._streams, self._copy2d
        assert copy2d is not None, "pitched on CUDA: cuda.bindings' 2D copy"
        stream = s.d2h if to_l2 else s.h2d
        assert stream is not None
        s.wait_for(stream, after if after is not None else s.current())
        start = s.timer(stream)
        copy_pages(copy2d, l1, l2, l1_ids, l2_ids, to_l2=to_l2, stream=stream.cuda_stream)
        # An H2D's end is handed out by its layer gate: a new event, never a recycled timer.
        end = s.timer(stream) if direction is Direction.D2H else s.mark(stream, timing=True)
        return _Completion(start, end)

    # -- completion and lifetime --------------------------------------------------------------

    def _retire(self, handle: DmaHandle, buffers: TransferBuffers, status: TransferStatus) -> None:
        """Called once per handle when it turns final: buffers back, counters."""
        buffers.release()
        self._in_flight.discard(handle)
        self.counters[handle.direction].finished(status, handle.nbytes)

    def _abandon(self, buffers: TransferBuffers) -> None:
        """Issue failed half-way: wait for whatever was enqueued, then return the buffers (R13:
        an issue that raises leaves nothing in flight)."""
        if self._streams.cuda:
            torch.cuda.synchronize(self.l1.device)
        buffers.release()

    def _allocation_counts(self) -> tuple[int, int]:
        """(host allocations, device allocations) over both caches, cumulative."""
        pages, indices = self.workspaces.counters, self.index_buffers.counters
        pinned = pages.pinned_allocations + indices.pinned_allocations
        return pinned, pages.allocations + indices.allocations - pinned

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
            "chunk_pages": self.chunk_pages
            if self.chunk_pages is not None
            else (
                f"one chunk up to {self.single_chunk_max_bytes} bytes (an H2D of one L2 run: "
                f"{min(self.single_chunk_max_bytes, self.run_h2d_single_max_bytes)}), else "
                f"doubling from {self.first_chunk_bytes} bytes"
            ),
            "direct_min_bytes": self.direct_min_bytes,
            "copies": self.copies.status(),
            "mapped_d2h": self.mapped_reason,
            "pitched": self.pitched_reason,
            "issue_graphs": self.graphs.status(),
            "streams": self._streams.ids(),
            "streams_how": self._streams.how,
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
        self._streams.release()
