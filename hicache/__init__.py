"""hicache: an executable, formally specified reference for hierarchical KV caching.

Tiers: L1 (GPU pool), L2 (pinned host, page-major), L3 (local file of fixed slots).
The control plane (tree, page tables, lifecycle, invariants) is pure Python + numpy;
the data plane (pools, transfers, kernels) needs torch and is imported lazily.

The layers, one folder each (`errors.py` and `choices.py` are the vocabulary
every layer shares: typed errors, and the knobs that are one of a few names):

    core/        the control plane: tree, page tables, lifecycle, transitions, trace, snapshot
    invariants/  the ownership invariants checked after every transition
    pools/       pool groups (multi-pool presets: dsv4, mla, ...) behind the page-table interface
    kernels/     gather/scatter kernels (Triton, torch)
    dataplane/   the bytes: L1/L2 pools, the L3 file, the transfer engine, faults
    producers/   what writes KV bytes (synthetic, a model)
    policy/      restore-or-recompute decisions and the cost model
    controller/  CacheController: the control plane joined to a data plane and a policy
    distributed/ tensor-parallel ranks and the points where they agree
    oracle/      check-trace, conformance vectors, the model checker, the spec check
    testing/     the stateful fuzz machine, engine adapters, mutants
    bench/       `hicache bench`: every figure as a ratio to a ceiling of the same run
    app/         the `hicache` command line and the demo
    spec/        the specification the code is checked against (the tables it reads)

What a library user starts from, importable from `hicache` (each is imported on first use, so
`import hicache` loads nothing else and never torch):

    name              defined in                         needs torch
    ----------------  ---------------------------------  -----------
    ControlPlane      hicache.core.control               no   every spec transition, checked
    CacheConfig       hicache.controller.config          no   every controller knob, validated
    CacheController   hicache.controller.controller      yes  control plane + data plane + policy
    Snapshot          hicache.core.snapshot              no   what the invariant checks read
    check_all         hicache.invariants.registry        no   every violation in a Snapshot
    Violation         hicache.invariants.violation       no   one failed check
    Tracer            hicache.core.trace                 no   numbers trace events for a sink
    ListSink          hicache.core.trace                 no   keeps events in memory
    NdjsonSink        hicache.core.trace                 no   writes one JSON event per line
    HiCacheError      hicache.errors                     no   base of every error hicache raises
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hicache.controller.config import CacheConfig
    from hicache.controller.controller import CacheController
    from hicache.core.control import ControlPlane
    from hicache.core.snapshot import Snapshot
    from hicache.core.trace import ListSink, NdjsonSink, Tracer
    from hicache.errors import HiCacheError
    from hicache.invariants.registry import check_all
    from hicache.invariants.violation import Violation

_SOURCE = {
    "ControlPlane": "hicache.core.control",
    "CacheConfig": "hicache.controller.config",
    "CacheController": "hicache.controller.controller",
    "Snapshot": "hicache.core.snapshot",
    "check_all": "hicache.invariants.registry",
    "Violation": "hicache.invariants.violation",
    "Tracer": "hicache.core.trace",
    "ListSink": "hicache.core.trace",
    "NdjsonSink": "hicache.core.trace",
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
