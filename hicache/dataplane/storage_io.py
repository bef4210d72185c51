"""H2S (L2 -> L3) and S2H (L3 -> L2): file I/O between the L2 pool and the slot file.

    h2s(l2_pages, slots)   coalesce -> one pwrite per extent     + crc32 of each source page
    s2h(slots, l2_pages)   coalesce -> one preadv per extent     -> crc32 check of each page

Bytes go straight between the L2 tensor's memory and the file: every extent's buffer is a
slice of one `memoryview` over the tensor (no intermediate copy, no serialisation). Extents
and checksum work run on one bounded `ThreadPoolExecutor` of `io_threads` threads (both
syscalls and `zlib.crc32` release the GIL). A short return is resumed from where it stopped,
at most `MAX_SHORT_RESUMES` times per extent, never accepted (bug class B14); Linux alone
caps one call at 2 GiB - 4 KiB, so a larger extent always needs a resume.

Metadata order (DESIGN.md §7, completion precedes publication): an H2S forgets its target
slots' checksums when issued and records them only when its completion is observed DONE; a
failed or cancelled H2S leaves them unreadable. An S2H is DONE only after every page it read
matched its slot's checksum; a mismatch fails it with `CorruptSlot` (a miss, never served).

Faults (`faults.py`) are drawn on the issuing thread, so a seeded injector replays exactly;
with `faults=None` no fault code runs at all.
"""

from __future__ import annotations

import errno
import math
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import torch

from hicache.dataplane.extents import Extent, coalesce
from hicache.dataplane.faults import FaultInjector, FaultSite
from hicache.dataplane.handles import TransferHandle, TransferStatus
from hicache.dataplane.storage import L3File, describe_os_error, page_checksum
from hicache.errors import ConfigError, CorruptSlot, HiCacheError, StorageError, TransferError
from hicache.invariants.snapshot import Pages
from hicache.tiers import Direction

MAX_SHORT_RESUMES = 64  # per extent; each resume must move at least one byte
MAX_IO_THREADS = 64


@dataclass
class StorageCounters:
    """Mover metrics. Bytes and ops count transfers observed DONE."""

    h2s_bytes: int = 0
    h2s_ops: int = 0
    s2h_bytes: int = 0
    s2h_ops: int = 0
    failed_ops: int = 0  # observed FAILED (I/O error, corrupt slot, injected failure)
    extents_issued: int = 0  # one per pwrite/preadv extent handed to the pool
    short_io_resumed: int = 0  # short returns that were resumed
    corrupt_reads: int = 0  # pages that failed their slot's checksum (the L3File's count)


class _ExtentFaults(NamedTuple):
    """The faults one extent will meet, drawn at issue."""

    errno: int | None  # the extent's first call fails with this errno
    short_calls: int  # this many leading calls return short
    corrupt_slots: tuple[int, ...]  # H2S: flip a byte in these slots after the write


class TaskGroup:
    """The pool tasks of one transfer, follow-ups its own tasks submit included.

    `idle()` is true once no task of the transfer runs or waits, i.e. no thread touches its
    pages any more. A task that raises a `HiCacheError` records it and stops the tasks not yet
    started (the transfer has failed; their I/O would be wasted). Any other exception is a
    bug: it stays in its future and `reraise_bug()` raises it on the observing thread.
    """

    def __init__(self, issued_at: float) -> None:
        self.errors: list[HiCacheError] = []
        self._cond = threading.Condition()
        self._outstanding = 0
        self._futures: list[Future[None]] = []
        self._stop = False
        self._issued_at = issued_at
        self._first_start: float | None = None
        self._last_end: float | None = None

    def submit(self, pool: ThreadPoolExecutor, fn: Callable[..., None], *args: object) -> None:
        with self._cond:  # counted before it can run, so the group is never idle too early
            self._outstanding += 1
        try:
            future = pool.submit(self._run, fn, *args)
        except RuntimeError:  # the pool is shut down: this task will never run
            with self._cond:
                self._outstanding -= 1
                self._cond.notify_all()
            raise
        with self._cond:
            self._futures.append(future)

    def _run(self, fn: Callable[..., None], *args: object) -> None:
        start = time.perf_counter()
        try:
            if not self._stop:
                fn(*args)
        except HiCacheError as e:
            with self._cond:
                self.errors.append(e)
                self._stop = True
        finally:
            end = time.perf_counter()
            with self._cond:
                first, last = self._first_start, self._last_end
                self._first_start = start if first is None else min(first, start)
                self._last_end = end if last is None else max(last, end)
                self._outstanding -= 1
                self._cond.notify_all()

    def idle(self) -> bool:
        with self._cond:
            return self._outstanding == 0

    def join(self, timeout_s: float | None) -> bool:
        """Block until idle or `timeout_s` passes (None: no limit). Returns idle()."""
        with self._cond:
            return self._cond.wait_for(lambda: self._outstanding == 0, timeout_s)

    def stop_and_join(self) -> None:
        """Skip the tasks not yet started, wait for the running ones."""
        with self._cond:
            self._stop = True
        self.join(None)

    def reraise_bug(self) -> None:
        """Raise the first non-HiCacheError exception a task died of (a bug, not a fault)."""
        with self._cond:
            futures = list(self._futures)
        for future in futures:
            future.result()

    def timings(self) -> tuple[float, float]:
        """(queue_wait_s, service_s): issue -> first task start -> last task end."""
        if self._first_start is None or self._last_end is None:
            return 0.0, 0.0
        return self._first_start - self._issued_at, self._last_end - self._first_start

    def seconds_since_issue(self) -> float:
        return time.perf_counter() - self._issued_at


