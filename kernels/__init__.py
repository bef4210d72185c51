"""Gather/scatter kernels between the L1 layout and packed page-major buffers.
Imported as `hicache.kernels` (DESIGN.md §2)."""

from __future__ import annotations
