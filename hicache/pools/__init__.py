"""Pool groups: the pools one tier holds for a model's KV cache (spec/pools.md).

`spec.py` is the vocabulary (`PoolSpec`, `PoolGroup`, roles, hit policies) and the group's
construction-time rules. `presets.py` builds the presets of spec/pools.toml:
`group(name)`, `names()`.
"""

from hicache.pools.spec import (
    ALL_PAGES,
    ANCHOR,
    ALLOCATING,
    HIT_POLICIES,
    REPLICATED,
    ROLES,
    SHARDED,
    SIDECAR,
    STATE,
    TP_MODES,
    TRAILING_PAGES,
    PoolGroup,
    PoolSpec,
)
from hicache.pools.presets import group, names

__all__ = [
    "ALL_PAGES", "ANCHOR", "ALLOCATING", "HIT_POLICIES", "REPLICATED", "ROLES", "SHARDED",
    "SIDECAR", "STATE", "TP_MODES", "TRAILING_PAGES", "PoolGroup", "PoolSpec", "group", "names",
]
