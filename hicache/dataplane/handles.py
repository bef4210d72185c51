"""Transfer handles: what every transfer call returns, on every data plane.

A completion takes effect only when the caller *observes* it by polling: the hardware may have
finished long before. That is what lets the controller -- and the fuzzer -- decide the order in
which completions, failures and cancels reach the control plane.

    status       meaning                                          pages may be
    ---------    ---------------------------------------------    ---------------------------
    PENDING      issued; the hardware may still read/write        touched by hardware: keep
    DONE         every byte arrived (and, for S2H, verified)      published by the caller
    FAILED       the transfer did not complete; `error` says why  released (target), unlocked
    CANCELLED    cancelled; the hardware no longer touches them   released (target), unlocked

An S2H of a pool group may end FAILED with a per-pool report, `landed`: for each pool, how
many of its own pages (a leading run of the target, in the pool's pages) landed before it
stopped. A pool missing from the report landed nothing. The caller publishes at most what
`prefetch_clamp` allows of it and releases the rest (spec/pools.md, F11, F12); `landed` None
(every other failure) means nothing is usable.

A final status is reported only once the hardware no longer reads or writes the transfer's
pages: `cancel` and `fail` quiesce first, and a subclass's `_probe` returns FAILED only when
no part of the transfer still runs. That is what lets the caller release the target and
unlock the source on the status alone (the quiesce rule, R11: spec/lifecycle.md, "Cancel,
fail and live hardware"). A deadline that passes is never taken for quiet (R12): `wait`
returns PENDING then, and nothing may be released on it; a bounded `cancel(timeout_s)` that
finds the hardware still busy raises QuiesceTimeout and leaves the handle PENDING (R79,
spec/faults.md, "Hardware that never goes quiet").
"""

from __future__ import annotations

import enum
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from hicache.core.tiers import Direction
from hicache.errors import HiCacheError, QuiesceTimeout, TransferError


class TransferStatus(str, enum.Enum):
    PENDING = "PENDING"
    DONE = "DONE"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def final(self) -> bool:
        return self is not TransferStatus.PENDING


@dataclass
class TransferTimings:
    """Seconds spent in each stage of one transfer (metrics; the cost model's samples exclude
    `workspace_setup_s`, a one-time cost, see hicache/policy/costmodel.py)."""

    enqueue_s: float = 0.0  # CPU time to issue (index upload, kernel, DMA enqueue), setup excluded
    workspace_setup_s: float = 0.0  # one-time workspace / pinned allocation inside the call
    queue_wait_s: float = 0.0  # I/O: time waiting for a pool thread
    service_s: float = 0.0  # kernel + DMA, or file I/O
    issued_at: float = field(default_factory=time.perf_counter)
    observed_at: float | None = None  # when poll() first returned a final status


@dataclass
class OutcomeCounters:
    """A mover's per-direction counts of issued transfers and how they ended (cumulative);
    `bytes` counts transfers observed DONE. Movers extend it with their own counters."""

    ops: int = 0  # issued (empty transfers included)
    done: int = 0
    failed: int = 0
    cancelled: int = 0
    bytes: int = 0

    def finished(self, status: TransferStatus, nbytes: int) -> None:
        """Count one transfer that turned final with `status` (`nbytes`: its size)."""
        if status is TransferStatus.DONE:
            self.done += 1
            self.bytes += nbytes
        elif status is TransferStatus.FAILED:
            self.failed += 1
        else:
            self.cancelled += 1


class LayerGate(Protocol):
    """What a reader of an H2D's target pages may hold before the transfer ends: `wait(l)`
    before reading layer `l` of them (dataplane/layerwise.py; spec/restore.md, "Layer-wise
    load-back"). Whether the bytes are *valid* is still the handle's end: a reader's work on
    a transfer that ends FAILED or CANCELLED is void."""

    layers: int
    landed_layers: int  # the layers a reader waited for so far

    def wait(self, layer: int) -> None:
        """The current stream reads nothing more until `layer` of every page landed (CUDA: a
        stream wait, no host block; CPU: the layer lands now if it had not)."""


