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
same on every rank. The row's format, the board and the counters (`exchange_s`, `wait_s`, ...)
are wire.py's, shared with the shared-memory transport (shm.py).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import PrefixStore, ProcessGroup, Store

from hicache.distributed.collectives import CollectiveTimeout, Entry, RankFailed
from hicache.distributed.wire import (
    INLINE_VALUES,
    STAMP,
    ProcessCollectives,
    agreed_rows,
    last_key,
    missing_ranks,
    read_board,
    row_of,
)

BOARD_PREFIX = "hicache/board/"  # the default board's keys, in the default process group's store


class TorchCollectives(ProcessCollectives):
    """This process's rank of `group` (default: the default process group), reporting its
    arrivals on `board` (default: a prefix of the default group's store)."""

    def __init__(self, board: Store | None = None, group: ProcessGroup | None = None) -> None:
        # Verify the process group exists: collectives before init would hang or fail opaquely.
        assert dist.is_initialized(), "call torch.distributed.init_process_group first"
        if board is None:
            board = PrefixStore(BOARD_PREFIX, dist.distributed_c10d._get_default_store())
        super().__init__(dist.get_rank(group), dist.get_world_size(group), board)
        self.group = group

    def _meet(
        self, seq: int, entry: Entry, values: tuple[int, ...], arrived_ns: int
    ) -> tuple[list[int], list[tuple[int, ...]]]:
        self._arrive(seq, entry.point)
        inline = entry.length <= INLINE_VALUES
        rows = self._gather(seq, entry, row_of(seq, entry, values if inline else (), arrived_ns))
        agreed_rows(seq, rows)
        # The headers agree: every rank brings `entry.length` values, in its row or next.
        first = STAMP + 1
        out = (
            [row[first : first + entry.length] for row in rows]
            if inline
            else self._gather(seq, entry, list(values))
        )
        return [row[STAMP] for row in rows], out

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


__all__ = ["BOARD_PREFIX", "TorchCollectives"]
