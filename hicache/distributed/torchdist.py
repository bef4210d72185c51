"""`TorchCollectives`: the ranks of one cache as processes over torch.distributed (gloo).

    dist.init_process_group("gloo", ..., timeout=timedelta(seconds=T))   # the op timeout
    coll = TorchCollectives(board)            # board: a Store every rank and the launcher reach
    CacheController(config, collectives=coll)

Each collective (spec/tp.toml) is one write to the arrival board, then one gloo all_gather
of a fixed-size row, and a second only for a payload longer than INLINE_VALUES:

    step     what                                           why
    -------  ---------------------------------------------  -----------------------------------
    arrive   board `last/{rank}` = "seq point"              a timeout can say who never came
    header   int64[6 + INLINE_VALUES]: seq, point index,    every rank made the same call, else
             op code, length, crc32 of the entry's text;    CollectiveMismatch (F16, F17); the
             the rank's arrival (CLOCK_MONOTONIC ns);       values are read only once every
             then the values when there are at most         rank's header is equal; the
             INLINE_VALUES of them (else zeros)             arrivals say who waited for whom
    payload  int64[length], by rank: only for a length      the values that did not fit
             over INLINE_VALUES

A gloo op that fails -- the process group's timeout T passed, or a peer's connection closed --
is read against the board and raised as what it means, never as gloo's RuntimeError:

    the board says                                  raised
    ----------------------------------------------  -----------------------------------------
    another rank wrote `failed/{r}` (it raised)     RankFailed(r, its error)
    rank(s) never reached collective `seq`          CollectiveTimeout(seq, point, missing, last)
    every rank reached it                           CollectiveTimeout(..., missing=(), why=gloo's)

So a stuck or departed rank becomes a report within T seconds naming the point and the ranks
that did not arrive. The board should outlive every rank (processes.py hosts it in the launcher);
when it is unreachable the report says so and names no positions.

Contract: every rank's `TorchCollectives` is built on the same process group, after
`init_process_group`; values are int64 (RecordingCollectives checks them); results are the
same on every rank. `exchange_s`, `exchanges` and `payload_int64` count the seconds spent in
`_exchange`, its calls and the values sent; `wait_s` the part of `exchange_s` this rank spent
before the last rank arrived (the ranks' own work out of step, not the agreement's cost), by
the arrival stamps of one host's shared monotonic clock (benchmarks/tp_gloo_overhead.py
reports both).
"""

from __future__ import annotations

import time
import zlib
from collections import Counter
from collections.abc import Mapping
from functools import lru_cache

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import PrefixStore, ProcessGroup, Store

from hicache.distributed.collectives import (
    CollectiveMismatch, CollectiveTimeout, Entry, RankFailed, RecordingCollectives,
)
from hicache.distributed.points import COLLECTIVE_OPS, load_points

HEADER_FIELDS = ("seq", "point", "op", "length", "crc")  # the header's int64 entries, in order
STAMP = len(HEADER_FIELDS)  # the row's entry after the header: the rank's arrival, in ns
INLINE_VALUES = 64  # a payload of at most this many values rides in the header's row: one op
BOARD_PREFIX = "hicache/board/"  # the default board's keys, in the default process group's store
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
    names = point_names()
    return [seq, names.index(entry.point), COLLECTIVE_OPS.index(entry.op), entry.length,
            zlib.crc32(entry.text().encode())]


def row_of(seq: int, entry: Entry, inline: tuple[int, ...], arrived_ns: int = 0) -> list[int]:
    """The first all_gather's row: the header, the arrival stamp (`time.monotonic_ns()`: one
    clock for every process of a host), then `inline` (the values, or none when they do not
    fit), zeros to INLINE_VALUES."""
    # Verify the values fit: a longer payload goes in an all_gather of its own.
    assert len(inline) <= INLINE_VALUES, len(inline)
    return header_of(seq, entry) + [arrived_ns] + list(inline) + [0] * (INLINE_VALUES - len(inline))


def entry_of(header: tuple[int, ...]) -> Entry:
    """The call a header describes (a point or op this rank's table lacks shows as `?N`)."""
    _, point_index, op_code, length, _ = header
    names = point_names()
    name = names[point_index] if 0 <= point_index < len(names) else f"?{point_index}"
    op = COLLECTIVE_OPS[op_code] if 0 <= op_code < len(COLLECTIVE_OPS) else f"?{op_code}"
    return Entry(name, op, length)


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


