"""Layer-wise load-back: an H2D whose layers land one at a time, each with its own event.

A restore's prefill reads the prefix layer by layer: layer 0's attention needs only layer 0
of the prefix. An H2D that lands every layer before any may be read makes the request wait
for the whole copy, then for the whole prefill. Landed layer by layer, the prefill of layer
`l` runs while layers `l+1 ...` are still copied (spec/restore.md, "Layer-wise load-back"):

    h2d stream   wait(caller) -> layer 0: K, V of every run -> mark 0 -> layer 1 ... -> mark L-1
    reader       gate.wait(l) before it reads layer l of the prefix (a stream wait, no host block)

L2 is page-major (`[page, K/V, layer, token, head, dim]`), L1 layer-major (`[K/V, layer,
page, token, head, dim]`). One layer's K (or V) of a run of pages consecutive in L2 is one 2D
DMA: `height` = the run's pages, `width` = one block (page_size x kv_heads x head_dim
elements), source pitch = one L2 page. Two routes, by the target pages:

    direct   the L1 pages run alongside the L2 pages (a run consecutive in both): each DMA
             writes the L1 pool itself, target pitch one block; no workspace, no kernel
    staged   any other L1 pages (a freed L1 hands out pages in any order): each layer's DMAs
             fill that layer's slice of a device workspace, then one `index_copy_` on the
             same stream puts it at its L1 pages

`2 x layers x runs` DMAs, each `cudaMemcpy2DAsync` (`cuda.bindings`). Without the bindings,
or with more than `MAX_RUNS` L2 runs, the mover's usual path lands every layer at once and
the gate waits for all of it: correct, not overlapped.

`LayerGate` (handles.py) is what a reader holds: `wait(l)` makes the current stream wait
until layer `l` of every page landed. `landed_layers` counts the layers a reader waited
for (tests). On CPU a layer is copied when it is first waited for (`wait(l)`), and the rest
at completion: a reader that skips the wait reads what L1 held before -- the GPU race of a
missing wait, made deterministic.

A handle's end is that of its last layer. Faults: a late observation (DELAY) as for every
D2H/H2D; a completion failure (H2D_COMPLETE) is drawn at issue, where a layer-wise transfer
fails: the layers from the middle one on never land, the earlier ones do (a reader may have
read them), and the handle ends FAILED. A failure voids every layer: what a reader computed
from them must be thrown away (the controller's rule, spec/restore.md, R84).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
import torch

from hicache.core.tiers import Direction
from hicache.dataplane.copy2d import Copy2D, runtime_copy2d
from hicache.dataplane.faults import FaultInjector, FaultSite, completion_fault
from hicache.dataplane.handles import OutcomeCounters, TransferHandle, TransferStatus
from hicache.dataplane.pools import DevicePool, HostPool
from hicache.dataplane.streams import Event, Streams, landed
from hicache.errors import TransferError

MAX_RUNS = 8  # more runs than this: 2 x layers x runs DMAs cost more host time than they save
# Same-width integers: the staged route copies raw bits (every float format, fp8 included).
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32}

Run = tuple[int, int, int]  # (first L2 page, first L1 page, pages)


class EventGate:
    """Every layer lands with one event (a whole-transfer H2D): each wait waits for it."""

    def __init__(self, layers: int, end: Event | None, device: torch.device) -> None:
        self.layers = layers
        self._end, self._device = end, device
        self.landed_layers = 0

    def wait(self, layer: int) -> None:
        _check_layer(layer, self.layers)
        self.landed_layers = max(self.landed_layers, layer + 1)
        if self._end is not None:
            torch.cuda.current_stream(self._device).wait_event(self._end)


class _PerLayerGate:
    """A layer-wise H2D's gate: CUDA, one event per layer; CPU, one deferred copy per layer."""

    def __init__(
        self,
        events: Sequence[Event | None],
        copies: Sequence[Callable[[], None]],
        device: torch.device,
    ) -> None:
        self.layers = len(events)
        self._events, self._device = list(events), device
        self._copies: list[Callable[[], None] | None] = list(copies)  # CPU: not yet landed
        self.landed_layers = 0

    def wait(self, layer: int) -> None:
        _check_layer(layer, self.layers)
        self.landed_layers = max(self.landed_layers, layer + 1)
        event = self._events[layer]
        if event is not None:
            torch.cuda.current_stream(self._device).wait_event(event)
        self.land(layer)

    def land(self, layer: int) -> None:
        """CPU: run layer `layer`'s copies if they have not run (no-op on CUDA)."""
        copy = self._copies[layer] if self._copies else None
        if copy is not None:
            self._copies[layer] = None
            copy()

    @property
    def last(self) -> Event | None:
        """The last layer's event: the transfer's end (None on CPU)."""
        return self._events[-1] if self._events else None

    def land_all(self) -> None:
        for layer in range(self.layers):
            self.land(layer)

    def stop(self) -> None:
        """CPU: the hardware stopped (cancel, fail): layers not landed never will."""
        self._copies = [None] * self.layers


