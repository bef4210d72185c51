"""What one group transfer moves: pages named per allocating pool, bytes for every pool.

    request   {"kv": (source pages, target pages), "swa": (source pages, target pages)}
              one entry per allocating pool the transfer touches (anchor and side pools);
              D2H: source = L1 pages, target = L2 pages; H2D the reverse
    derived   a sidecar or state pool moves its source's pages (c4 on kv's, c4_state on
              swa's); a pool whose source is not named is skipped, as in SGLang's group
              transfers
    packed    one device workspace, pool after pool in table order, each pool's pages
              page-major (so a pool's part is laid out exactly like its L2 region), each
              pool's part starting at a multiple of REGION_ALIGN bytes

`plan_group` checks everything before anything is issued (InvalidPages naming the pool and
side; a rejected transfer changes nothing). `PoolMove.runs` cuts a pool's L2 pages into runs
of consecutive pages: one DMA each.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from hicache.core.pages import Pages
from hicache.core.tiers import Direction
from hicache.dataplane.groupgeometry import GroupGeometry
from hicache.dataplane.grouppools import REGION_ALIGN, GroupDevicePool, GroupHostPool
from hicache.dataplane.null import transfer_pages
from hicache.errors import InvalidPages
from hicache.pools.spec import PoolSpec

# What a caller asks one group transfer to move: allocating pool -> (source, target) pages.
# Not pools.table.GroupPages (a tier's reserved pages per pool, every pool named).
GroupRequest = Mapping[str, tuple[object, object]]


@dataclass(frozen=True)
class PoolMove:
    """One byte pool's share: its L1 and L2 pages (l1[i] <-> l2[i]) and where its packed
    part starts in the workspace (bytes)."""

    pool: PoolSpec
    l1: Pages
    l2: Pages
    packed_at: int

    @property
    def nbytes(self) -> int:
        return int(self.l1.size) * self.pool.bytes_per_page

    def runs(self) -> list[tuple[int, int, int]]:
        """(lo, hi, l2_first): positions [lo, hi) hold L2 pages l2_first .. l2_first+hi-lo-1."""
        n = int(self.l2.size)
        if n == 0:
            return []
        cuts = np.flatnonzero(np.diff(self.l2) != 1) + 1
        bounds = [0, *cuts.tolist(), n]
        return [(a, b, int(self.l2[a])) for a, b in pairwise(bounds)]


@dataclass(frozen=True)
class GroupPlan:
    direction: Direction
    moves: tuple[PoolMove, ...]  # byte pools with pages, table order
    pages: dict[str, tuple[Pages, Pages]]  # validated (l1, l2) per named allocating pool
    packed_bytes: int  # workspace size, alignment padding included

    @functools.cached_property  # read at issue and by the handle: summed once
    def nbytes(self) -> int:
        """Bytes the transfer moves (every pool, no padding)."""
        return sum(m.nbytes for m in self.moves)


def source_pages(
    direction: Direction,
    source: str,
    src: object,
    dst: object,
    near_capacity: int,
    far_capacity: int,
) -> tuple[Pages, Pages]:
    """`transfer_pages` for one allocating pool's (source, target) pages: `near_capacity` is
    the capacity of the tier a backup (D2H, H2S) reads, `far_capacity` the other's; the
    InvalidPages field is prefixed with the pool's name."""
    caps = (near_capacity, far_capacity)
    if direction in (Direction.H2D, Direction.S2H):
        caps = caps[::-1]
    try:
        return transfer_pages(direction, src, dst, *caps)
    except InvalidPages as e:
        raise InvalidPages(f"{source}.{e.field}", str(e).split(": ", 1)[-1]) from None


def check_sources(direction: Direction, request: GroupRequest, geometry: GroupGeometry) -> None:
    """Verify `request` names allocating pools of `geometry` only (a sidecar or state pool
    moves its source's pages and is never named); InvalidPages otherwise."""
    sources = geometry.sources
    if all(name in sources for name in request):
        return
    unknown = sorted(set(request) - set(sources))
    if unknown:
        raise InvalidPages(
            f"{direction}.pools",
            f"{unknown} are not allocating pools of "
            f"{geometry.group.name}; name pages for "
            f"{list(geometry.sources)}",
        )


def plan_group(
    direction: Direction, request: GroupRequest, l1: GroupDevicePool, l2: GroupHostPool
) -> GroupPlan:
    """Validate `request` (module docstring) and lay its pools out in the workspace."""
    geometry = l1.geometry
    check_sources(direction, request, geometry)
    validated: dict[str, tuple[Pages, Pages]] = {}
    for source, (src, dst) in request.items():
        a, b = source_pages(direction, source, src, dst, l1.capacity(source), l2.capacity(source))
        validated[source] = (a, b) if direction is Direction.D2H else (b, a)
    moves: list[PoolMove] = []
    at = 0
    for p, source, bytes_per_page in geometry.layout:
        pair = validated.get(source)
        if pair is None or pair[0].size == 0:
            continue
        moves.append(PoolMove(p, pair[0], pair[1], at))
        at += -(-(int(pair[0].size) * bytes_per_page) // REGION_ALIGN) * REGION_ALIGN
    return GroupPlan(direction, tuple(moves), validated, at)
