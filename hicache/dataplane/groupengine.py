"""The group transfer engine: the controller's data plane for a pool group.

    GroupTransferEngine                       the DataPlane the controller drives
      l1       GroupDevicePool                per byte pool a layer-first region
      l2       GroupHostPool                  per byte pool a page-major region
      mover    GroupMover                     d2h / h2d of every pool, one operation
      storage  GroupStorageMover              h2s / s2h, one L3 file per pool

The controller names *anchor* pages (a tree value is anchor pages). Each call maps them to
every allocating pool's pages through `pool_pages(tier, anchor_pages)` -- the control plane's
answer (its per-tier `TierPools`), injected at construction or bound later (`bind`) -- and
moves every byte pool in one group operation; derived pools follow their source:

    anchor pages   a0 a1 a2           ->   pool_pages("L1", [a0 a1 a2])
    kv  (anchor)   a0 a1 a2                 c4, c128 ... move these pages
    swa            s0 s1 s2 (x ratio)       c4_state ... move these pages

Contract: page arguments are checked exactly as the single-pool engine checks them
(`transfer_pages`: InvalidPages naming the same fields), then the mapping is checked (every
allocating pool named, `ratio` pages per anchor page, in range, the anchor's own entry equal
to the anchor pages): a refused call issues nothing. Request-scoped pools (`backupable =
False`) are not part of the engine: they never reach L2 or L3.

`digests(tier, pages)` is I4's one uint64 per anchor page, mixed from every pool's page
digests (`pool_digests`, per pool) so that a changed byte in any single pool changes it;
L3 slots that a read would not serve digest as `UNSERVABLE` in every pool. Faults are the
single-pool engine's sites: DMA sites once per group D2H/H2D, I/O sites per piece of each
pool's L3 part; an L3 slot error names the *anchor* slot, as the controller's tree holds.
Not thread-safe: one thread issues and polls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import TracebackType

import numpy as np
import numpy.typing as npt
import torch

from hicache.dataplane.faults import FaultInjector
from hicache.dataplane.groupgeometry import GroupGeometry
from hicache.dataplane.groupmix import mix_columns
from hicache.dataplane.grouppools import GroupDevicePool, GroupHostPool, pool_digest
from hicache.dataplane.groupstorage import GroupStorageMover
from hicache.dataplane.grouptransfer import GroupMover
from hicache.dataplane.handles import TransferHandle
from hicache.dataplane.null import check_capacities, digest_pages, page_array, transfer_pages
from hicache.dataplane.pools import resolve_device
from hicache.dataplane.slotdigest import slot_digests
from hicache.dataplane.slotnames import AnchorSlotHandle
from hicache.dataplane.storage import share_path
from hicache.errors import ConfigError, InvalidPages
from hicache.pages import Pages
from hicache.pools.spec import PoolGroup
from hicache.pools.tierpools import tier_capacities
from hicache.snapshot import TOMBSTONE, UNSERVABLE
from hicache.tiers import Direction, Tier

PoolPages = Callable[[str, Pages], Mapping[str, object]]
"""(tier "L1" | "L2" | "L3", anchor pages) -> pages per allocating pool, anchor included,
`ratio` pages per anchor page in anchor order (the control plane's `TierPools.pool_pages`)."""

BACKENDS = {"auto": "auto", "torch": "torch", "triton": "per_pool"}  # CacheConfig.backend -> mode
UNLANDED_BYTE = 0xA5  # what `unland` leaves in a pool page an S2H stopped before


class GroupTransferEngine:
    """L1, L2 and L3 of a pool group with the movers between them (module docstring).

    Capacities are in anchor pages (L3: anchor slots), sized as the control plane sizes them
    (`tierpools.tier_capacities`): an allocating pool of anchor/own
    page-size `ratio` gets `ratio` times as many unless `pool_capacities[tier][pool]` says
    otherwise (the control plane's own option of that name: pass the same). `backend`:
    CacheConfig's name ("auto", "torch", "triton": the per-pool Triton kernels).
    `pool_pages`: None until `bind`; a transfer or digest before then raises ConfigError.
    ConfigError naming the field for bad sizes; L3 is one temporary file per byte pool,
    removed on close.
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
        backend: str = "auto",
        io_threads: int = 2,
        faults: FaultInjector | None = None,
        pool_capacities: Mapping[str, Mapping[str, int]] | None = None,
    ) -> None:
        check_capacities(l1_pages, l2_pages, l3_slots)
        if backend not in BACKENDS:
            raise ConfigError("backend", f"one of {sorted(BACKENDS)}, got {backend!r}")
        self.group = group.backed_up()  # what L2 and L3 hold
        self.geometry = GroupGeometry.from_group(self.group)
        self.ratios = {p.name: self.group.ratio(p.name) for p in self.group.allocating}
        self._capacity = {Tier.L1: l1_pages, Tier.L2: l2_pages, Tier.L3: l3_slots}
        given = pool_capacities or {}
        for tier, caps in given.items():
            unknown = sorted(set(caps) - set(self.ratios))
            if tier not in ("L1", "L2", "L3") or unknown:
                raise ConfigError(
                    f"pool_capacities.{tier}",
                    f"tiers L1, L2, L3 of allocating "
                    f"pools {sorted(self.ratios)}; unknown: {unknown or tier}",
                )
        self._pool_caps = {
            t: tier_capacities(self.group, str(t), n, given) for t, n in self._capacity.items()
        }  # the control plane's sizing
        self.device = resolve_device(device)
        self.l1 = GroupDevicePool(self.geometry, self._pool_capacity(Tier.L1), self.device)
        self.l2 = GroupHostPool(
            self.geometry, self._pool_capacity(Tier.L2), pin=self.device.type == "cuda"
        )
        self.mover = GroupMover(self.l1, self.l2, BACKENDS[backend], faults=faults)
        self.storage = GroupStorageMover(
            self.l2, self._pool_capacity(Tier.L3), io_threads=io_threads, faults=faults
        )
        self._pool_pages = pool_pages
        self._closed = False

    def _pool_capacity(self, tier: Tier) -> dict[str, int]:
        return dict(self._pool_caps[tier])

    def bind(self, pool_pages: PoolPages) -> None:
        """Take the control plane's mapping (it exists only once the plane is built)."""
        self._pool_pages = pool_pages

    @property
    def l3_path(self) -> str:
        """The per-pool L3 files' (temporary) paths, for errors."""
        return ", ".join(f.path for f in self.storage.files.values())

    @property
    def corrupt_reads(self) -> int:
        """L3 reads, of any pool's file, whose bytes failed their slot's checksum."""
        return sum(f.corrupt_reads for f in self.storage.files.values())

    # -- anchor pages -> pool pages ---------------------------------------------------------

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
                "the group engine is not bound to a control plane; call bind(pool_pages) first",
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

    def _request(
        self, direction: Direction, source: object, target: object
    ) -> dict[str, tuple[Pages, Pages]]:
        src, dst = transfer_pages(
            direction,
            source,
            target,
            self._capacity[direction.source],
            self._capacity[direction.target],
        )
        a = self.pool_pages(direction.source, src)
        b = self.pool_pages(direction.target, dst)
        return {name: (a[name], b[name]) for name in self.ratios}

    # -- transfers ----------------------------------------------------------------------------

    def d2h(
        self, l1_pages: Pages, l2_pages: Pages, *, after: torch.cuda.Stream | None = None
    ) -> TransferHandle:
        """Backup: every pool's pages of L1 anchor pages -> those of L2 anchor pages."""
        return self.mover.d2h(self._request(Direction.D2H, l1_pages, l2_pages), after=after)

    def h2d(
        self, l2_pages: Pages, l1_pages: Pages, *, after: torch.cuda.Stream | None = None
    ) -> TransferHandle:
        """Load-back: L2 -> L1, every pool; see `d2h`."""
        return self.mover.h2d(self._request(Direction.H2D, l2_pages, l1_pages), after=after)

    def h2s(self, l2_pages: Pages, slots: Pages) -> TransferHandle:
        """Backup: L2 anchor pages -> L3 anchor slots, every pool into its own file."""
        request = self._request(Direction.H2S, l2_pages, slots)
        return AnchorSlotHandle(
            self.storage.h2s(request), self.geometry, request, self.ratios, target=True
        )

    def s2h(self, slots: Pages, l2_pages: Pages) -> TransferHandle:
        """Promotion: L3 anchor slots -> L2; DONE only once every pool's checksums matched."""
        request = self._request(Direction.S2H, slots, l2_pages)
        return AnchorSlotHandle(
            self.storage.s2h(request), self.geometry, request, self.ratios, target=False
        )

    def unland(self, l2_pages: Pages, landed: Mapping[str, int]) -> None:
        """An S2H into L2 anchor pages `l2_pages` stopped part way (an aimed `partial`,
        aimed.py): each byte pool's own pages past its leading run of `landed[pool]` (in
        transfer order; a pool not named: all) are overwritten with UNLANDED_BYTE, as bytes
        that never arrived hold anything but the slot's. Call only once nothing moves them."""
        ids = page_array("unland.l2_pages", l2_pages, self._capacity[Tier.L2])
        mapped = self.pool_pages(Tier.L2, ids)
        for p in self.geometry.pools:
            past = mapped[p.source][landed.get(p.name, 0) :]
            if past.size:
                self.l2.bytes_view(p.name)[torch.from_numpy(past)] = UNLANDED_BYTE

    def scribble(self, tier: Tier, pages_of: Mapping[str, Pages], value: int) -> None:
        """Fill pages of L1 or L2 with byte `value`: a sanitizer's write (the fuzz poisons
        each page a reservation takes, so one published before its bytes arrived holds bytes
        no copy holds). `pages_of[source]`: an allocating pool's own pages; every byte pool
        on its indices is filled there. Only for pages no transfer moves now (a reservation's,
        before its transfer is issued); on CUDA it returns once the fill is done, so a
        transfer issued next on another stream writes after it."""
        assert tier in (Tier.L1, Tier.L2), tier
        caps = self._pool_caps[tier]
        for p in self.geometry.pools:
            ids = pages_of.get(p.source)
            if ids is None or not len(ids):
                continue
            idx = torch.from_numpy(page_array(f"scribble.{tier}.{p.name}", ids, caps[p.source]))
            if tier is Tier.L1:
                self.l1.region(p.name).index_fill_(1, idx.to(self.l1.device), value)
                if self.l1.device.type == "cuda":
                    torch.cuda.current_stream(self.l1.device).synchronize()
            else:
                self.l2.bytes_view(p.name).index_fill_(0, idx, value)

    def corrupt_slot(self, slot: int) -> None:
        """Flip one byte of anchor slot `slot` in the first byte pool's file (an aimed
        `corrupt`): the next S2H reading it fails (CorruptSlot naming `slot`, a miss)."""
        ids = page_array("corrupt_slot.slot", [slot], self._capacity[Tier.L3])
        first = self.geometry.pools[0]
        pool_slots = self.pool_pages(Tier.L3, ids)[first.source]
        self.storage.movers[first.name].flip_byte(int(pool_slots[0]))

    # -- a replicated pool's one L3 copy, across ranks (spec/tp.md, "L3 writes") ------------

    def share_l3(self, pools: Sequence[str]) -> list[int]:
        """Per pool of `pools` (replicated pools, table order), (this process's id, the
        descriptor of its L3 file); (0, 0) for a pool without bytes: what rank 0 hands the
        other ranks (C6a) for `attach_l3`."""
        files = self.storage.files
        return [
            v for name in pools for v in (files[name].share_handle() if name in files else (0, 0))
        ]

    def attach_l3(self, pools: Sequence[str], shared: Sequence[int]) -> None:
        """Read each of `pools` that has bytes from rank 0's file (`shared`: rank 0's
        `share_l3(pools)`) and never write it here; call it before any transfer.
        StorageError when a file cannot be reached or is not this geometry's."""
        # Verify one (pid, fd) pair per pool: C6a's length is the pools'.
        assert len(shared) == 2 * len(pools), (shared, pools)
        for i, name in enumerate(pools):
            if name in self.storage.files:
                self.storage.attach(name, share_path(shared[2 * i], shared[2 * i + 1]))

    def is_replica(self, pool: str) -> bool:
        """Whether `pool` is read from rank 0's file here, and never written (`attach_l3`)."""
        return pool in self.storage.replicas

    def writes(self, pool: str) -> bool:
        """Whether an H2S writes `pool`'s bytes here (not a replica, nor a pool without bytes)."""
        return pool in self.storage.files and not self.is_replica(pool)

    def l3_checksums(self, pool: str, slots: Pages) -> list[int] | None:
        """The checksums this rank recorded for `slots` of `pool` when it wrote them; None
        when it writes none of the pool (a replica, or a pool without bytes)."""
        if not self.writes(pool):
            return None
        # C6b runs only after the H2S was observed DONE here: every slot is written.
        return [int(c) for c in self.storage.files[pool].checksums(slots)]

    def record_l3(self, pool: str, slots: Pages, checksums: Sequence[int]) -> None:
        """Rank 0's checksums of `slots` of replica `pool` (C6b): read as written from now on."""
        self.storage.files[pool].record(slots, np.asarray(checksums, dtype=np.uint32))

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
            p.name: np.full(ids.size, UNSERVABLE, dtype=np.uint64) for p in self.geometry.pools
        }
        if not ids.size:
            return out
        mapped = self.pool_pages(which, ids, freed=True)
        for p in self.geometry.pools:
            rows = mapped[p.source].reshape(ids.size, self.ratios[p.source])
            held = (rows != TOMBSTONE).all(axis=1)
            if not held.any():
                continue
            own = rows[held].ravel()
            if which is Tier.L3:
                d = slot_digests(self.storage.files[p.name], own)
            else:
                d = pool_digest(self.l1 if which is Tier.L1 else self.l2, p.name, own)
            out[p.name][held] = mix_columns(d.reshape(int(held.sum()), self.ratios[p.source]))
        return out

    def digests(self, tier: str, pages: Pages) -> npt.NDArray[np.uint64]:
        """One uint64 per anchor page of `tier`: every pool's `pool_digests` mixed, so a
        change in any one pool changes it; `UNSERVABLE` where any pool's slot is."""
        per_pool = self.pool_digests(tier, pages)
        return mix_columns(np.stack(list(per_pool.values()), axis=1))

    # -- status and lifetime --------------------------------------------------------------------

    def status(self) -> dict[str, object]:
        """Kernels (with the reason for the choice), pools, and every counter."""
        return {
            "data_plane": "real",
            "group": self.group.name,
            "backends": {
                "gather": self.mover.kernels.mode,
                "scatter": self.mover.kernels.mode,
                "reason": self.mover.kernels.reason,
            },
            "pools": {
                p.name: {"source": p.source, "bytes_per_page": p.bytes_per_page}
                for p in self.geometry.pools
            },
            "capacity": {str(t): self._pool_capacity(t) for t in self._capacity},
            "dma": {str(d): vars(c).copy() for d, c in self.mover.counters.items()},
            "storage": {name: vars(m.counters).copy() for name, m in self.storage.movers.items()},
        }

    @property
    def closed(self) -> bool:
        """Whether `close` ran: the plane holds no bytes to read any more."""
        return self._closed

    def close(self) -> None:
        """Cancel DMA in flight, let file I/O finish, close the L3 files; forget the mapping
        (it holds the control plane). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.mover.close()
        self.storage.close()
        self._pool_pages = None

    def __enter__(self) -> GroupTransferEngine:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
