"""The shared-memory transport (hicache/distributed/shm.py) in one process: two ranks as
threads over one block agree (a payload of several rounds included), a different call is a
CollectiveMismatch, a skipped collective a CollectiveTimeout naming the missing rank, a raised
flag a RankFailed with the board's why, a row read while being written is read again, and a
block or a machine the transport cannot use is a ConfigError. The same transport across real
processes: test_torchdist.py (every test there runs over both transports)."""

from __future__ import annotations

import platform
import threading
import time
from array import array
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from hicache.distributed import shm  # noqa: E402
from hicache.distributed.collectives import (  # noqa: E402
    CollectiveMismatch,
    CollectiveTimeout,
    Entry,
    RankFailed,
)
from hicache.distributed.shm import SharedMemoryCollectives, ShmBlock  # noqa: E402
from hicache.distributed.wire import INLINE_VALUES, ROW_WIDTH, failed_key, row_of  # noqa: E402
from hicache.errors import ConfigError  # noqa: E402

if platform.machine() not in shm.TSO_MACHINES:
    pytest.skip("the shared-memory transport runs on x86-64 hosts only", allow_module_level=True)

T = TypeVar("T")
TIMEOUT_S = 5.0


@pytest.fixture()
def pair() -> Iterator[list[SharedMemoryCollectives]]:
    """Two ranks over a fresh block and one board; closed and unlinked after the test."""
    block = ShmBlock.create(2)
    board = dist.HashStore()
    ranks = [SharedMemoryCollectives(block.name, r, 2, board, TIMEOUT_S) for r in range(2)]
    yield ranks
    for c in ranks:
        c.close()
    block.unlink()


def both(
    ranks: list[SharedMemoryCollectives], fn: Callable[[SharedMemoryCollectives], T]
) -> list[T | BaseException]:
    """`fn(rank)` on each rank in its own thread; each one's result or error, by rank."""
    out: list[T | BaseException] = [RuntimeError("did not finish")] * len(ranks)

    def run(r: int) -> None:
        try:
            out[r] = fn(ranks[r])
        except BaseException as e:  # each rank's outcome is the test's
            out[r] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(ranks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(3 * TIMEOUT_S)
    return out


def test_two_ranks_agree_on_short_empty_and_several_round_payloads(
    pair: list[SharedMemoryCollectives],
) -> None:
    n = 2 * INLINE_VALUES + 3  # three rounds

    Agreed = tuple[
        tuple[int, ...],
        tuple[tuple[int, ...], ...],
        tuple[int, ...],
        tuple[tuple[int, ...], ...],
        int,
        str,
    ]

    def agree(c: SharedMemoryCollectives) -> Agreed:
        r = c.rank
        return (
            c.all_reduce_min("reserve", [r + 1, 5 - r]),
            c.all_gather("admit_choice", [10 * r]),
            c.all_reduce_min("completion", []),
            c.all_gather("check_state", [r * 1000 + i for i in range(n)]),
            c.rounds,
            c.log.digest,
        )

    a, b = both(pair, agree)
    assert a == b  # every rank the same results, rounds and log (I10)
    assert not isinstance(a, BaseException), a
    low, gathered, empty, long, rounds, _ = a
    assert low == (1, 4) and gathered == ((0,), (10,)) and empty == ()
    assert long == (tuple(range(n)), tuple(1000 + i for i in range(n)))
    assert rounds == 3 + 3  # one round each, then three for the long payload
    assert all(c.exchanges == 4 and c.payload_int64 == 3 + n for c in pair)


def test_another_call_is_a_mismatch_on_both_ranks(pair: list[SharedMemoryCollectives]) -> None:
    got = both(pair, lambda c: c.all_reduce_min("serve" if c.rank else "reserve", [1]))
    for e in got:
        assert isinstance(e, CollectiveMismatch) and e.seq == 0
        assert "rank 0: reserve all_reduce_min int64[1]" in str(e)
        assert "rank 1: serve all_reduce_min int64[1]" in str(e)


def test_a_skipped_collective_is_a_timeout_naming_the_missing_rank() -> None:
    block = ShmBlock.create(2)
    board = dist.HashStore()
    ranks = [SharedMemoryCollectives(block.name, r, 2, board, 0.3) for r in range(2)]
    try:

        def skip(c: SharedMemoryCollectives) -> None:
            c.all_reduce_min("reserve", [1])
            if c.rank == 0:
                c.all_reduce_min("completion", [1, 2])

        started = time.monotonic()
        got = both(ranks, skip)
        assert got[1] is None
        e = got[0]
        assert isinstance(e, CollectiveTimeout) and e.missing == (1,)
        assert e.last == {0: (1, "completion"), 1: (0, "reserve")}
        assert "collective #1 (completion)" in str(e)
        assert time.monotonic() - started < 3  # the timeout's 0.3 s, not a hang
    finally:
        for c in ranks:
            c.close()
        block.unlink()


def test_a_raised_flag_breaks_the_waiting_rank_out_with_the_boards_why(
    pair: list[SharedMemoryCollectives],
) -> None:
    def fail_or_wait(c: SharedMemoryCollectives) -> None:
        if c.rank == 1:
            time.sleep(0.1)
            c.mark_failed("ValueError: rank 1's own bug")
            return
        c.all_reduce_min("reserve", [1])

    started = time.monotonic()
    e, _ = both(pair, fail_or_wait)
    assert isinstance(e, RankFailed) and e.rank == 1
    assert "ValueError: rank 1's own bug" in str(e)
    assert time.monotonic() - started < TIMEOUT_S / 2  # at once, not at the timeout
    assert pair[0].board.get(failed_key(1)) == b"ValueError: rank 1's own bug"


def test_the_launcher_marks_a_dead_rank_and_the_waiting_one_stops() -> None:
    block = ShmBlock.create(2)
    board = dist.HashStore()
    c = SharedMemoryCollectives(block.name, 0, 2, board, TIMEOUT_S)
    try:
        board.set(failed_key(1), "died: exited with code 9 without a report")
        threading.Timer(0.1, block.mark_dead, (1,)).start()
        with pytest.raises(RankFailed, match="died: exited with code 9"):
            c.all_reduce_min("reserve", [1])
    finally:
        c.close()
        block.unlink()


def test_a_row_published_before_it_is_whole_is_read_again(
    pair: list[SharedMemoryCollectives],
) -> None:
    """Rank 1's publish seen before its row (a stale guard): rank 0 waits for the row."""
    mine, other = pair
    words = other._words
    at = other._slot(1, 0)
    entry_row = row_of(0, Entry("reserve", "all_reduce_min", 1), [7], 0)

    def late_row() -> None:
        words[at] = -5  # the guard of some earlier round
        words[1 * shm.CONTROL_WORDS + shm.PUBLISHED] = 1  # published first ...
        time.sleep(0.1)
        words[at : at + ROW_WIDTH + 2] = array("q", [0, *entry_row, 0])  # ... whole later

    threading.Thread(target=late_row).start()
    assert mine.all_reduce_min("reserve", [9]) == (7,)


def test_a_machine_without_ordered_stores_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    with pytest.raises(ConfigError, match="shm needs an x86-64 host .* 'arm64': use gloo"):
        ShmBlock.create(2)


def test_a_block_of_fewer_ranks_is_refused() -> None:
    block = ShmBlock.create(2)
    try:
        with pytest.raises(ConfigError, match="not the .* of 3 ranks"):
            SharedMemoryCollectives(block.name, 0, 3, dist.HashStore(), TIMEOUT_S)
    finally:
        block.unlink()
