"""tp.md against tp.toml, and tp.toml against the code that makes the collectives.

    point table     tp.md's table with the columns POINT_COLUMNS holds tp.toml's [[point]]
                    rows, in table order, cell by cell
    point sections  one heading `### <id> `<name>`` per point (op `none` too: a point no code
                    calls is still documented) and none for a name tp.toml lacks; each section
                    states the point's `when`
    usage           every string literal passed as the point of an `all_reduce_min` or
                    `all_gather` call in the package is a point of tp.toml with that op, and
                    every point whose op is not `none` is passed by some call (`UNCALLED`: the
                    known exceptions, each reported once code calls it)
    l3 writes       tp.md's table with the columns L3_COLUMNS holds tp.toml's [[l3_write]]
                    rows; they name every tp_mode once, and `ledger.writes_pool` follows them

`points_table` and `l3_write_table` render the two tables (tp.md's are their output).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import hicache
import hicache.distributed.ledger as ledger
from hicache.distributed.points import Point, load_points
from hicache.oracle.speccheck.mdtables import MdTable, _normalise, parse_tables
from hicache.pools.spec import TP_MODES
from hicache.spec import load_toml

POINT_COLUMNS = ("id", "name", "op", "payload", "rule")
"""The point table's columns: fields of a [[point]] row (`when` is in each point's section)."""
L3_COLUMNS = ("tp_mode", "writers", "key")
"""The L3 write table's columns: the fields of an [[l3_write]] row."""
WRITERS = {"rank 0": False, "every rank": True}
"""An [[l3_write]] row's `writers` -> whether ranks other than 0 write the pool's pages."""
COLLECTIVE_CALLS = ("all_reduce_min", "all_gather")
"""The `Collectives` methods whose first argument is the point's name (spec/tp.toml's ops)."""
UNCALLED: frozenset[str] = frozenset()
"""Points whose op is a collective that no code makes yet (none now). A name here that code
calls is reported: take it out then."""

HEADING = re.compile(r"^###\s+(C\d+[a-z]?)\s+`([a-z0-9_]+)`\s*$")
SECTION_END = re.compile(r"^#{1,3}\s")


class Call(NamedTuple):
    """One collective call found in the code: the point's name, the method, where."""

    point: str
    op: str
    where: str  # "path:line"


def point_cells(p: Point) -> tuple[str, ...]:
    """One point's row as tp.md writes it: names in backticks, an empty payload as `-`."""
    return (p.id, f"`{p.name}`", f"`{p.op}`", p.payload, p.rule)


def points_table(points: Mapping[str, Point]) -> str:
    """The markdown table of `points` (name -> Point, in table order), as tp.md holds it."""
    return _table(POINT_COLUMNS, [point_cells(p) for p in points.values()])


def l3_write_table(rows: Sequence[Mapping[str, str]]) -> str:
    """The markdown table of tp.toml's [[l3_write]] rows, as tp.md holds it."""
    return _table(L3_COLUMNS, [(f"`{r['tp_mode']}`", r["writers"], r["key"]) for r in rows])


def check_tp(tp_md: str, toml_path: Path, sources: Mapping[str, str] | None = None) -> list[str]:
    """Every difference between tp.md, the table at `toml_path` and `sources` (path -> Python
    text; default: every module of the installed package, `package_sources`)."""
    try:
        # Uncached: an edited copy is checked as it stands, not the shipped table.
        points: dict[str, Point] = load_points.__wrapped__(str(toml_path))
        writes = _l3_rows(load_toml(toml_path).get("l3_write", []))
    except (OSError, ValueError, TypeError, AttributeError) as e:  # ValueError: TOML, ConfigError
        return [f"tp.toml: cannot be loaded ({type(e).__name__}: {e})"]
    tables = parse_tables(tp_md)
    problems: list[str] = []
    point_table = _one_table(tables, POINT_COLUMNS, "point", problems)
    l3_table = _one_table(tables, L3_COLUMNS, "L3 write", problems)
    problems += _compare_points(points, point_table)
    problems += _check_sections(points, tp_md)
    problems += check_usage(points, package_sources() if sources is None else sources)
    problems += _compare_l3(writes, l3_table)
    problems += _check_writers(writes)
    return problems