class TransferHandle(ABC):
    """One transfer in flight. Subclasses implement `_probe` and `_quiesce`. `gate`: an H2D's
    `LayerGate` where its mover offers one (None: read the pages only once DONE)."""

    def __init__(self, direction: Direction, nbytes: int) -> None:
        self.direction = direction
        self.nbytes = nbytes
        self.timings = TransferTimings()
        self.error: HiCacheError | None = None
        self.landed: dict[str, int] | None = None  # FAILED S2H: pages each pool landed
        self.gate: LayerGate | None = None
        self._status = TransferStatus.PENDING

    @property
    def status(self) -> TransferStatus:
        """The last *observed* status (does not poll)."""
        return self._status

    def poll(self) -> TransferStatus:
        """Observe the transfer without blocking; a final status, once seen, never changes."""
        if self._status is TransferStatus.PENDING:
            probed = self._probe()
            if probed.final:
                self._finish(probed)
        return self._status

    def wait(self, timeout_s: float | None = None) -> TransferStatus:
        """Poll until final or `timeout_s` passes (None: no limit). Returns the status."""
        deadline = None if timeout_s is None else time.perf_counter() + timeout_s
        while self.poll() is TransferStatus.PENDING:
            if deadline is not None and time.perf_counter() >= deadline:
                break
            self._block(0.0005)
        return self._status

    def fail(self, error: HiCacheError | None = None) -> None:
        """Force failure (fault injection). Waits until the hardware no longer touches the
        pages, then reports FAILED. No effect on a final handle."""
        if self._status.final:
            return
        if not self._quiesce(None):
            raise AssertionError("an unbounded quiesce returned before the hardware was quiet")
        self.error = error or TransferError(f"{self.direction} failed by injection")
        self._finish(TransferStatus.FAILED)

    def cancel(self, timeout_s: float | None = None) -> None:
        """Cancel: waits until the hardware no longer touches the pages, then CANCELLED (R12).
        No effect on a final handle. `timeout_s` bounds the wait (R79) (None: no bound); past it,
        QuiesceTimeout, and the handle stays PENDING: its pages are still the hardware's."""
        if self._status.final:
            return
        if not self._quiesce(timeout_s):
            raise QuiesceTimeout(f"{self.direction} cancel", float(timeout_s or 0.0))
        self._finish(TransferStatus.CANCELLED)

    def _finish(self, status: TransferStatus) -> None:
        assert status.final and not self._status.final, "a handle finishes once"
        self._status = status
        self.timings.observed_at = time.perf_counter()

    @abstractmethod
    def _probe(self) -> TransferStatus:
        """Non-blocking look at the hardware: PENDING, DONE or FAILED (setting `error`)."""

    @abstractmethod
    def _quiesce(self, timeout_s: float | None) -> bool:
        """Block until the hardware no longer reads or writes this transfer's pages, or
        `timeout_s` seconds pass (None: no bound). Whether it is quiet."""

    def _block(self, seconds: float) -> None:
        """Wait a little between polls (subclasses may block on an event instead)."""
        time.sleep(seconds)


class ReadyHandle(TransferHandle):
    """A handle whose work finished synchronously inside the issuing call (CPU paths)."""

    def __init__(
        self, direction: Direction, nbytes: int, error: HiCacheError | None = None
    ) -> None:
        super().__init__(direction, nbytes)
        self._outcome = TransferStatus.FAILED if error is not None else TransferStatus.DONE
        self._error = error

    def _probe(self) -> TransferStatus:
        if self._outcome is TransferStatus.FAILED:
            self.error = self._error
        return self._outcome

    def _quiesce(self, timeout_s: float | None) -> bool:
        return True


