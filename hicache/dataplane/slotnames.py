"""A group L3 transfer whose slot errors name anchor slots.

The controller's tree holds *anchor* slots; a group H2S/S2H moves each pool's own slots (a
side pool's differ from the anchor's). When a part fails with `CorruptSlot` or
`UnreadableSlot`, the controller drops the L3 copies that hold the named slots -- so the
error must name the anchor slot the failed pool slot belongs to, or the controller would drop
the wrong node and keep serving the bad one. Everything else (status, timings, cancel) is the
inner `GroupStorageHandle`'s.

    pool slots of source s   p0 p1 | p2 p3      (ratio 2)
    anchor slots             a0    | a1         pool slot position i -> anchor position i // 2
"""

from __future__ import annotations

from collections.abc import Mapping

from hicache.core.pages import Pages
from hicache.dataplane.groupgeometry import GroupGeometry
from hicache.dataplane.groupstorage import GroupStorageHandle
from hicache.dataplane.handles import TransferHandle, TransferStatus, cancel_within
from hicache.errors import CorruptSlot, HiCacheError, UnreadableSlot


class AnchorSlotHandle(TransferHandle):
    """`inner` with slot errors renamed; `request[source]` = (source, target) pages as issued,
    the slots being the target (`target=True`, H2S) or the source (S2H)."""

    def __init__(
        self,
        inner: GroupStorageHandle,
        geometry: GroupGeometry,
        request: Mapping[str, tuple[Pages, Pages]],
        ratios: Mapping[str, int],
        *,
        target: bool,
    ) -> None:
        super().__init__(inner.direction, inner.nbytes)
        self.inner = inner
        self.timings = inner.timings
        anchor = geometry.group.anchor.name
        side = 1 if target else 0
        anchors = request[anchor][side].tolist()
        self._anchor_of: dict[str, dict[int, int]] = {
            source: {
                int(s): anchors[i // ratios[source]] for i, s in enumerate(pair[side].tolist())
            }
            for source, pair in request.items()
        }
        self._source = {p.name: p.source for p in geometry.pools}

    def _probe(self) -> TransferStatus:
        status = self.inner.poll()
        if status.final:
            self._time_parts()
        if status is TransferStatus.FAILED:
            self.error = self._renamed()
        return status

    def _time_parts(self) -> None:
        """The group's timings from its parts': issue time adds up, the parts' I/O overlaps
        (each pool's file has its own threads), so waiting and service are the longest."""
        parts = [p.timings for p in self.inner.parts.values()]
        if parts:
            self.timings.enqueue_s = sum(t.enqueue_s for t in parts)
            self.timings.queue_wait_s = max(t.queue_wait_s for t in parts)
            self.timings.service_s = max(t.service_s for t in parts)

    def _renamed(self) -> HiCacheError | None:
        """The first failed part's error, its slots named as anchor slots."""
        for pool, part in self.inner.parts.items():
            if part.status is not TransferStatus.FAILED:
                continue
            e = part.error
            to_anchor = self._anchor_of[self._source[pool]]
            if isinstance(e, CorruptSlot):
                return CorruptSlot(to_anchor[e.slot], e.path)
            if isinstance(e, UnreadableSlot):
                slots = tuple(dict.fromkeys(to_anchor[s] for s in e.slots))
                return UnreadableSlot(slots, e.path, f"pool {pool}: {e}")
            return e
        return self.inner.error

    def _quiesce(self, timeout_s: float | None) -> bool:
        return cancel_within(self.inner, timeout_s)  # quiet once no part's I/O runs

    def _block(self, seconds: float) -> None:
        self.inner._block(seconds)