def package_sources(root: Path | None = None) -> dict[str, str]:
    """The Python modules under `root` (default: the hicache package) that name a collective
    call, by path relative to `root` (symlinked directories are not followed)."""
    base = Path(hicache.__file__).parent if root is None else root
    out: dict[str, str] = {}
    for path in sorted(base.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if any(name in text for name in COLLECTIVE_CALLS):
            out[path.relative_to(base).as_posix()] = text
    return out


def collective_calls(sources: Mapping[str, str]) -> tuple[list[Call], list[str]]:
    """Every `x.all_reduce_min(NAME, ...)` / `x.all_gather(NAME, ...)` whose point NAME is a
    string literal (torch's own `all_gather(rows, tensor)` has none and is skipped), and one
    problem line per module that does not parse."""
    calls: list[Call] = []
    problems: list[str] = []
    for path, text in sorted(sources.items()):
        try:
            tree = ast.parse(text, filename=path)
        except SyntaxError as e:
            problems.append(
                f"{path}: cannot be parsed for collective calls ({e.msg}, line {e.lineno})"
            )
            continue
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in COLLECTIVE_CALLS
            ):
                continue
            first: ast.expr | None
            if node.args:
                first = node.args[0]
            else:
                first = next((k.value for k in node.keywords if k.arg == "point_name"), None)
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                calls.append(Call(first.value, node.func.attr, f"{path}:{node.lineno}"))
    return calls, problems


def check_usage(points: Mapping[str, Point], sources: Mapping[str, str]) -> list[str]:
    """The code calls every collective point of `points` with its op, and no other."""
    calls, problems = collective_calls(sources)
    for c in calls:
        p = points.get(c.point)
        if p is None:
            problems.append(f"{c.where}: {c.op}({c.point!r}) names no point of tp.toml")
        elif p.op != c.op:
            problems.append(f"{c.where}: {c.op}({c.point!r}), but tp.toml's {p.id} is {p.op}")
    called = {c.point for c in calls}
    for p in points.values():
        if p.op != "none" and p.name not in called and p.name not in UNCALLED:
            problems.append(f"tp.toml: {p.id} `{p.name}` is an {p.op} point no code calls")
    for name in sorted(UNCALLED & called):
        problems.append(
            f"speccheck/tp.py: `{name}` is listed in UNCALLED, but code calls it: take it out"
        )
    for name in sorted(UNCALLED - set(points)):
        problems.append(f"speccheck/tp.py: UNCALLED lists `{name}`, which is no point of tp.toml")
    return problems


def _l3_rows(rows: Any) -> list[dict[str, str]]:
    """tp.toml's [[l3_write]] rows; ValueError for a row without exactly L3_COLUMNS as text."""
    out = []
    for i, row in enumerate(rows):
        if not (
            isinstance(row, dict)
            and set(row) == set(L3_COLUMNS)
            and all(isinstance(v, str) and v for v in row.values())
        ):
            raise ValueError(f"l3_write[{i}] needs string fields {list(L3_COLUMNS)} and no others")
        out.append(dict(row))
    return out


def _one_table(
    tables: Sequence[MdTable], columns: tuple[str, ...], what: str, problems: list[str]
) -> MdTable | None:
    found = [t for t in tables if t.headers == columns]
    if not found:
        problems.append(f"tp.md: no {what} table (columns {', '.join(columns)})")
    problems += [f"tp.md line {t.line}: a second {what} table" for t in found[1:]]
    return found[0] if found else None


