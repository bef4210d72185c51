"""H2S (L2 -> L3) and S2H (L3 -> L2): file I/O between the L2 pool and the slot file.

    h2s(l2_pages, slots)   coalesce -> split -> lane 1: one pwrite per piece
                                                lane 2: checksum of each piece's source pages
    s2h(slots, l2_pages)   coalesce -> split -> per piece: one preadv, then checksum its pages

Extents (`extents.coalesce`, both sides consecutive, B13) are cut into pieces of at most
`piece_bytes` (whole pages, at least one; `extents.split`), so that one long extent spreads
over the threads like many short ones:

- S2H: each piece is one `preadv`, then the checksum check of its pages on the same thread,
  while they are still in its cache.
- H2S: writes to one file serialise on its inode lock, so worker 0 writes the pieces in
  order while the others checksum the same (locked, unchanging) source pages
  (`TaskGroup.spread`'s lanes), and each helps the other lane once its own is empty.

(The measurements behind pieces and lanes: benchmarks/results/HISTORY.md.)

Bytes go straight between the L2 tensor's memory and the file: every piece's buffer is a
slice of one `memoryview` over the tensor (no intermediate copy, no serialisation). Pieces
run on one bounded `ThreadPoolExecutor` of `io_threads` threads; a transfer submits one
task per thread (not per piece), and each takes the next piece until none is left. Both
syscalls and the L3 file's page checksum (`checksums.py`) release the GIL. The threads make no
CUDA call, so they may keep running while a CUDA graph is captured (capture.py: what may run during
a capture). A short return is resumed from where it stopped, at most `MAX_SHORT_RESUMES`
times per piece, never accepted (bug class B14); a return of 0 bytes fails the transfer at
once (spec/l3.md, "Short I/O and I/O errors"). Linux alone caps one call at 2 GiB - 4 KiB,
so a larger piece needs a resume.

Metadata order (I5 `publish_order`, spec/invariants.md): an H2S forgets its target
slots' checksums when issued and records them only when its completion is observed DONE; a
failed or cancelled H2S leaves them unreadable. An S2H is DONE only after every page it read
matched its slot's checksum; a mismatch fails it with `CorruptSlot`, a read that cannot finish
(an I/O error, a file that ends early) with `UnreadableSlot`: both a miss, never served.

Faults (`faults.py`) are drawn per piece on the issuing thread, so a seeded injector replays
exactly; with `faults=None` no fault code runs at all.

Deterministic schedule (`io_threads=0`): no thread is started; a transfer's I/O is queued at
issue and runs on the caller's thread, in issue order, at the first poll (or wait, cancel,
close) of any transfer after it -- so the same calls give the same bytes, checksums and
completions at the same points, and a replay of a real-byte run matches its original
(spec/faults.md, "Deterministic I/O").
"""

from __future__ import annotations

import errno
import functools
import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import torch

from hicache.core.pages import Pages
from hicache.core.tiers import Direction
from hicache.dataplane.extents import Extent, coalesce, split
from hicache.dataplane.faults import FaultInjector, FaultSite
from hicache.dataplane.handles import TransferHandle, TransferStatus
from hicache.dataplane.storage import DIRECT_ALIGN, L3File, describe_os_error
from hicache.dataplane.taskgroup import IO_THREADS, MAX_IO_THREADS, DeferredExecutor, TaskGroup
from hicache.errors import (
    ConfigError,
    CorruptSlot,
    InvalidPages,
    StorageError,
    TransferError,
    UnreadableSlot,
)

MAX_SHORT_RESUMES = 64  # per piece; each resume must move at least one byte
# Bytes one I/O call moves at most (a piece; never less than one page). Small enough that a
# long extent spreads over the threads and a piece's pages are still in the CPU cache when
# they are checksummed; large enough that per-call costs vanish in the copy.
PIECE_BYTES = 4 << 20


