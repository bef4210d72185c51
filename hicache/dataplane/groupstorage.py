"""Group H2S and S2H: L3 slots keyed by pool, every pool of a group in one operation.

    L3      one `L3File` per byte pool, `slots[source]` slots of that pool's bytes_per_page;
            slot s of every pool on one source is the same logical page (the key is
            (pool, slot), as SGLang keys its storage pages per pool); on a tensor-parallel
            rank other than 0, a replicated pool's file is rank 0's (`attach`: a replica,
            read here, written there)
    request {"kv": (L2 pages, slots), "swa": (L2 pages, slots)} for H2S; (slots, L2 pages)
            for S2H; derived pools move their source's pages, as in group D2H/H2D

`GroupStorageMover` checks every pool's part before issuing any (InvalidPages naming the pool;
a rejected transfer issues nothing), then issues one `StorageMover` transfer per pool. Its
handle is final only once every part is: FAILED if any part failed (the first error is
reported), CANCELLED if any was cancelled, else DONE -- so the caller releases or publishes
the whole group's target pages at once, never one pool's.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from hicache.core.pages import Pages
from hicache.core.tiers import Direction
from hicache.dataplane.faults import FaultInjector
from hicache.dataplane.groupgeometry import GroupGeometry
from hicache.dataplane.groupplan import GroupRequest, check_sources, source_pages
from hicache.dataplane.grouppools import GroupHostPool
from hicache.dataplane.handles import (
    TransferHandle,
    TransferStatus,
    cancel_within,
    deadline_of,
    remaining,
)
from hicache.dataplane.storage import L3File
from hicache.dataplane.storage_io import StorageHandle, StorageMover
from hicache.errors import ConfigError, InvalidPages


class GroupStorageHandle(TransferHandle):
    """One group H2S/S2H: its per-pool parts, final together (module docstring)."""

    def __init__(self, direction: Direction, parts: dict[str, StorageHandle]) -> None:
        super().__init__(direction, sum(p.nbytes for p in parts.values()))
        self.parts = parts

    def _probe(self) -> TransferStatus:
        statuses = [p.poll() for p in self.parts.values()]
        if any(s is TransferStatus.PENDING for s in statuses):
            return TransferStatus.PENDING
        failed = [p for p in self.parts.values() if p.status is TransferStatus.FAILED]
        if failed:
            self.error = failed[0].error
            return TransferStatus.FAILED
        if TransferStatus.CANCELLED in statuses:
            return TransferStatus.CANCELLED
        return TransferStatus.DONE

    def _quiesce(self, timeout_s: float | None) -> bool:
        deadline = deadline_of(timeout_s)  # one bound for every part's I/O together
        # Each part waits for its I/O; no effect on a part already final.
        return all([cancel_within(part, remaining(deadline)) for part in self.parts.values()])

    def _block(self, seconds: float) -> None:
        for part in self.parts.values():
            if not part.status.final:
                part._block(seconds)
                return


class GroupStorageMover:
    """L3 files per byte pool (temporary files, removed on close) and their movers. `faults`
    reaches every pool's mover: its I/O sites are drawn per piece of each pool's part, so a
    fault in any one pool fails the whole group transfer."""

    def __init__(
        self,
        l2: GroupHostPool,
        slots: Mapping[str, int],
        *,
        io_threads: int = 2,
        faults: FaultInjector | None = None,
    ) -> None:
        geometry: GroupGeometry = l2.geometry
        missing = [
            s for s in geometry.sources if not isinstance(slots.get(s), int) or slots[s] <= 0
        ]
        if missing or set(slots) - set(geometry.sources):
            raise ConfigError(
                "l3_slots",
                f"a positive slot count for each of {list(geometry.sources)}, got {dict(slots)}",
            )
        self.l2, self.slots = l2, dict(slots)
        self._io_threads, self._faults = io_threads, faults
        self.files: dict[str, L3File] = {}
        self.movers: dict[str, StorageMover] = {}
        for p in geometry.pools:
            self.files[p.name] = L3File(None, slots[p.source], p.bytes_per_page)
            self.movers[p.name] = StorageMover(
                self.files[p.name], l2.bytes_view(p.name), io_threads=io_threads, faults=faults
            )

    @property
    def replicas(self) -> frozenset[str]:
        """The pools read from another rank's file (`attach`): never written here."""
        return frozenset(n for n, f in self.files.items() if f.replica)

    def attach(self, pool: str, path: str) -> None:
        """Read `pool` from the file at `path` (rank 0's: `share_path(*L3File.share_handle())`)
        from now on, instead of this mover's own: its own file and mover are closed first,
        so call it before any transfer of the pool. An H2S skips the pool from then on (rank
        0 writes it); an S2H reads rank 0's slots, verified against the checksums `record`ed."""
        p = self.l2.geometry.pool(pool)
        replica = L3File.open_replica(path, self.slots[p.source], p.bytes_per_page)
        self.movers[pool].close()
        self.files[pool].close()
        self.files[pool] = replica
        self.movers[pool] = StorageMover(
            replica, self.l2.bytes_view(pool), io_threads=self._io_threads, faults=self._faults
        )

    def h2s(self, request: GroupRequest) -> GroupStorageHandle:
        """L2 -> L3 for every pool: request[source] = (L2 pages, slots)."""
        return self._issue(Direction.H2S, request)

    def s2h(self, request: GroupRequest) -> GroupStorageHandle:
        """L3 -> L2 for every pool: request[source] = (slots, L2 pages); every slot of every
        pool on the source must hold a written page."""
        return self._issue(Direction.S2H, request)

    def _issue(self, direction: Direction, request: GroupRequest) -> GroupStorageHandle:
        checked = self._check(direction, request)
        parts: dict[str, StorageHandle] = {}
        for p in self.l2.geometry.pools:
            if p.source not in checked or checked[p.source][0].size == 0:
                continue
            if direction is Direction.H2S and self.files[p.name].replica:
                continue  # rank 0 writes it (spec/tp.md, "L3 writes")
            l2_ids, slot_ids = checked[p.source]
            mover = self.movers[p.name]
            parts[p.name] = (
                mover.h2s(l2_ids, slot_ids)
                if direction is Direction.H2S
                else mover.s2h(slot_ids, l2_ids)
            )
        return GroupStorageHandle(direction, parts)

    def _check(self, direction: Direction, request: GroupRequest) -> dict[str, tuple[Pages, Pages]]:
        """(L2 pages, slots) per named source, validated for every pool before any issue."""
        geometry = self.l2.geometry
        check_sources(direction, request, geometry)
        out: dict[str, tuple[Pages, Pages]] = {}
        for source, (a, b) in request.items():
            src, dst = source_pages(
                direction, source, a, b, self.l2.capacity(source), self.slots[source]
            )
            l2_ids, slot_ids = (src, dst) if direction is Direction.H2S else (dst, src)
            if direction is Direction.S2H:
                for p in geometry.on(source):
                    unwritten = slot_ids[~self.files[p.name].written(slot_ids)]
                    if unwritten.size:
                        raise InvalidPages(
                            f"{source}.S2H.slots",
                            f"pool {p.name} holds no written page in slots "
                            f"{np.unique(unwritten).tolist()}; read published "
                            f"slots only",
                        )
            out[source] = (l2_ids, slot_ids)
        return out

    def close(self) -> None:
        """Close every mover and file (the temporary files go with them). Idempotent."""
        for mover in self.movers.values():
            mover.close()
        for f in self.files.values():
            f.close()
