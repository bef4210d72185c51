"""The pool-group presets, built once from `spec/pools.toml`.

    group("dsv4-tiny") -> PoolGroup      names() -> ("dsv4", "dsv4-tiny", ...)

Loading checks, before any group is handed out: every pool row gives every `PoolSpec` field
and no other; each group passes `PoolGroup`'s rules; and every preset `X` has an `X-tiny`
of the same structure (`structure`), so a CPU test of the tiny group exercises the real
group's shape. Each failure is a ConfigError naming the field (R60).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from hicache.errors import ConfigError
from hicache.pools.spec import PoolGroup, PoolSpec
from hicache.spec import POOLS_TOML, load_toml

TINY = "-tiny"
SINGLE_POOL = "mha"
"""The preset that is one pool: a tier holds `TierTable`s (a group of one) and the single-pool
TransferEngine moves its bytes (every other preset is a `TierPools` group)."""
FIELDS = tuple(f.name for f in dataclasses.fields(PoolSpec))
"""The columns of a pool row: every `PoolSpec` field, in declaration order."""

STRUCTURE = ("name", "role", "indices_from", "hit_policy", "tp_mode", "backupable", "upstream")
"""The fields a `-tiny` variant shares with its preset; the others are sizes."""


def group(name: str) -> PoolGroup:
    """The shipped preset `name`. ConfigError listing the presets if there is none."""
    presets = load_presets()
    if name not in presets:
        raise ConfigError("pools.preset", f"unknown preset {name!r}; one of {sorted(presets)}")
    return presets[name]


def names() -> tuple[str, ...]:
    """The shipped presets' names, in table order."""
    return tuple(load_presets())


def descriptions(path: Path | None = None) -> dict[str, str]:
    """Preset name -> its one-paragraph description from the toml."""
    return {name: str(table.get("description", "")) for name, table in _presets(path).items()}


def load_presets(path: Path | None = None) -> Mapping[str, PoolGroup]:
    """Every preset of `path` (default: the shipped spec/pools.toml), validated; parsed once
    per path."""
    return _load_cached(str(path or POOLS_TOML))


def read_presets(path: Path) -> Mapping[str, PoolGroup]:
    """Every preset of `path` as the file stands now (not cached: the drift check reads
    edited copies), validated."""
    groups = {name: _build(name, table) for name, table in _presets(path).items()}
    _check_tiny_variants(groups)
    return MappingProxyType(groups)


def structure(g: PoolGroup) -> tuple[tuple[object, ...], ...]:
    """The group's shape: per pool, in table order, the `STRUCTURE` fields."""
    return tuple(tuple(getattr(p, f) for f in STRUCTURE) for p in g.pools)


@functools.cache
def _load_cached(path: str) -> Mapping[str, PoolGroup]:
    return read_presets(Path(path))


def _presets(path: Path | None) -> dict[str, Any]:
    presets = load_toml(path or POOLS_TOML).get("presets")
    if not isinstance(presets, dict) or not presets:
        raise ConfigError("presets", "pools.toml has no [presets.NAME] tables")
    return presets


def _build(name: str, table: Mapping[str, Any]) -> PoolGroup:
    rows = table.get("pools")
    if not isinstance(rows, list) or not rows:
        raise ConfigError(f"presets.{name}.pools", "a preset needs at least one [[pools]] row")
    return PoolGroup(name, tuple(_pool(name, i, row) for i, row in enumerate(rows)))


def _pool(preset: str, index: int, row: Mapping[str, Any]) -> PoolSpec:
    """One pool row: exactly the `FIELDS`, `guesses` a list (stored as a tuple)."""
    where = f"presets.{preset}.pools[{index}]"
    missing = [f for f in FIELDS if f not in row]
    if missing:
        raise ConfigError(
            f"{where}.{missing[0]}", f"every pool row gives every field; missing {missing}"
        )
    extra = sorted(set(row) - set(FIELDS))
    if extra:
        raise ConfigError(f"{where}.{extra[0]}", f"not a field of a pool; the fields are {FIELDS}")
    if not isinstance(row["guesses"], list):
        raise ConfigError(f"{where}.guesses", f"a list of field names, got {row['guesses']!r}")
    return PoolSpec(**{**row, "guesses": tuple(row["guesses"])})


def _check_tiny_variants(groups: Mapping[str, PoolGroup]) -> None:
    """Verify every preset has a `-tiny` variant of its structure, and every variant a preset."""
    for name, g in groups.items():
        base, tiny = (name.removesuffix(TINY), name) if name.endswith(TINY) else (name, name + TINY)
        other = tiny if name == base else base
        if other not in groups:
            raise ConfigError(
                f"presets.{other}", f"{name!r} needs it: every preset has a {TINY} variant"
            )
        if structure(g) != structure(groups[other]):
            raise ConfigError(
                f"presets.{tiny}.pools",
                f"differs in structure from {base!r}: same pools, roles, sources, "
                f"hit policies, tp modes and backupable, in the same order",
            )
