"""KV geometry: the shape of one page, and the presets.

    bytes_per_page = 2 (K/V) * layers * page_size * kv_heads * head_dim * itemsize

One *row* is one (page, layer, K/V) slice: page_size * kv_heads * head_dim elements, contiguous
in L1 ([K/V, layer, page, token, head, dim]) and in the packed page-major layout
([page, K/V, layer, token, head, dim]) alike -- the unit the gather/scatter kernels copy.
"""

from __future__ import annotations

from dataclasses import dataclass

from hicache.errors import ConfigError
from hicache.pools.spec import DTYPE_BYTES, TypedRows

__all__ = ["DTYPE_BYTES", "PRESETS", "KVGeometry", "preset"]


@dataclass(frozen=True)
class KVGeometry:
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str = "bf16"
    page_size: int = 16  # tokens per page

    def __post_init__(self) -> None:
        for name in ("layers", "kv_heads", "head_dim", "page_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ConfigError(f"geometry.{name}", f"must be a positive integer, got {v!r}")
        if self.page_size > 256:
            raise ConfigError("geometry.page_size", f"at most 256 tokens, got {self.page_size}")
        if self.dtype not in DTYPE_BYTES:
            raise ConfigError("geometry.dtype", f"one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}")

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def row_elems(self) -> int:
        """Elements in one (page, layer, K/V) row."""
        return self.page_size * self.kv_heads * self.head_dim

    @property
    def row_bytes(self) -> int:
        return self.row_elems * self.itemsize

    @property
    def rows_per_page(self) -> int:
        return 2 * self.layers

    @property
    def bytes_per_page(self) -> int:
        return self.rows_per_page * self.row_bytes

    @property
    def bytes_per_token(self) -> int:
        return self.bytes_per_page // self.page_size

    @property
    def typed(self) -> TypedRows:
        """What one K or V row's elements are (a typed group of one carries it)."""
        return TypedRows(self.kv_heads, self.head_dim, self.dtype)


PRESETS: dict[str, KVGeometry] = {
    # Qwen3-8B: 36 layers, 8 KV heads, head_dim 128, bf16 -> 147,456 bytes/token.
    "qwen3-8b": KVGeometry(layers=36, kv_heads=8, head_dim=128, dtype="bf16", page_size=16),
    # Qwen3-4B: 36 layers, 8 KV heads, head_dim 128 (same KV geometry as 8B).
    "qwen3-4b": KVGeometry(layers=36, kv_heads=8, head_dim=128, dtype="bf16", page_size=16),
    # Small enough for CPU tests and the demo on 2 cores.
    "tiny": KVGeometry(layers=2, kv_heads=2, head_dim=16, dtype="fp32", page_size=4),
}


def preset(name: str) -> KVGeometry:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(
            "geometry", f"unknown preset {name!r}; one of {sorted(PRESETS)}"
        ) from None
