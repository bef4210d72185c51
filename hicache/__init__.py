"""hicache: an executable, formally specified reference for hierarchical KV caching.

Tiers: L1 (GPU pool), L2 (pinned host, page-major), L3 (local file of fixed slots).
The control plane (tree, page tables, lifecycle, invariants) is pure Python + numpy;
the data plane (pools, transfers, kernels) needs torch and is imported lazily.
"""

from __future__ import annotations

__version__ = "0.1.0"
