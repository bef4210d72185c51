"""Mixing per-page digests into one: a group page's digest from its pools' (invariant I4).

    cols     n x k uint64     row i: the k digests that make anchor page i (its `ratio` pool
                              pages, or its byte pools)
    mixed    n uint64         sum_j cols[i, j] * w_j  (mod 2**64),  w_j odd

Why odd weights: multiplying by an odd number is a bijection mod 2**64, so a change in any
single column changes the row's mix -- a flipped byte in one pool is never hidden by the
others. A row with an `UNSERVABLE` column (an L3 slot a read would not serve) is
`UNSERVABLE`: I4 exempts it, as the single-pool engine's slot digests do. One column is
returned as is, so a one-pool group digests exactly like its pool.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from hicache.core.snapshot import UNSERVABLE

GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def mix_columns(cols: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """One uint64 per row of the 2-D `cols` (module docstring)."""
    # Verify a 2-D table: a flat array here would mix pages of different anchor pages.
    assert cols.ndim == 2, cols.shape
    if cols.shape[1] == 1:
        return np.ascontiguousarray(cols[:, 0], dtype=np.uint64)
    with np.errstate(over="ignore"):
        weights = (np.arange(1, cols.shape[1] + 1, dtype=np.uint64) * GOLDEN) | np.uint64(1)
        mixed: npt.NDArray[np.uint64] = np.asarray(
            np.sum(cols.astype(np.uint64) * weights, axis=1, dtype=np.uint64), dtype=np.uint64
        )
    mixed[(cols == UNSERVABLE).any(axis=1)] = UNSERVABLE
    return mixed
