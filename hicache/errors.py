"""Typed errors. Every error says what was wrong and what to do about it.

All errors derive from `HiCacheError`, so an engine can catch the whole family at one
boundary. A rejected operation leaves every piece of state as it was (spec/README.md,
"Invalid input means raise, state unchanged").
"""

from __future__ import annotations


class HiCacheError(Exception):
    """Base of every error hicache raises on purpose. An operation that raises one changed
    nothing (R4): it checked every precondition first.

    Every one pickles with its fields, whatever its constructor takes, so an error raised in
    another process (a tensor-parallel rank) reaches the launcher as itself."""

    def __reduce__(self) -> tuple[object, ...]:
        return _rebuilt, (type(self), self.args, self.__dict__)


def _rebuilt(
    cls: type[HiCacheError], args: tuple[object, ...], fields: dict[str, object]
) -> HiCacheError:
    """`cls`'s error with `args` and `fields`, its constructor not called (unpickling)."""
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(fields)
    return error


class ConfigError(HiCacheError, ValueError):
    """Invalid configuration; raised at construction. The message names the field."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        super().__init__(f"{field}: {problem}")


class SpecError(HiCacheError):
    """The spec tables are malformed or disagree with the prose, diagrams or machine."""


class IllegalTransition(HiCacheError):
    """A lifecycle transition was asked for from a state that does not allow it.

    Raised before any state is touched: the caller's state is unchanged.
    """

    def __init__(self, event: str, tier: str, state: str, why: str) -> None:
        self.event = event
        self.tier = tier
        self.state = state
        self.why = why
        super().__init__(f"illegal transition {event!r} on tier {tier} from {state}: {why}")


class OutOfPages(HiCacheError):
    """A tier cannot supply the pages asked for. Evict, or retry smaller."""

    def __init__(self, tier: str, wanted: int, free: int) -> None:
        self.tier = tier
        self.wanted = wanted
        self.free = free
        super().__init__(
            f"{tier}: wanted {wanted} pages, {free} free; evict from {tier} or ask for fewer"
        )


class ReservationAborted(OutOfPages):
    """A tensor-parallel issue some rank could not reserve (spec/tp.md C2): every rank released
    what it reserved and raises this, so each falls back alike. `cause` is this rank's own
    error (None: its reservation succeeded; another rank's failed)."""

    def __init__(self, tier: str, wanted: int, free: int, cause: HiCacheError | None) -> None:
        super().__init__(tier, wanted, free)
        self.cause = cause
        why = f"this rank: {cause}" if cause is not None else "another rank's reservation failed"
        self.args = (
            f"{tier}: the ranks did not all reserve {wanted} pages ({why}); every rank "
            "released them (C2, R72)",
        )


class InvariantViolation(HiCacheError):
    """An ownership invariant or structural check failed; carries every violation found and
    the transition after which it was found (`context`). The control plane that raised it is
    poisoned from then on (`PlanePoisoned`)."""

    def __init__(self, violations: tuple[object, ...], context: str = "") -> None:
        self.violations = violations
        self.context = context
        head = "; ".join(str(v) for v in violations[:3])
        more = f" (+{len(violations) - 3} more)" if len(violations) > 3 else ""
        where = f" after {context}" if context else ""
        super().__init__(f"{len(violations)} invariant violation(s){where}: {head}{more}")


class PlanePoisoned(HiCacheError):
    """A control plane refused `attempted` because an earlier transition broke an invariant
    (`cause`): its records disagree, so no transition on it can be validated any more
    (spec/invariants.md, "A poisoned plane"). Nothing was changed. Still allowed: `snapshot()`,
    the tree's read-only queries, reading the trace. What to do: find the cause from those,
    quiesce the data plane's transfer handles directly, and start a new control plane."""

    def __init__(self, attempted: str, cause: InvariantViolation) -> None:
        self.attempted = attempted
        self.cause = cause
        after = f" after {cause.context}" if cause.context else ""
        first = f": {cause.violations[0]}" if cause.violations else ""
        super().__init__(
            f"{attempted} refused, nothing changed: the control plane is poisoned since "
            f"{len(cause.violations)} invariant violation(s){after}{first}. Read snapshot() and "
            "the trace to find the cause, cancel in-flight transfer handles on the data plane, "
            "then start over with a new control plane (R59)"
        )


class TransferError(HiCacheError):
    """A transfer failed (device, DMA or I/O). The op's private pages may be released."""


class QuiesceTimeout(HiCacheError):
    """A cancel waited `timeout_s` seconds and the hardware still read or wrote the
    transfer's pages (a DMA or an I/O that never reports its end). Not a TransferError: its
    pages may NOT be released. The transfer stays in flight (target pages private, source
    locked); the controller refuses every operation but `close`, which leaks those pages
    (`CacheController.leaked`) and keeps the data plane, L3 file included, open until
    `hicache.dataplane.leaks.reclaim()` finds the hardware quiet (spec/faults.md, "Hardware
    that never goes quiet")."""

    def __init__(self, what: str, timeout_s: float) -> None:
        self.what = what
        self.timeout_s = timeout_s
        super().__init__(
            f"{what}: the hardware still touches its pages {timeout_s} s after the cancel "
            "(quiesce_timeout_s); close the controller: its pages stay leaked, and its data "
            "plane and L3 file open, until hicache.dataplane.leaks.reclaim() finds them quiet"
        )


class StorageError(HiCacheError):
    """The L3 file cannot be used (unwritable, no space, replaced under us). Names the path."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        super().__init__(f"L3 file {path}: {problem}")


class L3PathRefused(StorageError):
    """An existing path that L3 will not take over: a symlink, not a regular file, a
    regular file that is not a hicache L3 file, or one in use (`L3InUse`). It was left
    exactly as it was (bytes, mode, a symlink's target). `reason` follows "the path ...";
    `overwrite_helps`: the explicit overwrite flag would let L3 replace it (never for a
    symlink, a non-regular file or a file in use)."""

    def __init__(self, path: str, reason: str, *, overwrite_helps: bool) -> None:
        self.reason = reason
        self.overwrite_helps = overwrite_helps
        todo = "choose another path"
        if overwrite_helps:
            todo += ", or set the overwrite flag (CacheConfig.l3_overwrite) to replace it"
        super().__init__(path, f"{reason}; refused, nothing was changed: {todo}")


class L3InUse(L3PathRefused):
    """The path names an L3 file another open `L3File` holds: a live controller, in this
    process or another, uses it (its advisory lock, held for the file's life, spec/l3.md
    "Opening a path"). Taking it over would truncate that controller's slots under it, so it
    is refused before anything changes, even with the overwrite flag."""

    def __init__(self, path: str) -> None:
        super().__init__(
            path,
            "is in use: another open L3 file (a live controller, in this process or another) "
            "holds its lock; close that controller first (R51)",
            overwrite_helps=False,
        )


class CorruptSlot(HiCacheError):
    """An L3 slot failed its checksum. Treated as a miss, never served; the controller drops
    the L3 copy that held it (`invalidate_l3`)."""

    def __init__(self, slot: int, path: str) -> None:
        self.slot = slot
        self.slots = (slot,)
        self.path = path
        super().__init__(f"L3 slot {slot} in {path} failed its checksum; treat as a miss (R53)")


class UnreadableSlot(TransferError):
    """L3 slots could not be read whole (an I/O error, or the file ends before them: truncated
    under us). Like a corrupt slot: a miss, never served, and the L3 copy that held them is
    dropped -- a slot that failed once is not read again for every later request."""

    def __init__(self, slots: tuple[int, ...], path: str, why: str) -> None:
        self.slot = slots[0]
        self.slots = slots
        self.path = path
        super().__init__(
            f"L3 slots {slots[0]}..{slots[-1]} in {path} cannot be read: {why}; treat as a miss"
        )


class RestorePending(HiCacheError):
    """`prefill` was called before the request's restore settled: tick (or wait) until
    `ready(request_id)` is true, then prefill."""

    def __init__(self, request_id: int) -> None:
        self.request_id = request_id
        super().__init__(f"request {request_id}: its restore has not settled; tick until ready()")


class RequestTooLarge(HiCacheError, ValueError):
    """A prompt needs more L1 pages than L1 has: its KV must sit in L1 whole, so it can never
    be served. Raised by `admit` before anything changes."""

    def __init__(self, request_id: int, tokens: int, pages_needed: int, l1_pages: int) -> None:
        super().__init__(
            f"request {request_id} has {tokens} prompt tokens ({pages_needed} pages) but L1 holds "
            f"{l1_pages} pages; give L1 at least {pages_needed} pages (l1_pages) or shorten it"
        )


class BackendError(HiCacheError):
    """An explicitly requested kernel backend cannot run here (e.g. Triton failed to compile)."""


class TreeError(HiCacheError):
    """The HiRadixTree was misused (unaligned split, unknown or removed node, duplicate child,
    negative lock, value of the wrong length). Nothing was changed; fix the caller."""


class LayoutError(HiCacheError, ValueError):
    """A tensor handed to a data-plane kernel has the wrong shape, dtype, device or memory
    layout. Nothing was enqueued; the message names the tensor and what it must be."""


class PolicyError(HiCacheError, ValueError):
    """The cost model, a policy or the decision log was misused (negative size or seconds,
    unknown cost kind or tier, hit length outside the prompt, unknown or already settled
    decision id). Nothing was changed; fix the caller."""


class InvalidPages(HiCacheError, ValueError):
    """A transfer named pages it cannot move: out of the tier's range, a target page named
    twice, or source and target lists of different lengths. Nothing was issued."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        super().__init__(f"{field}: {problem}")


class ProducerError(HiCacheError, ValueError):
    """A KV producer was asked for a range, pages or an L1 tensor that do not fit its geometry
    (unaligned or empty range, page count not matching the range, page out of range or used
    twice, L1 of the wrong shape, dtype or device). Nothing was written; fix the caller."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        super().__init__(f"{field}: {problem}")


class NoAllocator(HiCacheError):
    """A pool without a free list (a sidecar or state pool, spec/pools.md) was asked to
    allocate, free or report its free pages. Its indices are its source pool's: ask the
    source (`source`). Nothing was changed."""

    def __init__(self, pool: str, operation: str, source: str) -> None:
        self.pool = pool
        self.operation = operation
        self.source = source
        super().__init__(
            f"pool {pool!r} has no allocator ({operation} refused); it uses {source!r}'s "
            f"indices: {operation} on {source!r} instead (R62)"
        )
