"""The private CUDA streams of one mover, and the cheap way to switch between them.

    compute   index uploads and the gather/scatter kernels (launched onto it by argument)
    d2h       D2H DMAs (`copy_` calls: they run on the current stream)
    h2d       H2D DMAs; its own stream, so a load-back never queues behind a backup -- PCIe
              copies each way on its own engine

On CPU there are no streams: every method degrades to "already done" (None events, no waits,
no switches), so the mover runs the same code synchronously.
"""

from __future__ import annotations

import contextlib

import torch

Event = torch.cuda.Event


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
    argument.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device

        def new() -> torch.cuda.Stream | None:
            return torch.cuda.Stream(device) if self.cuda else None  # type: ignore[no-untyped-call]

        self.compute, self.d2h, self.h2d = new(), new(), new()

    def current(self) -> torch.cuda.Stream | None:
        """The caller's current stream on our device (None on CPU)."""
        return torch.cuda.current_stream(self.device) if self.cuda else None

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

    def wait(self, stream: torch.cuda.Stream | None, event: Event | None) -> None:
        if stream is not None and event is not None:
            stream.wait_event(event)

    def wait_for(self, stream: torch.cuda.Stream | None, other: torch.cuda.Stream | None) -> None:
        """`stream` runs nothing more until `other`'s work so far is done."""
        if stream is not None and other is not None:
            stream.wait_stream(other)


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