def _compare_points(points: Mapping[str, Point], table: MdTable | None) -> list[str]:
    if table is None:
        return []
    problems: list[str] = []
    seen: dict[str, int] = {}
    for line, row in table.rows:
        name = row.get("name", "")
        if name in seen:
            problems.append(
                f"tp.md line {line}: point `{name}` appears again (first at line {seen[name]})"
            )
            continue
        seen[name] = line
        p = points.get(name)
        if p is None:
            problems.append(f"tp.md line {line}: point `{name}` is not in tp.toml")
            continue
        for column, want in zip(POINT_COLUMNS, point_cells(p)):
            have, want = row.get(column, ""), _normalise(want)
            if have != want:
                problems.append(
                    f"tp.md line {line}: point `{name}` column {column!r} says "
                    f"{have or '-'!r}, tp.toml says {want or '-'!r}"
                )
    problems += [
        f"tp.md: point {p.id} `{p.name}` of tp.toml has no row in the point table"
        for p in points.values()
        if p.name not in seen
    ]
    listed = [n for n in seen if n in points]
    if listed != [n for n in points if n in seen]:
        problems.append(
            f"tp.md line {table.line}: the point table's rows are not in tp.toml's order"
        )
    return problems


def _check_sections(points: Mapping[str, Point], markdown: str) -> list[str]:
    """One `### <id> `<name>`` section per point, stating its `when`."""
    lines = markdown.split("\n")
    problems: list[str] = []
    found: dict[str, int] = {}
    for i, line in enumerate(lines):
        m = HEADING.match(line)
        if m is None:
            continue
        pid, name = m.groups()
        p = points.get(name)
        if p is None:
            problems.append(f"tp.md line {i + 1}: section {pid} `{name}` is not a point of tp.toml")
            continue
        if name in found:
            problems.append(f"tp.md line {i + 1}: point `{name}` has a second section")
            continue
        found[name] = i + 1
        if pid != p.id:
            problems.append(f"tp.md line {i + 1}: section {pid} `{name}`, tp.toml's id is {p.id}")
        end = next((j for j in range(i + 1, len(lines)) if SECTION_END.match(lines[j])), len(lines))
        if _normalise(p.when) not in _normalise(" ".join(lines[i + 1 : end])):
            problems.append(
                f"tp.md line {i + 1}: section {p.id} `{name}` does not state tp.toml's "
                f"when ({p.when!r})"
            )
    problems += [
        f"tp.md: point {p.id} `{p.name}` has no section (### {p.id} `{p.name}`)"
        for p in points.values()
        if p.name not in found
    ]
    return problems


def _compare_l3(rows: Sequence[Mapping[str, str]], table: MdTable | None) -> list[str]:
    if table is None:
        return []
    want = [
        tuple(_normalise(c) for c in cells)
        for cells in [(r["tp_mode"], r["writers"], r["key"]) for r in rows]
    ]
    have = [tuple(row.get(c, "") for c in L3_COLUMNS) for _, row in table.rows]
    problems = [
        f"tp.md line {line}: L3 write row {' | '.join(h)} differs from tp.toml's {' | '.join(w)}"
        for (line, _), h, w in zip(table.rows, have, want)
        if h != w
    ]
    if len(have) != len(want):
        problems.append(f"tp.md line {table.line}: {len(have)} L3 write rows, tp.toml {len(want)}")
    return problems


def _check_writers(rows: Sequence[Mapping[str, str]]) -> list[str]:
    """Every tp_mode has one row, its writers are a known rule, and the ledger follows it."""
    problems: list[str] = []
    modes = [r["tp_mode"] for r in rows]
    if sorted(modes) != sorted(TP_MODES):
        problems.append(
            f"tp.toml: [[l3_write]] rows name tp_modes {modes}, pools have {list(TP_MODES)}"
        )
    for r in rows:
        followers = WRITERS.get(r["writers"])
        if followers is None:
            problems.append(
                f"tp.toml: [[l3_write]] {r['tp_mode']}: writers {r['writers']!r} is "
                f"not one of {list(WRITERS)}"
            )
        elif [ledger.writes_pool(r["tp_mode"], rank) for rank in (0, 1)] != [True, followers]:
            problems.append(
                f"hicache/distributed/ledger.py: writes_pool({r['tp_mode']!r}, rank) "
                f"does not follow tp.toml's writers {r['writers']!r}"
            )
    return problems


def _table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


__all__ = [
    "COLLECTIVE_CALLS",
    "L3_COLUMNS",
    "POINT_COLUMNS",
    "UNCALLED",
    "Call",
    "check_tp",
    "check_usage",
    "collective_calls",
    "l3_write_table",
    "package_sources",
    "points_table",
]
