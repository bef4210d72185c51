"""The pool groups the multi-pool transfer benchmark moves, built from PoolSpec directly.

`bench_group(name)` is the one place to swap for the preset loader (spec/pools.toml) once it
lands. Sizes: DeepSeek V4-Pro per TP rank from an SGLang startup log (SGLang issue #26783:
swa 149,760 B per layer-page over 61 layers; c128 1,728 B over 31; c4_state 65,536 B and
c4_indexer_state 16,384 B over 30), page size 256. Marked guesses (`guesses`): the c4 and
c4_indexer sizes (cut off in that log: 64 compressed entries a page of 864 B, c128's entry
size, and of 132 B, 128 fp8 dims plus a 4-byte scale), the 30/31 layer split, swa's page
size and the trailing windows. MLA: DeepSeek V3, 61 layers of (512 + 64) bf16 elements per
token; the 64-token page is a guess (FlashMLA's block size).
"""

from __future__ import annotations

from hicache.dataplane.groupgeometry import mla_pool_spec
from hicache.errors import ConfigError
from hicache.pools.spec import ALLOCATING, ANCHOR, SIDECAR, STATE, TRAILING_PAGES, PoolGroup, PoolSpec

NAMES = ("dsv4", "mla", "dsv4-tiny", "mla-tiny")


def _dsv4(name: str, page: int, scale: int) -> PoolGroup:
    """The 7-pool V4 group; `scale` divides every row (tiny variants keep the structure)."""
    guessed = ("row_bytes", "layers")

    def side(pool: str, layers: int, row: int, guesses: tuple[str, ...] = ("layers",)) -> PoolSpec:
        return PoolSpec(pool, SIDECAR, indices_from="kv", page_size=page, layers=layers,
                        rows_per_layer=1, row_bytes=row // scale, guesses=guesses)

    def state(pool: str, row: int) -> PoolSpec:
        return PoolSpec(pool, STATE, indices_from="swa", hit_policy=TRAILING_PAGES,
                        window_pages=1, page_size=page, layers=_layers(30, scale),
                        rows_per_layer=1, row_bytes=row // scale,
                        guesses=("layers", "window_pages"))

    return PoolGroup(name, (
        PoolSpec("kv", ANCHOR, page_size=page, layers=0),
        PoolSpec("swa", ALLOCATING, hit_policy=TRAILING_PAGES, window_pages=1, page_size=page,
                 layers=_layers(61, scale), rows_per_layer=1, row_bytes=149_760 // scale,
                 guesses=("page_size", "window_pages")),
        side("c4", _layers(30, scale), 64 * 864, guessed),
        side("c4_indexer", _layers(30, scale), 64 * 132, guessed),
        side("c128", _layers(31, scale), 1_728),
        state("c4_state", 65_536),
        state("c4_indexer_state", 16_384),
    ))


def _layers(real: int, scale: int) -> int:
    return real if scale == 1 else 2 + real % 2


def bench_group(name: str) -> PoolGroup:
    """The named group (NAMES); ConfigError naming the preset otherwise."""
    if name == "dsv4":
        return _dsv4(name, 256, 1)
    if name == "dsv4-tiny":
        return _dsv4(name, 4, 576)  # rows of 260, 96, 14 (c4_indexer), 3 (c128), 113, 28 bytes
    if name == "mla":
        return PoolGroup(name, (mla_pool_spec(61, 512 + 64, "bf16", 64),))
    if name == "mla-tiny":
        return PoolGroup(name, (mla_pool_spec(3, 8 + 4, "bf16", 4),))
    raise ConfigError("preset", f"one of {NAMES}, got {name!r}")
