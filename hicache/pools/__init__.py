"""Pool groups: the pools one tier holds for a model's KV cache (spec/pools.md).

`spec.py` is the vocabulary (`PoolSpec`, `PoolGroup`, roles, hit policies) and the group's
construction-time rules. The presets come from spec/pools.toml.
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

__all__ = [
    "ALL_PAGES", "ANCHOR", "ALLOCATING", "HIT_POLICIES", "REPLICATED", "ROLES", "SHARDED",
    "SIDECAR", "STATE", "TP_MODES", "TRAILING_PAGES", "PoolGroup", "PoolSpec",
]
