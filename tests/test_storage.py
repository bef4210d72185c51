"""The L3 slot file and the H2S/S2H mover: byte-exact round trips, faults, file lifetime."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

import torch
from hypothesis import given
from hypothesis import strategies as st

from hicache.bench.storage import main as bench_main
from hicache.core.pages import pages
from hicache.dataplane.checksums import default_algorithm
from hicache.dataplane.faults import FaultInjector, FaultSite
from hicache.dataplane.handles import TransferStatus
from hicache.dataplane.l3format import HEADER_BYTES
from hicache.dataplane.slotdigest import read_servable
from hicache.dataplane.storage import DIRECT_ALIGN, L3File
from hicache.dataplane.storage_io import (
    MAX_SHORT_RESUMES,
    StorageHandle,
    StorageMover,
    aligned_pages,
)
from hicache.dataplane.taskgroup import TaskGroup
from hicache.errors import ConfigError, CorruptSlot, InvalidPages, StorageError, TransferError

BPP = 3080  # bytes per page: small, and not a power of two, so offset slips show
L2_PAGES = 24
SLOTS = 32


def random_l2(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (L2_PAGES, BPP), dtype=torch.uint8, generator=g)


@pytest.fixture
def l3() -> Iterator[L3File]:
    with L3File(None, SLOTS, BPP) as f:
        yield f


def done(handle: StorageHandle) -> StorageHandle:
    assert handle.wait(timeout_s=10) is TransferStatus.DONE, handle.error
    return handle


def round_trip(
    mover: StorageMover,
    l2: torch.Tensor,
    src: list[int],
    slots: list[int],
    back: list[int],
    dst: list[int],
) -> None:
    """H2S src -> slots; poison dst; S2H back (a subset of slots) -> dst; compare bytes."""
    expected = l2.clone()
    done(mover.h2s(pages(src), pages(slots)))
    l2[pages(dst)] = 0xA5
    done(mover.s2h(pages(back), pages(dst)))
    page_of_slot = dict(zip(slots, src))
    for d, s in zip(dst, back):
        assert torch.equal(l2[d], expected[page_of_slot[s]]), (d, s)
    # Each slot's recorded checksum is its own page's (pieces index checksums by position).
    for s, p in page_of_slot.items():
        assert mover.l3.checksum(s) == mover.l3.page_checksum(expected[p].numpy().data), (s, p)


# -- round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["consecutive", "fragmented", "mixed"])
def test_round_trip_is_byte_exact(l3: L3File, case: str) -> None:
    l2 = random_l2()
    src, slots, dst = {
        "consecutive": (list(range(0, 8)), list(range(4, 12)), list(range(12, 20))),
        "fragmented": ([9, 2, 17, 5, 11], [30, 3, 12, 0, 21], [1, 23, 7, 14, 19]),
        "mixed": ([0, 1, 2, 10, 11, 6], [5, 6, 7, 20, 21, 9], [15, 16, 17, 3, 4, 8]),
    }[case]
    with StorageMover(l3, l2, io_threads=3) as mover:
        round_trip(mover, l2, src, slots, slots, dst)
        assert mover.counters.h2s_ops == 1 and mover.counters.s2h_ops == 1
        assert mover.counters.h2s_bytes == len(src) * BPP == mover.counters.s2h_bytes


@st.composite
def transfers(draw: st.DrawFn) -> tuple[list[int], list[int], list[int], list[int]]:
    n = draw(st.integers(1, 12))
    src = draw(st.lists(st.integers(0, L2_PAGES - 1), min_size=n, max_size=n))
    slots = draw(st.lists(st.integers(0, SLOTS - 1), min_size=n, max_size=n, unique=True))
    back = draw(st.lists(st.sampled_from(slots), min_size=1, max_size=n))
    m = len(back)
    dst = draw(st.lists(st.integers(0, L2_PAGES - 1), min_size=m, max_size=m, unique=True))
    return src, slots, back, dst


@given(transfers(), st.integers(0, 4), st.booleans(), st.integers(1, 4 * BPP))
def test_round_trip_property(
    t: tuple[list[int], list[int], list[int], list[int]],
    threads: int,
    short_io: bool,
    piece_bytes: int,
) -> None:
    """Random page/slot sets, reads in any order (repeats allowed), short I/O at random, long
    extents cut into pieces of 1 to 4 pages; 0 threads is the deterministic schedule."""
    src, slots, back, dst = t
    faults = None
    if short_io:
        rates = {FaultSite.SHORT_READ: 0.5, FaultSite.SHORT_WRITE: 0.5}
        faults = FaultInjector(seed=len(src), rates=rates)
    l2 = random_l2(len(src))
    with L3File(None, SLOTS, BPP) as l3:
        with StorageMover(
            l3, l2, io_threads=threads, piece_bytes=piece_bytes, faults=faults
        ) as mover:
            round_trip(mover, l2, src, slots, back, dst)


def test_extents_follow_coalescing(l3: L3File) -> None:
    with StorageMover(l3, random_l2()) as mover:
        assert done(mover.h2s(pages(range(10)), pages(range(10, 20)))).extents == 1
        assert done(mover.s2h(pages([10, 11, 12, 15]), pages([3, 4, 5, 6]))).extents == 2
        assert mover.counters.extents_issued == 3


@pytest.mark.parametrize("piece_bytes,pieces", [(3 * BPP, 4), (3 * BPP + BPP - 1, 4), (1, 10)])
def test_long_extents_are_cut_into_pieces(l3: L3File, piece_bytes: int, pieces: int) -> None:
    l2 = random_l2()
    with StorageMover(l3, l2, piece_bytes=piece_bytes) as mover:
        h = done(mover.h2s(pages(range(10)), pages(range(10, 20))))
        assert (h.extents, h.pieces) == (1, pieces)
        round_trip(
            mover,
            l2,
            list(range(10)),
            list(range(10, 20)),
            list(range(10, 20)),
            list(range(12, 22)),
        )
        assert mover.counters.extents_issued == 3 and mover.counters.pieces_issued == 3 * pieces


def test_piece_bytes_must_be_positive(l3: L3File) -> None:
    with pytest.raises(ConfigError, match="piece_bytes"):
        StorageMover(l3, random_l2(), piece_bytes=0)


def test_empty_transfer_is_done(l3: L3File) -> None:
    with StorageMover(l3, random_l2()) as mover:
        h = done(mover.h2s(pages([]), pages([])))
        assert h.nbytes == 0 and h.extents == 0 and h.pieces == 0


# -- the task group's lanes ---------------------------------------------------------------------


def run_spread(
    items: list[int], lanes: int, workers: int, fail_at: tuple[int, int] | None = None
) -> tuple[TaskGroup, list[tuple[int, int]]]:
    """Spread `items` over `lanes` recording lanes; (lane, item) == fail_at raises."""
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def lane(k: int) -> Callable[[int], None]:
        def work(item: int) -> None:
            with lock:
                seen.append((k, item))
            if (k, item) == fail_at:
                raise TransferError(f"injected at lane {k} item {item}")

        return work

    group = TaskGroup(0.0)
    with ThreadPoolExecutor(workers) as pool:
        group.spread(pool, items, [lane(k) for k in range(lanes)], workers)
        assert group.join(10)
    return group, seen


@pytest.mark.parametrize("lanes,workers", [(1, 1), (1, 3), (2, 1), (2, 2), (2, 5), (3, 4)])
def test_spread_runs_every_lane_on_every_item_once(lanes: int, workers: int) -> None:
    group, seen = run_spread(list(range(40)), lanes, workers)
    assert sorted(seen) == [(k, i) for k in range(lanes) for i in range(40)]
    assert group.errors == []


def test_spread_with_one_worker_does_lane_after_lane_and_stops_at_an_error() -> None:
    _, seen = run_spread([0, 1, 2], lanes=2, workers=1)
    assert seen == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    group, seen = run_spread([0, 1, 2], lanes=2, workers=1, fail_at=(0, 1))
    assert seen == [(0, 0), (0, 1)]  # the rest is skipped: the transfer has failed
    assert [str(e) for e in group.errors] == ["injected at lane 0 item 1"]


def test_spread_keeps_a_bug_for_the_observer() -> None:
    group = TaskGroup(0.0)

    def buggy(item: int) -> None:
        raise KeyError(item)

    with ThreadPoolExecutor(2) as pool:
        group.spread(pool, [7], [buggy], 2)
        assert group.join(10) and group.errors == []
        with pytest.raises(KeyError):
            group.reraise_bug()


# -- faults --------------------------------------------------------------------------------


def write_reference_slots(mover: StorageMover) -> None:
    done(mover.h2s(pages([0, 1, 2]), pages([0, 1, 2])))


@dataclass
class Rig:
    """A mover with an injector, whose slots 0..2 already hold L2 pages 0..2."""

    l3: L3File
    l2: torch.Tensor
    expected: torch.Tensor  # the L2 bytes as written
    faults: FaultInjector
    mover: StorageMover

    def assert_reference_slots_intact(self) -> None:
        self.l2[pages([20, 21, 22])] = 0
        done(self.mover.s2h(pages([0, 1, 2]), pages([20, 21, 22])))
        assert torch.equal(self.l2[20:23], self.expected[0:3])


@pytest.fixture
def rig(l3: L3File) -> Iterator[Rig]:
    l2 = random_l2()
    faults = FaultInjector()
    with StorageMover(l3, l2, faults=faults) as mover:
        write_reference_slots(mover)
        yield Rig(l3, l2, l2.clone(), faults, mover)


@pytest.mark.parametrize("site,name", [(FaultSite.IO_EIO, "EIO"), (FaultSite.IO_ENOSPC, "ENOSPC")])
def test_write_error_fails_the_handle_and_nothing_else(
    rig: Rig, site: FaultSite, name: str
) -> None:
    rig.faults.once(site)
    h = rig.mover.h2s(pages([5, 6, 7]), pages([10, 11, 12]))
    assert h.wait(timeout_s=10) is TransferStatus.FAILED
    assert isinstance(h.error, TransferError)
    assert rig.l3.path in str(h.error) and name in str(h.error) and "pwrite" in str(h.error)
    # The failed slots are not readable; the others are untouched.
    assert not rig.l3.written(pages([10, 11, 12])).any()
    with pytest.raises(ValueError, match="hold no written page"):
        rig.mover.s2h(pages([10]), pages([20]))
    rig.assert_reference_slots_intact()
    assert rig.mover.counters.failed_ops == 1 and rig.mover.counters.h2s_ops == 1


@pytest.mark.parametrize("direction", ["h2s", "s2h"])
def test_an_error_in_one_piece_fails_the_whole_transfer(l3: L3File, direction: str) -> None:
    l2 = random_l2()
    faults = FaultInjector()
    with StorageMover(l3, l2, io_threads=3, piece_bytes=BPP, faults=faults) as mover:
        done(mover.h2s(pages(range(6)), pages(range(10, 16))))
        faults.rates = {FaultSite.IO_EIO: 0.3}  # seeded: some pieces of six fail, not all
        if direction == "h2s":
            h = mover.h2s(pages(range(6)), pages(range(20, 26)))
        else:
            h = mover.s2h(pages(range(10, 16)), pages(range(6, 12)))
        assert h.wait(timeout_s=10) is TransferStatus.FAILED and h.tasks.idle()
        assert 0 < faults.fired[FaultSite.IO_EIO] < 6 and h.pieces == 6
        assert isinstance(h.error, TransferError) and "EIO" in str(h.error)
        assert mover.counters.failed_ops == 1
        # A failed write publishes no slot, not even the pieces that made it to the file.
        assert not l3.written(pages(range(20, 26))).any()


def test_read_error_fails_the_handle_and_a_retry_succeeds(rig: Rig) -> None:
    rig.faults.once(FaultSite.IO_EIO)
    h = rig.mover.s2h(pages([0, 1, 2]), pages([20, 21, 22]))
    assert h.wait(timeout_s=10) is TransferStatus.FAILED
    assert isinstance(h.error, TransferError)
    assert rig.l3.path in str(h.error) and "EIO" in str(h.error) and "preadv" in str(h.error)
    rig.assert_reference_slots_intact()


@pytest.mark.parametrize("site", [FaultSite.SHORT_WRITE, FaultSite.SHORT_READ])
def test_short_io_is_resumed(l3: L3File, site: FaultSite) -> None:
    l2 = random_l2()
    faults = FaultInjector()
    with StorageMover(l3, l2, faults=faults) as mover:
        faults.once(site, times=3)
        round_trip(mover, l2, [4, 5, 6, 7], [8, 9, 10, 11], [8, 9, 10, 11], [16, 17, 18, 19])
        assert faults.fired[site] == 3
        assert mover.counters.short_io_resumed == 3


@pytest.mark.parametrize("site", [FaultSite.SHORT_WRITE, FaultSite.SHORT_READ])
def test_persistent_short_io_fails(l3: L3File, site: FaultSite) -> None:
    l2 = random_l2()
    faults = FaultInjector(rates={site: 1.0})
    with StorageMover(l3, l2, faults=faults) as mover:
        if site is FaultSite.SHORT_READ:
            faults.rates = {}
            write_reference_slots(mover)
            faults.rates = {site: 1.0}
            h = mover.s2h(pages([0, 1, 2]), pages([20, 21, 22]))
        else:
            h = mover.h2s(pages([0, 1, 2]), pages([0, 1, 2]))
        assert h.wait(timeout_s=10) is TransferStatus.FAILED
        assert f"still short after {MAX_SHORT_RESUMES} resumes" in str(h.error)
        assert l3.path in str(h.error)


def test_corrupt_slot_fault_is_caught_and_counted(rig: Rig) -> None:
    rig.faults.once(FaultSite.CORRUPT_SLOT)  # the first slot written next: slot 10
    done(rig.mover.h2s(pages([5, 6, 7]), pages([10, 11, 12])))
    h = rig.mover.s2h(pages([10, 11, 12]), pages([20, 21, 22]))
    assert h.wait(timeout_s=10) is TransferStatus.FAILED
    assert isinstance(h.error, CorruptSlot)
    assert h.error.slot == 10 and h.error.path == rig.l3.path
    assert rig.mover.counters.corrupt_reads == 1 == rig.l3.corrupt_reads
    # Only slot 10 is bad: its neighbours and the older slots still read back exactly.
    rig.l2[pages([20, 21])] = 0
    done(rig.mover.s2h(pages([11, 12]), pages([20, 21])))
    assert torch.equal(rig.l2[20:22], rig.expected[6:8])
    rig.assert_reference_slots_intact()


def test_corrupting_a_slot_the_file_does_not_reach_changes_nothing(l3: L3File) -> None:
    """CORRUPT_SLOT flips a byte of a slot just written; if the file was cut below that slot
    meanwhile (or the write stopped short), there is no byte to flip: the fault does nothing
    (the read of that slot fails anyway) rather than raising an IndexError on an I/O thread."""
    l2 = random_l2()
    with StorageMover(l3, l2) as mover:
        done(mover.h2s(pages([3]), pages([20])))
        os.ftruncate(l3.fd, l3.offset(20) + 10)
        size = os.fstat(l3.fd).st_size
        mover.flip_byte(20)
        assert os.fstat(l3.fd).st_size == size  # nothing written past the end either


@pytest.mark.parametrize("piece_bytes", [BPP, 4 << 20])
def test_bytes_changed_in_the_file_are_never_served(l3: L3File, piece_bytes: int) -> None:
    l2 = random_l2()
    with StorageMover(l3, l2, piece_bytes=piece_bytes) as mover:
        done(mover.h2s(pages([3, 4]), pages([6, 7])))
        # Someone else scribbles one byte into slot 7 (the temporary file has no name: its fd).
        os.pwrite(l3.fd, bytes([int(l2[4, 100]) ^ 1]), l3.offset(7) + 100)
        h = mover.s2h(pages([6, 7]), pages([0, 1]))
        assert h.wait(timeout_s=10) is TransferStatus.FAILED
        assert isinstance(h.error, CorruptSlot) and h.error.slot == 7
        assert l3.corrupt_reads == 1


def test_truncated_file_fails_the_read(l3: L3File) -> None:
    l2 = random_l2()
    with StorageMover(l3, l2) as mover:
        done(mover.h2s(pages([3, 4]), pages([20, 21])))
        os.ftruncate(l3.fd, l3.offset(21) + 10)
        h = mover.s2h(pages([20, 21]), pages([0, 1]))
        assert h.wait(timeout_s=10) is TransferStatus.FAILED
        assert "file ended early" in str(h.error) and l3.path in str(h.error)


def test_delay_keeps_the_handle_pending_and_the_slots_unpublished(l3: L3File) -> None:
    l2 = random_l2()
    faults = FaultInjector(delay_polls=3).once(FaultSite.DELAY)
    with StorageMover(l3, l2, faults=faults) as mover:
        h = mover.h2s(pages([1, 2]), pages([3, 4]))
        assert h.tasks.join(10)  # the bytes are in the file ...
        for _ in range(3):  # ... but the completion is observed late
            assert h.poll() is TransferStatus.PENDING
            assert not l3.written(pages([3, 4])).any()
        assert h.poll() is TransferStatus.DONE
        assert l3.written(pages([3, 4])).all()


@pytest.mark.parametrize("how", ["cancel", "fail"])
@pytest.mark.parametrize("piece_bytes", [BPP, 4 << 20])
def test_cancel_and_fail_wait_for_the_threads(l3: L3File, how: str, piece_bytes: int) -> None:
    l2 = random_l2()
    faults = FaultInjector(delay_polls=1000).once(FaultSite.DELAY)
    with StorageMover(l3, l2, piece_bytes=piece_bytes, faults=faults) as mover:
        h = mover.h2s(pages(range(8)), pages(range(8)))
        if how == "cancel":
            h.cancel()
            assert h.status is TransferStatus.CANCELLED
        else:
            h.fail(TransferError("injected"))
            assert h.status is TransferStatus.FAILED and str(h.error) == "injected"
        assert h.tasks.idle()  # no thread touches the pages any more
        assert not l3.written(pages(range(8))).any()  # never published


# -- the file --------------------------------------------------------------------------------


def test_temp_file_is_0600_sized_and_has_no_name_from_the_start() -> None:
    f = L3File(None, SLOTS, BPP)
    st_ = os.fstat(f.fd)
    assert stat.S_IMODE(st_.st_mode) == 0o600
    assert st_.st_size == f.size_bytes == HEADER_BYTES + SLOTS * BPP
    assert st_.st_nlink == 0 and not os.path.exists(f.path)  # only our descriptor holds it
    f.check_identity()  # nothing to check, nothing wrong
    f.close()
    f.close()  # idempotent
    with pytest.raises(StorageError, match="closed"):
        _ = f.fd


@pytest.mark.parametrize(
    "ending",
    ["", "raise RuntimeError('boom')", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
)
def test_temp_file_leaves_nothing_behind_however_the_process_ends(ending: str) -> None:
    code = (
        "from hicache.dataplane.storage import L3File\n"
        "f = L3File(None, 4, 512)\n"
        "print(f.path, flush=True)\n" + ending
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    expected = {"": 0, "raise RuntimeError('boom')": 1}.get(ending, -signal.SIGKILL)
    assert out.returncode == expected, out.stderr
    path = out.stdout.strip()
    assert path.endswith(".slots") and not os.path.exists(path)


def test_unusable_paths_raise_storage_error_naming_them(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for bad in (tmp_path / "missing-dir" / "l3.slots", tmp_path, fifo, Path("/proc/hicache-l3")):
        with pytest.raises(StorageError) as info:
            L3File(str(bad), 4, 512)
        assert str(bad) in str(info.value) and info.value.path == str(bad)


def test_bad_sizes_raise_config_error() -> None:
    with pytest.raises(ConfigError, match="l3.slots"):
        L3File(None, 0, 512)
    with pytest.raises(ConfigError, match="l3.bytes_per_page"):
        L3File(None, 4, -1)


@pytest.mark.parametrize("how", ["replaced", "removed"])
def test_file_replaced_under_us_is_detected(tmp_path: Path, how: str) -> None:
    path = tmp_path / "l3.slots"
    l2 = random_l2()
    with L3File(str(path), SLOTS, BPP) as l3, StorageMover(l3, l2) as mover:
        done(mover.h2s(pages([1]), pages([1])))
        if how == "replaced":
            other = tmp_path / "other"
            other.write_bytes(bytes(SLOTS * BPP))
            os.replace(other, path)
        else:
            path.unlink()
        with pytest.raises(StorageError, match=how) as info:
            mover.s2h(pages([1]), pages([2]))
        assert info.value.path == str(path)


# -- the mover's contract ----------------------------------------------------------------------


def test_invalid_arguments_raise_before_anything_is_issued(l3: L3File) -> None:
    l2 = random_l2()
    with StorageMover(l3, l2) as mover:
        done(mover.h2s(pages([1, 2]), pages([1, 2])))
        before = mover.counters
        bad = [
            (mover.h2s, pages([1, 2]), pages([3])),  # lengths differ
            (mover.h2s, pages([1, 2]), pages([3, 3])),  # one slot written twice
            (mover.h2s, pages([L2_PAGES]), pages([3])),  # L2 page out of range
            (mover.h2s, pages([1]), pages([SLOTS])),  # slot out of range
        ]
        # Typed (a HiCacheError the controller handles), and still a ValueError.
        for call, a, b in bad:
            with pytest.raises(InvalidPages):
                call(a, b)
        with pytest.raises(InvalidPages, match="distinct"):
            mover.s2h(pages([1, 2]), pages([5, 5]))  # one L2 page filled twice
        with pytest.raises(InvalidPages, match="hold no written page"):
            mover.s2h(pages([1, 9]), pages([5, 6]))
        assert mover.counters == before
        assert l3.written(pages([1, 2])).all() and not l3.written(pages([3])).any()
    with pytest.raises(StorageError, match="mover is closed"):
        mover.h2s(pages([1]), pages([1]))


def test_l2_must_be_a_byte_view_of_matching_pages(l3: L3File) -> None:
    with pytest.raises(ConfigError, match="l2_bytes"):
        StorageMover(l3, torch.zeros(4, BPP, dtype=torch.float32))
    with pytest.raises(ConfigError, match="l2_bytes"):
        StorageMover(l3, torch.zeros(4, BPP + 1, dtype=torch.uint8))
    with pytest.raises(ConfigError, match="l2_bytes"):
        StorageMover(l3, torch.zeros(BPP, 4, dtype=torch.uint8).t())
    with pytest.raises(ConfigError, match="io_threads"):
        StorageMover(l3, torch.zeros(4, BPP, dtype=torch.uint8), io_threads=-1)


def test_timings_are_recorded(l3: L3File) -> None:
    with StorageMover(l3, random_l2()) as mover:
        h = done(mover.h2s(pages(range(6)), pages(range(6))))
        assert h.timings.queue_wait_s >= 0 and h.timings.service_s > 0
        assert h.timings.observed_at is not None and h.timings.enqueue_s > 0


def test_l3_file_reads_back_what_the_mover_wrote_at_computed_offsets(l3: L3File) -> None:
    l2 = random_l2()
    with StorageMover(l3, l2) as mover:
        done(mover.h2s(pages([7, 3]), pages([5, 30])))
    raw = np.frombuffer(os.pread(l3.fd, l3.size_bytes, 0), dtype=np.uint8)
    assert l3.offset(5) == HEADER_BYTES + 5 * BPP and raw.size == l3.offset(SLOTS)
    assert np.array_equal(raw[l3.offset(5) : l3.offset(6)], l2[7].numpy())
    assert np.array_equal(raw[l3.offset(30) : l3.offset(31)], l2[3].numpy())


# -- direct I/O (L3File(direct=True): O_DIRECT) ------------------------------------------------

DIRECT_BPP = 2 * DIRECT_ALIGN


def test_direct_io_round_trips_through_its_own_descriptor(tmp_path: Path) -> None:
    path = str(tmp_path / "l3.slots")
    try:
        l3 = L3File(path, 8, DIRECT_BPP, direct=True)
    except StorageError as e:  # this file system refuses O_DIRECT: nothing to round-trip
        pytest.skip(str(e))
    l2 = aligned_pages(6, DIRECT_BPP)
    assert l2.data_ptr() % DIRECT_ALIGN == 0 and l2.is_contiguous()
    l2.copy_(torch.randint(0, 256, (6, DIRECT_BPP), dtype=torch.uint8))
    expected = l2.clone()
    with l3, StorageMover(l3, l2, io_threads=2) as mover:
        assert fcntl.fcntl(l3.io_fd, fcntl.F_GETFL) & os.O_DIRECT
        assert not fcntl.fcntl(l3.fd, fcntl.F_GETFL) & os.O_DIRECT  # header, digests: buffered
        done(mover.h2s(pages([0, 1, 2, 4]), pages([3, 4, 5, 0])))
        l2[:] = 0xA5
        done(mover.s2h(pages([3, 4, 5, 0]), pages([0, 1, 2, 4])))
        assert torch.equal(l2[pages([0, 1, 2, 4])], expected[pages([0, 1, 2, 4])])
        # The buffered descriptor sees what direct I/O wrote (a digest reads through it).
        row = memoryview(bytearray(DIRECT_BPP))
        assert read_servable(l3, 5, row) and bytes(row) == expected[2].numpy().tobytes()
        io_fd = l3.io_fd
    assert l3.closed
    with pytest.raises(OSError):
        os.fstat(io_fd)  # closed with the file


def test_direct_io_refused_by_the_file_system_names_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tmpfs refused O_DIRECT before Linux 6.6 (this kernel may take it): EINVAL at open,
    simulated, is a StorageError naming the file, and the half-made file is closed."""
    real_open = os.open

    def refusing(path: str, flags: int, *args: int) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", refusing)
    path = str(tmp_path / "l3.slots")
    with pytest.raises(StorageError, match="file system refuses O_DIRECT") as info:
        L3File(path, 4, DIRECT_BPP, direct=True)
    assert info.value.path == path and "turn direct off" in str(info.value)
    monkeypatch.undo()
    with L3File(path, 4, DIRECT_BPP):  # the refused open left nothing locked
        pass


