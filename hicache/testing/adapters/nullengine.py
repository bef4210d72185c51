"""A null data plane whose faults follow a `FaultInjector`: what the machine's null plane runs.

`hicache.dataplane.null.NullEngine` completes a transfer only when its caller says so. This
subclass adds the fault sites of the real plane at the points where that plane meets them, so
one schedule means the same on both planes:

    site                          where it fires here              the transfer then
    ----------------------------  -------------------------------  --------------------------
    DEVICE_ALLOC, PINNED_ALLOC    issue of a D2H or H2D            TransferError at issue
    D2H_COMPLETE, H2D_COMPLETE    `settle(ok=True)` of D2H / H2D   FAILED
    IO_EIO, SHORT_WRITE,          `settle(ok=True)` of an H2S      FAILED
    IO_ENOSPC
    IO_EIO, SHORT_READ            `settle(ok=True)` of an S2H      FAILED (UnreadableSlot)
    CORRUPT_SLOT                  `settle(ok=True)` of an S2H      FAILED (CorruptSlot)
    S2H_PARTIAL                   `settle(ok=True)` of an S2H      FAILED, with `landed` (the
                                                                   pages each pool landed)
    DELAY                         `settle(ok=True)`                observed one poll later
    (aimed `corrupt`)             `settle(ok=True)` of an S2H of   FAILED (CorruptSlot), until
                                  the slot                         an H2S writes the slot again

L3 file damage (`damage`), the null plane's equivalent of a file cut or removed underneath:

    damage     the real plane                        here
    ---------  ------------------------------------  ---------------------------------------
    truncate   a read of a slot past the cut is      every slot is unreadable (an S2H of it
               short (UnreadableSlot)                FAILS, UnreadableSlot) until an H2S
                                                     writes it again
    remove     the next L3 transfer's issue raises   the same: StorageError at the issue of
               StorageError (L3 goes offline)        every H2S and S2H from then on

A failure the machine aims at one op (`settle(False, kind)`) counts as the site that would
have failed it (`TARGETED`): D2H/H2D any kind -> *_COMPLETE; S2H error/corrupt/unreadable ->
IO_EIO/CORRUPT_SLOT/SHORT_READ; H2S -> IO_EIO/IO_ENOSPC/SHORT_WRITE.

A controller that waits on a transfer (write-back's D2H) settles it as if the machine had said
"complete" (`_block`), so a wait never hangs.
"""

from __future__ import annotations

from hicache.core.pages import Pages
from hicache.core.tiers import Direction, Tier
from hicache.dataplane.faults import FaultInjector, FaultSite
from hicache.dataplane.geometry import KVGeometry
from hicache.dataplane.handles import NullHandle, TransferHandle, TransferStatus
from hicache.dataplane.null import NullEngine, StoppedEarly, transfer_pages
from hicache.errors import (
    ConfigError,
    CorruptSlot,
    HiCacheError,
    StorageError,
    TransferError,
    UnreadableSlot,
)

L3_PATH = "<null L3>"
COMPLETE_SITES: dict[Direction, tuple[FaultSite, ...]] = {
    Direction.D2H: (FaultSite.D2H_COMPLETE,),
    Direction.H2D: (FaultSite.H2D_COMPLETE,),
    Direction.H2S: (FaultSite.IO_EIO, FaultSite.IO_ENOSPC, FaultSite.SHORT_WRITE),
    Direction.S2H: (FaultSite.IO_EIO, FaultSite.SHORT_READ, FaultSite.CORRUPT_SLOT),
}

TARGETED: dict[Direction, dict[str, FaultSite]] = {
    Direction.D2H: {"error": FaultSite.D2H_COMPLETE},
    Direction.H2D: {"error": FaultSite.H2D_COMPLETE},
    Direction.H2S: {
        "error": FaultSite.IO_EIO,
        "corrupt": FaultSite.IO_ENOSPC,
        "unreadable": FaultSite.SHORT_WRITE,
    },
    Direction.S2H: {
        "error": FaultSite.IO_EIO,
        "corrupt": FaultSite.CORRUPT_SLOT,
        "unreadable": FaultSite.SHORT_READ,
    },
}
"""`settle(False, kind)`: the fault site a failure of that kind, aimed at one op, stands for."""