def _check_layer(layer: int, layers: int) -> None:
    if not 0 <= layer < layers:
        raise IndexError(f"layer {layer} of a load-back of {layers} layers")


def runs_of(l2_ids: npt.NDArray[np.int64], l1_ids: npt.NDArray[np.int64]) -> list[Run]:
    """Maximal runs of pages consecutive in L2 and in L1 alike, in transfer order: (first L2
    page, first L1 page, pages). With `l1_ids` the transfer's own positions (0, 1, ...): the
    runs of consecutive L2 pages, each with its offset in the transfer."""
    if l2_ids.size == 0:
        return []
    both = (np.diff(l2_ids) == 1) & (np.diff(l1_ids) == 1)
    cuts = np.flatnonzero(~both) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [l2_ids.size]))
    return [(int(l2_ids[a]), int(l1_ids[a]), int(b - a)) for a, b in zip(starts, ends)]


class LayerwiseHandle(TransferHandle):
    """A layer-wise H2D (module docstring); `gate` is what its reader waits on."""

    def __init__(
        self,
        nbytes: int,
        gate: _PerLayerGate,
        start: Event | None,
        failure: TransferError | None,
        delay_polls: int,
        on_final: Callable[[LayerwiseHandle, TransferStatus], None],
    ) -> None:
        super().__init__(Direction.H2D, nbytes)
        self.gate = gate
        self._per_layer = gate
        self._start = start
        self._end = gate.last
        self._failure = failure  # drawn at issue: the end it reports once landed
        self._delay_polls = delay_polls
        self.keep: tuple[torch.Tensor, ...] = ()  # device buffers the copies use until final
        self._on_final = on_final

    def _probe(self) -> TransferStatus:
        if self._end is not None and not landed(self._end):
            return TransferStatus.PENDING
        self._per_layer.land_all()  # CPU: the layers nobody waited for land now
        if self._delay_polls > 0:  # DELAY fault: the completion is observed late
            self._delay_polls -= 1
            return TransferStatus.PENDING
        self.error = self._failure
        return TransferStatus.FAILED if self.error is not None else TransferStatus.DONE

    def _quiesce(self, timeout_s: float | None) -> bool:
        if self._end is None:
            self._per_layer.stop()
            return True
        deadline = None if timeout_s is None else time.perf_counter() + timeout_s
        while not landed(self._end):
            if deadline is not None and time.perf_counter() >= deadline:
                return False
            time.sleep(0.0005)
        return True

    def _finish(self, status: TransferStatus) -> None:
        super()._finish(status)
        self.keep = ()  # the hardware is done with them
        if self._start is not None and self._end is not None and status is TransferStatus.DONE:
            self.timings.service_s = self._start.elapsed_time(self._end) / 1e3
        self._on_final(self, status)


