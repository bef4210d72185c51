"""Per-pool L1 (device) and L2 (host) pools of a group, each tier one flat byte arena.

    arena   | pool 0 region | pad | pool 1 region | pad | ...       uint8, one tensor per tier
    L1      region [rows_per_page, capacity, row_bytes]     layer-first, like the MHA pool
    L2      region [capacity, rows_per_page, row_bytes]     page-major: one page = one run of
                                                            bytes_per_page contiguous bytes

Why one arena per tier: every byte of a group sits at an offset from one base pointer, so one
kernel launch can copy rows of every pool from a table of (offset, bytes) (kernels/
row_table.py), and a run of consecutive L2 pages of one pool is one DMA. Regions start at a
multiple of `REGION_ALIGN` bytes. Only pools that hold bytes get a region; a derived pool's
capacity is its source's. Capacities are given per allocating pool (anchor included, even
when it holds no bytes: its indices name its sidecars' pages). Arenas are zero-filled, so an
unwritten page digests the same in every tier.

`pool_digest(tier, pool, pages)` is I4's per-pool page fingerprint (the same `digest_rows`
hash of the page's bytes in page-major order as the single-pool `page_digest`, so an MHA pool
digests alike in both); `group_digest` folds every pool's digests of one group page set.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt
import torch

from hicache.core.pages import Pages, pages
from hicache.dataplane.groupgeometry import GroupGeometry
from hicache.dataplane.pools import allocate, digest_rows, resolve_device
from hicache.errors import ConfigError
from hicache.pools.spec import PoolSpec

REGION_ALIGN = 256  # bytes: 16-byte vector loads and DMA-friendly starts for every region


def _capacities(
    geometry: GroupGeometry, capacity_pages: Mapping[str, int], field: str
) -> dict[str, int]:
    """Capacity per allocating pool, validated; ConfigError naming `field.<pool>` otherwise."""
    unknown = sorted(set(capacity_pages) - set(geometry.sources))
    if unknown:
        raise ConfigError(
            field,
            f"not allocating pools of {geometry.group.name}: {unknown}; "
            f"give pages for {list(geometry.sources)}",
        )
    out: dict[str, int] = {}
    for source in geometry.sources:
        value = capacity_pages.get(source)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(
                f"{field}.{source}", f"a positive number of pages (at least one), got {value!r}"
            )
        out[source] = value
    return out


class _Arena:
    """The regions of one tier: byte offset and capacity per byte pool, one flat tensor."""

    def __init__(
        self,
        geometry: GroupGeometry,
        capacity_pages: Mapping[str, int],
        *,
        device: torch.device,
        pin: bool,
        field: str,
    ) -> None:
        self.geometry = geometry
        self.capacity = _capacities(geometry, capacity_pages, field)
        self.offsets: dict[str, int] = {}
        end = 0
        for p in geometry.pools:
            self.offsets[p.name] = end
            size = self.capacity[p.source] * p.bytes_per_page
            end += -(-size // REGION_ALIGN) * REGION_ALIGN
        self.nbytes = end
        self.tensor = allocate((max(end, REGION_ALIGN),), torch.uint8, device, pin=pin, field=field)
        self._flat: dict[str, torch.Tensor] = {}  # views made once: a transfer asks per pool

    def pages_of(self, pool: PoolSpec) -> int:
        return self.capacity[pool.source]

    def flat(self, pool: PoolSpec) -> torch.Tensor:
        """The pool's region as a flat uint8 view."""
        view = self._flat.get(pool.name)
        if view is None:
            start = self.offsets[pool.name]
            view = self.tensor[start : start + self.pages_of(pool) * pool.bytes_per_page]
            self._flat[pool.name] = view
        return view


class _GroupPool:
    """What L1 and L2 of a group share: one arena, a capacity per allocating pool."""

    geometry: GroupGeometry
    arena: _Arena

    @property
    def tensor(self) -> torch.Tensor:
        return self.arena.tensor

    def capacity(self, source: str) -> int:
        """Pages of allocating pool `source` in this tier (its own pages)."""
        return self.arena.capacity[source]


