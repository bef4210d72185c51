"""The `Collectives` protocol: the only way the ranks of one cache talk (spec/tp.md).

    Collectives            rank, size, log; all_reduce_min(point, values), all_gather(point, values)
    RecordingCollectives   the shared part: checks the call against spec/tp.toml, logs it,
                           then `_exchange`s the values (each implementation's own)
    Alone                  one rank (size 1): every collective returns its own input
    CollectiveLog          what a rank has called, in order: (point, op, dtype, length), a
                           running hash and the last LOG_TAIL entries (I10 compares them)

Implementations: `Alone` here; `ThreadGroup` (simulated.py: ranks as threads of one process,
for the fuzz machine and tests) and `TorchCollectives` (torchdist.py: processes over
torch.distributed, gloo). A collective that cannot finish raises a `CollectiveError`,
never hangs: `CollectiveTimeout` (some ranks did not arrive within the timeout: which, and
where each was last), `CollectiveMismatch` (the ranks arrived at different points, ops or
lengths: F16, F17), `RankFailed` (another rank died; this one was broken out).

Contract: values are int64 (Python ints in range); a payload's length must be one every rank
knows (spec/tp.toml); results are tuples, the same on every rank.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from hicache.distributed.points import point
from hicache.errors import ConfigError, HiCacheError

T = TypeVar("T")

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
LOG_TAIL = 64  # entries a log keeps for a report (the hash and count cover all of them)


@dataclass(frozen=True)
class Entry:
    """One collective as a rank made it: what I10 compares across ranks."""

    point: str
    op: str
    length: int
    dtype: str = "int64"

    def text(self) -> str:
        return f"{self.point} {self.op} {self.dtype}[{self.length}]"


class CollectiveLog:
    """Every collective a rank made since the start (count, running hash, last entries)."""

    def __init__(self) -> None:
        self.count = 0
        self._hash = hashlib.sha256()
        self.tail: deque[Entry] = deque(maxlen=LOG_TAIL)

    def add(self, entry: Entry) -> None:
        self.count += 1
        self._hash.update(entry.text().encode() + b"\n")
        self.tail.append(entry)

    @property
    def digest(self) -> str:
        return self._hash.hexdigest()[:16]


class CollectiveError(HiCacheError):
    """A collective could not complete: the ranks no longer agree on what they are doing.
    Raised instead of a hang; the group is broken afterwards (R73)."""


class CollectiveTimeout(CollectiveError):
    """Collective `seq` (`point`) did not complete within the timeout: `missing` ranks never
    arrived; `last` says where each rank was last (its collective number and point)."""

    def __init__(
        self,
        seq: int,
        point_name: str,
        missing: Sequence[int],
        last: Mapping[int, tuple[int, str]],
        why: str = "timed out",
    ) -> None:
        self.seq, self.point, self.missing, self.last = seq, point_name, tuple(missing), dict(last)
        where = ", ".join(f"rank {r} at #{s} {p}" for r, (s, p) in sorted(self.last.items()))
        super().__init__(
            f"collective #{seq} ({point_name}) {why}: rank(s) {list(self.missing)} did "
            f"not arrive; last seen: {where or 'none'} (a rank skipped or left a "
            "collective: every rank must make the same collectives, spec/tp.md R70; R73)"
        )


class CollectiveMismatch(CollectiveError):
    """The ranks met at collective `seq` with different calls: a rank made one collective
    fewer or more (F16), or a payload whose length depends on local state (F17)."""

    def __init__(self, seq: int, calls: Mapping[int, Entry]) -> None:
        self.seq, self.calls = seq, dict(calls)
        shown = "; ".join(f"rank {r}: {e.text()}" for r, e in sorted(self.calls.items()))
        super().__init__(
            f"collective #{seq} differs across ranks: {shown} (every rank must make the "
            "same collectives with the same lengths, spec/tp.md R70)"
        )


class RankFailed(CollectiveError):
    """Another rank raised (or died) while this one waited in a collective."""

    def __init__(self, rank: int, why: str) -> None:
        self.rank = rank
        super().__init__(f"rank {rank} failed ({why}); this rank was broken out of its collective")


class GroupBroken(CollectiveError):
    """A collective was asked of a rank whose group broke at an earlier one (`cause`): the
    ranks no longer agree on collective numbers, and a late rank's call would pair with
    another. Close this cache and restart every rank with a new group (spec/tp.md, "A
    collective that never returns")."""

    def __init__(self, what: str, cause: str) -> None:
        self.what, self.cause = what, cause
        super().__init__(
            f"{what} refused: this rank's group broke earlier ({cause}); "
            "close the cache and restart every rank with a new group"
        )


class Collectives(Protocol):
    """What a rank's cache calls to agree with the other ranks (spec/tp.md)."""

    rank: int
    size: int
    log: CollectiveLog

    def all_reduce_min(self, point_name: str, values: Sequence[int]) -> tuple[int, ...]:
        """The element-wise minimum over every rank's `values` (same length on every rank)."""
        ...

    def all_gather(self, point_name: str, values: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        """Every rank's `values`, by rank."""
        ...


class RecordingCollectives(ABC):
    """The shared half of every implementation: check the call, log it, exchange it."""

    def __init__(self, rank: int, size: int) -> None:
        if not isinstance(size, int) or size < 1 or not 0 <= rank < size:
            raise ConfigError(
                "tp", f"rank {rank!r} of size {size!r}: need 0 <= rank < size, size >= 1"
            )
        self.rank, self.size = rank, size
        self.log = CollectiveLog()

    def all_reduce_min(self, point_name: str, values: Sequence[int]) -> tuple[int, ...]:
        entry = self._enter(point_name, "all_reduce_min", values)
        got = self._exchange(entry, tuple(int(v) for v in values))
        return tuple(min(col) for col in zip(*got)) if entry.length else ()

    def all_gather(self, point_name: str, values: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        entry = self._enter(point_name, "all_gather", values)
        return tuple(self._exchange(entry, tuple(int(v) for v in values)))

    def _enter(self, point_name: str, op: str, values: Sequence[int]) -> Entry:
        p = point(point_name)  # ConfigError for a point spec/tp.toml lacks
        # Verify the call is the table's: its op, and int64 values.
        if p.op != op:
            raise ConfigError(
                f"tp.{point_name}", f"is a point of op {p.op} (spec/tp.toml), called as {op}"
            )
        bad = [
            v
            for v in values
            if not isinstance(v, int) or isinstance(v, bool) or not INT64_MIN <= v <= INT64_MAX
        ]
        if bad:
            raise ConfigError(f"tp.{point_name}", f"int64 values only, got {bad[:3]!r}")
        entry = Entry(point_name, op, len(values))
        self.log.add(entry)
        return entry

    @abstractmethod
    def _exchange(self, entry: Entry, values: tuple[int, ...]) -> list[tuple[int, ...]]:
        """Every rank's values for this collective, by rank (the implementation's own)."""


class Guarded:
    """A rank's cache's view of its collectives (`inner`): the first CollectiveError breaks
    them for good (`broken`), and every later call raises GroupBroken before it reaches the
    transport -- a late peer's call would pair with it (spec/tp.md, "A collective that
    never returns"). The transport itself stays usable by its own tests."""

    def __init__(self, inner: Collectives) -> None:
        self.inner = inner
        self.broken: CollectiveError | None = None

    @property
    def rank(self) -> int:
        return self.inner.rank

    @property
    def size(self) -> int:
        return self.inner.size

    @property
    def log(self) -> CollectiveLog:
        return self.inner.log

    def all_reduce_min(self, point_name: str, values: Sequence[int]) -> tuple[int, ...]:
        return self._guard(point_name, lambda: self.inner.all_reduce_min(point_name, values))

    def all_gather(self, point_name: str, values: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        return self._guard(point_name, lambda: self.inner.all_gather(point_name, values))

    def _guard(self, point_name: str, call: Callable[[], T]) -> T:
        if self.broken is not None:
            raise GroupBroken(
                f"collective {point_name}", f"{type(self.broken).__name__}: {self.broken}"
            )
        try:
            return call()
        except CollectiveError as e:
            self.broken = e
            raise


class Alone(RecordingCollectives):
    """A cache of one rank: every collective is its own input (and logged, as anywhere)."""

    def __init__(self) -> None:
        super().__init__(0, 1)

    def _exchange(self, entry: Entry, values: tuple[int, ...]) -> list[tuple[int, ...]]:
        return [values]


__all__ = [
    "Alone",
    "CollectiveError",
    "CollectiveLog",
    "CollectiveMismatch",
    "CollectiveTimeout",
    "Collectives",
    "Entry",
    "GroupBroken",
    "Guarded",
    "RankFailed",
    "RecordingCollectives",
]
