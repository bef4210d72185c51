"""`SharedMemoryCollectives`: the ranks of one host meeting in a shared-memory block.

    block = ShmBlock.create(size)                 # the launcher (processes.py), before the ranks
    coll = SharedMemoryCollectives(block.name, rank, size, board, timeout_s)   # each rank
    CacheController(config, collectives=coll)
    block.unlink()                                # the launcher, after every rank ended

A gloo collective costs a TCP round trip through the kernel and a wake-up of the waiting
process: hundreds of microseconds on a loaded host, several times a request's agreement
budget (benchmarks/tp_agreement_overhead.py). The ranks of one host need neither: each collective
is a round of the same row wire.py defines, written to this rank's slot in a block every rank
maps, and read from every other rank's slot once it is published.

    the block (int64 words)     what
    --------------------------  ----------------------------------------------------------
    control line r (8 words)    [0] rounds rank r has published; [1] 1 once rank r failed
                                (its own line: no two ranks write one cache line)
    slot (r, round % 2)         GUARD = round, then the row (ROW_WIDTH), then GUARD = round

    one round (rank r)          write the row to slot (r, round % 2), then publish round + 1;
                                wait until every rank published round + 1 (spin SPIN_S, then
                                sleep SLEEP_S between looks); read every rank's slot
    a collective                one round, or one per INLINE_VALUES values of a longer payload
                                (each round's row repeats the header: agreed_rows checks each)

Two slots suffice: a rank writes slot (r, round % 2) again only at round + 2, which it reaches
only once every rank published round + 1, that is, after every rank read round. A rank's row
stores become visible before its publish (x86-64 keeps stores in order; other machines are
refused with a ConfigError), and a reader checks both guards: a row read while being written
is read again.

A wait ends within `timeout_s`, never hangs:

    seen                                      raised
    ----------------------------------------  ------------------------------------------------
    rank r's failed flag (it raised, or the   RankFailed(r, why): why from the board's
    launcher found it dead)                   `failed/{r}`
    the rows' headers differ                  CollectiveMismatch (F16, F17)
    `timeout_s` passed                        CollectiveTimeout(seq, point, missing, last):
                                              where each rank was last, from its newest row

Contract: one `ShmBlock` per group, created before the ranks and unlinked after them; every
rank's `SharedMemoryCollectives` of the same `size`; `close()` before the process ends.
Counters (`exchange_s`, `wait_s`, ...) as every ProcessCollectives (wire.py).
"""

from __future__ import annotations

import os
import platform
import secrets
import time
from array import array
from multiprocessing.shared_memory import SharedMemory

from torch.distributed.distributed_c10d import Store

from hicache.distributed.collectives import CollectiveTimeout, Entry, RankFailed
from hicache.distributed.wire import (
    INLINE_VALUES,
    ROW_WIDTH,
    STAMP,
    ProcessCollectives,
    agreed_rows,
    failed_key,
    missing_ranks,
    point_names,
    row_of,
)
from hicache.errors import ConfigError

