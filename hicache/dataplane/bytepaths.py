"""The engine's two byte paths: one interface, two ways of holding and moving a group's bytes.

`TransferEngine` holds one `BytePath` and delegates every byte to it; which one depends only
on the group it is built from:

    path         when                           pieces
    -----------  -----------------------------  ------------------------------------------
    OnePoolPath  a typed group of one           l1 DevicePool, l2 HostPool (typed tensors),
                 (`PoolGroup.typed`: the mha     dma DeviceHostMover (chunking, host staging
                 pool at a KV geometry)          of small runs), storage StorageMover over
                                                one L3File (dma.py, storage_io.py)
    GroupPath    every other group (raw bytes)  l1/l2 per-pool regions of one arena, mover
                                                GroupMover, storage one L3 file per pool
                                                (group*.py)

Both move the same bytes: a group of one moved by `GroupPath` holds, page for page, what
`OnePoolPath` moves, and digests alike (tests/test_one_engine.py holds them to it). A path
takes the engine's `AnchorMap` and checks its own arguments, so the engine adds nothing on
the way (the single-pool path validates exactly as the DMA mover does). Byte pool names are
the group's: the group of one has one pool, `kv`, which `OnePoolPath` answers for any name
the caller has checked against the group.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch

from hicache.choices import TransferRoute
from hicache.core.pages import Pages
from hicache.core.tiers import Direction, Tier
from hicache.dataplane.anchormap import AnchorMap
from hicache.dataplane.dma import DeviceHostMover
from hicache.dataplane.faults import FaultInjector
from hicache.dataplane.geometry import KVGeometry
from hicache.dataplane.groupgeometry import GroupGeometry
from hicache.dataplane.grouppools import GroupDevicePool, GroupHostPool, pool_digest
from hicache.dataplane.groupstorage import GroupStorageMover
from hicache.dataplane.grouptransfer import GroupMover
from hicache.dataplane.handles import TransferHandle
from hicache.dataplane.layerwise import LayerwiseMover
from hicache.dataplane.null import transfer_pages
from hicache.dataplane.pools import DevicePool, HostPool, page_digest
from hicache.dataplane.routes import GROUP_NOT_PITCHED, route_requests
from hicache.dataplane.slotnames import AnchorSlotHandle
from hicache.dataplane.storage import L3File
from hicache.dataplane.storage_io import StorageMover
from hicache.errors import ConfigError, HiCacheError
from hicache.kernels import KernelSet

GROUP_BACKENDS = {"auto": "auto", "torch": "torch", "triton": "per_pool"}
"""CacheConfig.backend -> the group path's kernel mode ("triton": per-pool Triton kernels)."""


class BytePath(Protocol):
    """What the engine asks of a byte path. Pages are anchor pages (L3: anchor slots) as the
    caller gave them; a path validates them (InvalidPages before anything is issued)."""

    @property
    def files(self) -> Mapping[str, L3File]:
        """The L3 file of each byte pool."""
        ...

    @property
    def l1_arena(self) -> torch.Tensor:
        """The tensor holding every L1 byte (what the producer writes)."""
        ...

    def l1_region(self, name: str) -> torch.Tensor:
        """uint8 `[rows_per_page, pages, row_bytes]` of byte pool `name` in L1 (a view)."""
        ...

    def l2_bytes(self, name: str) -> torch.Tensor:
        """uint8 `[pages, bytes_per_page]` of byte pool `name` in L2 (a view)."""
        ...

    def packed(self, tier: Tier, name: str, page_ids: Pages) -> torch.Tensor:
        """A copy of pool `name`'s own pages of L1 or L2, page-major uint8 `[n, bytes]`."""
        ...

    def page_digests(self, tier: Tier, name: str, page_ids: Pages) -> npt.NDArray[np.uint64]:
        """One digest per own page of pool `name` in L1 or L2 (equal bytes, equal digests)."""
        ...

    def d2h(self, l1: Pages, l2: Pages, after: torch.cuda.Stream | None) -> TransferHandle: ...

    def h2d(self, l2: Pages, l1: Pages, after: torch.cuda.Stream | None) -> TransferHandle: ...

    def h2s(self, l2: Pages, slots: Pages) -> TransferHandle: ...

    def s2h(self, slots: Pages, l2: Pages) -> TransferHandle: ...

    def corrupt_slot(self, slot: Pages) -> None:
        """Flip one byte of validated anchor slot `slot` (one entry) in the first pool's file."""
        ...

    def run_deferred(self) -> None: ...

    def replicas(self) -> Collection[str]:
        """Pools read from another rank's file and never written here."""
        ...

    def status(self) -> dict[str, object]: ...

    def close(self) -> None: ...


