"""What the process transports share: the header row every collective starts with, the
arrival board, and the counters a benchmark reads (`ProcessCollectives`).

    row      int64[ROW_WIDTH]: seq, point index, op code, length, crc32 of the entry's text
             (HEADER_FIELDS: equal on every rank, else CollectiveMismatch, F16 F17); the
             rank's arrival (STAMP: CLOCK_MONOTONIC ns, one clock for every process of a
             host; not compared); up to INLINE_VALUES values, zeros after them
    board    a Store every rank and the launcher reach: `last/{r}` "seq point" (where rank r
             was last, for a transport that cannot tell otherwise), `failed/{r}` why r raised

Implementations: `TorchCollectives` (torchdist.py: the row over a gloo all_gather) and
`SharedMemoryCollectives` (shm.py: the row in a shared-memory slot, the ranks of one host).
Both run `ProcessCollectives._exchange`: `_meet` is theirs.

Contract of `_meet(seq, entry, values)`: every rank's row of collective `seq` (checked by
`agreed_rows`) and every rank's values, by rank; a collective that cannot finish raises a
CollectiveError (collectives.py) within the transport's timeout, never gloo's or the OS's error.
"""

from __future__ import annotations

import time
import zlib
from abc import abstractmethod
from collections import Counter
from collections.abc import Mapping, Sequence
from functools import lru_cache

from torch.distributed.distributed_c10d import Store

from hicache.distributed.collectives import CollectiveMismatch, Entry, RecordingCollectives
from hicache.distributed.points import COLLECTIVE_OPS, load_points

HEADER_FIELDS = ("seq", "point", "op", "length", "crc")  # the header's int64 entries, in order
STAMP = len(HEADER_FIELDS)  # the row's entry after the header: the rank's arrival, in ns
INLINE_VALUES = 64  # values one row carries: a longer payload takes more (transport's own)
ROW_WIDTH = STAMP + 1 + INLINE_VALUES
WHY_MAX_CHARS = 2000  # a `failed/{r}` entry is cut to this: a report, not a log


def last_key(rank: int) -> str:
    """The board key where `rank` says which collective it entered last ("seq point")."""
    return f"last/{rank}"


def failed_key(rank: int) -> str:
    """The board key where `rank` says why it failed (set once, by `mark_failed`)."""
    return f"failed/{rank}"


@lru_cache(maxsize=1)
def point_names() -> tuple[str, ...]:
    """The points of spec/tp.toml in table order: a header carries a point as its index."""
    return tuple(load_points())


def header_of(seq: int, entry: Entry) -> list[int]:
    """The fixed-size header of collective `seq` (HEADER_FIELDS)."""
    return [seq, *_call_code(entry)]


@lru_cache(maxsize=1024)
def _call_code(entry: Entry) -> tuple[int, int, int, int]:
    """The header's fields after `seq` for call `entry` (a rank makes few distinct calls, one
    each per collective: computed once per call, not per collective)."""
    return (
        point_names().index(entry.point),
        COLLECTIVE_OPS.index(entry.op),
        entry.length,
        zlib.crc32(entry.text().encode()),
    )


def row_of(seq: int, entry: Entry, inline: Sequence[int], arrived_ns: int = 0) -> list[int]:
    """A row of ROW_WIDTH: the header, the arrival stamp (`time.monotonic_ns()`), then
    `inline` (at most INLINE_VALUES values), zeros to the end."""
    # Verify the values fit: a longer payload takes more than one row.
    assert len(inline) <= INLINE_VALUES, len(inline)
    return header_of(seq, entry) + [arrived_ns] + list(inline) + [0] * (INLINE_VALUES - len(inline))


def entry_of(header: Sequence[int]) -> Entry:
    """The call a header describes (a point or op this rank's table lacks shows as `?N`)."""
    _, point_index, op_code, length, _ = header
    names = point_names()
    name = names[point_index] if 0 <= point_index < len(names) else f"?{point_index}"
    op = COLLECTIVE_OPS[op_code] if 0 <= op_code < len(COLLECTIVE_OPS) else f"?{op_code}"
    return Entry(name, op, length)


