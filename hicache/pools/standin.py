"""A stand-in for `hicache.pools.presets.group` while that module is not in this tree.

`group(name)` returns the shipped preset when `hicache.pools.presets` exists, and otherwise
builds the two CPU groups the control plane's tests and fuzz run on, with the structure of
SGLang's DeepSeek V4 and V4.1 host pool groups (anchor `kv`, allocating `swa`, sidecars on
`kv`, state pools on `swa`). Replace every call with `presets.group` once presets land.
"""

from __future__ import annotations

import importlib
from typing import Callable, cast

from hicache.errors import ConfigError
from hicache.pools.spec import ALLOCATING, SIDECAR, STATE, TRAILING_PAGES, PoolGroup, PoolSpec


def group(name: str) -> PoolGroup:
    """The pool group preset `name` (`mha`, `dsv4-tiny`, `dsv41-tiny` without presets.py)."""
    try:
        presets = importlib.import_module("hicache.pools.presets")
    except ImportError:
        pass
    else:
        return cast(Callable[[str], PoolGroup], presets.group)(name)
    side = {"dsv4-tiny": ("c4", "c4_indexer", "c128"),
            "dsv41-tiny": ("c1", "c1_indexer", "c1_indexer_scale", "c2", "c2_indexer",
                           "c2_indexer_scale")}
    if name == "mha":
        return PoolGroup(name, (PoolSpec("kv", page_size=4),))
    if name not in side:
        raise ConfigError("pools.preset", f"unknown preset {name!r}; one of mha, {', '.join(side)}")
    pools = [PoolSpec("kv", page_size=4),
             PoolSpec("swa", ALLOCATING, hit_policy=TRAILING_PAGES, window_pages=2, page_size=4)]
    pools += [PoolSpec(s, SIDECAR, indices_from="kv", page_size=4) for s in side[name]]
    if name == "dsv4-tiny":
        pools += [PoolSpec(s, STATE, indices_from="swa", hit_policy=TRAILING_PAGES, window_pages=1,
                           page_size=4) for s in ("c4_state", "c4_indexer_state")]
    return PoolGroup(name, tuple(pools))