class TorchCollectives(RecordingCollectives):
    """This process's rank of `group` (default: the default process group), reporting its
    arrivals on `board` (default: a prefix of the default group's store)."""

    def __init__(self, board: Store | None = None,
                 group: ProcessGroup | None = None) -> None:
        # Verify the process group exists: collectives before init would hang or fail opaquely.
        assert dist.is_initialized(), "call torch.distributed.init_process_group first"
        super().__init__(dist.get_rank(group), dist.get_world_size(group))
        if board is None:
            board = PrefixStore(BOARD_PREFIX, dist.distributed_c10d._get_default_store())
        self.board, self.group = board, group
        self.seq = 0  # this rank's next collective number
        self.exchange_s = 0.0  # seconds spent inside `_exchange` (board, header, payload)
        self.exchanges = 0
        self.payload_int64 = 0  # values this rank sent, over every exchange (headers aside)
        self.wait_s = 0.0  # seconds of `exchange_s` before the last rank arrived
        self.by_point: Counter[str] = Counter()  # exchanges per point name

    def mark_failed(self, why: str) -> None:
        """Tell the other ranks (and the launcher) that this rank raised (`mark_failed`)."""
        mark_failed(self.board, self.rank, why)

    def _exchange(self, entry: Entry, values: tuple[int, ...]) -> list[tuple[int, ...]]:
        started = time.perf_counter()
        seq = self.seq
        self.seq += 1
        try:
            self._arrive(seq, entry.point)
            inline = entry.length <= INLINE_VALUES
            arrived = time.monotonic_ns()
            rows = self._gather(seq, entry, row_of(seq, entry, values if inline else (), arrived))
            width = len(HEADER_FIELDS)
            if len({row[:width] for row in rows}) != 1:
                calls = {r: entry_of(row[:width]) for r, row in enumerate(rows)}
                raise CollectiveMismatch(seq, calls)
            self.wait_s += max(0, max(row[STAMP] for row in rows) - arrived) / 1e9
            # The headers agree: every rank brings `entry.length` values, in its row or next.
            first = STAMP + 1
            out = ([row[first:first + entry.length] for row in rows] if inline
                   else self._gather(seq, entry, list(values)))
            # Verify gloo returned one row of the agreed length per rank.
            assert len(out) == self.size and all(len(row) == entry.length for row in out)
            return out
        finally:
            self.exchange_s += time.perf_counter() - started
            self.exchanges += 1
            self.payload_int64 += entry.length
            self.by_point[entry.point] += 1

    def _arrive(self, seq: int, point_name: str) -> None:
        """Say on the board that this rank entered collective `seq`; a board that is gone
        (the launcher ended) costs only the report's positions, never the collective."""
        try:
            self.board.set(last_key(self.rank), f"{seq} {point_name}")
        except RuntimeError:
            pass

    def _gather(self, seq: int, entry: Entry, values: list[int]) -> list[tuple[int, ...]]:
        """One gloo all_gather of int64 `values` (the same length on every rank), by rank; a
        failed op raised as what the board says it means."""
        mine = torch.tensor(values, dtype=torch.int64)
        rows = [torch.empty_like(mine) for _ in range(self.size)]
        try:
            dist.all_gather(rows, mine, group=self.group)
        except RuntimeError as e:  # gloo: timed out, or a peer's connection closed
            raise self._failure(seq, entry.point, e) from e
        return [tuple(int(v) for v in row.tolist()) for row in rows]

    def _failure(self, seq: int, point_name: str, error: RuntimeError) -> Exception:
        """The report for collective `seq`, whose gloo op failed with `error` (module table)."""
        gloo = " ".join(str(error).split())[:300]
        try:
            last, failed = read_board(self.board, self.size)
        except RuntimeError as e:
            why = f"failed ({gloo}) and the arrival board is unreachable ({e})"
            return CollectiveTimeout(seq, point_name, [], {}, why=why)
        others = sorted(r for r in failed if r != self.rank)
        if others:
            return RankFailed(others[0], failed[others[0]])
        missing = missing_ranks(seq, last, self.size)
        why = "timed out or a rank left" if missing else f"failed in gloo ({gloo})"
        return CollectiveTimeout(seq, point_name, missing, last, why=why)


def missing_ranks(seq: int, last: Mapping[int, tuple[int, str]], size: int) -> list[int]:
    """The ranks whose last collective is before `seq` (or who made none): they never came."""
    return [r for r in range(size) if r not in last or last[r][0] < seq]


__all__ = ["HEADER_FIELDS", "INLINE_VALUES", "TorchCollectives", "entry_of", "failed_key",
           "header_of", "last_key", "mark_failed", "missing_ranks", "point_names", "read_board",
           "row_of"]
