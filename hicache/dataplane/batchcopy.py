"""Many DMAs as one driver call: `cuMemcpyBatchAsync` (CUDA >= 12.8, through `cuda.bindings`).

A fragmented transfer moves one DMA per run of consecutive L2 pages (dma.py) or per run of
each pool (grouptransfer.py). Issued one `copy_` at a time, 22 single-page runs of 2.25 MiB
cost about 0.17 ms of host time and reach 92-94% of one pinned copy on an H100; the same 22
as one `cuMemcpyBatchAsync` cost 0.02 ms and reach 99% (benchmarks/batched_copies.py).

`BatchedCopies.copy(pieces)` enqueues a list of (target, source) tensor pairs on the current
CUDA stream, in stream order, as one batched call when it can, else one `copy_` per piece:

    when                                                   how
    -----------------------------------------------------  ---------------------------------
    CPU tensors, or batching off / unavailable (no         `target.copy_(source)` each
    `cuda.bindings`, no cuMemcpyBatchAsync, a driver that
    answers CUDA_ERROR_NOT_SUPPORTED)
    otherwise, one piece too                               one cuMemcpyBatchAsync

One piece goes as a batch of one too: the call from pointers costs the issuing thread less
than the byte views, slices and `copy_` of the per-piece way (an H100 host: 29 us for a
single-run `copy_runs` that way, before the DMA could start).

Both move the same bytes with the same ordering: the batch runs after the stream's earlier
work and before its later work (`CU_MEMCPY_SRC_ACCESS_ORDER_STREAM`), as a `copy_(...,
non_blocking=True)` does; copies within one batch have no order among themselves, so pieces
must not overlap. `reason` says which way it copies and why. Contract: every piece is a
contiguous pair of equal byte size, each on the CUDA device or in pinned host memory, and
both stay alive until the stream passes the copy (the movers' handles hold them). The first
batched call failing (bindings of another CUDA major, a driver without batches) turns
batching off for good, its pieces copied one by one; after a batch has worked, a driver
error raises TransferError (some pieces of that batch may have been enqueued).
`HICACHE_BATCHED_COPIES=0` turns batching off (to compare). Not thread-safe: one thread
issues (as the movers).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hicache.errors import TransferError

Piece = tuple[torch.Tensor, torch.Tensor]  # (target, source), contiguous, equal bytes
Run = tuple[int, int, int]  # (target byte offset, source byte offset, bytes)
# (target, target byte offset, source, source byte offset, bytes); target and source contiguous
Span = tuple[torch.Tensor, int, torch.Tensor, int, int]


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes, flat (a view)."""
    return t.view(-1).view(torch.uint8)


ENV = "HICACHE_BATCHED_COPIES"


def _driver_batch() -> tuple[Callable[..., Any] | None, str]:
    """cuda.bindings' cuMemcpyBatchAsync and its stream-ordered attributes, or why not."""
    try:
        from cuda.bindings import driver  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None, "per piece: cuda.bindings is not installed"
    call = getattr(driver, "cuMemcpyBatchAsync", None)
    if call is None:
        return None, "per piece: cuda.bindings has no cuMemcpyBatchAsync (CUDA < 12.8)"
    attr = driver.CUmemcpyAttributes()
    attr.srcAccessOrder = driver.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
    attr.flags = 0
    unsupported = int(driver.CUresult.CUDA_ERROR_NOT_SUPPORTED)

    def batch(dsts: list[int], srcs: list[int], sizes: list[int], stream: int) -> int:
        """0 on success, -1 when the driver does not support it; raises on other errors."""
        ptr = driver.CUdeviceptr  # the bindings take pointer objects, not ints
        d, s = [ptr(p) for p in dsts], [ptr(p) for p in srcs]
        out = call(d, s, sizes, len(dsts), [attr], [0], 1, driver.CUstream(stream))
        err = int(out[0] if isinstance(out, tuple) else out)
        if err == unsupported:
            return -1
        if err != 0:
            raise TransferError(f"cuMemcpyBatchAsync of {len(dsts)} copies failed: CUresult {err}")
        return 0

    return batch, "batched: one cuMemcpyBatchAsync per chunk (cuda.bindings)"