class NullHandle(TransferHandle):
    """No bytes: completes when the caller says (`finish`). For model checking and replay.

    `on_wait`: what a blocking wait does while nobody has finished the handle. None: raise
    TransferError (the wait would hang). True/False: finish it done/failed, as if the
    hardware had -- for a controller path that blocks on its own transfer (write-back's
    synchronous D2H), whose outcome a driver can still choose by an aimed fault at issue."""

    def __init__(self, direction: Direction, nbytes: int = 0, on_wait: bool | None = None) -> None:
        super().__init__(direction, nbytes)
        self._outcome = TransferStatus.PENDING
        self.on_wait = on_wait
        self.hung = False  # `hang`: the hardware never goes quiet
        # The plane's content tags (tags.py): told once what arrived, None meaning all of it.
        self.on_land: Callable[[dict[str, int] | None], None] | None = None

    def finish(self, ok: bool = True) -> None:
        """Let the next poll observe success (or failure). Success: the content arrived.
        Ignored while hung (`hang`)."""
        if self.hung:
            return
        if ok and not self.status.final:
            self._land(None)
        self._outcome = TransferStatus.DONE if ok else TransferStatus.FAILED

    def fail(self, error: HiCacheError | None = None) -> None:
        """As `TransferHandle.fail`; an S2H that stopped part way (`landed` set first) lands
        each pool's leading run."""
        if self.landed is not None and not self.status.final:
            self._land(self.landed)
        super().fail(error)

    def _land(self, landed: dict[str, int] | None) -> None:
        on_land, self.on_land = self.on_land, None
        if on_land is not None:
            on_land(landed)

    def hang(self) -> None:
        """Simulate hardware that never goes quiet: every poll reads PENDING, `finish` is
        ignored, and a bounded cancel times out (QuiesceTimeout) until `unhang`."""
        self.hung = True

    def unhang(self) -> None:
        """The hardware went quiet after all (a cancel now succeeds)."""
        self.hung = False

    def _probe(self) -> TransferStatus:
        if self.hung:
            return TransferStatus.PENDING
        if self._outcome is TransferStatus.FAILED and self.error is None:
            self.error = TransferError(f"{self.direction} failed (null data plane)")
        return self._outcome

    def _quiesce(self, timeout_s: float | None) -> bool:
        if not self.hung:
            return True
        if timeout_s is None:
            raise TransferError("an unbounded quiesce of a hung null transfer would never end")
        time.sleep(timeout_s)  # the bound passes, as on hardware that never answers
        return not self.hung

    def _block(self, seconds: float) -> None:
        if self.on_wait is None:
            raise TransferError(
                "waiting on a null-data-plane transfer that nobody finishes would hang"
            )
        self.finish(self.on_wait)


class DelayedHandle(TransferHandle):
    """Another handle whose final status is observed `polls` polls late (the DELAY fault and
    an aimed `delay`): the transfer itself is untouched, only its observation waits.
    `finish(ok)` reaches a wrapped `NullHandle`, so a driver can still end the op."""

    def __init__(self, inner: TransferHandle, polls: int) -> None:
        super().__init__(inner.direction, inner.nbytes)
        self.inner = inner
        self.timings = inner.timings
        self.gate = inner.gate
        self._polls_left = polls

    def finish(self, ok: bool = True) -> None:
        """Forwarded to the wrapped NullHandle; TransferError for a real transfer (the
        hardware ends it, not the caller)."""
        if not isinstance(self.inner, (NullHandle, DelayedHandle)):  # delays may nest
            raise TransferError(
                f"{self.direction}: only a null-data-plane transfer is finished by its caller"
            )
        self.inner.finish(ok)

    def _probe(self) -> TransferStatus:
        status = self.inner.poll()
        if not status.final:
            return status
        if self._polls_left > 0:
            self._polls_left -= 1
            return TransferStatus.PENDING
        self.error, self.landed = self.inner.error, self.inner.landed
        return status

    def _quiesce(self, timeout_s: float | None) -> bool:
        return cancel_within(self.inner, timeout_s)

    def _block(self, seconds: float) -> None:
        if self.inner.status.final:
            return  # only the observation waits: the next poll counts one down
        self.inner.wait(seconds)


# What a driver may `finish(ok)`: a null transfer, possibly observed late (DELAY).
Finishable = (NullHandle, DelayedHandle)


def cancel_within(handle: TransferHandle, timeout_s: float | None) -> bool:
    """Cancel `handle` (a wrapper's inner transfer), waiting at most `timeout_s` (None: no
    bound). Whether the hardware is quiet; on False the handle stays PENDING."""
    try:
        handle.cancel(timeout_s)
    except QuiesceTimeout:
        return False
    return True


def remaining(deadline: float | None) -> float | None:
    """Seconds left until `deadline` (a perf_counter time; None: no bound), never below 0."""
    return None if deadline is None else max(0.0, deadline - time.perf_counter())


def deadline_of(timeout_s: float | None) -> float | None:
    """The perf_counter time `timeout_s` seconds from now (None: no bound)."""
    return None if timeout_s is None else time.perf_counter() + timeout_s


class DeviceEvent(Protocol):
    """What a quiesce needs of a recorded device event (torch.cuda.Event has both)."""

    def synchronize(self) -> None: ...

    def query(self) -> bool: ...


def event_passed(event: DeviceEvent | None, timeout_s: float | None) -> bool:
    """Wait until the device passed `event` (None: nothing was queued), at most `timeout_s`
    seconds (None: no bound). Whether it passed: a queued copy cannot be recalled, only
    waited for."""
    if event is None:
        return True
    if timeout_s is None:
        event.synchronize()
        return True
    deadline = time.perf_counter() + timeout_s
    while not event.query():
        if time.perf_counter() >= deadline:
            return False
        time.sleep(0.0005)
    return True
