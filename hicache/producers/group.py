"""`GroupSyntheticProducer`: every pool's bytes as a pure function of the token prefix.

The single-pool `SyntheticProducer`'s rule, per pool of a group. A pool page covering tokens
`[t, t + pool.page_size)` holds `bytes_per_page` raw bytes, page-major (row after row):

    key(page)      = fmix(prefix_hash(t + page_size - 1) ^ salt(pool))       64-bit
    word(page, w)  = fmix(key(page) ^ fmix(w + 1))                           w = 0, 1, ...
    bytes          = the words' little-end bytes, cut to bytes_per_page

`prefix_hash` is synthetic.py's chain, so two prefixes that differ anywhere before a page's
last token give unrelated bytes in every pool (bug class B15), and `salt` (the pool's name,
hashed) makes each pool's bytes differ from every other's: a restore that put one pool's
page into another is caught too. An anchor page holds `ratio` pages of a side pool (anchor /
pool page size), each keyed by its own last token.

`produce` writes through the engine's L1 regions at the pool pages `pool_pages("L1", ...)`
names for the new anchor pages; `expected_pools` says what those pages must hold, per pool,
so the `RestoreVerifier` can compare a restore with recomputation pool by pool.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from hicache.core.tiers import Tier
from hicache.dataplane.geometry import KVGeometry
from hicache.errors import ConfigError, ProducerError
from hicache.pools.spec import PoolSpec
from hicache.producers.base import PageIndex, check_range, seconds_since
from hicache.producers.synthetic import _signed, fmix, fmix_scalar, prefix_hashes

if TYPE_CHECKING:
    from hicache.dataplane.engine import TransferEngine


def pool_salt(name: str) -> int:
    """A 64-bit salt from a pool's name (the chain of its UTF-8 bytes)."""
    chain = prefix_hashes(list(name.encode()), len(name.encode()))
    return fmix_scalar(chain[-1])


class GroupSyntheticProducer:
    """Synthetic bytes for every pool of `engine`'s group (module docstring). `geometry`: the
    controller's page geometry; only its `page_size` (tokens per anchor page) is used, and it
    must equal the anchor's. ConfigError otherwise."""

    def __init__(self, engine: TransferEngine, geometry: KVGeometry) -> None:
        anchor = engine.group.anchor
        if geometry.page_size != anchor.page_size:
            raise ConfigError(
                "geometry.page_size",
                f"{geometry.page_size} tokens, but the {engine.group.name} anchor's "
                f"pages hold {anchor.page_size}; use a geometry of that page size",
            )
        self.engine = engine
        self.geometry = geometry
        self.device = engine.device
        self._salt = {p.name: pool_salt(p.name) for p in engine.pools.pools}

    def pool_bytes(
        self, pool: PoolSpec, tokens: Sequence[int], start: int, end: int
    ) -> torch.Tensor:
        """uint8 `[pages, bytes_per_page]`: `pool`'s pages for tokens `[start, end)` (aligned
        to the anchor's pages, so to the pool's), in token order, on this producer's device."""
        hashes = prefix_hashes(tokens, end)
        ps = pool.page_size
        keys = [
            fmix_scalar(hashes[t + ps - 1] ^ self._salt[pool.name]) for t in range(start, end, ps)
        ]
        key = torch.tensor([_signed(k) for k in keys], dtype=torch.int64, device=self.device)
        words = -(-pool.bytes_per_page // 8)
        word = fmix(torch.arange(1, words + 1, dtype=torch.int64, device=self.device))
        bits = fmix(key.view(-1, 1) ^ word.view(1, -1))  # [pages, words]
        return bits.view(torch.uint8)[:, : pool.bytes_per_page]

    def expected_pools(
        self, tokens: Sequence[int], start: int, end: int
    ) -> dict[str, torch.Tensor]:
        """Per byte pool, uint8 `[anchor pages, ratio * bytes_per_page]`: what `produce`
        writes for tokens `[start, end)`, each anchor page's pool pages side by side."""
        check_range(self.geometry, len(tokens), start, end)
        n = (end - start) // self.geometry.page_size
        return {
            p.name: self.pool_bytes(p, tokens, start, end).reshape(n, -1)
            for p in self.engine.pools.pools
        }

    def expected(self, tokens: Sequence[int], start: int, end: int) -> torch.Tensor:
        """uint8 `[anchor pages, group bytes per anchor page]`: `expected_pools` side by side
        in table order (the KVProducer contract's packed page-major bytes, for a group)."""
        return torch.cat(list(self.expected_pools(tokens, start, end).values()), dim=1)

    def produce(
        self,
        tokens: Sequence[int],
        start: int,
        end: int,
        l1: torch.Tensor,
        prefix_pages: PageIndex,
        new_pages: PageIndex,
    ) -> float:
        """Write every pool's bytes of `tokens[start:end]` into the pool pages of anchor
        `new_pages` of the engine's L1 (`l1` must be its arena); the seconds spent. Never
        reads `prefix_pages`. ProducerError, nothing written, for bad arguments."""
        check_range(self.geometry, len(tokens), start, end)
        # Verify the caller passes this engine's L1: the producer writes through its regions.
        if l1.data_ptr() != self.engine.l1_arena.data_ptr():
            raise ProducerError("l1", "not this engine's L1 arena; pass engine.l1_arena")
        new = np.asarray(new_pages.cpu() if isinstance(new_pages, torch.Tensor) else new_pages)
        want = (end - start) // self.geometry.page_size
        # Verify one distinct page per page of tokens (a repeat would mix two pages' bytes).
        if new.ndim != 1 or new.size != want or np.unique(new).size != want:
            raise ProducerError(
                "new_pages",
                f"{want} distinct anchor pages for tokens [{start}, {end}), got {new.tolist()}",
            )
        mapped = self.engine.pool_pages(Tier.L1, new.astype(np.int64))
        started_s = time.perf_counter()
        for p in self.engine.pools.pools:
            data = self.pool_bytes(p, tokens, start, end)
            idx = torch.from_numpy(mapped[p.source]).to(self.device)
            rows = data.reshape(idx.numel(), p.rows_per_page, p.row_bytes).transpose(0, 1)
            self.engine.l1_region(p.name).index_copy_(1, idx, rows)
        return seconds_since(self.device, started_s)
