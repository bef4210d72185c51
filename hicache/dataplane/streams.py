"""The private CUDA streams of one mover, and the cheap way to switch between them.

    compute   index uploads and the gather/scatter kernels (launched onto it by argument)
    d2h       D2H DMAs (`copy_` calls: they run on the current stream)
    h2d       H2D DMAs; its own stream, so a load-back never queues behind a backup -- PCIe
              copies each way on its own engine

The three are the mover's own (ownstreams.py: never one of torch's round-robin pool streams,
which a process that asks for more than 32 hands to two owners at once). On CPU there are no
streams: every method degrades to "already done" (None events, no waits, no switches), so the
mover runs the same code synchronously.
"""

from __future__ import annotations

import contextlib

import torch

from hicache.dataplane.ownstreams import how, lend, release

Event = torch.cuda.Event
KNOWN_STREAMS = 64  # caller streams remembered by id (a serving loop uses a few)
TIMERS_KEPT = 64  # idle timing events kept for reuse (one transfer holds two)


def landed(event: Event) -> bool:
    """Has the device passed `event`? (non-blocking)"""
    return bool(event.query())  # type: ignore[no-untyped-call]


class Streams:
    """CUDA: private streams -- `compute` (index uploads, kernels), and one DMA stream per
    direction (`d2h`, `h2d`), so a load-back never queues behind a backup: PCIe copies each
    way on its own engine. CPU: no streams; every step runs synchronously.

    Switching streams costs host time (a `torch.cuda.stream` block looks the current stream
    up twice; benchmarks/results/HISTORY.md has the figures), so an issue looks the caller's
    stream up once and switches with `use(stream, back)`; kernels take their stream as an
    argument. Events cost host time too when new (the driver creates one at its first
    record), so the ones an issue makes every time are reused:

        current()       the caller's stream: its Python object remembered by stream id
                        (`torch.cuda.current_stream` builds a new one per call)
        wait_for(a, b)  one reused event, recorded on b and waited on by a at once
        relay(s, k)     reused event k, recorded on s: for stream waits enqueued before the
                        next relay(..., k) (a wait takes the record current at its call, so
                        re-recording leaves every enqueued wait as it was)
        timer(s)        a timing event from the idle ones, recorded on s; `recycle` gives it
                        back once nothing reads it (its handle is final)
    Events that outlive the issue and are polled or handed out (a staged piece's landing, a
    layer's gate) are new ones: `mark`.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self.how = how() if self.cuda else "none: the CPU plane runs each step in its call"
        self.compute: torch.cuda.Stream | None = None
        self.d2h: torch.cuda.Stream | None = None
        self.h2d: torch.cuda.Stream | None = None
        if self.cuda:
            self.compute, self.d2h, self.h2d = (lend(self, device) for _ in range(3))
        self._known: dict[tuple[int, int, int], torch.cuda.Stream] = {}  # by stream id
        self._follow = self._event(timing=False) if self.cuda else None
        self._relays: list[Event] = []
        self._timers: list[Event] = []  # idle timing events

    def release(self) -> None:
        """The three streams go back for other owners (ownstreams.py): the mover is closed.
        Work still queued on them only delays the next owner's; a mover that issued after this
        would still be right, its work in one order with the next owner's."""
        release(self)

    def _event(self, *, timing: bool) -> Event:
        return torch.cuda.Event(enable_timing=timing)  # type: ignore[no-untyped-call]

    def ids(self) -> dict[str, int] | None:
        """The three streams' torch ids, for a run's record (None on CPU): a stream another
        user also enqueues on runs its work and theirs in one order (ownstreams.py)."""
        if self.compute is None or self.d2h is None or self.h2d is None:
            return None
        return {
            "compute": int(self.compute.stream_id),
            "d2h": int(self.d2h.stream_id),
            "h2d": int(self.h2d.stream_id),
        }

    def current(self) -> torch.cuda.Stream | None:
        """The caller's current stream on our device (None on CPU)."""
        if not self.cuda:
            return None
        index = self.device.index
        key = torch._C._cuda_getCurrentStream(
            torch.cuda.current_device() if index is None else index
        )
        stream = self._known.get(key)
        if stream is None:  # an object per stream id: equal ids are the same stream
            if len(self._known) >= KNOWN_STREAMS:
                self._known.clear()
            stream = self._known[key] = torch.cuda.current_stream(self.device)
        return stream

    def use(
        self, stream: torch.cuda.Stream | None, back: torch.cuda.Stream | None
    ) -> contextlib.AbstractContextManager[object]:
        """Make `stream` current for a block, then `back` (the stream that was current)."""
        if stream is None or back is None:
            return contextlib.nullcontext()
        return _Current(stream, back)

    def mark(self, stream: torch.cuda.Stream | None, *, timing: bool = False) -> Event | None:
        """An event recorded on `stream` now (None on CPU: the work is already done)."""
        if stream is None:
            return None
        event = torch.cuda.Event(enable_timing=timing)  # type: ignore[no-untyped-call]
        event.record(stream)
        return event

    def relay(self, stream: torch.cuda.Stream | None, slot: int = 0) -> Event | None:
        """Reused event `slot` recorded on `stream` now, for stream waits enqueued before the
        next `relay(..., slot)` (class docstring); None on CPU."""
        if stream is None:
            return None
        while len(self._relays) <= slot:
            self._relays.append(self._event(timing=False))
        event = self._relays[slot]
        event.record(stream)
        return event

    def timer(self, stream: torch.cuda.Stream | None) -> Event | None:
        """A timing event recorded on `stream` now, reused once `recycle`d (None on CPU)."""
        if stream is None:
            return None
        event = self._timers.pop() if self._timers else self._event(timing=True)
        event.record(stream)
        return event

    def recycle(self, *events: Event | None) -> None:
        """Give `timer` events back: nothing reads them any more (their transfer is final)."""
        for event in events:
            if event is not None and len(self._timers) < TIMERS_KEPT:
                self._timers.append(event)

    def wait(self, stream: torch.cuda.Stream | None, event: Event | None) -> None:
        if stream is not None and event is not None:
            stream.wait_event(event)

    def wait_for(self, stream: torch.cuda.Stream | None, other: torch.cuda.Stream | None) -> None:
        """`stream` runs nothing more until `other`'s work so far is done (`wait_stream` with
        a reused event instead of a new one)."""
        if stream is not None and other is not None and self._follow is not None:
            self._follow.record(other)
            stream.wait_event(self._follow)


class _Current:
    """`torch.cuda.set_stream(stream)` for a block, `back` after it (no lookups)."""

    __slots__ = ("back", "stream")

    def __init__(self, stream: torch.cuda.Stream, back: torch.cuda.Stream) -> None:
        self.stream, self.back = stream, back

    def __enter__(self) -> object:
        torch.cuda.set_stream(self.stream)
        return self

    def __exit__(self, *exc: object) -> None:
        torch.cuda.set_stream(self.back)
