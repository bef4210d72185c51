"""Markdown pipe tables as the drift check reads them, and row-by-row comparison.

Cells are normalised (backticks removed, whitespace collapsed, a lone dash meaning empty);
list-valued cells (guards, effects) compare item by item, in order.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import NamedTuple

Row = dict[str, str]
"""One markdown or expected table row: column header -> normalised cell text."""


@dataclasses.dataclass(frozen=True)
class MdTable:
    """A markdown pipe table: where it starts (1-based line), its headers and its rows."""

    line: int
    headers: tuple[str, ...]
    rows: tuple[tuple[int, Row], ...]  # (line, row)


class TableSpec(NamedTuple):
    """What one lifecycle.md table must hold: its checked columns (the first `key_columns`
    of them identify a row) and the rows."""

    columns: tuple[str, ...]
    key_columns: int
    rows: list[Row]


def compare_rows(
    where: str,
    what: str,
    spec: TableSpec,
    found: Iterable[tuple[int, Row]],
    source: str = "lifecycle.toml",
) -> list[str]:
    """Differences between the expected rows (from `source`) and rows found at lines of
    `where`, matched by their key columns; list-valued cells (guards, effects) compare item
    by item, in order."""
    keys = spec.columns[: spec.key_columns]
    columns = spec.columns[spec.key_columns :]
    want = {" ".join(row[k] for k in keys): row for row in spec.rows}
    problems: list[str] = []
    seen: dict[str, int] = {}
    for line, row in found:
        name = " ".join(row.get(k, "") for k in keys)
        if name in seen:
            problems.append(
                f"{where} line {line}: {what} `{name}` appears again (first at line {seen[name]})"
            )
            continue
        seen[name] = line
        if name not in want:
            problems.append(f"{where} line {line}: {what} `{name}` is not in {source}")
            continue
        for col in columns:
            if col in row and _items(row[col]) != _items(_normalise(want[name][col])):
                problems.append(
                    f"{where} line {line}: {what} `{name}` column {col!r} says "
                    f"{row[col] or '-'!r}, {source} says {want[name][col] or '-'!r}"
                )
    for name in want:
        if name not in seen:
            problems.append(f"{where}: {what} `{name}` of {source} has no table row")
    return problems


def parse_tables(markdown: str) -> list[MdTable]:
    """Every pipe table (header, `---` separator, rows) in `markdown`, cells normalised:
    backticks removed, whitespace collapsed, a lone dash meaning empty."""
    tables: list[MdTable] = []
    lines = markdown.split("\n")
    i = 0
    while i + 1 < len(lines):
        if not (
            _is_row(lines[i]) and re.fullmatch(r"\|[\s:|-]*-[\s:|-]*\|?", lines[i + 1].strip())
        ):
            i += 1
            continue
        headers = tuple(_cells(lines[i]))
        first, i = i + 1, i + 2
        rows: list[tuple[int, Row]] = []
        while i < len(lines) and _is_row(lines[i]):
            rows.append((i + 1, dict(zip(headers, _cells(lines[i])))))
            i += 1
        tables.append(MdTable(first, headers, tuple(rows)))
    return tables


def _is_row(line: str) -> bool:
    return line.strip().startswith("|")


def _cells(line: str) -> list[str]:
    inner = line.strip().removeprefix("|").removesuffix("|")
    return [_normalise(c.replace("\\|", "|")) for c in re.split(r"(?<!\\)\|", inner)]


def _normalise(cell: str) -> str:
    text = " ".join(cell.replace("`", "").split())
    return "" if text in {"-", "\u2014", "\u2013"} else text  # hyphen, em dash, en dash


def _items(cell: str) -> list[str]:
    return [item.strip() for item in cell.split(",") if item.strip()]
