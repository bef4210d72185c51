"""Per-pool geometry of a pool group: how many raw bytes one page of each pool holds.

    pool page = rows_per_page rows of row_bytes bytes,  rows_per_page = layers * rows_per_layer

    preset   pool             rows_per_layer  row (one page of one layer)
    -------  ---------------  --------------  ------------------------------------------------
    mha      kv               2 (K, V)        page_size * kv_heads * head_dim * itemsize
    mla      kv               1 (latent)      page_size * (kv_lora_rank + rope) * itemsize
    dsv4     kv (anchor)      -               none: the anchor is index space only
             swa, c4, ...     1               the pool's bytes per page per layer (raw, fp8 ok)

Bytes are moved as raw bytes: the geometry knows no dtype. A pool's sizes are its
`PoolSpec`'s (`rows_per_page`, `row_bytes`, `bytes_per_page`). `KVGeometry` (the single-pool
MHA geometry) maps to the `mha` case with `kv_pool_spec`; MLA is one latent row per layer
(`mla_pool_spec`). A pool with `bytes_per_page == 0` (the dsv4 anchor) holds nothing and is
left out of `GroupGeometry.pools`; its page indices still name the pages of its sidecars.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from hicache.dataplane.geometry import DTYPE_BYTES, KVGeometry
from hicache.errors import ConfigError
from hicache.pools.presets import SINGLE_POOL
from hicache.pools.spec import ANCHOR, SHARDED, PoolGroup, PoolSpec


def kv_pool_spec(geometry: KVGeometry, name: str = "kv") -> PoolSpec:
    """The single-pool MHA group's one pool: K and V rows per layer, `KVGeometry.row_bytes`
    each, so its `bytes_per_page` equals `geometry.bytes_per_page`; sharded across ranks, as
    the `mha` preset's."""
    return PoolSpec(
        name,
        ANCHOR,
        page_size=geometry.page_size,
        layers=geometry.layers,
        rows_per_layer=2,
        row_bytes=geometry.row_bytes,
        tp_mode=SHARDED,
    )


def one_pool(geometry: KVGeometry) -> PoolGroup:
    """The group of one at `geometry`: the `mha` preset's shape (pool `kv`, the anchor) at
    its sizes, typed by it (`TypedRows`), so the data plane moves it on its single-pool path.
    Its anchor pages are its pool pages."""
    return PoolGroup(SINGLE_POOL, (kv_pool_spec(geometry),), geometry.typed)


def typed_geometry(group: PoolGroup) -> KVGeometry | None:
    """The KV geometry of a typed group of one (`PoolGroup.typed`); None for a group of raw
    bytes. The inverse of `one_pool`."""
    if group.typed is None:
        return None
    kv, t = group.anchor, group.typed
    return KVGeometry(kv.layers, t.kv_heads, t.head_dim, t.dtype, kv.page_size)


def mla_pool_spec(
    layers: int, latent_dims: int, dtype: str, page_size: int, name: str = "kv"
) -> PoolSpec:
    """An MLA pool: one latent row per layer of `latent_dims` elements per token
    (`kv_lora_rank + qk_rope_head_dim`; DeepSeek V3: 512 + 64) of `dtype`."""
    if dtype not in DTYPE_BYTES:
        raise ConfigError("geometry.dtype", f"one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    return PoolSpec(
        name,
        ANCHOR,
        page_size=page_size,
        layers=layers,
        rows_per_layer=1,
        row_bytes=page_size * latent_dims * DTYPE_BYTES[dtype],
    )


@dataclass(frozen=True)
class GroupGeometry:
    """The byte-holding pools of `group`, in table order, and the group's allocating pools
    (`sources`, sorted by name: the order a group reservation takes them in)."""

    group: PoolGroup
    pools: tuple[PoolSpec, ...]

    @classmethod
    def from_group(cls, group: PoolGroup) -> GroupGeometry:
        return cls(group, tuple(p for p in group.pools if p.bytes_per_page > 0))

    @functools.cached_property  # read per transfer; the group never changes
    def sources(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.group.allocating)

    @functools.cached_property
    def layout(self) -> tuple[tuple[PoolSpec, str, int], ...]:
        """(pool, its source, its bytes per page) per byte pool, in table order: what planning
        a group transfer reads for every pool, worked out once."""
        return tuple((p, p.source, p.bytes_per_page) for p in self.pools)

    def pool(self, name: str) -> PoolSpec:
        """The byte pool `name`; ConfigError if the group has none (or it holds no bytes)."""
        for p in self.pools:
            if p.name == name:
                return p
        raise ConfigError(
            f"presets.{self.group.name}",
            f"no byte-holding pool {name!r}; pools with bytes: {[p.name for p in self.pools]}",
        )

    def on(self, source: str) -> tuple[PoolSpec, ...]:
        """The byte pools that take `source`'s page indices (source itself included)."""
        return tuple(p for p in self.pools if p.source == source)

    def bytes_per_page(self, source: str) -> int:
        """Bytes one page of `source` names across every pool on its indices."""
        return self.group.bytes_per_page(source)
