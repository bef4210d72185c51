"""Pool groups: the pools one tier holds for a model's KV cache (spec/pools.md).

    spec.py       the vocabulary (`PoolSpec`, `PoolGroup`, roles, hit policies) and the
                  group's construction-time rules
    presets.py    the presets of spec/pools.toml: `group(name)`, `names()`, `SINGLE_POOL`
    hits.py       how long a prefix a group can serve (endpoints in anchor pages)
    table.py      `GroupTable`: one page table per allocating pool, all-or-nothing moves
    tiertable.py  `TierTable`: a tier's table; a single pool answers as a group of one
    tierpools.py  `TierPools`: a tier's group behind the `PageTable` interface (anchor pages)
    command.py    `hicache pools [PRESET]`

Only the vocabulary and the preset loader are re-exported here; import the others from their
modules.
"""

from hicache.pools.presets import group, names
from hicache.pools.spec import (
    ALL_PAGES,
    ALLOCATING,
    ANCHOR,
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
    "ALLOCATING",
    "ALL_PAGES",
    "ANCHOR",
    "HIT_POLICIES",
    "REPLICATED",
    "ROLES",
    "SHARDED",
    "SIDECAR",
    "STATE",
    "TP_MODES",
    "TRAILING_PAGES",
    "PoolGroup",
    "PoolSpec",
    "group",
    "names",
]