@dataclass
class StorageCounters:
    """Mover metrics. Bytes and ops count transfers observed DONE."""

    h2s_bytes: int = 0
    h2s_ops: int = 0
    s2h_bytes: int = 0
    s2h_ops: int = 0
    failed_ops: int = 0  # observed FAILED (I/O error, corrupt slot, injected failure)
    extents_issued: int = 0  # coalesced extents (runs consecutive on both sides)
    pieces_issued: int = 0  # I/O pieces the extents were cut into (one pwrite/preadv each)
    short_io_resumed: int = 0  # short returns that were resumed
    corrupt_reads: int = 0  # pages that failed their slot's checksum (the L3File's count)


class _PieceFaults(NamedTuple):
    """The faults one piece will meet, drawn at issue."""

    errno: int | None  # the piece's first call fails with this errno
    short_calls: int  # this many leading calls return short
    corrupt_slots: tuple[int, ...]  # H2S: flip a byte in these slots after the write


class _Piece(NamedTuple):
    """One I/O task: a bounded part of an extent."""

    ext: Extent
    first: int  # index of its first page in the transfer's piece order (H2S checksums)
    faults: _PieceFaults | None


class StorageHandle(TransferHandle):
    """One H2S or S2H transfer. DONE means every byte is in place (S2H: and verified)."""

    def __init__(
        self,
        mover: StorageMover,
        direction: Direction,
        slots: Pages,
        l2_pages: Pages,
        extents: int,
        pieces: list[_Piece],
        delay_polls: int,
    ) -> None:
        super().__init__(direction, int(slots.size) * mover.l3.bytes_per_page)
        self.slots = slots
        self.l2_pages = l2_pages
        self.extents = extents
        self.pieces = len(pieces)
        self.tasks = TaskGroup(self.timings.issued_at)
        # H2S: the checksum of each written page in piece order, and the slot it went to; published
        # to the L3File on DONE. (S2H: empty; its pages are checked against the file's record.)
        writing = direction is Direction.H2S
        self.checksums: npt.NDArray[np.uint32] = np.zeros(slots.size if writing else 0, np.uint32)
        self.checksum_slots: Pages = _slots_in_piece_order(pieces) if writing else slots[:0]
        self._mover = mover
        self._delay_polls = delay_polls

    def _probe(self) -> TransferStatus:
        self._mover.run_deferred()  # deterministic schedule: the I/O runs at this poll
        if not self.tasks.idle():
            return TransferStatus.PENDING
        self.tasks.reraise_bug()
        if self._delay_polls > 0:  # DELAY fault: the completion is observed late
            self._delay_polls -= 1
            return TransferStatus.PENDING
        self.timings.queue_wait_s, self.timings.service_s = self.tasks.timings()
        if self.tasks.errors:
            self.error = self.tasks.errors[0]
            self._mover._observed_failed()
            return TransferStatus.FAILED
        self._mover._observed_done(self)
        return TransferStatus.DONE

    def _quiesce(self, timeout_s: float | None) -> bool:
        self.tasks.stop()
        self._mover.run_deferred()  # earlier transfers' I/O runs; this one's is skipped
        return self.tasks.join(timeout_s)

    def _block(self, seconds: float) -> None:
        self.tasks.join(seconds)


