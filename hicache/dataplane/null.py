"""The null data plane: the transfer engine's interface with no bytes behind it.

Used for model checking, trace replay and fuzzing where only the control plane matters: every
transfer returns a `NullHandle` that stays PENDING until the caller (the fuzzer, a replayed
trace) calls `finish(ok)` on it, in any order it likes (R58: every order must leave the cache
consistent, which the fuzz holds it to); `.handles` keeps them in issue order. There are no bytes
(`has_bytes` is False), but each page carries a content tag (tags.py) that moves as its
bytes would, and `digests` returns the tags: the invariants that compare content run here.

`ScriptedEngine` decides each outcome at issue by a script (the default: every transfer
completes on the next poll), for drivers that care about some ops only.

Page arguments are checked exactly as the real engine checks them (`transfer_pages`, shared
by both), so a controller driven by either plane meets the same errors: it never branches on
which plane it holds. Imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from hicache.core.pages import Pages
from hicache.core.tiers import Direction, Tier
from hicache.dataplane.faults import FaultInjector, FaultSite
from hicache.dataplane.geometry import KVGeometry
from hicache.dataplane.handles import DelayedHandle, NullHandle, TransferHandle
from hicache.dataplane.tags import ContentTags
from hicache.dataplane.taskgroup import IO_THREADS
from hicache.errors import (
    ConfigError,
    CorruptSlot,
    HiCacheError,
    InvalidPages,
    TransferError,
    UnreadableSlot,
)

SMALL_PAGES = 64  # page arrays up to this size are checked on a Python list (cheaper there)


def page_array(field: str | Callable[[], str], values: object, capacity: int) -> Pages:
    """`values` as a 1-D int64 array of pages in [0, capacity); InvalidPages naming `field`
    otherwise (non-integer values are refused, not truncated). `field` may be a callable that
    names it: called only for the error (transfers issue in a hot loop)."""
    arr = np.asarray(values)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":  # signed or unsigned integers
        raise InvalidPages(
            _named(field), f"expected a 1-D integer array, got {arr.dtype} of shape {arr.shape}"
        )
    ids = arr.astype(np.int64, copy=False)
    if ids.size <= SMALL_PAGES:  # a list's min/max beat numpy's fixed costs on short arrays
        xs = ids.tolist()
        low, high = min(xs), max(xs)
    else:
        low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= capacity:
        raise InvalidPages(
            _named(field), f"pages must lie in [0, {capacity}), got values in [{low}, {high}]"
        )
    return ids


def digest_pages(tier: str, values: object, capacity: Mapping[Tier, int]) -> tuple[Tier, Pages]:
    """A byte plane's `digests(tier, pages)` arguments checked: `tier` one of "L1", "L2",
    "L3" and `values` pages of that tier (`page_array`); InvalidPages naming `digests.tier`
    or `digests.<tier>_pages` otherwise."""
    if tier not in (Tier.L1.value, Tier.L2.value, Tier.L3.value):
        raise InvalidPages("digests.tier", f"one of L1, L2, L3, got {tier!r}")
    which = Tier(tier)
    return which, page_array(f"digests.{which}_pages", values, capacity[which])


def _named(field: str | Callable[[], str]) -> str:
    return field if isinstance(field, str) else field()


def transfer_pages(
    direction: Direction, source: object, target: object, source_capacity: int, target_capacity: int
) -> tuple[Pages, Pages]:
    """Validated (source, target) page arrays for one transfer, source[i] -> target[i].

    Targets must be distinct (two copies landing on one page race); sources may repeat.
    Raises InvalidPages (a ValueError) with nothing issued.
    """

    def src_field() -> str:
        return f"{direction}.{direction.source}_pages"

    def dst_field() -> str:
        return f"{direction}.{direction.target}_pages"

    src = page_array(src_field, source, source_capacity)
    dst = page_array(dst_field, target, target_capacity)
    if src.size != dst.size:
        raise InvalidPages(dst_field(), f"{dst.size} target pages for {src.size} source pages")
    if _has_repeat(dst):
        raise InvalidPages(dst_field(), "a target page is named twice")
    return src, dst


def _has_repeat(ids: Pages) -> bool:
    """True when some value of `ids` occurs twice: a set of a short list, else sort, then
    compare neighbours.

    Exact, like `np.unique`, but 5x (22 pages) to 15x (4,096 pages) cheaper on this machine,
    and unlike a bitmap over the tier its cost does not grow with the capacity (L3 slots).
    """
    if ids.size <= SMALL_PAGES:
        return len(set(ids.tolist())) < ids.size
    ordered = np.sort(ids)
    return bool((ordered[1:] == ordered[:-1]).any())


def check_capacities(l1_pages: object, l2_pages: object, l3_slots: object) -> None:
    """ConfigError naming the first non-positive (or non-integer) tier size."""
    for field, value in (("l1_pages", l1_pages), ("l2_pages", l2_pages), ("l3_slots", l3_slots)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(
                field, f"must be a positive number of pages (at least one), got {value!r}"
            )


class NullEngine:
    """The byte-free twin of `TransferEngine`: same constructor, same methods.

    `device`, `l3_path`, `l3_overwrite`, `backend` and `io_threads` are accepted and ignored
    (a null plane has no device, file or kernels). Failures are the caller's `finish(False)`,
    or `faults`' sites drawn when a transfer is issued (faults.py, `SITES`: the null plane
    reaches every site but the DMA workspace's and SHORT_WRITE): a site that fires makes the
    handle FAILED at once, with the error the real plane would report; DELAY wraps it in a
    `DelayedHandle`. `on_wait`: how a blocking wait ends a transfer nobody finished (True:
    done, the default; False: failed; None: TransferError) -- the controller blocks only on
    write-back's D2H and in `drain`. A slot marked corrupt (CORRUPT_SLOT on a write, or
    `corrupt_slot`) fails every S2H that reads it with CorruptSlot until an H2S rewrites it.
    S2H_PARTIAL fails an S2H with a per-pool `landed` report (`FaultInjector.landing`) over the
    pools `bind_pools` named (none until then: the report is empty, so nothing is usable).

    No bytes, but content tags (tags.py): each anchor page's tag says where its content came
    from (fresh at a transfer's issue, a hash of the tokens at `computed`, copied when a
    transfer lands), and `digests` returns them, so I4 runs on this plane too.
    """

    has_bytes = False

    def __init__(
        self,
        geometry: KVGeometry,
        l1_pages: int,
        l2_pages: int,
        l3_slots: int,
        *,
        device: str | None = None,
        l3_path: str | None = None,
        backend: str = "auto",
        io_threads: int = IO_THREADS,
        faults: FaultInjector | None = None,
        l3_overwrite: bool = False,
        on_wait: bool | None = True,
    ) -> None:
        check_capacities(l1_pages, l2_pages, l3_slots)
        self.geometry = geometry
        self.capacity = {Tier.L1: l1_pages, Tier.L2: l2_pages, Tier.L3: l3_slots}
        self.handles: list[NullHandle] = []
        self.faults = faults
        self.on_wait = on_wait  # a blocking wait on an unfinished transfer ends it so (NullHandle)
        # Directions whose transfers never go quiet once issued (`NullHandle.hang`): hardware
        # that never completes, for the bounded waits of spec/faults.md.
        self.hang_issued: set[Direction] = set()
        self.corrupt: set[int] = set()  # slots whose bytes would fail their checksum
        self.pools: dict[str, int] = {}  # pool -> its pages per anchor page (`bind_pools`)
        self.tags = ContentTags(self.capacity, geometry.page_size)

    def bind_pools(self, ratios: Mapping[str, int], anchor: str) -> None:
        """The tiers' pools (each with its pages per anchor page), `anchor` among them: what
        an S2H's per-pool landing report (S2H_PARTIAL) names, and by which such an S2H's
        content tags land. The controller binds its group's backed-up pools."""
        if ratios.get(anchor) != 1:
            raise ConfigError(
                "pools",
                f"the anchor {anchor!r} must be a bound pool of one page "
                f"per anchor page, got {dict(ratios)}",
            )
        self.pools = dict(ratios)
        self.tags.ratios = dict(ratios)

    def landing(self, faults: FaultInjector, anchor_pages: int) -> dict[str, int]:
        """S2H_PARTIAL's report for an S2H of `anchor_pages` pages, over the bound pools."""
        return faults.landing({pool: anchor_pages * r for pool, r in self.pools.items()})

    @property
    def l3_path(self) -> str:
        """There is no L3 file; errors name this instead."""
        return "<null>"

    def d2h(self, l1_pages: Pages, l2_pages: Pages, *, after: object = None) -> TransferHandle:
        return self._issue(Direction.D2H, l1_pages, l2_pages)

    def h2d(self, l2_pages: Pages, l1_pages: Pages, *, after: object = None) -> TransferHandle:
        return self._issue(Direction.H2D, l2_pages, l1_pages)

    def h2s(self, l2_pages: Pages, slots: Pages) -> TransferHandle:
        return self._issue(Direction.H2S, l2_pages, slots)

    def s2h(self, slots: Pages, l2_pages: Pages) -> TransferHandle:
        return self._issue(Direction.S2H, slots, l2_pages)

    def corrupt_slot(self, slot: int) -> None:
        """Mark one L3 slot corrupt (an aimed `corrupt`): the next S2H reading it fails."""
        page_array("corrupt_slot.slot", [slot], self.capacity[Tier.L3])
        self.corrupt.add(int(slot))

    def pending(self) -> list[NullHandle]:
        """Handles not yet observed final, in issue order (what a fuzzer may finish next)."""
        return [h for h in self.handles if not h.status.final]

    def computed(self, tokens: Sequence[int], start: int, end: int, l1_pages: Pages) -> None:
        """Tokens `[start, end)` of `tokens` (page-aligned) were computed into `l1_pages`:
        what a producer would write on a plane with bytes (their content tags)."""
        self.tags.compute(
            tokens, start, end, page_array("computed.l1_pages", l1_pages, self.capacity[Tier.L1])
        )

    def digests(self, tier: str, pages: Pages) -> npt.NDArray[np.uint64]:
        """The content tags of `pages` of `tier` (one uint64 per page, tags.py); an L3 slot
        a read would fail on: UNSERVABLE."""
        t, p = digest_pages(tier, pages, self.capacity)
        return self.tags.digests(t, p, self.unservable())

    def unservable(self) -> set[int]:
        """The L3 slots a read fails on (marked corrupt)."""
        return set(self.corrupt)

    def _tagged(self, handle: NullHandle, direction: Direction, src: Pages, dst: Pages) -> None:
        """The transfer's targets are reserved (fresh tags); its handle, when it lands, copies
        the tags of what it read."""
        self.tags.reserve(direction.target, dst)
        handle.on_land = self.tags.lander(direction, src, dst)

    def status(self) -> dict[str, object]:
        return {"data_plane": "null", "issued": len(self.handles), "pending": len(self.pending())}

    def close(self) -> None:
        """Cancel what is still pending (nothing touches bytes, so this cannot block)."""
        for h in self.pending():
            h.cancel()

    def _issue(self, direction: Direction, source: Pages, target: Pages) -> TransferHandle:
        src, dst = transfer_pages(
            direction,
            source,
            target,
            self.capacity[direction.source],
            self.capacity[direction.target],
        )
        handle = NullHandle(direction, int(src.size) * self.geometry.bytes_per_page, self.on_wait)
        if direction in self.hang_issued:
            handle.hang()
        self._tagged(handle, direction, src, dst)
        self.handles.append(handle)
        if direction is Direction.H2S:
            self.corrupt.difference_update(dst.tolist())  # rewritten (corrupt again if it fires)
        error = self._fault(direction, src, dst)
        if error is not None:
            if isinstance(error, StoppedEarly):
                assert self.faults is not None  # Verify: only a drawn site stops an S2H early.
                handle.landed = self.landing(self.faults, int(src.size))
            handle.fail(error)
        if self.faults is not None and self.faults.fire(FaultSite.DELAY):
            return DelayedHandle(handle, self.faults.delay_polls)
        return handle

    def _fault(self, direction: Direction, src: Pages, dst: Pages) -> HiCacheError | None:
        """The error a transfer meets (drawn now, in issue order), or None."""
        slots = src.tolist() if direction is Direction.S2H else []
        bad = [s for s in slots if s in self.corrupt]
        if bad:
            return CorruptSlot(bad[0], self.l3_path)
        f = self.faults
        if f is None:
            return None
        if direction in (Direction.D2H, Direction.H2D):
            site = FaultSite.D2H_COMPLETE if direction is Direction.D2H else FaultSite.H2D_COMPLETE
            return (
                TransferError(f"{direction}: completion failed ({site.value} injected)")
                if f.fire(site)
                else None
            )
        if direction is Direction.S2H:
            if f.fire(FaultSite.IO_EIO) or f.fire(FaultSite.SHORT_READ):
                return UnreadableSlot(
                    tuple(slots), self.l3_path, "injected EIO or persistent short read"
                )
            return StoppedEarly() if f.fire(FaultSite.S2H_PARTIAL) else None
        if f.fire(FaultSite.IO_EIO) or f.fire(FaultSite.IO_ENOSPC):
            return TransferError(f"{direction}: injected EIO or ENOSPC; release the target slots")
        self.corrupt.update(s for s in dst.tolist() if f.fire(FaultSite.CORRUPT_SLOT))
        return None