class LayerwiseMover:
    """Issues layer-wise H2Ds between `l1` and `l2` (module docstring). `issue` returns None
    when a transfer is not for it (too many runs, no 2D copy on CUDA): the caller moves it
    its usual way. Not thread-safe: one thread issues and polls."""

    def __init__(self, l1: DevicePool, l2: HostPool, *, faults: FaultInjector | None) -> None:
        self.l1, self.l2, self.faults = l1, l2, faults
        self.layers = l1.geometry.layers
        self._streams = Streams(l1.device)
        self._copy2d: Copy2D | None = None
        self.reason = "per layer: CPU, copied when read"
        if self._streams.cuda:
            self._copy2d, why = runtime_copy2d()
            per_layer = "per layer: cudaMemcpy2DAsync per run and K/V (cuda.bindings)"
            self.reason = per_layer if self._copy2d else f"whole transfer: {why}"
        self.counters = OutcomeCounters()
        self.staged = 0  # transfers issued through the workspace (L1 pages not in runs)
        self.in_flight: set[LayerwiseHandle] = set()

    def issue(
        self,
        l2_ids: npt.NDArray[np.int64],
        l1_ids: npt.NDArray[np.int64],
        after: torch.cuda.Stream | None,
    ) -> LayerwiseHandle | None:
        """Copy L2 pages to L1 pages (validated by the caller, n >= 1), layer by layer."""
        runs = runs_of(l2_ids, l1_ids)
        direct = len(runs) <= MAX_RUNS
        if not direct:  # staged: runs of L2 pages into the workspace, at transfer offsets
            runs = runs_of(l2_ids, np.arange(l2_ids.size, dtype=np.int64))
        if len(runs) > MAX_RUNS or (self._streams.cuda and self._copy2d is None):
            return None
        entered = time.perf_counter()
        self.counters.ops += 1
        delay = 0
        if self.faults is not None and self.faults.fire(FaultSite.DELAY):
            delay = self.faults.delay_polls
        # A failure is drawn at issue, where it happens: from layer `torn` on nothing lands
        # (the layers before it do, and a reader may have read them), and the end is FAILED.
        error = completion_fault(self.faults, Direction.H2D)
        torn = self.layers // 2 if error is not None else self.layers
        keep: tuple[torch.Tensor, ...] = ()
        if not self._streams.cuda:
            copies = self._cpu_copies(l2_ids, l1_ids, torn)
            gate, start = _PerLayerGate([None] * self.layers, copies, self.l1.device), None
        elif direct:
            gate, start = self._enqueue(runs, after, torn)
        else:
            gate, start, keep = self._enqueue_staged(runs, l1_ids, after, torn)
        self.staged += not direct
        nbytes = int(l2_ids.size) * self.l1.geometry.bytes_per_page
        handle = LayerwiseHandle(nbytes, gate, start, error, delay, self._retire)
        handle.keep = keep  # the workspace and index the device reads until the end
        handle.timings.issued_at = entered
        handle.timings.enqueue_s = time.perf_counter() - entered
        self.in_flight.add(handle)
        return handle

    def _begin(
        self, after: torch.cuda.Stream | None
    ) -> tuple[torch.cuda.Stream | None, Event | None]:
        """The caller's stream, and the timing event the DMA stream starts with -- after the
        caller's queued work (B05: the DMAs overwrite L1 pages it may still read)."""
        s = self._streams
        caller = s.current()
        s.wait_for(s.h2d, after if after is not None else caller)
        return caller, s.mark(s.h2d, timing=True)

    def _enqueue(
        self, runs: list[Run], after: torch.cuda.Stream | None, torn: int
    ) -> tuple[_PerLayerGate, Event | None]:
        s = self._streams
        assert self._copy2d is not None and s.h2d is not None, "CUDA with cuda.bindings"
        _, start = self._begin(after)
        g = self.l1.geometry
        block = g.page_size * g.kv_heads * g.head_dim * self.l1.tensor.element_size()
        l1_base, l2_base = self.l1.tensor.data_ptr(), self.l2.tensor.data_ptr()
        cap1, layers = self.l1.capacity_pages, self.layers
        l2_page = 2 * layers * block
        stream = s.h2d.cuda_stream
        events: list[Event | None] = []
        for layer in range(layers):
            for kv in (0, 1) if layer < torn else ():
                row = kv * layers + layer  # the (K/V, layer) row of both layouts
                for first2, first1, n in runs:
                    dst = l1_base + (row * cap1 + first1) * block
                    src = l2_base + first2 * l2_page + row * block
                    self._copy2d(dst, block, src, l2_page, block, n, stream)
            events.append(s.mark(s.h2d, timing=layer in (0, layers - 1)))  # layer 0: benches
        return _PerLayerGate(events, [], self.l1.device), start

    def _enqueue_staged(
        self,
        runs: list[Run],
        l1_ids: npt.NDArray[np.int64],
        after: torch.cuda.Stream | None,
        torn: int,
    ) -> tuple[_PerLayerGate, Event | None, tuple[torch.Tensor, ...]]:
        """The staged route: per layer, its DMAs into the workspace's slice of that layer,
        then one `index_copy_` of the slice to the L1 pages, then the layer's event."""
        s = self._streams
        assert self._copy2d is not None and s.h2d is not None, "CUDA with cuda.bindings"
        caller, start = self._begin(after)
        l1, layers, n = self.l1.tensor, self.layers, int(l1_ids.size)
        bits = _BITS[l1.element_size()]
        with s.use(s.h2d, caller):  # allocated, uploaded and read on the DMA stream
            ws = torch.empty((layers, 2, n, *l1.shape[3:]), dtype=bits, device=l1.device)
            index = torch.from_numpy(l1_ids).to(l1.device, non_blocking=True)
            block = ws[0, 0, 0].numel() * ws.element_size()
            l2_base, ws_base = self.l2.tensor.data_ptr(), ws.data_ptr()
            l2_page, stream = 2 * layers * block, s.h2d.cuda_stream
            target = l1.view(bits)
            events: list[Event | None] = []
            for layer in range(layers):
                if layer < torn:
                    for kv in (0, 1):
                        row = kv * layers + layer
                        for first2, at, count in runs:
                            dst = ws_base + ((layer * 2 + kv) * n + at) * block
                            src = l2_base + first2 * l2_page + row * block
                            self._copy2d(dst, block, src, l2_page, block, count, stream)
                    target[:, layer].index_copy_(1, index, ws[layer])
                events.append(s.mark(s.h2d, timing=layer in (0, layers - 1)))
        return _PerLayerGate(events, [], self.l1.device), start, (ws, index)

    def _cpu_copies(
        self, l2_ids: npt.NDArray[np.int64], l1_ids: npt.NDArray[np.int64], torn: int
    ) -> list[Callable[[], None]]:
        l1, l2 = self.l1.tensor, self.l2.tensor
        src, dst = torch.from_numpy(l2_ids), torch.from_numpy(l1_ids)

        def copy_layer(layer: int) -> None:
            if layer >= torn:
                return  # the transfer failed before this layer: nothing lands
            # l2[page, kv, layer] -> l1[kv, layer, page]
            l1[:, layer].index_copy_(1, dst, l2.index_select(0, src)[:, :, layer].transpose(0, 1))

        return [functools.partial(copy_layer, layer) for layer in range(self.layers)]

    def _retire(self, handle: LayerwiseHandle, status: TransferStatus) -> None:
        self.in_flight.discard(handle)
        self.counters.finished(status, handle.nbytes)

    def status(self) -> dict[str, object]:
        return {
            "how": self.reason,
            "in_flight": len(self.in_flight),
            "staged": self.staged,
            "streams": self._streams.ids(),
            "streams_how": self._streams.how,
            **vars(self.counters),
        }

    def close(self) -> None:
        """Cancel every transfer in flight (waiting for its hardware); give the streams back."""
        for handle in list(self.in_flight):
            handle.cancel()
        self._streams.release()
