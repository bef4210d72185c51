"""Verification: restored bytes compared with what recomputation writes.

Contract: `RestoreVerifier.verify(tokens, start, end, pages)` reads the L1 pages a restore
delivered for tokens `[start, end)` (page aligned, `pages` one per page in token order) and
compares them, byte for byte, with the producer's `expected` KV for the same tokens. It
returns the pages compared (0 when the range is empty or the producer cannot say what it
would write) and raises `RestoreMismatch`, changing nothing, when any page differs: a
restore that serves another prefix's bytes (a cross-prefix mix-up) or a torn transfer is a
bug in the cache, never a fallback. It only reads; the caller decides when to verify
(`CacheConfig.verify`). A pool group is compared pool by pool (the anchor `pages` mapped to
every pool's); a single pool is the group of one. Importing this module does not import
torch (the null data plane never builds a verifier).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from hicache.core.pages import Pages
from hicache.errors import HiCacheError

if TYPE_CHECKING:  # torch is imported only when a verifier is built (a plane with bytes)
    import torch

    from hicache.dataplane.engine import TransferEngine
    from hicache.producers import KVProducer


class RestoreMismatch(HiCacheError):
    """A restored page's bytes differ from what recomputation writes: a real bug (B15). The
    controller's state is suspect: report (`status()`, the trace) and close it."""


def check_rows(
    got: torch.Tensor, expected: torch.Tensor, pages: Pages, what: str, start: int, end: int
) -> None:
    """Verify row i of `got` equals row i of `expected` (row i: page `pages[i]`, bytes);
    RestoreMismatch naming `what` and the first eight differing pages otherwise."""
    bad = (got != expected).any(dim=1).nonzero().flatten().tolist()
    if bad:
        raise RestoreMismatch(
            f"{what} {[int(pages[i]) for i in bad[:8]]} (tokens {start}..{end}) differ from "
            "recomputation: a cross-prefix mix-up or a torn transfer; report the trace and "
            "close this controller"
        )


class RestoreVerifier:
    """Restored L1 bytes compared with recomputation, pool by pool (module docstring): the
    L1 pages of every byte pool that a restore of anchor `pages` delivered (the group of one:
    its one pool's pages), against the producer's `expected` bytes of the same pages (every
    byte pool's side by side, in table order). A difference in any one pool raises
    RestoreMismatch naming the pool (a group's) and the first differing anchor pages."""

    def __init__(self, producer: KVProducer, engine: TransferEngine) -> None:
        self.producer = producer
        self.engine = engine
        self.bytes_checked = {p.name: 0 for p in engine.pools.pools}  # per pool, cumulative

    def verify(self, tokens: Sequence[int], start: int, end: int, pages: Pages) -> int:
        """Compare every pool's L1 pages of anchor `pages` with the producer's bytes of tokens
        `[start, end)`; the anchor pages compared (0 for an empty range, or when the producer
        cannot say what it would write)."""
        # Why the empty range is checked first: a restore can settle with nothing new in L1
        # (another request's restore already made the deepest node resident), and producers
        # refuse an empty range (ProducerError).
        if end <= start:
            return 0
        import numpy as np
        import torch

        from hicache.core.snapshot import TOMBSTONE
        from hicache.core.tiers import Tier

        expected = self.producer.expected(tokens, start, end)  # part of the KVProducer protocol
        if expected is None:
            return 0
        anchor = np.asarray(pages, dtype=np.int64)
        packed = expected.cpu().view(torch.uint8).reshape(anchor.size, -1)
        # A page may be served with its trailing pools' window freed (a hit policy that
        # recomputes them): those pools have no pages there to compare.
        mapped = self.engine.pool_pages(Tier.L1, anchor, freed=True)
        pools = self.engine.pools.pools
        checked: dict[str, int] = {}
        offset = 0
        for p in pools:
            rows = mapped[p.source].reshape(anchor.size, -1)
            width = rows.shape[1] * p.bytes_per_page
            want = packed[:, offset : offset + width]
            offset += width
            held = (rows != TOMBSTONE).all(axis=1)
            if not held.any():
                continue
            got = self.engine.packed(Tier.L1, p.name, rows[held].ravel()).reshape(
                int(held.sum()), -1
            )
            want = want[torch.from_numpy(held)]
            what = (
                "restored pages"
                if len(pools) == 1
                else f"pool {p.name}: restored pages of anchor pages"
            )
            check_rows(got.cpu(), want, anchor[held], what, start, end)
            checked[p.name] = int(want.numel())
        for name, n in checked.items():
            self.bytes_checked[name] += n
        return int(anchor.size)
