"""Gather/scatter kernels between the L1 layout and packed page-major buffers.
Imported as `hicache.kernels` (a symlink).

    gather(l1, pages, out, backend=)      out[i, kv, l] = l1[kv, l, pages[i]]
    scatter(packed, pages, l1, backend=)  l1[kv, l, pages[i]] = packed[i, kv, l]
    KernelSet.create(l1, "auto")          the per-geometry backend choice, with its reason

`reference` holds the layouts and the torch versions (the definition), `triton_rows` the
Triton kernels (imported only when used), `select` the dispatch and the choice;
`triton_mapped` moves rows between L1 and a pinned L2 the GPU addresses in place (the mapped
D2H, `KernelSet.copy_mapped`), `row_table`/`triton_table` rows of many sizes in one launch.
"""

from __future__ import annotations

from hicache.kernels.reference import gather_torch, scatter_torch
from hicache.kernels.select import BACKENDS, REQUESTS, KernelSet, gather, scatter

__all__ = [
    "BACKENDS",
    "REQUESTS",
    "KernelSet",
    "gather",
    "gather_torch",
    "scatter",
    "scatter_torch",
]