class OnePoolPath:
    """The typed group of one: one typed pool per tier, one L3 file (module table).
    `l3_path`, `l3_overwrite` (`L3File`), `chunk_pages` (fixed DMA chunking) are this path's
    alone."""

    def __init__(
        self,
        geometry: KVGeometry,
        anchors: AnchorMap,
        device: torch.device,
        *,
        l3_path: str | None,
        backend: str,
        io_threads: int,
        faults: FaultInjector | None,
        chunk_pages: int | None,
        l3_overwrite: bool,
        layerwise: bool = False,
        transfer_route: TransferRoute = TransferRoute.AUTO,
    ) -> None:
        self.geometry = geometry
        self.anchors = anchors
        capacity = anchors.capacity
        self.l1 = DevicePool(geometry, capacity[Tier.L1], device)
        self.l2 = HostPool(geometry, capacity[Tier.L2], pin=device.type == "cuda")
        self.kernels = KernelSet.create(self.l1.tensor, requested=backend)
        mapped_d2h, pitched = route_requests(transfer_route)
        self.dma = DeviceHostMover(
            self.l1,
            self.l2,
            self.kernels,
            faults=faults,
            chunk_pages=chunk_pages,
            mapped_d2h=mapped_d2h,
            pitched=pitched,
        )
        # Layer-wise load-back (layerwise.py): H2Ds land layer by layer where they can.
        self.layerwise = LayerwiseMover(self.l1, self.l2, faults=faults) if layerwise else None
        self.l3 = L3File(
            l3_path,
            capacity[Tier.L3],
            geometry.bytes_per_page,
            geometry=geometry,
            overwrite=l3_overwrite,
        )
        try:
            self.storage = StorageMover(
                self.l3, self.l2.bytes_view(), io_threads=io_threads, faults=faults
            )
        except HiCacheError:
            self.l3.close()  # a temporary file must not outlive a failed construction
            raise
        self.files = {"kv": self.l3}

    @property
    def l1_arena(self) -> torch.Tensor:
        return self.l1.tensor

    def l1_region(self, name: str) -> torch.Tensor:
        t = self.l1.tensor.view(torch.uint8)
        return t.view(2 * self.geometry.layers, self.l1.capacity_pages, -1)

    def l2_bytes(self, name: str) -> torch.Tensor:
        return self.l2.bytes_view()

    def packed(self, tier: Tier, name: str, page_ids: Pages) -> torch.Tensor:
        one = self.l1 if tier is Tier.L1 else self.l2
        return one.packed(page_ids).view(torch.uint8).reshape(len(page_ids), -1)

    def page_digests(self, tier: Tier, name: str, page_ids: Pages) -> npt.NDArray[np.uint64]:
        return page_digest(self.l1 if tier is Tier.L1 else self.l2, page_ids)

    def d2h(self, l1: Pages, l2: Pages, after: torch.cuda.Stream | None) -> TransferHandle:
        return self.dma.d2h(l1, l2, after=after)  # the mover validates

    def h2d(self, l2: Pages, l1: Pages, after: torch.cuda.Stream | None) -> TransferHandle:
        if self.layerwise is not None:
            src, dst = transfer_pages(
                Direction.H2D, l2, l1, self.l2.capacity_pages, self.l1.capacity_pages
            )
            handle = self.layerwise.issue(src, dst, after) if src.size else None
            if handle is not None:
                return handle
        return self.dma.h2d(l2, l1, after=after)  # the mover validates

    def h2s(self, l2: Pages, slots: Pages) -> TransferHandle:
        return self.storage.h2s(*self.anchors.pages(Direction.H2S, l2, slots))

    def s2h(self, slots: Pages, l2: Pages) -> TransferHandle:
        return self.storage.s2h(*self.anchors.pages(Direction.S2H, slots, l2))

    def corrupt_slot(self, slot: Pages) -> None:
        self.storage.flip_byte(int(slot[0]))

    def run_deferred(self) -> None:
        self.storage.run_deferred()

    def replicas(self) -> Collection[str]:
        return ()  # the one pool is sharded: every rank writes its own file

    def status(self) -> dict[str, object]:
        return {
            "data_plane": "real",
            "backends": {
                "gather": self.kernels.gather_backend,
                "scatter": self.kernels.scatter_backend,
                "reason": self.kernels.reason,
            },
            "pools": {
                "bytes_per_page": self.geometry.bytes_per_page,
                "l1_pages": self.l1.capacity_pages,
                "l2_pages": self.l2.capacity_pages,
                "l3_slots": self.l3.slots,
                "l3_path": self.l3.path,
            },
            "dma": self.dma.status(),
            "layerwise": None if self.layerwise is None else self.layerwise.status(),
            "storage": vars(self.storage.counters).copy(),
        }

    def close(self) -> None:
        if self.layerwise is not None:
            self.layerwise.close()
        self.dma.close()
        self.storage.close()
        self.l3.close()