class BatchedCopies:
    """Enqueues a chunk's DMAs on the current stream (module docstring). `enabled`: try the
    batched call on CUDA (default: unless HICACHE_BATCHED_COPIES=0)."""

    def __init__(self, device: torch.device, *, enabled: bool | None = None) -> None:
        if enabled is None:
            enabled = os.environ.get(ENV, "1") != "0"
        self.device = device
        self._batch: Callable[..., Any] | None = None
        if device.type != "cuda":
            self.reason = "per piece: CPU (copies run in the call)"
        elif not enabled:
            self.reason = f"per piece: batching off ({ENV}=0 or batched=False)"
        else:
            self._batch, self.reason = _driver_batch()
        self.batched_calls = 0  # cumulative: batched calls made, pieces they carried
        self.batched_pieces = 0

    @property
    def batched(self) -> bool:
        return self._batch is not None

    def copy(self, pieces: Sequence[Piece], *, stream: torch.cuda.Stream | None = None) -> int:
        """Enqueue every piece (target <- source) on the current stream; returns the number
        of driver copy calls made (1 when batched). `stream`, when given, must be the current
        stream: a caller that has just made it current passes it to save looking it up."""
        if self._batch is None or not pieces:
            for target, source in pieces:
                target.copy_(source, non_blocking=True)
            return len(pieces)
        # Verify the contract: a wrong size or a strided view would copy the wrong bytes.
        for target, source in pieces:
            assert target.is_contiguous() and source.is_contiguous(), "contiguous pieces"
            assert target.nbytes == source.nbytes, (target.nbytes, source.nbytes)
        dsts = [t.data_ptr() for t, _ in pieces]
        srcs = [s.data_ptr() for _, s in pieces]
        sizes = [t.nbytes for t, _ in pieces]
        return self._call(dsts, srcs, sizes, lambda: self.copy(pieces), stream)

    def _call(
        self,
        dsts: list[int],
        srcs: list[int],
        sizes: list[int],
        again: Callable[[], int],
        stream: torch.cuda.Stream | None,
    ) -> int:
        """One batched call on the current stream (`stream`: it, as the caller knows it);
        `again` (the same copies, which now go piece by piece) when this driver or these
        bindings cannot batch."""
        assert self._batch is not None
        if stream is None and self.device.type == "cuda":
            stream = torch.cuda.current_stream(self.device)
        handle = stream.cuda_stream if stream is not None else 0
        try:
            answer = self._batch(dsts, srcs, sizes, handle)
        except (TransferError, TypeError, ValueError, RuntimeError) as e:
            if self.batched_calls:  # it worked before: this transfer's own failure
                raise
            # The first call failed: bindings or a driver that cannot batch (a copy it made
            # before failing is made again below, the same bytes).
            self._batch, self.reason = None, f"per piece: the first batch failed ({e!r})"
            return again()
        if answer < 0:  # this driver has none: never again
            self._batch, self.reason = None, "per piece: the driver does not support batches"
            return again()
        self.batched_calls += 1
        self.batched_pieces += len(dsts)
        return 1

    def copy_runs(
        self,
        target: torch.Tensor,
        source: torch.Tensor,
        runs: Sequence[Run],
        more: Sequence[Piece] = (),
        *,
        stream: torch.cuda.Stream | None = None,
    ) -> int:
        """`copy` of byte runs between two contiguous tensors -- (target offset, source
        offset, bytes) each -- and `more` pieces, without slicing a tensor per run when
        batched (the addresses are the bases' plus the offsets). Returns driver copy calls."""
        # Verify every run lies inside both tensors: an address past the end is another
        # allocation's memory, which no later check would see.
        t_end, s_end = target.nbytes, source.nbytes
        for t, s, n in runs:
            assert 0 <= t and t + n <= t_end and 0 <= s and s + n <= s_end, (t, s, n)
        if self._batch is None or not (runs or more):
            t_bytes, s_bytes = _bytes(target), _bytes(source)
            pieces = [(t_bytes[t : t + n], s_bytes[s : s + n]) for t, s, n in runs]
            return self.copy([*pieces, *more])
        assert target.is_contiguous() and source.is_contiguous(), "contiguous bases"
        t0, s0 = target.data_ptr(), source.data_ptr()
        dsts = [t0 + t for t, _, _ in runs] + [t.data_ptr() for t, _ in more]
        srcs = [s0 + s for _, s, _ in runs] + [s.data_ptr() for _, s in more]
        sizes = [n for _, _, n in runs] + [t.nbytes for t, _ in more]
        again = lambda: self.copy_runs(target, source, runs, more)  # noqa: E731
        return self._call(dsts, srcs, sizes, again, stream)

    def copy_spans(self, spans: Sequence[Span], *, stream: torch.cuda.Stream | None = None) -> int:
        """`copy` of byte spans, each between its own pair of contiguous tensors, by address
        when batched (no tensor made per span: a group transfer's runs sit in as many L2
        regions as it has pools), by byte views otherwise. Returns driver copy calls."""
        # Verify every span lies inside both its tensors: an address past the end is another
        # allocation's memory, which no later check would see.
        for t, a, src, b, n in spans:
            assert 0 <= a and a + n <= t.nbytes and 0 <= b and b + n <= src.nbytes, (a, b, n)
        if self._batch is None or not spans:
            flat: dict[int, torch.Tensor] = {}  # one byte view per tensor

            def view(t: torch.Tensor) -> torch.Tensor:
                v = flat.get(id(t))
                if v is None:
                    v = flat[id(t)] = _bytes(t)
                return v

            return self.copy([(view(t)[a : a + n], view(s)[b : b + n]) for t, a, s, b, n in spans])
        assert all(t.is_contiguous() and src.is_contiguous() for t, _, src, _, _ in spans)
        dsts = [t.data_ptr() + a for t, a, _, _, _ in spans]
        srcs = [src.data_ptr() + b for _, _, src, b, _ in spans]
        sizes = [n for *_, n in spans]
        again = lambda: self.copy_spans(spans)  # noqa: E731
        return self._call(dsts, srcs, sizes, again, stream)

    def status(self) -> dict[str, object]:
        return {
            "reason": self.reason,
            "batched_calls": self.batched_calls,
            "batched_pieces": self.batched_pieces,
        }