WORD = 8  # bytes per int64
CONTROL_WORDS = 8  # a rank's control line: one 64-byte cache line
PUBLISHED, FAILED = 0, 1  # a control line's words
SLOT_WORDS = -(-(ROW_WIDTH + 2) // CONTROL_WORDS) * CONTROL_WORDS  # guard, row, guard; whole lines
SPIN_S = 0.002  # a waiting rank spins this long before it sleeps between looks
SLEEP_S = 50e-6  # then sleeps this long between looks (what a late rank costs the others)
LOOKS_PER_CLOCK = 64  # looks between two reads of the clock while spinning
TSO_MACHINES = ("x86_64", "AMD64", "i386", "i686")  # stores become visible in program order


def block_words(size: int) -> int:
    """The block's length for `size` ranks, in int64 words."""
    return size * CONTROL_WORDS + 2 * size * SLOT_WORDS


def require_tso() -> None:
    """ConfigError unless this machine keeps stores in order (the module's publish rule)."""
    if platform.machine() not in TSO_MACHINES:
        raise ConfigError(
            "tp.transport",
            f"shm needs an x86-64 host (stores seen in order); "
            f"this is {platform.machine()!r}: use gloo",
        )


def mapped(shm: SharedMemory) -> memoryview:
    """`shm`'s bytes; a closed block has none (using it after `close` is a bug here)."""
    buf = shm.buf
    assert buf is not None, f"shared-memory block {shm.name!r} used after close"
    return buf


def block_prefix(pid: int | None = None) -> str:
    """The name prefix of the blocks launcher process `pid` (default: this one) creates: what
    lies in /dev/shm under it after every run of that launcher ended is a leaked block."""
    return f"hicache-tp-{os.getpid() if pid is None else pid}-"


class ShmBlock:
    """The group's block, owned by the launcher: `create`, then `mark_dead` for a rank found
    dead, then `unlink` once every rank ended."""

    def __init__(self, shm: SharedMemory, size: int) -> None:
        self.shm, self.size = shm, size

    @classmethod
    def create(cls, size: int) -> ShmBlock:
        """A new zeroed block for `size` ranks, named `block_prefix()` + a random suffix."""
        require_tso()
        name = f"{block_prefix()}{secrets.token_hex(6)}"
        shm = SharedMemory(name=name, create=True, size=block_words(size) * WORD)
        buf = mapped(shm)
        buf[:] = bytes(len(buf))  # every count 0, every flag clear
        return cls(shm, size)

    @property
    def name(self) -> str:
        return self.shm.name

    def mark_dead(self, rank: int) -> None:
        """Raise rank `rank`'s failed flag (its `failed/{r}` on the board is the caller's):
        a rank waiting for it stops with RankFailed instead of waiting out the timeout."""
        words = mapped(self.shm).cast("q")
        try:
            words[rank * CONTROL_WORDS + FAILED] = 1
        finally:
            words.release()

    def unlink(self) -> None:
        self.shm.close()
        self.shm.unlink()


class SharedMemoryCollectives(ProcessCollectives):
    """Rank `rank` of `size` over the block named `name` (module docstring); `board` holds
    why a rank failed; a wait gives up after `timeout_s`."""

    def __init__(self, name: str, rank: int, size: int, board: Store, timeout_s: float) -> None:
        require_tso()
        if not timeout_s > 0:
            raise ConfigError("tp.timeout_s", f"> 0 seconds, got {timeout_s!r}")
        super().__init__(rank, size, board)
        self.timeout_s = timeout_s
        self._shm = SharedMemory(name=name)
        buf = mapped(self._shm)
        if len(buf) < block_words(size) * WORD:
            raise ConfigError(
                "tp.transport",
                f"block {name!r} has {len(buf)} bytes, "
                f"not the {block_words(size) * WORD} of {size} ranks",
            )
        self._words = buf.cast("q")
        self.rounds = 0  # this rank's rounds published (a collective takes one or more)

    def mark_failed(self, why: str) -> None:
        """The board's `failed/{r}` first, then the flag: a rank that sees the flag finds why."""
        super().mark_failed(why)
        self._words[self.rank * CONTROL_WORDS + FAILED] = 1

    def close(self) -> None:
        """Unmap the block (the launcher unlinks it)."""
        self._words.release()
        self._shm.close()

    def bare_round(self, row: list[int]) -> list[list[int]]:
        """One round of `row` (ROW_WIDTH values) with every rank, made by every rank at once,
        unchecked and uncounted: the least a collective costs over this block (the ceiling
        benchmarks/tp_agreement_overhead.py compares the agreement with)."""
        return self._round(-1, Entry("bare", "all_gather", len(row)), row)

    def _meet(
        self, seq: int, entry: Entry, values: tuple[int, ...], arrived_ns: int
    ) -> tuple[list[int], list[tuple[int, ...]]]:
        out: list[list[int]] = [[] for _ in range(self.size)]
        stamps: list[int] = []
        first = STAMP + 1
        for at in range(0, max(1, entry.length), INLINE_VALUES):
            chunk = values[at : at + INLINE_VALUES]
            rows = self._round(seq, entry, row_of(seq, entry, chunk, arrived_ns))
            agreed_rows(seq, rows)
            stamps = stamps or [row[STAMP] for row in rows]
            for r, row in enumerate(rows):
                out[r].extend(row[first : first + len(chunk)])
        return stamps, [tuple(row) for row in out]

    def _slot(self, rank: int, round_: int) -> int:
        return self.size * CONTROL_WORDS + (2 * rank + round_ % 2) * SLOT_WORDS

    def _round(self, seq: int, entry: Entry, row: list[int]) -> list[list[int]]:
        """Publish `row` as this rank's next round and return every rank's row of it."""
        round_ = self.rounds
        at = self._slot(self.rank, round_)
        self._words[at : at + ROW_WIDTH + 2] = array("q", [round_, *row, round_])
        self.rounds += 1
        self._words[self.rank * CONTROL_WORDS + PUBLISHED] = self.rounds
        deadline = time.monotonic() + self.timeout_s
        rows = []
        for r in range(self.size):
            rows.append(self._read(r, round_, seq, entry, deadline))
        return rows

    def _read(self, rank: int, round_: int, seq: int, entry: Entry, deadline: float) -> list[int]:
        """Rank `rank`'s row of `round_`, once it is published and whole (module docstring)."""
        words, control = self._words, rank * CONTROL_WORDS
        at = self._slot(rank, round_)
        spin_until = time.monotonic() + SPIN_S
        looks, sleeping = 0, False
        while True:
            if words[control + PUBLISHED] > round_:
                got = words[at : at + ROW_WIDTH + 2].tolist()
                if got[0] == round_ == got[-1]:
                    return got[1:-1]
            if words[control + FAILED]:
                raise RankFailed(rank, self._why(rank))
            looks += 1
            if sleeping or looks % LOOKS_PER_CLOCK == 0:
                now = time.monotonic()
                if now > deadline:
                    raise self._timeout(seq, entry.point)
                sleeping = now > spin_until
                if sleeping:
                    time.sleep(SLEEP_S)

    def _why(self, rank: int) -> str:
        try:
            return self.board.get(failed_key(rank)).decode()
        except RuntimeError as e:
            return f"its failed flag is up; why is not on the board ({e})"

    def _timeout(self, seq: int, point_name: str) -> CollectiveTimeout:
        """Where each rank was last, from its newest row; the ranks before `seq` are missing."""
        last: dict[int, tuple[int, str]] = {}
        names = point_names()
        for r in range(self.size):
            published = self._words[r * CONTROL_WORDS + PUBLISHED]
            if published:
                at = self._slot(r, published - 1) + 1  # past the guard: the row's header
                row_seq, index = self._words[at], self._words[at + 1]
                last[r] = (row_seq, names[index] if 0 <= index < len(names) else f"?{index}")
        missing = missing_ranks(seq, last, self.size)
        why = "timed out or a rank left" if missing else "timed out (every rank reached it)"
        return CollectiveTimeout(seq, point_name, missing, last, why=why)


__all__ = [
    "CONTROL_WORDS",
    "FAILED",
    "PUBLISHED",
    "SLEEP_S",
    "SPIN_S",
    "TSO_MACHINES",
    "SharedMemoryCollectives",
    "ShmBlock",
    "block_words",
    "mapped",
    "require_tso",
]