class StorageMover:
    """Moves pages between the L2 pool (`l2_bytes`) and an `L3File` on `io_threads` threads.

    `l2_bytes`: uint8 CPU tensor `[capacity_pages, bytes_per_page]`, contiguous (pinned on
    CUDA machines) -- a byte view of the page-major L2 pool; starting at a multiple of
    `DIRECT_ALIGN` bytes when the L3 file is `direct` (pinned memory is page-aligned;
    `aligned_pages` allocates such on CPU), ConfigError otherwise. Page and slot arguments are
    int64 arrays. Invalid arguments raise `InvalidPages` (a `HiCacheError`) before anything is
    issued.
    """

    def __init__(
        self,
        l3: L3File,
        l2_bytes: torch.Tensor,
        *,
        io_threads: int = IO_THREADS,
        piece_bytes: int = PIECE_BYTES,
        faults: FaultInjector | None = None,
    ) -> None:
        _check_l2(l2_bytes, l3.bytes_per_page)
        if l3.direct and l2_bytes.data_ptr() % DIRECT_ALIGN:
            raise ConfigError(
                "l2_bytes",
                f"the L3 file is direct (O_DIRECT), which moves memory aligned to "
                f"{DIRECT_ALIGN} bytes; this L2 tensor starts at "
                f"{l2_bytes.data_ptr() % DIRECT_ALIGN} past such a boundary: allocate it "
                "with aligned_pages() (or pinned memory)",
            )
        if not isinstance(io_threads, int) or not 0 <= io_threads <= MAX_IO_THREADS:
            raise ConfigError(
                "io_threads",
                f"must be an integer in [0, {MAX_IO_THREADS}] (0: deterministic, "
                f"I/O on the polling thread), got {io_threads!r}",
            )
        if not isinstance(piece_bytes, int) or piece_bytes <= 0:
            raise ConfigError("piece_bytes", f"must be a positive integer, got {piece_bytes!r}")
        self.l3 = l3
        self.io_threads = io_threads
        self.piece_pages = max(1, piece_bytes // l3.bytes_per_page)  # pages per I/O call, max
        self.capacity_pages = int(l2_bytes.shape[0])
        self._l2 = l2_bytes  # keeps the memory alive while views of it are in flight
        self._l2_view = l2_bytes.numpy().data.cast("B")
        self._faults = faults
        self._deferred = DeferredExecutor() if io_threads == 0 else None
        self._pool = self._deferred or ThreadPoolExecutor(
            io_threads, thread_name_prefix="hicache-l3-io"
        )
        self._workers = max(1, io_threads)  # pool tasks per transfer
        self._groups: list[TaskGroup] = []  # live transfers' task groups, drained by close()
        self._lock = threading.Lock()
        self._counters = StorageCounters()
        self._closed = False

    # -- issuing ----------------------------------------------------------------------------

    def h2s(self, l2_pages: Pages, slots: Pages) -> StorageHandle:
        """Write L2 pages into L3 slots (l2_pages[i] -> slots[i]); slots must be distinct."""
        src, dst = self._mapping(l2_pages, slots, Direction.H2S)
        extents = coalesce(src, dst)
        pieces = self._pieces(Direction.H2S, extents)
        handle = self._new_handle(Direction.H2S, dst, src, len(extents), pieces)
        self.l3.invalidate(dst)  # unreadable until this write is observed DONE
        # Two lanes: writes serialise on the file, so one worker writes while the others
        # checksum the same (locked, unchanging) source pages beside it.
        checksum = functools.partial(self._checksum_piece, handle)
        handle.tasks.spread(self._pool, pieces, (self._write_piece, checksum), self._workers)
        return self._issued(handle)

    def s2h(self, slots: Pages, l2_pages: Pages) -> StorageHandle:
        """Read L3 slots into L2 pages (slots[i] -> l2_pages[i]); pages must be distinct and
        every slot must hold a written page."""
        dst, src = self._mapping(l2_pages, slots, Direction.S2H)
        unwritten = src[~self.l3.written(src)]
        if unwritten.size:
            raise InvalidPages(
                "s2h slots",
                f"{unwritten.tolist()} hold no written page (never written, or the "
                "last H2S into them failed or is not yet observed DONE); read published slots only",
            )
        extents = coalesce(src, dst)
        pieces = self._pieces(Direction.S2H, extents)
        handle = self._new_handle(Direction.S2H, src, dst, len(extents), pieces)
        handle.tasks.spread(self._pool, pieces, (self._read_piece,), self._workers)
        return self._issued(handle)

    def _mapping(self, l2_pages: Pages, slots: Pages, direction: Direction) -> tuple[Pages, Pages]:
        """Validated int64 copies (l2 pages, slots); the target side must be distinct."""
        if self._closed:
            raise StorageError(self.l3.path, "the mover is closed; make a new StorageMover")
        pages_ = np.array(l2_pages, dtype=np.int64).reshape(-1)
        slots_ = np.array(slots, dtype=np.int64).reshape(-1)
        if pages_.size != slots_.size:
            raise InvalidPages(str(direction), f"{pages_.size} L2 pages but {slots_.size} slots")
        if pages_.size and (int(pages_.min()) < 0 or int(pages_.max()) >= self.capacity_pages):
            raise InvalidPages(
                f"{direction} L2 pages",
                f"out of range [0, {self.capacity_pages}) in {pages_.tolist()}",
            )
        self.l3.check_slots(slots_, f"{direction} slots")
        target = slots_ if direction is Direction.H2S else pages_
        if np.unique(target).size != target.size:
            raise InvalidPages(
                f"{direction} {direction.target} targets",
                f"must be distinct, got {target.tolist()}",
            )
        self.l3.check_identity()  # once per batch: one stat call
        return pages_, slots_

    def _pieces(self, direction: Direction, extents: list[Extent]) -> list[_Piece]:
        """The extents cut into I/O pieces, each with its first page's index and its faults."""
        parts = split(extents, self.piece_pages)
        firsts = itertools.accumulate((p.count for p in parts), initial=0)
        plans = self._draw_faults(direction, parts)
        return [_Piece(p, first, plan) for p, first, plan in zip(parts, firsts, plans)]

    def _new_handle(
        self,
        direction: Direction,
        slots: Pages,
        pages_: Pages,
        extents: int,
        pieces: list[_Piece],
    ) -> StorageHandle:
        delay = 0
        if self._faults is not None and self._faults.fire(FaultSite.DELAY):
            delay = self._faults.delay_polls
        handle = StorageHandle(self, direction, slots, pages_, extents, pieces, delay)
        self._groups = [g for g in self._groups if not g.idle()]
        self._groups.append(handle.tasks)
        return handle

    def _issued(self, handle: StorageHandle) -> StorageHandle:
        with self._lock:
            self._counters.extents_issued += handle.extents
            self._counters.pieces_issued += handle.pieces
        handle.timings.enqueue_s = handle.tasks.seconds_since_issue()
        return handle

    def _draw_faults(self, direction: Direction, pieces: list[Extent]) -> list[_PieceFaults | None]:
        """Per piece, which faults it meets (drawn here, on the issuing thread)."""
        f = self._faults
        if f is None:
            return [None] * len(pieces)
        writing = direction is Direction.H2S
        short_site = FaultSite.SHORT_WRITE if writing else FaultSite.SHORT_READ
        plans: list[_PieceFaults | None] = []
        for ext in pieces:
            err = errno.EIO if f.fire(FaultSite.IO_EIO) else None
            if err is None and writing and f.fire(FaultSite.IO_ENOSPC):
                err = errno.ENOSPC
            shorts = 0
            while shorts <= MAX_SHORT_RESUMES and f.fire(short_site):
                shorts += 1
            slots = range(ext.dst_start, ext.dst_start + ext.count) if writing else range(0)
            corrupt = tuple(s for s in slots if f.fire(FaultSite.CORRUPT_SLOT))
            plans.append(_PieceFaults(err, shorts, corrupt))
        return plans

    # -- work on the I/O threads ------------------------------------------------------------

    def _pages_view(self, first_page: int, count: int) -> memoryview:
        bpp = self.l3.bytes_per_page
        return self._l2_view[first_page * bpp : (first_page + count) * bpp]

    def _write_piece(self, piece: _Piece) -> None:
        """L2 pages src_start.. -> slots dst_start..: pwrite until every byte is in."""
        ext = piece.ext
        view = self._pages_view(ext.src_start, ext.count)
        self._move_all(Direction.H2S, view, ext.dst_start, piece.faults)
        if piece.faults is not None:
            for slot in piece.faults.corrupt_slots:
                self.flip_byte(slot)

    def _checksum_piece(self, handle: StorageHandle, piece: _Piece) -> None:
        """Checksums of the piece's (locked, unchanging) source pages, by page index."""
        ext = piece.ext
        for i in range(ext.count):
            crc = self.l3.page_checksum(self._pages_view(ext.src_start + i, 1))
            handle.checksums[piece.first + i] = crc

    def _read_piece(self, piece: _Piece) -> None:
        """Slots src_start.. -> L2 pages dst_start..: preadv until every byte is in, then
        verify those pages here, while they are still in this core's cache."""
        ext = piece.ext
        view = self._pages_view(ext.dst_start, ext.count)
        try:
            self._move_all(Direction.S2H, view, ext.src_start, piece.faults)
        except TransferError as e:
            # The slots themselves failed (EOF of a truncated file, a medium error): name them,
            # so the controller drops their L3 copy instead of reading them again and again.
            slots = tuple(range(ext.src_start, ext.src_start + ext.count))
            raise UnreadableSlot(slots, self.l3.path, str(e)) from e
        self._verify(ext)

    def _verify(self, ext: Extent) -> None:
        """CorruptSlot for the first mismatching page; every page is checked (and counted)."""
        first_bad: CorruptSlot | None = None
        for i in range(ext.count):
            try:
                self.l3.verify(ext.src_start + i, self._pages_view(ext.dst_start + i, 1))
            except CorruptSlot as e:
                first_bad = first_bad or e
        if first_bad is not None:
            raise first_bad

    def _move_all(
        self, direction: Direction, view: memoryview, first_slot: int, plan: _PieceFaults | None
    ) -> None:
        """Move all of `view` to/from the file at `first_slot`'s offset, resuming short
        returns. TransferError (naming path, slots and errno) on failure."""
        offset, total = self.l3.offset(first_slot), len(view)
        done = calls = resumes = 0
        while done < total:
            part = view[done:]
            try:
                if plan is not None:
                    part = _apply_faults(plan, part, calls, total)
                calls += 1
                moved = self._syscall(direction, part, offset + done)
            except OSError as e:
                raise self._io_error(direction, first_slot, total, describe_os_error(e)) from e
            if moved == 0:  # no progress: for a read, the file ends before the slot does
                reading = direction is Direction.S2H
                why = "file ended early (truncated under us?)" if reading else "0 bytes written"
                raise self._io_error(direction, first_slot, total, f"{why} at byte {done}")
            done += moved
            if done < total:
                resumes += 1
                if resumes > MAX_SHORT_RESUMES:
                    why = f"still short after {MAX_SHORT_RESUMES} resumes (R54)"
                    raise self._io_error(direction, first_slot, total, why)
        if resumes:
            with self._lock:
                self._counters.short_io_resumed += resumes

    def _syscall(self, direction: Direction, part: memoryview, offset: int) -> int:
        fd = self.l3.io_fd  # O_DIRECT where the L3 file is direct
        if direction is Direction.H2S:
            return os.pwrite(fd, part, offset)
        return os.preadv(fd, [part], offset)

    def _io_error(
        self, direction: Direction, first_slot: int, nbytes: int, why: str
    ) -> TransferError:
        last = first_slot + nbytes // self.l3.bytes_per_page - 1
        call = "pwrite" if direction is Direction.H2S else "preadv"
        return TransferError(
            f"{direction}: {call} of slots {first_slot}..{last} ({nbytes} bytes) in L3 file "
            f"{self.l3.path} failed: {why}; the transfer failed, release its target pages"
        )

    def flip_byte(self, slot: int) -> None:
        """CORRUPT_SLOT fault: invert the slot's middle byte in the file (not in L2). A slot
        the file no longer reaches (cut below it meanwhile) has no byte to flip: nothing is
        done (its read fails as a short read anyway)."""
        fd, at = self.l3.fd, self.l3.offset(slot) + self.l3.bytes_per_page // 2
        try:
            old = os.pread(fd, 1, at)
            if old:
                os.pwrite(fd, bytes([old[0] ^ 0xFF]), at)
        except OSError as e:
            why = describe_os_error(e)
            raise self._io_error(Direction.H2S, slot, self.l3.bytes_per_page, why) from e

    # -- completion, metrics, lifetime --------------------------------------------------------

    def _observed_done(self, handle: StorageHandle) -> None:
        """On the observing thread: publish H2S checksums; count the transfer."""
        if handle.direction is Direction.H2S:
            self.l3.record(handle.checksum_slots, handle.checksums)
        with self._lock:
            if handle.direction is Direction.H2S:
                self._counters.h2s_bytes += handle.nbytes
                self._counters.h2s_ops += 1
            else:
                self._counters.s2h_bytes += handle.nbytes
                self._counters.s2h_ops += 1

    def _observed_failed(self) -> None:
        with self._lock:
            self._counters.failed_ops += 1

    @property
    def counters(self) -> StorageCounters:
        """A consistent copy of the counters."""
        with self._lock:
            return replace(self._counters, corrupt_reads=self.l3.corrupt_reads)

    def close(self) -> None:
        """Let every issued transfer finish its I/O, then stop the threads. Idempotent; does
        not close the L3File."""
        if self._closed:
            return
        self._closed = True
        self.run_deferred()
        for group in self._groups:
            group.join(None)
        self._pool.shutdown(wait=True)

    def run_deferred(self) -> None:
        """Deterministic schedule (`io_threads=0`): run the I/O issued so far, in issue
        order, on this thread. No effect with threads."""
        if self._deferred is not None:
            self._deferred.run_queued()

    def __enter__(self) -> StorageMover:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _slots_in_piece_order(pieces: list[_Piece]) -> Pages:
    """The slot of each page, pieces in order: piece j's page i (index first_j + i) goes to
    slot dst_start_j + i. One numpy expression, no loop over pages."""
    counts = np.fromiter((p.ext.count for p in pieces), np.int64, len(pieces))
    starts = np.fromiter((p.ext.dst_start - p.first for p in pieces), np.int64, len(pieces))
    return np.repeat(starts, counts) + np.arange(int(counts.sum()), dtype=np.int64)


def _apply_faults(plan: _PieceFaults, part: memoryview, calls: int, total: int) -> memoryview:
    """Injected EIO/ENOSPC on the first call. A short call moves a sliver of the piece
    (1/(4 * (MAX_SHORT_RESUMES + 1)) of it, at least 1 byte), so one short call is resumed
    but short calls that persist past the bound cannot finish the extent by accident."""
    if calls == 0 and plan.errno is not None:
        raise OSError(plan.errno, os.strerror(plan.errno))
    if calls < plan.short_calls and len(part) > 1:
        return part[: min(len(part) - 1, max(1, total // (4 * (MAX_SHORT_RESUMES + 1))))]
    return part


def aligned_pages(pages: int, bytes_per_page: int) -> torch.Tensor:
    """A zeroed uint8 CPU tensor `[pages, bytes_per_page]` whose memory starts at a multiple
    of `DIRECT_ALIGN` bytes: an L2 pool a direct L3 file can read into and write from."""
    nbytes = pages * bytes_per_page
    raw = torch.zeros(nbytes + DIRECT_ALIGN, dtype=torch.uint8)
    skip = -raw.data_ptr() % DIRECT_ALIGN
    return raw[skip : skip + nbytes].view(pages, bytes_per_page)


def _check_l2(l2_bytes: torch.Tensor, bytes_per_page: int) -> None:
    got = f"got {l2_bytes.dtype} {tuple(l2_bytes.shape)} on {l2_bytes.device}"
    if l2_bytes.device.type != "cpu" or l2_bytes.dtype != torch.uint8 or l2_bytes.dim() != 2:
        raise ConfigError("l2_bytes", f"must be a 2-D uint8 CPU tensor, {got}")
    if int(l2_bytes.shape[1]) != bytes_per_page or not l2_bytes.is_contiguous():
        raise ConfigError(
            "l2_bytes", f"must be contiguous [pages, {bytes_per_page} (L3 bytes_per_page)], {got}"
        )