class FaultyNullHandle(NullHandle):
    """A null handle that knows its source pages (an S2H failure names a slot)."""

    def __init__(
        self, engine: FaultyNullEngine, direction: Direction, nbytes: int, source: Pages
    ) -> None:
        super().__init__(direction, nbytes)
        self.engine = engine
        self.source = source
        self.delay_polls = 0

    def settle(self, ok: bool, kind: str = "error") -> None:
        """End the transfer: `ok` lets the fault schedule decide; otherwise fail with `kind`
        ("error", "corrupt", "unreadable"). Observed on the next poll."""
        if self.status.final:
            return
        if not ok:
            site = TARGETED[self.direction].get(kind, TARGETED[self.direction]["error"])
            # This op's fault: the site that fails it fired, for this op only.
            self.engine.injector.fired[site] = self.engine.injector.fired.get(site, 0) + 1
            self.fail(self.engine.error_for(self, kind))
            return
        if self.direction is Direction.S2H and self._read_bad_slot():
            return
        for site in COMPLETE_SITES[self.direction]:
            if self.engine.injector.fire(site):
                kind = {FaultSite.CORRUPT_SLOT: "corrupt", FaultSite.SHORT_READ: "unreadable"}.get(
                    site, "error"
                )
                self.fail(self.engine.error_for(self, kind))
                return
        if self.direction is Direction.S2H and self.engine.injector.fire(FaultSite.S2H_PARTIAL):
            self.landed = self.engine.landing(self.engine.injector, int(self.source.size))
            self.fail(StoppedEarly())
            return
        if self.engine.injector.fire(FaultSite.DELAY):
            self.delay_polls = 1
        self.finish(True)

    def _read_bad_slot(self) -> bool:
        """An S2H of a slot marked corrupt (an aimed `corrupt`) or past a cut fails so."""
        slots = [int(s) for s in self.source]
        corrupt = [s for s in slots if s in self.engine.corrupt]
        unreadable = [s for s in slots if s in self.engine.unreadable]
        if corrupt:
            self.fail(CorruptSlot(corrupt[0], L3_PATH))
        elif unreadable:
            self.fail(
                UnreadableSlot(tuple(unreadable), L3_PATH, "the L3 file was cut under the cache")
            )
        return bool(corrupt or unreadable)

    def _probe(self) -> TransferStatus:
        if self.delay_polls > 0:
            self.delay_polls -= 1
            return TransferStatus.PENDING
        return super()._probe()

    def _block(self, seconds: float) -> None:
        if self._outcome is TransferStatus.PENDING:
            self.settle(True)


class FaultyNullEngine(NullEngine):
    """`NullEngine` with the fault sites of the module docstring."""

    def __init__(
        self,
        geometry: KVGeometry,
        l1_pages: int,
        l2_pages: int,
        l3_slots: int,
        faults: FaultInjector,
    ) -> None:
        # The base plane draws no faults (its `faults` stays None): this plane draws them where
        # the machine wants them, from `injector`.
        super().__init__(geometry, l1_pages, l2_pages, l3_slots, faults=None)
        self.injector = faults
        self.unreadable: set[int] = set()  # slots past a cut (`damage("truncate")`)
        self.lost = False  # the L3 file was removed (`damage("remove")`)

    def damage(self, how: str) -> None:
        """The L3 file is cut ("truncate": every slot reads short until written again) or
        removed ("remove": every L3 transfer is refused at issue). ConfigError otherwise."""
        if how == "truncate":
            self.unreadable = set(range(self.capacity[Tier.L3]))
        elif how == "remove":
            self.lost = True
        else:
            raise ConfigError("damage", f"'truncate' or 'remove', got {how!r}")

    def unservable(self) -> set[int]:
        """The L3 slots a read fails on: marked corrupt, or past a cut."""
        return self.corrupt | self.unreadable

    def error_for(self, handle: FaultyNullHandle, kind: str) -> HiCacheError:
        if handle.direction is Direction.S2H and kind == "corrupt" and handle.source.size:
            return CorruptSlot(int(handle.source[0]), L3_PATH)
        if handle.direction is Direction.S2H and kind == "unreadable" and handle.source.size:
            slots = tuple(int(s) for s in handle.source)
            return UnreadableSlot(slots, L3_PATH, "injected on the null plane")
        return TransferError(f"{handle.direction} failed (injected on the null plane)")

    def _issue(self, direction: Direction, source: Pages, target: Pages) -> TransferHandle:
        src, dst = transfer_pages(
            direction,
            source,
            target,
            self.capacity[direction.source],
            self.capacity[direction.target],
        )
        if self.lost and direction in (Direction.H2S, Direction.S2H):
            raise StorageError(L3_PATH, "removed under us; its slots are lost")
        if direction is Direction.H2S:
            self.unreadable.difference_update(dst.tolist())  # written again
            self.corrupt.difference_update(dst.tolist())
        if direction in (Direction.D2H, Direction.H2D):
            for site in (FaultSite.DEVICE_ALLOC, FaultSite.PINNED_ALLOC):
                if self.injector.fire(site):
                    raise TransferError(f"cannot allocate a workspace ({site.value} injected)")
        handle = FaultyNullHandle(
            self, direction, int(src.size) * self.geometry.bytes_per_page, src
        )
        self._tagged(handle, direction, src, dst)
        self.handles.append(handle)
        return handle