class StorageHandle(TransferHandle):
    """One H2S or S2H transfer. DONE means every byte is in place (S2H: and verified)."""

    def __init__(
        self, mover: StorageMover, direction: Direction, slots: Pages, l2_pages: Pages,
        extents: list[Extent], delay_polls: int,
    ) -> None:
        super().__init__(direction, int(slots.size) * mover.l3.bytes_per_page)
        self.slots = slots
        self.l2_pages = l2_pages
        self.extents = len(extents)
        self.tasks = TaskGroup(self.timings.issued_at)
        # H2S: crc32 of each source page, by position; published to the L3File on DONE.
        writing = direction is Direction.H2S
        self.checksums: npt.NDArray[np.uint32] = np.zeros(slots.size if writing else 0, np.uint32)
        self._mover = mover
        self._delay_polls = delay_polls

    def _probe(self) -> TransferStatus:
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

    def _quiesce(self) -> None:
        self.tasks.stop_and_join()

    def _block(self, seconds: float) -> None:
        self.tasks.join(seconds)


class StorageMover:
    """Moves pages between the L2 pool (`l2_bytes`) and an `L3File` on `io_threads` threads.

    `l2_bytes`: uint8 CPU tensor `[capacity_pages, bytes_per_page]`, contiguous (pinned on
    CUDA machines) -- a byte view of the page-major L2 pool. Page and slot arguments are
    int64 arrays. Invalid arguments raise `ValueError` before anything is issued.
    """

    def __init__(
        self, l3: L3File, l2_bytes: torch.Tensor, *, io_threads: int = 4,
        faults: FaultInjector | None = None,
    ) -> None:
        _check_l2(l2_bytes, l3.bytes_per_page)
        if not isinstance(io_threads, int) or not 1 <= io_threads <= MAX_IO_THREADS:
            raise ConfigError(
                "io_threads", f"must be an integer in [1, {MAX_IO_THREADS}], got {io_threads!r}"
            )
        self.l3 = l3
        self.io_threads = io_threads
        self.capacity_pages = int(l2_bytes.shape[0])
        self._l2 = l2_bytes  # keeps the memory alive while views of it are in flight
        self._l2_view = l2_bytes.numpy().data.cast("B")
        self._faults = faults
        self._pool = ThreadPoolExecutor(io_threads, thread_name_prefix="hicache-l3-io")
        self._groups: list[TaskGroup] = []  # live transfers' task groups, drained by close()
        self._lock = threading.Lock()
        self._counters = StorageCounters()
        self._closed = False

    # -- issuing ----------------------------------------------------------------------------

    def h2s(self, l2_pages: Pages, slots: Pages) -> StorageHandle:
        """Write L2 pages into L3 slots (l2_pages[i] -> slots[i]); slots must be distinct."""
        src, dst = self._mapping(l2_pages, slots, Direction.H2S)
        extents = coalesce(src, dst)
        handle = self._new_handle(Direction.H2S, dst, src, extents)
        self.l3.invalidate(dst)  # unreadable until this write is observed DONE
        for ext, plan in zip(extents, self._draw_faults(Direction.H2S, extents)):
            handle.tasks.submit(self._pool, self._write_extent, ext, plan)
        # Checksums read the (locked, unchanging) source pages while the writes run; 2 chunks
        # per thread so that a thread freed by a short write picks up the remaining work.
        chunks = max(1, min(src.size, 2 * self.io_threads))
        for positions in np.array_split(np.arange(src.size), chunks):
            handle.tasks.submit(self._pool, self._checksum_sources, handle, positions)
        return self._issued(handle, extents)

    def s2h(self, slots: Pages, l2_pages: Pages) -> StorageHandle:
        """Read L3 slots into L2 pages (slots[i] -> l2_pages[i]); pages must be distinct and
        every slot must hold a written page."""
        dst, src = self._mapping(l2_pages, slots, Direction.S2H)
        unwritten = src[~self.l3.written(src)]
        if unwritten.size:
            raise ValueError(
                f"s2h: slots {unwritten.tolist()} hold no written page (never written, or the "
                "last H2S into them failed or is not yet observed DONE); read published slots only"
            )
        extents = coalesce(src, dst)
        handle = self._new_handle(Direction.S2H, src, dst, extents)
        for ext, plan in zip(extents, self._draw_faults(Direction.S2H, extents)):
            handle.tasks.submit(self._pool, self._read_extent, handle, ext, plan)
        return self._issued(handle, extents)

    def _mapping(
        self, l2_pages: Pages, slots: Pages, direction: Direction
    ) -> tuple[Pages, Pages]:
        """Validated int64 copies (l2 pages, slots); the target side must be distinct."""
        if self._closed:
            raise StorageError(self.l3.path, "the mover is closed; make a new StorageMover")
        pages_ = np.array(l2_pages, dtype=np.int64).reshape(-1)
        slots_ = np.array(slots, dtype=np.int64).reshape(-1)
        if pages_.size != slots_.size:
            raise ValueError(f"{direction}: {pages_.size} L2 pages but {slots_.size} slots")
        if pages_.size and (int(pages_.min()) < 0 or int(pages_.max()) >= self.capacity_pages):
            raise ValueError(
                f"{direction}: L2 page out of range [0, {self.capacity_pages}) in {pages_.tolist()}"
            )
        self.l3.check_slots(slots_, f"{direction} slots")
        target = slots_ if direction is Direction.H2S else pages_
        if np.unique(target).size != target.size:
            raise ValueError(
                f"{direction}: {direction.target} targets must be distinct, got {target.tolist()}"
            )
        self.l3.check_identity()  # once per batch: one stat call
        return pages_, slots_

    def _new_handle(
        self, direction: Direction, slots: Pages, pages_: Pages, extents: list[Extent]
    ) -> StorageHandle:
        delay = 0
        if self._faults is not None and self._faults.fire(FaultSite.DELAY):
            delay = self._faults.delay_polls
        handle = StorageHandle(self, direction, slots, pages_, extents, delay)
        self._groups = [g for g in self._groups if not g.idle()]
        self._groups.append(handle.tasks)
        return handle

    def _issued(self, handle: StorageHandle, extents: list[Extent]) -> StorageHandle:
        with self._lock:
            self._counters.extents_issued += len(extents)
        handle.timings.enqueue_s = handle.tasks.seconds_since_issue()
        return handle

    def _draw_faults(
        self, direction: Direction, extents: list[Extent]
    ) -> list[_ExtentFaults | None]:
        """Per extent, which faults it meets (drawn here, on the issuing thread)."""
        f = self._faults
        if f is None:
            return [None] * len(extents)
        writing = direction is Direction.H2S
        short_site = FaultSite.SHORT_WRITE if writing else FaultSite.SHORT_READ
        plans: list[_ExtentFaults | None] = []
        for ext in extents:
            err = errno.EIO if f.fire(FaultSite.IO_EIO) else None
            if err is None and writing and f.fire(FaultSite.IO_ENOSPC):
                err = errno.ENOSPC
            shorts = 0
            while shorts <= MAX_SHORT_RESUMES and f.fire(short_site):
                shorts += 1
            slots = range(ext.dst_start, ext.dst_start + ext.count) if writing else range(0)
            corrupt = tuple(s for s in slots if f.fire(FaultSite.CORRUPT_SLOT))
            plans.append(_ExtentFaults(err, shorts, corrupt))
        return plans

    # -- work on the I/O threads ------------------------------------------------------------

    def _pages_view(self, first_page: int, count: int) -> memoryview:
        bpp = self.l3.bytes_per_page
        return self._l2_view[first_page * bpp:(first_page + count) * bpp]

    def _write_extent(self, ext: Extent, plan: _ExtentFaults | None) -> None:
        """L2 pages src_start.. -> slots dst_start..: pwrite until every byte is in."""
        view = self._pages_view(ext.src_start, ext.count)
        self._move_all(Direction.H2S, view, ext.dst_start, plan)
        if plan is not None:
            for slot in plan.corrupt_slots:
                self._flip_byte(slot)

    def _checksum_sources(self, handle: StorageHandle, positions: npt.NDArray[np.int64]) -> None:
        for i in positions.tolist():
            handle.checksums[i] = page_checksum(self._pages_view(int(handle.l2_pages[i]), 1))

    def _read_extent(
        self, handle: StorageHandle, ext: Extent, plan: _ExtentFaults | None
    ) -> None:
        """Slots src_start.. -> L2 pages dst_start..: preadv until every byte is in, then
        verify; a long extent's checks are spread over the pool (crc32 is the slow part)."""
        view = self._pages_view(ext.dst_start, ext.count)
        self._move_all(Direction.S2H, view, ext.src_start, plan)
        per_task = max(1, math.ceil(ext.count / self.io_threads))
        for first in range(per_task, ext.count, per_task):
            n = min(per_task, ext.count - first)
            handle.tasks.submit(
                self._pool, self._verify, Extent(ext.src_start + first, ext.dst_start + first, n)
            )
        self._verify(Extent(ext.src_start, ext.dst_start, min(per_task, ext.count)))

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
        self, direction: Direction, view: memoryview, first_slot: int, plan: _ExtentFaults | None
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
                    why = f"still short after {MAX_SHORT_RESUMES} resumes"
                    raise self._io_error(direction, first_slot, total, why)
        if resumes:
            with self._lock:
                self._counters.short_io_resumed += resumes

    def _syscall(self, direction: Direction, part: memoryview, offset: int) -> int:
        fd = self.l3.fd
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

    def _flip_byte(self, slot: int) -> None:
        """CORRUPT_SLOT fault: invert the slot's middle byte in the file (not in L2)."""
        fd, at = self.l3.fd, self.l3.offset(slot) + self.l3.bytes_per_page // 2
        try:
            old = os.pread(fd, 1, at)
            os.pwrite(fd, bytes([old[0] ^ 0xFF]), at)
        except OSError as e:
            why = describe_os_error(e)
            raise self._io_error(Direction.H2S, slot, self.l3.bytes_per_page, why) from e

    # -- completion, metrics, lifetime --------------------------------------------------------

    def _observed_done(self, handle: StorageHandle) -> None:
        """On the observing thread: publish H2S checksums; count the transfer."""
        if handle.direction is Direction.H2S:
            self.l3.record(handle.slots, handle.checksums)
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
        for group in self._groups:
            group.join(None)
        self._pool.shutdown(wait=True)

    def __enter__(self) -> StorageMover:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _apply_faults(plan: _ExtentFaults, part: memoryview, calls: int, total: int) -> memoryview:
    """Injected EIO/ENOSPC on the first call. A short call moves a sliver of the extent
    (1/(4 * (MAX_SHORT_RESUMES + 1)) of it, at least 1 byte), so one short call is resumed
    but short calls that persist past the bound cannot finish the extent by accident."""
    if calls == 0 and plan.errno is not None:
        raise OSError(plan.errno, os.strerror(plan.errno))
    if calls < plan.short_calls and len(part) > 1:
        return part[: min(len(part) - 1, max(1, total // (4 * (MAX_SHORT_RESUMES + 1))))]
    return part


def _check_l2(l2_bytes: torch.Tensor, bytes_per_page: int) -> None:
    got = f"got {l2_bytes.dtype} {tuple(l2_bytes.shape)} on {l2_bytes.device}"
    if l2_bytes.device.type != "cpu" or l2_bytes.dtype != torch.uint8 or l2_bytes.dim() != 2:
        raise ConfigError("l2_bytes", f"must be a 2-D uint8 CPU tensor, {got}")
    if int(l2_bytes.shape[1]) != bytes_per_page or not l2_bytes.is_contiguous():
        raise ConfigError(
            "l2_bytes", f"must be contiguous [pages, {bytes_per_page} (L3 bytes_per_page)], {got}"
        )
