"""The transfer engine: the real data plane the controller holds.

    TransferEngine
      l1       DevicePool       [K/V, layer, page, ...] on cuda (cpu without one)
      l2       HostPool         page-major, pinned on cuda
      l3       L3File           fixed slots in one file
      dma      DeviceHostMover  d2h / h2d      (dma.py)
      storage  StorageMover     h2s / s2h      (storage_io.py)

Every transfer takes int64 page arrays (source first, target second, as the method name
reads) and returns a `TransferHandle` that the caller polls. Page arguments are validated
by the same function the null engine uses (`null.transfer_pages`): both planes raise
InvalidPages for the same inputs, before anything is issued.

`digests(tier, pages)` fingerprints page bytes for invariant I4; the same bytes give the same
digest in L1, L2 and L3. Not thread-safe: one thread issues and polls. Transfers may be in
flight while that thread captures a CUDA graph; `capture.py` says what may run meanwhile.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType

import numpy as np
import numpy.typing as npt
import torch

from hicache.dataplane.dma import DeviceHostMover
from hicache.dataplane.faults import FaultInjector
from hicache.dataplane.geometry import KVGeometry
from hicache.dataplane.handles import TransferHandle
from hicache.dataplane.null import check_capacities, digest_pages, page_array, transfer_pages
from hicache.dataplane.pools import DevicePool, HostPool, page_digest, resolve_device
from hicache.dataplane.slotdigest import slot_digests
from hicache.dataplane.storage import L3File
from hicache.dataplane.storage_io import StorageMover
from hicache.errors import HiCacheError
from hicache.kernels import KernelSet
from hicache.pages import Pages
from hicache.tiers import Direction, Tier


class TransferEngine:
    """L1, L2 and L3 with the movers between them (see the module docstring).

    `device`: None picks cuda when available. `backend`: "auto" | "triton" | "torch" for the
    gather/scatter kernels (`KernelSet.create`). `l3_path`: None for a temporary file; an
    existing path is taken over only if it is a hicache L3 file or `l3_overwrite` (never a
    symlink; `L3File`). The L3 header records `geometry`.
    `chunk_pages`: fixed DMA chunking (None: the doubling schedule of dma.py).
    Raises ConfigError naming the field for bad sizes, StorageError for an unusable L3 path,
    BackendError when an explicitly requested backend cannot run.
    """

    has_bytes = True

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
        io_threads: int = 4,
        faults: FaultInjector | None = None,
        chunk_pages: int | None = None,
        l3_overwrite: bool = False,
    ) -> None:
        check_capacities(l1_pages, l2_pages, l3_slots)
        self.geometry = geometry
        self.device = resolve_device(device)
        self.l1 = DevicePool(geometry, l1_pages, self.device)
        self.l2 = HostPool(geometry, l2_pages, pin=self.device.type == "cuda")
        self.kernels = KernelSet.create(self.l1.tensor, requested=backend)
        self.dma = DeviceHostMover(
            self.l1, self.l2, self.kernels, faults=faults, chunk_pages=chunk_pages
        )
        self.l3 = L3File(
            l3_path, l3_slots, geometry.bytes_per_page, geometry=geometry, overwrite=l3_overwrite
        )
        try:
            self.storage = StorageMover(
                self.l3, self.l2.bytes_view(), io_threads=io_threads, faults=faults
            )
        except HiCacheError:
            self.l3.close()  # a temporary file must not outlive a failed construction
            raise
        self._capacity = {Tier.L1: l1_pages, Tier.L2: l2_pages, Tier.L3: l3_slots}
        self._closed = False

    @property
    def l3_path(self) -> str:
        """The L3 file's path (named in errors)."""
        return self.l3.path

    @property
    def corrupt_reads(self) -> int:
        """L3 reads whose bytes failed their slot's checksum (never served)."""
        return self.l3.corrupt_reads

    # -- transfers ------------------------------------------------------------------------------

    def d2h(
        self, l1_pages: Pages, l2_pages: Pages, *, after: torch.cuda.Stream | None = None
    ) -> TransferHandle:
        """Backup: L1 pages -> L2 pages. `after`: the stream that produced the pages/indices
        (default: the current stream); the transfer starts after its queued work."""
        return self.dma.d2h(l1_pages, l2_pages, after=after)

    def h2d(
        self, l2_pages: Pages, l1_pages: Pages, *, after: torch.cuda.Stream | None = None
    ) -> TransferHandle:
        """Load-back: L2 pages -> L1 pages; see `d2h` for `after`."""
        return self.dma.h2d(l2_pages, l1_pages, after=after)

    def h2s(self, l2_pages: Pages, slots: Pages) -> TransferHandle:
        """Backup: L2 pages -> L3 slots."""
        src, dst = self._pages(Direction.H2S, l2_pages, slots)
        return self.storage.h2s(src, dst)

    def s2h(self, slots: Pages, l2_pages: Pages) -> TransferHandle:
        """Promotion: L3 slots -> L2 pages (DONE only after every page's checksum matched)."""
        src, dst = self._pages(Direction.S2H, slots, l2_pages)
        return self.storage.s2h(src, dst)

    def corrupt_slot(self, slot: int) -> None:
        """Flip one byte of an L3 slot in the file (an aimed `corrupt` fault): the next S2H
        that reads it fails its checksum (CorruptSlot, a miss)."""
        ids = page_array("corrupt_slot.slot", [slot], self._capacity[Tier.L3])
        self.storage.flip_byte(int(ids[0]))

    def scribble(self, tier: Tier, pages_of: Mapping[str, Pages], value: int) -> None:
        """Fill pages of L1 or L2 with byte `value`: a sanitizer's write (the fuzz poisons
        each page a reservation takes, so one published before its bytes arrived holds bytes
        no copy holds). `pages_of`: the one pool's pages, under any name. Only for pages no
        transfer moves now (a reservation's, before its transfer is issued); on CUDA it
        returns once the fill is done, so a transfer issued next on another stream writes
        after it."""
        assert tier in (Tier.L1, Tier.L2) and len(pages_of) <= 1, (tier, list(pages_of))
        for ids in pages_of.values():
            idx = page_array(f"scribble.{tier}", ids, self._capacity[tier])
            if not idx.size:
                continue
            if tier is Tier.L1:
                rows = torch.from_numpy(idx).to(self.l1.device)
                self.l1.tensor.view(torch.uint8).index_fill_(2, rows, value)
                if self.l1.device.type == "cuda":
                    torch.cuda.current_stream(self.l1.device).synchronize()
            else:
                self.l2.bytes_view().index_fill_(0, torch.from_numpy(idx), value)

    def _pages(self, direction: Direction, source: Pages, target: Pages) -> tuple[Pages, Pages]:
        return transfer_pages(
            direction,
            source,
            target,
            self._capacity[direction.source],
            self._capacity[direction.target],
        )

    # -- invariant I4 ---------------------------------------------------------------------------

    def digests(self, tier: str, pages: Pages) -> npt.NDArray[np.uint64]:
        """One uint64 per page of `tier` ("L1", "L2", "L3"): a hash of the page's bytes in
        page-major order (`pools.digest_rows`). L3 slots are read back from the file."""
        which, ids = digest_pages(tier, pages, self._capacity)
        if which is Tier.L1:
            return page_digest(self.l1, ids)
        if which is Tier.L2:
            return page_digest(self.l2, ids)
        return slot_digests(self.l3, ids)

    # -- status and lifetime --------------------------------------------------------------------

    def status(self) -> dict[str, object]:
        """Backends (with the reason for the choice), pools, and every counter."""
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
            "storage": vars(self.storage.counters).copy(),
        }

    def close(self) -> None:
        """Cancel DMA still in flight, let file I/O finish, close the L3 file. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.dma.close()
        self.storage.close()
        self.l3.close()

    def __enter__(self) -> TransferEngine:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