def agreed_rows(seq: int, rows: Sequence[Sequence[int]]) -> None:
    """Raise CollectiveMismatch unless every rank's row of collective `seq` has one header."""
    width = len(HEADER_FIELDS)
    if len({tuple(row[:width]) for row in rows}) != 1:
        raise CollectiveMismatch(seq, {r: entry_of(row[:width]) for r, row in enumerate(rows)})


def read_board(board: Store, size: int) -> tuple[dict[int, tuple[int, str]], dict[int, str]]:
    """(where each rank was last: rank -> (seq, point), why each failed rank failed). Ranks
    that wrote nothing are absent. Raises RuntimeError when the board is unreachable."""
    last: dict[int, tuple[int, str]] = {}
    failed: dict[int, str] = {}
    for r in range(size):
        if board.check([last_key(r)]):
            seq, _, name = board.get(last_key(r)).decode().partition(" ")
            last[r] = (int(seq), name)
        if board.check([failed_key(r)]):
            failed[r] = board.get(failed_key(r)).decode()
    return last, failed


def mark_failed(board: Store, rank: int, why: str) -> None:
    """Write why `rank` raised to the board: a rank waiting for it in a collective then raises
    RankFailed naming it instead of waiting out the timeout. Never raises."""
    try:
        board.set(failed_key(rank), why[:WHY_MAX_CHARS])
    except RuntimeError:
        pass  # the board is gone (the launcher ended): nobody is left to tell


def missing_ranks(seq: int, last: Mapping[int, tuple[int, str]], size: int) -> list[int]:
    """The ranks whose last collective is before `seq` (or who made none): they never came."""
    return [r for r in range(size) if r not in last or last[r][0] < seq]


class ProcessCollectives(RecordingCollectives):
    """A rank in its own process: numbers its collectives, times them, and leaves the meeting
    itself (`_meet`) to the transport. `exchange_s`, `exchanges` and `payload_int64` count
    the seconds spent in `_exchange`, its calls and the values sent; `wait_s` the part of
    `exchange_s` this rank spent before the last rank arrived (the ranks' own work out of
    step, not the agreement's cost), by the rows' arrival stamps; `by_point` the exchanges
    per point."""

    def __init__(self, rank: int, size: int, board: Store) -> None:
        super().__init__(rank, size)
        self.board = board
        self.seq = 0  # this rank's next collective number
        self.exchange_s = 0.0
        self.exchanges = 0
        self.payload_int64 = 0
        self.wait_s = 0.0
        self.by_point: Counter[str] = Counter()

    def mark_failed(self, why: str) -> None:
        """Tell the other ranks (and the launcher) that this rank raised (`mark_failed`)."""
        mark_failed(self.board, self.rank, why)

    def _exchange(self, entry: Entry, values: tuple[int, ...]) -> list[tuple[int, ...]]:
        started = time.perf_counter()
        seq = self.seq
        self.seq += 1
        try:
            arrived = time.monotonic_ns()
            stamps, out = self._meet(seq, entry, values, arrived)
            self.wait_s += max(0, max(stamps) - arrived) / 1e9
            # Verify the transport returned one row of the agreed length per rank.
            assert len(out) == self.size and all(len(row) == entry.length for row in out)
            return out
        finally:
            self.exchange_s += time.perf_counter() - started
            self.exchanges += 1
            self.payload_int64 += entry.length
            self.by_point[entry.point] += 1

    @abstractmethod
    def _meet(
        self, seq: int, entry: Entry, values: tuple[int, ...], arrived_ns: int
    ) -> tuple[list[int], list[tuple[int, ...]]]:
        """Collective `seq` with every rank: (every rank's arrival stamp, every rank's
        values), by rank; `agreed_rows` checked before any values are read."""


__all__ = [
    "HEADER_FIELDS",
    "INLINE_VALUES",
    "ROW_WIDTH",
    "STAMP",
    "ProcessCollectives",
    "agreed_rows",
    "entry_of",
    "failed_key",
    "header_of",
    "last_key",
    "mark_failed",
    "missing_ranks",
    "point_names",
    "read_board",
    "row_of",
]
