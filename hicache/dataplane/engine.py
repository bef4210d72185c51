"""The transfer engine: the one data plane with bytes that the controller holds.

A single pool is a group of one. The engine is built from a layout: a `PoolGroup` (every
pool of the group per call, on anchor pages), or a `KVGeometry`, the group of one (`one_pool`:
the `mha` pool `kv`, with its dtype). Which path moves the bytes:

    path       when                                pieces
    ---------  ----------------------------------  ---------------------------------------
    one pool   a KVGeometry: one pool, no derived  l1 DevicePool, l2 HostPool, dma
    (fast)     pools, anchor pages = pool pages    DeviceHostMover (chunking, host staging
                                                   of small runs), storage StorageMover
                                                   over one L3File (dma.py, storage_io.py)
    group      a PoolGroup                         group_l1 / group_l2 per-pool regions,
                                                   mover GroupMover, group_storage one L3
                                                   file per pool (group*.py)

Both paths move the same bytes: a group of one pool moved by the group path holds, page for
page, what the fast path moves, and digests alike (tests/test_one_engine.py holds them to it).

The controller names *anchor* pages (a tree value is anchor pages). The group path maps them
to every allocating pool's pages through `pool_pages(tier, anchor_pages)` -- the control
plane's answer (its per-tier `TierPools`), given at construction -- and moves every byte pool
in one group operation; derived pools follow their source:

    anchor pages   a0 a1 a2           ->   pool_pages("L1", [a0 a1 a2])
    kv  (anchor)   a0 a1 a2                 c4, c128 ... move these pages
    swa            s0 s1 s2 (x ratio)       c4_state ... move these pages

Contract: every transfer takes int64 page arrays (source first, target second, as the method
name reads) and returns a `TransferHandle` the caller polls. Page arguments are checked by
the null engine's function (`null.transfer_pages`): both planes raise InvalidPages for the
same inputs, before anything is issued; the group path then checks the mapping (every
allocating pool named, `ratio` pages per anchor page, in range, the anchor's own entry equal
to the anchor pages): a refused call issues nothing. Request-scoped pools (`backupable =
False`) are not part of the engine: they never reach L2 or L3.

`digests(tier, pages)` fingerprints page bytes for invariant I4: one uint64 per anchor page,
the same bytes giving the same digest in L1, L2 and L3; for a group, mixed from every pool's
page digests (`pool_digests`), so a changed byte in any one pool changes it; L3 slots a read
would not serve digest as `UNSERVABLE`. Faults: DMA sites once per D2H/H2D, I/O sites per
piece of each pool's L3 part; an L3 slot error names the *anchor* slot. Not thread-safe: one
thread issues and polls. Transfers may be in flight while that thread captures a CUDA graph;
`capture.py` says what may run meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import NoReturn

import numpy as np
import numpy.typing as npt
import torch

from hicache.core.pages import Pages
from hicache.core.snapshot import TOMBSTONE, UNSERVABLE
from hicache.core.tiers import Direction, Tier
from hicache.dataplane.dma import DeviceHostMover
from hicache.dataplane.faults import FaultInjector
from hicache.dataplane.geometry import KVGeometry
from hicache.dataplane.groupgeometry import GroupGeometry, kv_pool_spec
from hicache.dataplane.groupmix import mix_columns
from hicache.dataplane.grouppools import GroupDevicePool, GroupHostPool, pool_digest
from hicache.dataplane.groupstorage import GroupStorageMover
from hicache.dataplane.grouptransfer import GroupMover
from hicache.dataplane.handles import TransferHandle
from hicache.dataplane.null import check_capacities, digest_pages, page_array, transfer_pages
from hicache.dataplane.pools import DevicePool, HostPool, page_digest, resolve_device
from hicache.dataplane.slotdigest import slot_digests
from hicache.dataplane.slotnames import AnchorSlotHandle
from hicache.dataplane.storage import L3File, share_path
from hicache.dataplane.storage_io import StorageMover
from hicache.errors import ConfigError, HiCacheError, InvalidPages
from hicache.kernels import KernelSet
from hicache.pools.presets import SINGLE_POOL
from hicache.pools.spec import PoolGroup
from hicache.pools.tierpools import tier_capacities

PoolPages = Callable[[str, Pages], Mapping[str, object]]
"""(tier "L1" | "L2" | "L3", anchor pages) -> pages per allocating pool, anchor included,
`ratio` pages per anchor page in anchor order (the control plane's `TierPools.pool_pages`)."""

BACKENDS = {"auto": "auto", "torch": "torch", "triton": "per_pool"}  # CacheConfig.backend -> mode
UNLANDED_BYTE = 0xA5  # what `unland` leaves in a pool page an S2H stopped before


def one_pool(geometry: KVGeometry) -> PoolGroup:
    """The group of one: the `mha` preset's shape (pool `kv`, the anchor) at `geometry`'s
    sizes; its anchor pages are its pool pages."""
    return PoolGroup(SINGLE_POOL, (kv_pool_spec(geometry),))


def same_pages(tier: str, pages: Pages) -> Mapping[str, object]:
    """The group of one's `pool_pages`: the anchor pages are the pool's."""
    return {"kv": pages}


class _OnePool:
    """The fast path's pieces: one typed pool per tier, one L3 file (module table)."""

    def __init__(
        self,
        geometry: KVGeometry,
        capacity: Mapping[Tier, int],
        device: torch.device,
        *,
        l3_path: str | None,
        backend: str,
        io_threads: int,
        faults: FaultInjector | None,
        chunk_pages: int | None,
        l3_overwrite: bool,
    ) -> None:
        self.geometry = geometry
        self.l1 = DevicePool(geometry, capacity[Tier.L1], device)
        self.l2 = HostPool(geometry, capacity[Tier.L2], pin=device.type == "cuda")
        self.kernels = KernelSet.create(self.l1.tensor, requested=backend)
        self.dma = DeviceHostMover(
            self.l1, self.l2, self.kernels, faults=faults, chunk_pages=chunk_pages
        )
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

    def region(self, tier: Tier) -> torch.Tensor:
        """L1 as the group path's uint8 `[rows_per_page, pages, row_bytes]` (a view); L2 as
        `[pages, bytes_per_page]`."""
        if tier is Tier.L1:
            t = self.l1.tensor.view(torch.uint8)
            return t.view(2 * self.geometry.layers, self.l1.capacity_pages, -1)
        return self.l2.bytes_view()


class _Pools:
    """The group path's pieces: per byte pool a region of each tier's arena, one L3 file per
    pool (module table)."""

    def __init__(
        self,
        layout: GroupGeometry,
        caps: Mapping[Tier, dict[str, int]],
        device: torch.device,
        *,
        backend: str,
        io_threads: int,
        faults: FaultInjector | None,
    ) -> None:
        self.l1 = GroupDevicePool(layout, caps[Tier.L1], device)
        self.l2 = GroupHostPool(layout, caps[Tier.L2], pin=device.type == "cuda")
        self.mover = GroupMover(self.l1, self.l2, BACKENDS[backend], faults=faults)
        self.storage = GroupStorageMover(
            self.l2, caps[Tier.L3], io_threads=io_threads, faults=faults
        )


class TransferEngine:
    """L1, L2 and L3 of a pool group with the movers between them (module docstring).

    `layout`: a PoolGroup, or a KVGeometry (the group of one, moved by the fast path).
    Capacities are in anchor pages (L3: anchor slots), sized as the control plane sizes them
    (`tierpools.tier_capacities`): an allocating pool of anchor/own page-size `ratio` gets
    `ratio` times as many unless `pool_capacities[tier][pool]` says otherwise (the control
    plane's own option of that name: pass the same). `pool_pages`: the control plane's
    mapping (the group of one needs none: its anchor pages are its pool pages); a group
    engine built before its control plane takes it once with `bind`. `device`: None picks
    cuda when available. `backend`: "auto" | "triton" | "torch" (`KernelSet.create`; for a
    group, "triton" is the per-pool Triton kernels). `io_threads`: None for 4 (one pool) or
    2 (a group). One pool only: `l3_path` (None: a temporary file; an existing path is taken
    over only if it is a hicache L3 file or `l3_overwrite`, never a symlink; `L3File`, whose
    header records `geometry`), `chunk_pages` (fixed DMA chunking; None: dma.py's doubling
    schedule). A group keeps one temporary L3 file per pool, removed on close.
    Raises ConfigError naming the field for bad sizes, StorageError for an unusable L3 path,
    BackendError when an explicitly requested backend cannot run.
    """

    has_bytes = True

    def __init__(
        self,
        layout: KVGeometry | PoolGroup,
        l1_pages: int,
        l2_pages: int,
        l3_slots: int,
        *,
        pool_pages: PoolPages | None = None,
        device: str | None = None,
        l3_path: str | None = None,
        backend: str = "auto",
        io_threads: int | None = None,
        faults: FaultInjector | None = None,
        chunk_pages: int | None = None,
        l3_overwrite: bool = False,
        pool_capacities: Mapping[str, Mapping[str, int]] | None = None,
    ) -> None:
        check_capacities(l1_pages, l2_pages, l3_slots)
        self._capacity = {Tier.L1: l1_pages, Tier.L2: l2_pages, Tier.L3: l3_slots}
        kv, group = (layout, one_pool(layout)) if isinstance(layout, KVGeometry) else (None, layout)
        self.group = group.backed_up()  # what L2 and L3 hold
        self.pools = GroupGeometry.from_group(self.group)  # the byte pools, table order
        self.ratios = {p.name: self.group.ratio(p.name) for p in self.group.allocating}
        self._pool_caps = self._sizes(pool_capacities or {})
        self.device = resolve_device(device)
        self._one: _OnePool | None = None
        self._many: _Pools | None = None
        if kv is not None:
            self._one = _OnePool(
                kv,
                self._capacity,
                self.device,
                l3_path=l3_path,
                backend=backend,
                io_threads=4 if io_threads is None else io_threads,
                faults=faults,
                chunk_pages=chunk_pages,
                l3_overwrite=l3_overwrite,
            )
            pool_pages = pool_pages or same_pages
        else:
            for field, value in (("l3_path", l3_path), ("chunk_pages", chunk_pages)):
                if value is not None:
                    raise ConfigError(field, "a pool group's engine takes none; pass None")
            if backend not in BACKENDS:
                raise ConfigError("backend", f"one of {sorted(BACKENDS)}, got {backend!r}")
            self._many = _Pools(
                self.pools,
                self._pool_caps,
                self.device,
                backend=backend,
                io_threads=2 if io_threads is None else io_threads,
                faults=faults,
            )
        self._pool_pages = pool_pages
        self._closed = False

    def _sizes(self, given: Mapping[str, Mapping[str, int]]) -> dict[Tier, dict[str, int]]:
        """Own pages per allocating pool and tier, as the control plane sizes them."""
        for tier, caps in given.items():
            unknown = sorted(set(caps) - set(self.ratios))
            if tier not in ("L1", "L2", "L3") or unknown:
                raise ConfigError(
                    f"pool_capacities.{tier}",
                    f"tiers L1, L2, L3 of allocating "
                    f"pools {sorted(self.ratios)}; unknown: {unknown or tier}",
                )
        return {t: tier_capacities(self.group, str(t), n, given) for t, n in self._capacity.items()}

    # -- the two paths' pieces ------------------------------------------------------------------

    @property
    def one_pool(self) -> bool:
        """Whether the fast path moves the bytes (a group of one, built from a KVGeometry)."""
        return self._one is not None

    def _only(self, what: str, one: bool) -> NoReturn:
        raise ConfigError(
            what,
            "only the single-pool engine (built from a KVGeometry) has it"
            if one
            else "only a pool group's engine (built from a PoolGroup) has it",
        )

    def _fast(self, what: str) -> _OnePool:
        if self._one is None:
            self._only(what, True)
        return self._one

    def _general(self, what: str) -> _Pools:
        if self._many is None:
            self._only(what, False)
        return self._many

    @property
    def geometry(self) -> KVGeometry:
        """The one pool's KV geometry (ConfigError for a group: its pools are `pools`)."""
        return self._fast("geometry").geometry

    @property
    def l1(self) -> DevicePool:
        """The one pool's L1 (a group's: `group_l1`)."""
        return self._fast("l1").l1

    @property
    def l2(self) -> HostPool:
        """The one pool's L2 (a group's: `group_l2`)."""
        return self._fast("l2").l2

    @property
    def kernels(self) -> KernelSet:
        return self._fast("kernels").kernels

    @property
    def dma(self) -> DeviceHostMover:
        return self._fast("dma").dma

    @property
    def l3(self) -> L3File:
        return self._fast("l3").l3

    @property
    def storage(self) -> StorageMover:
        return self._fast("storage").storage

    @property
    def group_l1(self) -> GroupDevicePool:
        return self._general("group_l1").l1

    @property
    def group_l2(self) -> GroupHostPool:
        return self._general("group_l2").l2

    @property
    def mover(self) -> GroupMover:
        return self._general("mover").mover

    @property
    def group_storage(self) -> GroupStorageMover:
        return self._general("group_storage").storage

    def _files(self) -> dict[str, L3File]:
        """The L3 file of each byte pool."""
        if self._one is not None:
            return {"kv": self._one.l3}
        return self.group_storage.files

    @property
    def l3_path(self) -> str:
        """The L3 file's path, or the per-pool files' (temporary) paths, for errors."""
        return ", ".join(f.path for f in self._files().values())

    @property
    def corrupt_reads(self) -> int:
        """L3 reads, of any pool's file, whose bytes failed their slot's checksum."""
        return sum(f.corrupt_reads for f in self._files().values())

    # -- the bytes of L1, whichever path (what the producer writes and the verifier reads) ------

    @property
    def l1_arena(self) -> torch.Tensor:
        """The tensor holding every L1 byte (what the controller hands its producer)."""
        return self._one.l1.tensor if self._one is not None else self.group_l1.tensor

    def l1_region(self, name: str) -> torch.Tensor:
        """uint8 `[rows_per_page, pages, row_bytes]` of byte pool `name` in L1 (a view)."""
        if self._one is not None:
            self.pools.pool(name)  # ConfigError for another name
            return self._one.region(Tier.L1)
        return self.group_l1.region(name)

    def packed(self, tier: Tier, name: str, page_ids: Pages) -> torch.Tensor:
        """A copy of pool `name`'s pages `page_ids` of L1 or L2, page-major uint8 `[n,
        bytes_per_page]` on the tier's device: plain torch, independent of the transfer
        kernels."""
        assert tier in (Tier.L1, Tier.L2), tier
        if self._one is None:
            pool = self.group_l1 if tier is Tier.L1 else self.group_l2
            return pool.packed(name, page_ids)
        self.pools.pool(name)  # ConfigError for another name
        one = self._one.l1 if tier is Tier.L1 else self._one.l2
        return one.packed(page_ids).view(torch.uint8).reshape(len(page_ids), -1)

    def _l2_bytes(self, name: str) -> torch.Tensor:
        """uint8 `[pages, bytes_per_page]` of byte pool `name` in L2 (a view)."""
        if self._one is not None:
            return self._one.region(Tier.L2)
        return self.group_l2.bytes_view(name)

    # -- anchor pages -> pool pages ---------------------------------------------------------

    def bind(self, pool_pages: PoolPages) -> None:
        """Take the control plane's mapping: for an engine built before its control plane."""
        self._pool_pages = pool_pages

    def pool_pages(
        self, tier: Tier, anchor_pages: Pages, *, freed: bool = False
    ) -> dict[str, Pages]:
        """Every allocating pool's pages for validated `anchor_pages` of `tier`, checked
        against the contract (module docstring); InvalidPages naming the pool otherwise.
        `freed`: let a freed window's pages through as `TOMBSTONE` (to read what is left of
        a page, never to move it: every transfer asks without)."""
        if self._pool_pages is None:
            raise ConfigError(
                "pool_pages",
                "the group engine has no control plane mapping: build it with pool_pages, "
                "or bind(pool_pages) one built before its control plane",
            )
        mapped = self._pool_pages(tier.value, anchor_pages)
        out: dict[str, Pages] = {}
        for name, ratio in self.ratios.items():
            field = f"{tier}.pool_pages.{name}"
            if name not in mapped:
                raise InvalidPages(field, f"the control plane named no pages of pool {name!r}")
            raw = np.asarray(mapped[name], dtype=np.int64)
            gone = raw == TOMBSTONE if freed else np.zeros(raw.shape, dtype=bool)
            ids = page_array(field, np.where(gone, 0, raw), self._pool_caps[tier][name])
            ids[gone] = TOMBSTONE
            # Verify `ratio` pages per anchor page: a short list would leave pages unmoved.
            if ids.size != anchor_pages.size * ratio:
                raise InvalidPages(
                    field, f"{ids.size} pages for {anchor_pages.size} anchor pages of ratio {ratio}"
                )
            out[name] = ids
        # Verify the anchor maps to itself: the tree's values are anchor pages.
        if not np.array_equal(out[self.group.anchor.name], anchor_pages):
            raise InvalidPages(
                f"{tier}.pool_pages.{self.group.anchor.name}",
                "the anchor's pages must be the anchor pages asked for",
            )
        return out

    def _pages(self, direction: Direction, source: object, target: object) -> tuple[Pages, Pages]:
        return transfer_pages(
            direction,
            source,
            target,
            self._capacity[direction.source],
            self._capacity[direction.target],
        )

    def _request(
        self, direction: Direction, source: object, target: object
    ) -> dict[str, tuple[Pages, Pages]]:
        src, dst = self._pages(direction, source, target)
        a = self.pool_pages(direction.source, src)
        b = self.pool_pages(direction.target, dst)
        return {name: (a[name], b[name]) for name in self.ratios}

    # -- transfers ----------------------------------------------------------------------------

    def d2h(
        self, l1_pages: Pages, l2_pages: Pages, *, after: torch.cuda.Stream | None = None
    ) -> TransferHandle:
        """Backup: every pool's pages of L1 anchor pages -> those of L2 anchor pages. `after`:
        the stream that produced the pages/indices (default: the current stream); the
        transfer starts after its queued work."""
        if self._one is not None:
            return self._one.dma.d2h(l1_pages, l2_pages, after=after)
        return self.mover.d2h(self._request(Direction.D2H, l1_pages, l2_pages), after=after)

    def h2d(
        self, l2_pages: Pages, l1_pages: Pages, *, after: torch.cuda.Stream | None = None
    ) -> TransferHandle:
        """Load-back: L2 -> L1, every pool; see `d2h` for `after`."""
        if self._one is not None:
            return self._one.dma.h2d(l2_pages, l1_pages, after=after)
        return self.mover.h2d(self._request(Direction.H2D, l2_pages, l1_pages), after=after)

    def h2s(self, l2_pages: Pages, slots: Pages) -> TransferHandle:
        """Backup: L2 anchor pages -> L3 anchor slots, every pool into its own file."""
        if self._one is not None:
            return self._one.storage.h2s(*self._pages(Direction.H2S, l2_pages, slots))
        request = self._request(Direction.H2S, l2_pages, slots)
        return AnchorSlotHandle(
            self.group_storage.h2s(request), self.pools, request, self.ratios, target=True
        )

    def s2h(self, slots: Pages, l2_pages: Pages) -> TransferHandle:
        """Promotion: L3 anchor slots -> L2; DONE only once every pool's checksums matched."""
        if self._one is not None:
            return self._one.storage.s2h(*self._pages(Direction.S2H, slots, l2_pages))
        request = self._request(Direction.S2H, slots, l2_pages)
        return AnchorSlotHandle(
            self.group_storage.s2h(request), self.pools, request, self.ratios, target=False
        )

    def unland(self, l2_pages: Pages, landed: Mapping[str, int]) -> None:
        """An S2H into L2 anchor pages `l2_pages` stopped part way (an aimed `partial`,
        aimed.py): each byte pool's own pages past its leading run of `landed[pool]` (in
        transfer order; a pool not named: all) are overwritten with UNLANDED_BYTE, as bytes
        that never arrived hold anything but the slot's. Call only once nothing moves them."""
        ids = page_array("unland.l2_pages", l2_pages, self._capacity[Tier.L2])
        mapped = self.pool_pages(Tier.L2, ids)
        for p in self.pools.pools:
            past = mapped[p.source][landed.get(p.name, 0) :]
            if past.size:
                self._l2_bytes(p.name)[torch.from_numpy(past)] = UNLANDED_BYTE

    def scribble(self, tier: Tier, pages_of: Mapping[str, Pages], value: int) -> None:
        """Fill pages of L1 or L2 with byte `value`: a sanitizer's write (the fuzz poisons
        each page a reservation takes, so one published before its bytes arrived holds bytes
        no copy holds). `pages_of[source]`: an allocating pool's own pages (the group of one:
        its one pool's, under any name); every byte pool on its indices is filled there. Only
        for pages no transfer moves now (a reservation's, before its transfer is issued); on
        CUDA it returns once the fill is done, so a transfer issued next on another stream
        writes after it."""
        assert tier in (Tier.L1, Tier.L2), tier
        if self._one is not None:
            assert len(pages_of) <= 1, list(pages_of)
            pages_of = {"kv": next(iter(pages_of.values()))} if pages_of else {}
        caps = self._pool_caps[tier]
        for p in self.pools.pools:
            ids = pages_of.get(p.source)
            if ids is None or not len(ids):
                continue
            idx = torch.from_numpy(page_array(f"scribble.{tier}.{p.name}", ids, caps[p.source]))
            if tier is Tier.L1:
                self.l1_region(p.name).index_fill_(1, idx.to(self.device), value)
                if self.device.type == "cuda":
                    torch.cuda.current_stream(self.device).synchronize()
            else:
                self._l2_bytes(p.name).index_fill_(0, idx, value)

    def corrupt_slot(self, slot: int) -> None:
        """Flip one byte of anchor slot `slot` in the first byte pool's file (an aimed
        `corrupt`): the next S2H reading it fails (CorruptSlot naming `slot`, a miss)."""
        ids = page_array("corrupt_slot.slot", [slot], self._capacity[Tier.L3])
        if self._one is not None:
            self._one.storage.flip_byte(int(ids[0]))
            return
        first = self.pools.pools[0]
        pool_slots = self.pool_pages(Tier.L3, ids)[first.source]
        self.group_storage.movers[first.name].flip_byte(int(pool_slots[0]))

    def run_deferred(self) -> None:
        """Run the L3 I/O deferred on the deterministic schedule (`io_threads=0`) here; a
        group's per-pool parts run at issue: nothing waits."""
        if self._one is not None:
            self._one.storage.run_deferred()

    # -- a replicated pool's one L3 copy, across ranks (spec/tp.md, "L3 writes") ------------

    def share_l3(self, pools: Sequence[str]) -> list[int]:
        """Per pool of `pools` (replicated pools, table order), (this process's id, the
        descriptor of its L3 file); (0, 0) for a pool without bytes: what rank 0 hands the
        other ranks (C6a) for `attach_l3`. ConfigError for the one-pool engine (its pool is
        sharded: every rank writes its own)."""
        files = self.group_storage.files
        return [
            v for name in pools for v in (files[name].share_handle() if name in files else (0, 0))
        ]

    def attach_l3(self, pools: Sequence[str], shared: Sequence[int]) -> None:
        """Read each of `pools` that has bytes from rank 0's file (`shared`: rank 0's
        `share_l3(pools)`) and never write it here; call it before any transfer.
        StorageError when a file cannot be reached or is not this geometry's."""
        # Verify one (pid, fd) pair per pool: C6a's length is the pools'.
        assert len(shared) == 2 * len(pools), (shared, pools)
        storage = self.group_storage
        for i, name in enumerate(pools):
            if name in storage.files:
                storage.attach(name, share_path(shared[2 * i], shared[2 * i + 1]))

    def is_replica(self, pool: str) -> bool:
        """Whether `pool` is read from rank 0's file here, and never written (`attach_l3`)."""
        return self._many is not None and pool in self._many.storage.replicas

    def writes(self, pool: str) -> bool:
        """Whether an H2S writes `pool`'s bytes here (not a replica, nor a pool without bytes)."""
        return pool in self._files() and not self.is_replica(pool)

    def l3_checksums(self, pool: str, slots: Pages) -> list[int] | None:
        """The checksums this rank recorded for `slots` of `pool` when it wrote them; None
        when it writes none of the pool (a replica, or a pool without bytes)."""
        if not self.writes(pool):
            return None
        # C6b runs only after the H2S was observed DONE here: every slot is written.
        return [int(c) for c in self._files()[pool].checksums(slots)]

    def record_l3(self, pool: str, slots: Pages, checksums: Sequence[int]) -> None:
        """Rank 0's checksums of `slots` of replica `pool` (C6b): read as written from now on."""
        self._files()[pool].record(slots, np.asarray(checksums, dtype=np.uint32))

    # -- invariant I4 ---------------------------------------------------------------------------

    def pool_digests(self, tier: str, pages: Pages) -> dict[str, npt.NDArray[np.uint64]]:
        """Per byte pool, one uint64 per anchor page of `tier`: its `ratio` pool pages'
        digests mixed (`mix_columns`); L3 reads each pool's file (`slot_digests`). Where an
        L1 anchor page's window was freed (a trailing pool's pages gone, spec/pools.md
        "Freed windows"), the pools on the trailing pool's indices hold nothing: `UNSERVABLE`
        for them, the others' digests as always. A page missing any pool is not a whole
        group, so `digests` (I4) is `UNSERVABLE` there and skips that copy (the tiers below
        still compare theirs)."""
        which, ids = digest_pages(tier, pages, self._capacity)
        out: dict[str, npt.NDArray[np.uint64]] = {
            p.name: np.full(ids.size, UNSERVABLE, dtype=np.uint64) for p in self.pools.pools
        }
        if not ids.size:
            return out
        mapped = self.pool_pages(which, ids, freed=True)
        files = self._files()
        for p in self.pools.pools:
            rows = mapped[p.source].reshape(ids.size, self.ratios[p.source])
            held = (rows != TOMBSTONE).all(axis=1)
            if not held.any():
                continue
            own = rows[held].ravel()
            if which is Tier.L3:
                d = slot_digests(files[p.name], own)
            elif self._one is not None:
                d = page_digest(self._one.l1 if which is Tier.L1 else self._one.l2, own)
            else:
                d = pool_digest(self.group_l1 if which is Tier.L1 else self.group_l2, p.name, own)
            out[p.name][held] = mix_columns(d.reshape(int(held.sum()), self.ratios[p.source]))
        return out

    def digests(self, tier: str, pages: Pages) -> npt.NDArray[np.uint64]:
        """One uint64 per anchor page of `tier`: every pool's `pool_digests` mixed, so a
        change in any one pool changes it (the one pool's: its pages' own, `digest_rows` of
        the page's bytes in page-major order); `UNSERVABLE` where any pool's slot is."""
        per_pool = self.pool_digests(tier, pages)
        return mix_columns(np.stack(list(per_pool.values()), axis=1))

    # -- status and lifetime --------------------------------------------------------------------

    def status(self) -> dict[str, object]:
        """Kernels (with the reason for the choice), pools, and every counter."""
        if self._one is not None:
            one = self._one
            return {
                "data_plane": "real",
                "backends": {
                    "gather": one.kernels.gather_backend,
                    "scatter": one.kernels.scatter_backend,
                    "reason": one.kernels.reason,
                },
                "pools": {
                    "bytes_per_page": one.geometry.bytes_per_page,
                    "l1_pages": one.l1.capacity_pages,
                    "l2_pages": one.l2.capacity_pages,
                    "l3_slots": one.l3.slots,
                    "l3_path": one.l3.path,
                },
                "dma": one.dma.status(),
                "storage": vars(one.storage.counters).copy(),
            }
        many = self._general("status")
        return {
            "data_plane": "real",
            "group": self.group.name,
            "backends": {
                "gather": many.mover.kernels.mode,
                "scatter": many.mover.kernels.mode,
                "reason": many.mover.kernels.reason,
            },
            "pools": {
                p.name: {"source": p.source, "bytes_per_page": p.bytes_per_page}
                for p in self.pools.pools
            },
            "capacity": {str(t): dict(self._pool_caps[t]) for t in self._capacity},
            "dma": {str(d): vars(c).copy() for d, c in many.mover.counters.items()},
            "storage": {name: vars(m.counters).copy() for name, m in many.storage.movers.items()},
        }

    @property
    def closed(self) -> bool:
        """Whether `close` ran: the plane holds no bytes to read any more."""
        return self._closed

    def close(self) -> None:
        """Cancel DMA still in flight, let file I/O finish, close the L3 file(s); forget the
        mapping (it holds the control plane). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._one is not None:
            self._one.dma.close()
            self._one.storage.close()
            self._one.l3.close()
        else:
            self.mover.close()
            self.group_storage.close()
        self._pool_pages = None

    def __enter__(self) -> TransferEngine:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def byte_engine(plane: object) -> TransferEngine:
    """`plane` as the engine with bytes; ConfigError for any other plane with bytes (the
    verifier and producer read the engine's L1 pools)."""
    if not isinstance(plane, TransferEngine):
        raise ConfigError(
            "engine",
            "a plane with bytes must be a TransferEngine (the verifier and producer "
            "read its L1 pools); pass a NullEngine or none",
        )
    return plane
