"""The six ownership invariants and the structural checks, as pure predicates over a
`Snapshot` (spec/invariants.md). Imported as `hicache.invariants` (DESIGN.md §2)."""

from __future__ import annotations