class GroupPath:
    """Any group as raw bytes: per byte pool a region of each tier's arena, one temporary L3
    file per pool (module table); every pool moves in one group operation."""

    def __init__(
        self,
        pools: GroupGeometry,
        anchors: AnchorMap,
        device: torch.device,
        *,
        backend: str,
        io_threads: int,
        faults: FaultInjector | None,
        transfer_route: TransferRoute = TransferRoute.AUTO,
    ) -> None:
        if transfer_route is TransferRoute.PITCHED:
            raise ConfigError("transfer_route", GROUP_NOT_PITCHED)
        self.pools = pools
        self.anchors = anchors
        caps = anchors.pool_caps
        self.l1 = GroupDevicePool(pools, caps[Tier.L1], device)
        self.l2 = GroupHostPool(pools, caps[Tier.L2], pin=device.type == "cuda")
        mapped_d2h = route_requests(transfer_route)[0]
        self.mover = GroupMover(
            self.l1, self.l2, GROUP_BACKENDS[backend], faults=faults, mapped_d2h=mapped_d2h
        )
        self.storage = GroupStorageMover(
            self.l2, caps[Tier.L3], io_threads=io_threads, faults=faults
        )
        self.files = self.storage.files

    @property
    def l1_arena(self) -> torch.Tensor:
        return self.l1.tensor

    def l1_region(self, name: str) -> torch.Tensor:
        return self.l1.region(name)

    def l2_bytes(self, name: str) -> torch.Tensor:
        return self.l2.bytes_view(name)

    def packed(self, tier: Tier, name: str, page_ids: Pages) -> torch.Tensor:
        return (self.l1 if tier is Tier.L1 else self.l2).packed(name, page_ids)

    def page_digests(self, tier: Tier, name: str, page_ids: Pages) -> npt.NDArray[np.uint64]:
        return pool_digest(self.l1 if tier is Tier.L1 else self.l2, name, page_ids)

    def d2h(self, l1: Pages, l2: Pages, after: torch.cuda.Stream | None) -> TransferHandle:
        return self.mover.d2h(self.anchors.request(Direction.D2H, l1, l2), after=after)

    def h2d(self, l2: Pages, l1: Pages, after: torch.cuda.Stream | None) -> TransferHandle:
        return self.mover.h2d(self.anchors.request(Direction.H2D, l2, l1), after=after)

    def h2s(self, l2: Pages, slots: Pages) -> TransferHandle:
        request = self.anchors.request(Direction.H2S, l2, slots)
        return AnchorSlotHandle(
            self.storage.h2s(request), self.pools, request, self.anchors.ratios, target=True
        )

    def s2h(self, slots: Pages, l2: Pages) -> TransferHandle:
        request = self.anchors.request(Direction.S2H, slots, l2)
        return AnchorSlotHandle(
            self.storage.s2h(request), self.pools, request, self.anchors.ratios, target=False
        )

    def corrupt_slot(self, slot: Pages) -> None:
        first = self.pools.pools[0]
        pool_slots = self.anchors.pool_pages(Tier.L3, slot)[first.source]
        self.storage.movers[first.name].flip_byte(int(pool_slots[0]))

    def run_deferred(self) -> None:
        """Nothing waits: a group's per-pool parts run at issue."""

    def replicas(self) -> Collection[str]:
        return self.storage.replicas

    def status(self) -> dict[str, object]:
        return {
            "data_plane": "real",
            "group": self.pools.group.name,
            "backends": {
                "gather": self.mover.kernels.mode,
                "scatter": self.mover.kernels.mode,
                "reason": self.mover.kernels.reason,
            },
            "pools": {
                p.name: {"source": p.source, "bytes_per_page": p.bytes_per_page}
                for p in self.pools.pools
            },
            "capacity": {str(t): dict(c) for t, c in self.anchors.pool_caps.items()},
            "dma": {str(d): vars(c).copy() for d, c in self.mover.counters.items()},
            "storage": {name: vars(m.counters).copy() for name, m in self.storage.movers.items()},
        }

    def close(self) -> None:
        self.mover.close()
        self.storage.close()
