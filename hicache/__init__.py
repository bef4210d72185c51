"""hicache: an executable, formally specified reference for hierarchical KV caching.

Tiers: L1 (GPU pool), L2 (pinned host, page-major), L3 (local file of fixed slots).
The control plane (tree, page tables, lifecycle, invariants) is pure Python + numpy;
the data plane (pools, transfers, kernels) needs torch and is imported lazily.

What a library user starts from, importable from `hicache` (each is imported on first use, so
`import hicache` loads nothing else and never torch):

    name              defined in                       needs torch
    ----------------  -------------------------------  -----------
    ControlPlane      hicache.control                  no   every spec transition, checked
    CacheConfig       hicache.controller.config        no   every controller knob, validated
    CacheController   hicache.controller.controller    yes  control plane + data plane + policy
    Snapshot          hicache.snapshot                 no   what the invariant checks read
    check_all         hicache.invariants.registry      no   every violation in a Snapshot
    Violation         hicache.invariants.violation     no   one failed check
    Tracer            hicache.trace                    no   numbers trace events for a sink
    ListSink          hicache.trace                    no   keeps events in memory
    NdjsonSink        hicache.trace                    no   writes one JSON event per line
    HiCacheError      hicache.errors                   no   base of every error hicache raises
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hicache.control import ControlPlane
    from hicache.controller.config import CacheConfig
    from hicache.controller.controller import CacheController
    from hicache.errors import HiCacheError
    from hicache.invariants.registry import check_all
    from hicache.invariants.violation import Violation
    from hicache.snapshot import Snapshot
    from hicache.trace import ListSink, NdjsonSink, Tracer

_SOURCE = {
    "ControlPlane": "hicache.control",
    "CacheConfig": "hicache.controller.config",
    "CacheController": "hicache.controller.controller",
    "Snapshot": "hicache.snapshot",
    "check_all": "hicache.invariants.registry",
    "Violation": "hicache.invariants.violation",
    "Tracer": "hicache.trace",
    "ListSink": "hicache.trace",
    "NdjsonSink": "hicache.trace",
    "HiCacheError": "hicache.errors",
}

__all__ = [  # written out (not built from _SOURCE) so that type checkers see the exports
    "CacheConfig",
    "CacheController",
    "ControlPlane",
    "HiCacheError",
    "ListSink",
    "NdjsonSink",
    "Snapshot",
    "Tracer",
    "Violation",
    "__version__",
    "check_all",
]

try:
    __version__ = metadata.version("hicache")
except metadata.PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """Import an exported name's module on first use (see the table above)."""
    module = _SOURCE.get(name)
    if module is None:
        raise AttributeError(f"module 'hicache' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_SOURCE})