class StoppedEarly(TransferError):
    """An S2H that stopped after part of each pool landed (S2H_PARTIAL); its handle's
    `landed` says how much of each pool did."""

    def __init__(self) -> None:
        super().__init__(
            "S2H stopped early (S2H_PARTIAL injected): publish the clamp of what "
            "landed (`landed`), release the rest"
        )


# Decides a transfer's outcome when it is issued: True (done), False (failed), or None (left
# PENDING for the driver to `finish`).
Script = Callable[[Direction, int], "bool | None"]


class ScriptedEngine(NullEngine):
    """A null plane whose outcomes a script decides at issue: `script(direction, index)`,
    `index` counting this engine's transfers from 0. The default completes everything on the
    next poll (the fastest way to drive the controller when no op matters). The outcome is
    set before any fault is drawn, so a fired fault still fails the transfer."""

    def __init__(
        self,
        geometry: KVGeometry,
        l1_pages: int,
        l2_pages: int,
        l3_slots: int,
        *,
        script: Script | None = None,
        faults: FaultInjector | None = None,
    ) -> None:
        super().__init__(geometry, l1_pages, l2_pages, l3_slots, faults=faults)
        self.script: Script = script or (lambda direction, index: True)

    def _issue(self, direction: Direction, source: Pages, target: Pages) -> TransferHandle:
        outcome = self.script(direction, len(self.handles))
        handle = super()._issue(direction, source, target)
        inner = self.handles[-1]
        if outcome is not None and not inner.status.final:
            inner.finish(outcome)
        return handle