class GroupDevicePool(_GroupPool):
    """L1 of a group on `device` (CUDA, else CPU): per byte pool a layer-first region."""

    def __init__(
        self,
        geometry: GroupGeometry,
        capacity_pages: Mapping[str, int],
        device: str | torch.device | None,
    ) -> None:
        self.geometry = geometry
        self.device = resolve_device(device)
        self.arena = _Arena(
            geometry, capacity_pages, device=self.device, pin=False, field="l1_pages"
        )
        self._regions: dict[str, torch.Tensor] = {}

    def region(self, name: str) -> torch.Tensor:
        """uint8 `[rows_per_page, capacity, row_bytes]` of pool `name` (a view, made once)."""
        view = self._regions.get(name)
        if view is None:
            p = self.geometry.pool(name)
            view = self.arena.flat(p).view(p.rows_per_page, self.arena.pages_of(p), p.row_bytes)
            self._regions[name] = view
        return view

    def packed(self, name: str, page_ids: Pages) -> torch.Tensor:
        """A copy of pool `name`'s pages `page_ids`, page-major uint8 `[n, bytes_per_page]`,
        on the pool's device: plain torch, independent of the transfer kernels."""
        idx = torch.from_numpy(pages(page_ids)).to(self.device)
        rows = self.region(name).index_select(1, idx)  # [R, n, row_bytes]
        return rows.transpose(0, 1).reshape(idx.numel(), -1)


class GroupHostPool(_GroupPool):
    """L2 of a group in host memory (pinned when `pin`, which needs CUDA): per byte pool a
    page-major region."""

    def __init__(
        self, geometry: GroupGeometry, capacity_pages: Mapping[str, int], *, pin: bool
    ) -> None:
        if pin and not torch.cuda.is_available():
            raise ConfigError(
                "l2.pin", "pinned host memory needs a CUDA device; pass pin=False on CPU"
            )
        self.geometry = geometry
        self.pinned = pin
        self.arena = _Arena(
            geometry, capacity_pages, device=torch.device("cpu"), pin=pin, field="l2_pages"
        )
        self._rows: dict[str, torch.Tensor] = {}

    def bytes_view(self, name: str) -> torch.Tensor:
        """uint8 `[capacity, bytes_per_page]` of pool `name` (a view made once: page i is
        row i)."""
        view = self._rows.get(name)
        if view is None:
            p = self.geometry.pool(name)
            view = self.arena.flat(p).view(self.arena.pages_of(p), p.bytes_per_page)
            self._rows[name] = view
        return view

    def packed(self, name: str, page_ids: Pages) -> torch.Tensor:
        """A copy of pool `name`'s pages `page_ids`, uint8 `[n, bytes_per_page]`."""
        return self.bytes_view(name).index_select(0, torch.from_numpy(pages(page_ids)))


GroupTier = GroupDevicePool | GroupHostPool


def pool_digest(tier: GroupTier, name: str, page_ids: Pages) -> npt.NDArray[np.uint64]:
    """One uint64 per page of `page_ids` of pool `name`: `digest_rows` over the page's bytes
    in page-major order; equal bytes give equal digests in L1 and L2."""
    ids = pages(page_ids)
    if ids.size == 0:
        return np.zeros(0, dtype=np.uint64)
    return digest_rows(tier.packed(name, ids))


def group_digest(tier: GroupTier, page_ids: Mapping[str, Pages]) -> int:
    """One uint64 over every byte pool of the group for the pages named per allocating pool
    (`page_ids[source]`; a pool whose source is not named is left out): each pool's page
    digests, mixed with the pool's position, summed mod 2**64. Equal across tiers exactly
    when every pool's pages digest equal (up to ~2**-64 collisions)."""
    total = np.uint64(0)
    with np.errstate(over="ignore"):
        for i, p in enumerate(tier.geometry.pools):
            if p.source not in page_ids:
                continue
            d = pool_digest(tier, p.name, page_ids[p.source])
            weights = (np.arange(d.size, dtype=np.uint64) + np.uint64(1 + 1000 * i)) * np.uint64(
                0x9E3779B97F4A7C15
            )
            total = total + np.sum(d * (weights | np.uint64(1)), dtype=np.uint64)
    return int(total)