def test_direct_io_needs_aligned_pages_and_memory() -> None:
    with pytest.raises(ConfigError, match="l3.direct: O_DIRECT moves whole 4096-byte blocks"):
        L3File(None, 4, BPP, direct=True)
    with pytest.raises(ConfigError, match="l3.direct: must be True or False"):
        L3File(None, 4, DIRECT_BPP, direct=1)  # type: ignore[arg-type]
    with L3File(None, 4, DIRECT_BPP, direct=True) as l3:
        skewed = aligned_pages(3, DIRECT_BPP).view(-1)[64 : 64 + 2 * DIRECT_BPP]
        with pytest.raises(ConfigError, match="allocate it with aligned_pages"):
            StorageMover(l3, skewed.view(2, DIRECT_BPP))


# -- the benchmark runs (its figures are not asserted: performance lives in benchmarks) ----------


@pytest.mark.parametrize("checksum,direct", [(None, False), ("crc32", False), (None, True)])
def test_bench_storage_runs_on_cpu(tmp_path: Path, checksum: str | None, direct: bool) -> None:
    out = tmp_path / "storage.json"
    args = [
        *(["--checksum", checksum] if checksum else []),
        *(["--direct"] if direct else []),
        "--ceiling-threads",
        "1",
        "2",
        "--tokens",
        "32",
        "80",
        "--bytes-per-page",
        "4096",
        "--repeats",
        "1",
        "--dir",
        str(tmp_path),
        "--out",
        str(out),
    ]
    assert bench_main(args) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [r["pages"] for r in rows] == [2, 5]
    assert all(r["extents_consecutive"] == 1 for r in rows)
    assert all(1 <= r["extents_fragmented"] <= r["pages"] for r in rows)
    assert all(r["s2h_fragmented_GBps"] > 0 and r["h2s_consecutive_vs_raw"] > 0 for r in rows)
    assert all(r["pieces_consecutive"] == 1 for r in rows)  # 5 pages of 4 KiB: one 4 MiB piece
    assert all(r["pieces_fragmented"] == r["extents_fragmented"] for r in rows)
    assert all(r["h2s_fragmented_cpu_ms"] >= 0 and r["checksum_cpu_ms"] >= 0 for r in rows)
    # The multi-thread ceiling: each thread count, its best, and the mover's share of it.
    for r in rows:
        for d in ("write", "read"):
            best = max(r[f"ceiling_{d}_{t}t_GBps"] for t in (1, 2))
            assert r[f"ceiling_{d}_GBps"] == best > 0 and r[f"ceiling_{d}_threads"] in (1, 2)
        ratio = r["s2h_consecutive_GBps"] / r["ceiling_read_GBps"]
        assert r["s2h_consecutive_vs_ceiling"] == pytest.approx(ratio)
    config = result["config"]
    assert config["checksum"] == (checksum or default_algorithm())
    assert config["direct"] is direct
    assert config["ceiling_threads"] == [1, 2] and config["corrupt_reads"] == 0
    assert list(tmp_path.iterdir()) == [out]  # the benchmark's L3 file is gone
