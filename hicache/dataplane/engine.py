"""The transfer engine: the one data plane with bytes that the controller holds.

A single pool is a group of one. The engine is built from a `PoolGroup` and moves every
pool of it per call, on anchor pages; it delegates the bytes to one of its two byte paths
(bytepaths.py): `OnePoolPath` for a typed group of one (`PoolGroup.typed`: the `mha` pool at
a KV geometry, `one_pool(geometry)`), `GroupPath` for every other group. Both move the same
bytes (tests/test_one_engine.py holds them to it). Anchor pages map to each allocating
pool's pages through the control plane's answer (anchormap.py), given at construction; a
group of one maps to itself.

Contract: every transfer takes int64 page arrays (source first, target second, as the method
name reads) and returns a `TransferHandle` the caller polls. Page arguments are checked by
the null engine's function (`null.transfer_pages`): both planes raise InvalidPages for the
same inputs, before anything is issued; the mapping is checked too (`AnchorMap`): a refused
call issues nothing. Request-scoped pools (`backupable = False`) are not part of the engine:
they never reach L2 or L3.

`digests(tier, pages)` fingerprints page bytes for invariant I4: one uint64 per anchor page,
the same bytes giving the same digest in L1, L2 and L3; for a group, mixed from every pool's
page digests (`pool_digests`), so a changed byte in any one pool changes it; L3 slots a read
would not serve digest as `UNSERVABLE`. Faults: DMA sites once per D2H/H2D, I/O sites per
piece of each pool's L3 part; an L3 slot error names the *anchor* slot. Not thread-safe: one
thread issues and polls. Transfers may be in flight while that thread captures a CUDA graph;
`capture.py` says what may run meanwhile.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import NoReturn

import numpy as np
import numpy.typing as npt
import torch

from hicache.choices import TransferRoute
from hicache.core.pages import Pages
from hicache.core.snapshot import TOMBSTONE, UNSERVABLE
from hicache.core.tiers import Tier
from hicache.dataplane.anchormap import AnchorMap, PoolPages
from hicache.dataplane.bytepaths import GROUP_BACKENDS, BytePath, GroupPath, OnePoolPath
from hicache.dataplane.dma import DeviceHostMover
from hicache.dataplane.faults import FaultInjector
from hicache.dataplane.geometry import KVGeometry
from hicache.dataplane.groupgeometry import GroupGeometry, one_pool, typed_geometry
from hicache.dataplane.groupmix import mix_columns
from hicache.dataplane.grouppools import GroupDevicePool, GroupHostPool
from hicache.dataplane.groupstorage import GroupStorageMover
from hicache.dataplane.grouptransfer import GroupMover
from hicache.dataplane.handles import TransferHandle
from hicache.dataplane.null import check_capacities, digest_pages, page_array
from hicache.dataplane.pools import DevicePool, HostPool, resolve_device
from hicache.dataplane.slotdigest import slot_digests
from hicache.dataplane.storage import L3File, share_path
from hicache.dataplane.storage_io import StorageMover
from hicache.errors import ConfigError
from hicache.kernels import KernelSet
from hicache.pools.spec import PoolGroup
from hicache.pools.tierpools import tier_capacities

__all__ = ["PoolPages", "TransferEngine", "byte_engine", "one_pool"]

UNLANDED_BYTE = 0xA5  # what `unland` leaves in a pool page an S2H stopped before


class TransferEngine:
    """L1, L2 and L3 of a pool group with the movers between them (module docstring).

    `group`: the pools (`one_pool(geometry)` for the single-pool plane). Capacities are in
    anchor pages (L3: anchor slots), sized as the control plane sizes them
    (`tierpools.tier_capacities`): an allocating pool of anchor/own page-size `ratio` gets
    `ratio` times as many unless `pool_capacities[tier][pool]` says otherwise (the control
    plane's own option of that name: pass the same). `pool_pages`: the control plane's
    mapping (a group of one allocating pool needs none); an engine built before its control
    plane takes it once with `bind`. `device`: None picks cuda when available. `backend`:
    "auto" | "triton" | "torch" (`KernelSet.create`; for a raw-bytes group, "triton" is the
    per-pool Triton kernels). `io_threads`: None for 4 (typed group of one) or 2 (a group).
    A typed group of one only: `l3_path` (None: a temporary file; an existing path is taken
    over only if it is a hicache L3 file or `l3_overwrite`, never a symlink; `L3File`, whose
    header records the geometry), `chunk_pages` (fixed DMA chunking; None: dma.py's
    doubling schedule), `layerwise` (H2Ds land layer by layer where they can, each handle's
    `gate` says when: layerwise.py). `transfer_route`: how D2Hs and H2Ds move their pages
    (CacheConfig's knob: auto, dma, mapped, pitched -- a group has no pitched route;
    routes.route_requests). Any other group keeps one temporary L3 file per pool,
    removed on close. Raises ConfigError naming the field for bad sizes, StorageError for an
    unusable L3 path, BackendError when an explicitly requested backend cannot run.
    """

    has_bytes = True

    def __init__(
        self,
        group: PoolGroup,
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
        layerwise: bool = False,
        transfer_route: TransferRoute | str = TransferRoute.AUTO,
    ) -> None:
        if not isinstance(group, PoolGroup):
            raise ConfigError(
                "group", f"a PoolGroup (one_pool(geometry) for one pool), got {type(group)}"
            )
        check_capacities(l1_pages, l2_pages, l3_slots)
        self._capacity = {Tier.L1: l1_pages, Tier.L2: l2_pages, Tier.L3: l3_slots}
        self.group = group.backed_up()  # what L2 and L3 hold
        self.pools = GroupGeometry.from_group(self.group)  # the byte pools, table order
        self.ratios = {p.name: self.group.ratio(p.name) for p in self.group.allocating}
        self._pool_caps = self._sizes(pool_capacities or {})
        self.device = resolve_device(device)
        self._anchors = AnchorMap(
            self._capacity, self._pool_caps, self.ratios, self.group.anchor.name, pool_pages
        )
        kv = typed_geometry(self.group)
        route = TransferRoute.parse("transfer_route", transfer_route)
        self._path: BytePath
        if kv is not None:
            self._path = OnePoolPath(
                kv,
                self._anchors,
                self.device,
                l3_path=l3_path,
                backend=backend,
                io_threads=4 if io_threads is None else io_threads,
                faults=faults,
                chunk_pages=chunk_pages,
                l3_overwrite=l3_overwrite,
                layerwise=layerwise,
                transfer_route=route,
            )
        else:
            for field, value in (("l3_path", l3_path), ("chunk_pages", chunk_pages)):
                if value is not None:
                    raise ConfigError(field, "a pool group's engine takes none; pass None")
            if backend not in GROUP_BACKENDS:
                raise ConfigError("backend", f"one of {sorted(GROUP_BACKENDS)}, got {backend!r}")
            self._path = GroupPath(
                self.pools,
                self._anchors,
                self.device,
                backend=backend,
                io_threads=2 if io_threads is None else io_threads,
                faults=faults,
                transfer_route=route,
            )
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

    # -- each path's own pieces (tests and benchmarks reach them) --------------------------------

    @property
    def one_pool(self) -> bool:
        """Whether `OnePoolPath` moves the bytes (a typed group of one)."""
        return isinstance(self._path, OnePoolPath)

    def _only(self, what: str, one: bool) -> NoReturn:
        raise ConfigError(
            what,
            "only the single-pool engine (a typed group of one) has it"
            if one
            else "only a pool group's engine (a group of raw bytes) has it",
        )

    def _fast(self, what: str) -> OnePoolPath:
        if not isinstance(self._path, OnePoolPath):
            self._only(what, True)
        return self._path

    def _general(self, what: str) -> GroupPath:
        if not isinstance(self._path, GroupPath):
            self._only(what, False)
        return self._path

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

    @property
    def l3_path(self) -> str:
        """The L3 file's path, or the per-pool files' (temporary) paths, for errors."""
        return ", ".join(f.path for f in self._path.files.values())

    @property
    def corrupt_reads(self) -> int:
        """L3 reads, of any pool's file, whose bytes failed their slot's checksum."""
        return sum(f.corrupt_reads for f in self._path.files.values())

    # -- the bytes of L1, whichever path (what the producer writes and the verifier reads) ------

    @property
    def l1_arena(self) -> torch.Tensor:
        """The tensor holding every L1 byte (what the controller hands its producer)."""
        return self._path.l1_arena

    def l1_region(self, name: str) -> torch.Tensor:
        """uint8 `[rows_per_page, pages, row_bytes]` of byte pool `name` in L1 (a view)."""
        return self._path.l1_region(self.pools.pool(name).name)  # ConfigError: no such pool

    def packed(self, tier: Tier, name: str, page_ids: Pages) -> torch.Tensor:
        """A copy of pool `name`'s pages `page_ids` of L1 or L2, page-major uint8 `[n,
        bytes_per_page]` on the tier's device: plain torch, independent of the transfer
        kernels."""
        assert tier in (Tier.L1, Tier.L2), tier
        return self._path.packed(tier, self.pools.pool(name).name, page_ids)

    # -- anchor pages -> pool pages ---------------------------------------------------------

    def bind(self, pool_pages: PoolPages) -> None:
        """Take the control plane's mapping: for an engine built before its control plane."""
        self._anchors.bind(pool_pages)

    def pool_pages(
        self, tier: Tier, anchor_pages: Pages, *, freed: bool = False
    ) -> dict[str, Pages]:
        """Every allocating pool's pages for validated `anchor_pages` of `tier`
        (`AnchorMap.pool_pages`: checked; InvalidPages naming the pool otherwise)."""
        return self._anchors.pool_pages(tier, anchor_pages, freed=freed)

    # -- transfers ----------------------------------------------------------------------------

    def d2h(
        self, l1_pages: Pages, l2_pages: Pages, *, after: torch.cuda.Stream | None = None
    ) -> TransferHandle:
        """Backup: every pool's pages of L1 anchor pages -> those of L2 anchor pages. `after`:
        the stream that produced the pages/indices (default: the current stream); the
        transfer starts after its queued work."""
        return self._path.d2h(l1_pages, l2_pages, after)

    def h2d(
        self, l2_pages: Pages, l1_pages: Pages, *, after: torch.cuda.Stream | None = None
    ) -> TransferHandle:
        """Load-back: L2 -> L1, every pool; see `d2h` for `after`."""
        return self._path.h2d(l2_pages, l1_pages, after)

    def h2s(self, l2_pages: Pages, slots: Pages) -> TransferHandle:
        """Backup: L2 anchor pages -> L3 anchor slots, every pool into its own file."""
        return self._path.h2s(l2_pages, slots)

    def s2h(self, slots: Pages, l2_pages: Pages) -> TransferHandle:
        """Promotion: L3 anchor slots -> L2; DONE only once every pool's checksums matched."""
        return self._path.s2h(slots, l2_pages)

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
                self._path.l2_bytes(p.name)[torch.from_numpy(past)] = UNLANDED_BYTE

    def scribble(self, tier: Tier, pages_of: Mapping[str, Pages], value: int) -> None:
        """Fill pages of L1 or L2 with byte `value`: a sanitizer's write (the fuzz poisons
        each page a reservation takes, so one published before its bytes arrived holds bytes
        no copy holds). `pages_of[source]`: an allocating pool's own pages (a group of one:
        its one pool's, under any name); every byte pool on its indices is filled there. Only
        for pages no transfer moves now (a reservation's, before its transfer is issued); on
        CUDA it returns once the fill is done, so a transfer issued next on another stream
        writes after it."""
        assert tier in (Tier.L1, Tier.L2), tier
        if len(self.ratios) == 1 and pages_of:
            (only,) = pages_of.values()  # a group of one: its one pool's pages, any name
            pages_of = {self.group.anchor.name: only}
        caps = self._pool_caps[tier]
        for p in self.pools.pools:
            ids = pages_of.get(p.source)
            if ids is None or not len(ids):
                continue
            idx = torch.from_numpy(page_array(f"scribble.{tier}.{p.name}", ids, caps[p.source]))
            if tier is Tier.L1:
                self._path.l1_region(p.name).index_fill_(1, idx.to(self.device), value)
                if self.device.type == "cuda":
                    torch.cuda.current_stream(self.device).synchronize()
            else:
                self._path.l2_bytes(p.name).index_fill_(0, idx, value)

    def corrupt_slot(self, slot: int) -> None:
        """Flip one byte of anchor slot `slot` in the first byte pool's file (an aimed
        `corrupt`): the next S2H reading it fails (CorruptSlot naming `slot`, a miss)."""
        self._path.corrupt_slot(page_array("corrupt_slot.slot", [slot], self._capacity[Tier.L3]))

    def run_deferred(self) -> None:
        """Run the L3 I/O deferred on the deterministic schedule (`io_threads=0`) here; a
        group's per-pool parts run at issue: nothing waits."""
        self._path.run_deferred()

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
        return pool in self._path.replicas()

    def writes(self, pool: str) -> bool:
        """Whether an H2S writes `pool`'s bytes here (not a replica, nor a pool without bytes)."""
        return pool in self._path.files and not self.is_replica(pool)

    def l3_checksums(self, pool: str, slots: Pages) -> list[int] | None:
        """The checksums this rank recorded for `slots` of `pool` when it wrote them; None
        when it writes none of the pool (a replica, or a pool without bytes)."""
        if not self.writes(pool):
            return None
        # C6b runs only after the H2S was observed DONE here: every slot is written.
        return [int(c) for c in self._path.files[pool].checksums(slots)]

    def record_l3(self, pool: str, slots: Pages, checksums: Sequence[int]) -> None:
        """Rank 0's checksums of `slots` of replica `pool` (C6b): read as written from now on."""
        self._path.files[pool].record(slots, np.asarray(checksums, dtype=np.uint32))

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
        files = self._path.files
        for p in self.pools.pools:
            rows = mapped[p.source].reshape(ids.size, self.ratios[p.source])
            held = (rows != TOMBSTONE).all(axis=1)
            if not held.any():
                continue
            own = rows[held].ravel()
            if which is Tier.L3:
                d = slot_digests(files[p.name], own)
            else:
                d = self._path.page_digests(which, p.name, own)
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
        return self._path.status()

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
        self._path.close()
        self._anchors.bind(None)

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
