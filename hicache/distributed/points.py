"""The agreement points of spec/tp.toml, loaded once: where the ranks of one cache agree.

    Point(id, name, when, op, payload, rule)     one [[point]] row (spec/tp.md says why)
    POINTS            name -> Point, in table order
    COLLECTIVE_OPS    the ops a collective may have (`none`: the same call on every rank)
    L3_WRITERS        tp_mode -> which ranks write a pool's pages to L3

Contract: a point's `name` is what every collective log, error and report calls it; code
makes collectives only at points of this table (`point(name)` raises ConfigError for any
other), so a row added or renamed is a behaviour change the drift check sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from hicache.errors import ConfigError
from hicache.spec import TP_TOML, load_toml

COLLECTIVE_OPS = ("all_gather", "all_reduce_min", "none")
FIELDS = ("id", "name", "when", "op", "payload", "rule")


@dataclass(frozen=True)
class Point:
    """One agreement point (spec/tp.toml, `[[point]]`)."""

    id: str
    name: str
    when: str
    op: str
    payload: str
    rule: str


@lru_cache(maxsize=4)
def load_points(path: str | None = None) -> dict[str, Point]:
    """The points of `path` (default: the shipped spec/tp.toml) by name, in table order;
    ConfigError naming the row and field for a malformed one."""
    rows = load_toml(Path(path) if path else TP_TOML).get("point", [])
    out: dict[str, Point] = {}
    for i, row in enumerate(rows):
        where = f"tp.toml point[{i}]"
        missing = [f for f in FIELDS if not isinstance(row.get(f), str) or not row[f]]
        if missing or set(row) - set(FIELDS):
            raise ConfigError(
                where,
                f"needs string fields {list(FIELDS)} and no others; "
                f"missing or empty: {missing}, extra: {sorted(set(row) - set(FIELDS))}",
            )
        if row["op"] not in COLLECTIVE_OPS:
            raise ConfigError(f"{where}.op", f"one of {COLLECTIVE_OPS}, got {row['op']!r}")
        if row["name"] in out:
            raise ConfigError(f"{where}.name", f"{row['name']!r} names two points")
        out[row["name"]] = Point(**{f: row[f] for f in FIELDS})
    return out


def point(name: str) -> Point:
    """The point called `name`; ConfigError for a name the table lacks."""
    found = load_points().get(name)
    if found is None:
        raise ConfigError(
            "tp.point", f"{name!r} is not a point of spec/tp.toml ({', '.join(load_points())})"
        )
    return found


__all__ = ["COLLECTIVE_OPS", "Point", "load_points", "point"]
