"""pools.md's preset tables against pools.toml, pool by pool and cell by cell.

Each preset of pools.toml has one table in pools.md, under a heading `### Preset `NAME``,
with the columns `POOL_COLUMNS`: one row per pool, in table order. A guessed field's cell
ends in `?`. `preset_table` renders the table (pools.md's tables are its output, and
`hicache pools NAME` prints it); `check_pools` reports every cell that differs.
"""

from __future__ import annotations

import re
from pathlib import Path

from hicache.oracle.speccheck.mdtables import MdTable, _normalise, parse_tables
from hicache.pools.presets import read_presets
from hicache.pools.spec import PoolGroup, PoolSpec

POOL_COLUMNS = (
    "pool",
    "role",
    "indices_from",
    "hit_policy",
    "window_pages",
    "page_size",
    "layers",
    "rows_per_layer",
    "row_bytes",
    "tp_mode",
    "backupable",
    "upstream",
)
"""A preset table's columns: `pool` is the `name` field, the rest are fields of the same name
(every field but `guesses`, which the `?` marks show)."""

HEADING = re.compile(r"^### Preset `([\w.-]+)`\s*$")


def cells(p: PoolSpec) -> tuple[str, ...]:
    """One pool's row as text: integers with thousands commas, booleans as in the toml,
    empty as `-`, and `?` after a guessed value."""
    out = []
    for column in POOL_COLUMNS:
        field = "name" if column == "pool" else column
        value = getattr(p, field)
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, int):
            text = f"{value:,}"
        else:
            text = f"`{value}`" if value else "-"
        out.append(text + ("?" if field in p.guesses else ""))
    return tuple(out)


def preset_table(g: PoolGroup) -> str:
    """The markdown table of group `g`, as pools.md holds it."""
    lines = ["| " + " | ".join(POOL_COLUMNS) + " |", "|" + " --- |" * len(POOL_COLUMNS)]
    lines += ["| " + " | ".join(cells(p)) + " |" for p in g.pools]
    return "\n".join(lines) + "\n"


def check_pools(pools_md: str, toml_path: Path) -> list[str]:
    """Every difference between pools.md's preset tables and the presets of `toml_path`."""
    try:
        presets = read_presets(toml_path)
    except (OSError, ValueError) as e:  # ValueError: TOML syntax, ConfigError
        return [f"pools.toml: cannot be loaded ({type(e).__name__}: {e})"]
    tables, problems = _tables_by_preset(pools_md)
    for name, g in presets.items():
        table = tables.pop(name, None)
        if table is None:
            problems.append(f"pools.md: preset `{name}` of pools.toml has no table")
        else:
            problems += _compare(name, g, table)
    problems += [
        f"pools.md line {t.line}: preset `{name}` is not in pools.toml"
        for name, t in tables.items()
    ]
    return problems


def _tables_by_preset(markdown: str) -> tuple[dict[str, MdTable], list[str]]:
    """Preset name -> its pool table (the last `### Preset` heading above it)."""
    headings = [
        (i + 1, m.group(1))
        for i, line in enumerate(markdown.split("\n"))
        if (m := HEADING.match(line))
    ]
    found: dict[str, MdTable] = {}
    problems: list[str] = []
    for t in parse_tables(markdown):
        if t.headers != POOL_COLUMNS:
            continue
        above = [name for line, name in headings if line < t.line]
        if not above:
            problems.append(f"pools.md line {t.line}: a pool table under no `### Preset` heading")
        elif above[-1] in found:
            problems.append(f"pools.md line {t.line}: a second table for preset `{above[-1]}`")
        else:
            found[above[-1]] = t
    return found, problems


def _compare(name: str, g: PoolGroup, table: MdTable) -> list[str]:
    problems = []
    for (line, row), p in zip(table.rows, g.pools):
        for column, want in zip(POOL_COLUMNS, cells(p)):
            have, want = row.get(column, ""), _normalise(want)
            if have != want:
                problems.append(
                    f"pools.md line {line}: preset `{name}` pool `{p.name}` column "
                    f"{column!r} says {have or '-'!r}, pools.toml says {want or '-'!r}"
                )
    if len(table.rows) != len(g.pools):
        problems.append(
            f"pools.md line {table.line}: preset `{name}` has {len(table.rows)} "
            f"pool rows, pools.toml {len(g.pools)}"
        )
    return problems
