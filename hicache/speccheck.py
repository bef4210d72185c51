"""The drift check: the spec's prose, diagrams, tables, machine and code must agree.

`check_spec(spec_dir)` reads one spec directory (an edited copy is checked as it stands, not
the cached shipped tables) and returns every difference it finds, one human-readable line
each; an empty list means the spec is consistent. What it compares:

    lifecycle.toml   vs  the `transitions` machines built from it (states, initial, edges)
    lifecycle.toml   vs  its [[composite]] list: reachable set, naming rule, duplicates
    lifecycle.toml   vs  lifecycle.md tables (constants, ownership, residency, transitions,
                         composites): every row present once, every checked cell equal
    generated        vs  lifecycle.md's embedded Mermaid blocks (DIAGRAMS)
    registry CHECKS  vs  invariants.md headings (`I1 `name``), checker and test names
    lifecycle.toml   vs  trace.schema.json: event enum, tier per event, composite names
    TraceEvent       vs  trace.schema.json properties; schema enum vs trace.md's event table
    l3format.LAYOUT  vs  l3.md's L3 header table, row by row
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Protocol, Sequence

from hicache.dataplane.l3format import LAYOUT
from hicache.diagram import DIAGRAMS, all_diagrams, extract_blocks
from hicache.errors import SpecError
from hicache.lifecycle import Lifecycle, composite_name
from hicache.spec import load_toml
from hicache.tiers import TIERS
from hicache.trace import TraceEvent

NON_LIFECYCLE_EVENTS: tuple[str, ...] = (
    "request_start", "request_end", "cached_len", "split", "lock", "unlock", "node_remove",
)
"""Trace events that are not lifecycle transitions (spec/trace.md)."""

REGISTRY_MODULE = "hicache.invariants.registry"

Row = dict[str, str]
"""One markdown or expected table row: column header -> normalised cell text."""


class CheckInfo(Protocol):
    """What the drift check reads from one entry of the invariants registry's CHECKS."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def summary(self) -> str: ...
    @property
    def func(self) -> Callable[..., object]: ...


@dataclasses.dataclass(frozen=True)
class MdTable:
    """A markdown pipe table: where it starts (1-based line), its headers and its rows."""

    line: int
    headers: tuple[str, ...]
    rows: tuple[tuple[int, Row], ...]  # (line, row)


def check_spec(spec_dir: Path, checks: Sequence[CheckInfo] | None = None) -> list[str]:
    """Every difference between the parts of the spec in `spec_dir`; empty means consistent.

    `checks` defaults to `hicache.invariants.registry.CHECKS`; if that module cannot be
    imported, one difference says so instead of raising."""
    try:
        lc = Lifecycle(load_toml(spec_dir / "lifecycle.toml"))
    except (OSError, ValueError, KeyError, TypeError, SpecError) as e:
        return [f"lifecycle.toml: cannot be loaded ({type(e).__name__}: {e})"]
    problems = check_machines(lc) + check_composites(lc)
    lifecycle_md = _read(spec_dir / "lifecycle.md", problems)
    if lifecycle_md is not None:
        problems += check_lifecycle_tables(lc, lifecycle_md)
        problems += check_diagrams(lc, lifecycle_md)
    invariants_md = _read(spec_dir / "invariants.md", problems)
    if invariants_md is not None:
        loaded = registry_checks() if checks is None else checks
        if isinstance(loaded, str):
            problems.append(loaded)
        else:
            problems += check_invariant_headings(loaded, invariants_md)
    schema_text = _read(spec_dir / "trace.schema.json", problems)
    trace_md = _read(spec_dir / "trace.md", problems)
    if schema_text is not None:
        problems += check_trace_schema(lc, schema_text, trace_md)
    readme = _read(spec_dir / "l3.md", problems)
    if readme is not None:
        problems += check_l3_header(readme)
    return problems


def spec_counts(lc: Lifecycle) -> dict[str, int]:
    """The sizes the spec quotes (lifecycle.md constants; `hicache spec check` prints them)."""
    graph = lc.reachable()
    return {
        "TRANSITIONS": len(lc.transitions),
        "COMPOSITE_STATES": len(graph),
        "COMPOSITE_EDGES": sum(len(edges) for edges in graph.values()),
    }


def registry_checks() -> Sequence[CheckInfo] | str:
    """The registry's CHECKS, or one line saying why they cannot be read."""
    try:
        module = importlib.import_module(REGISTRY_MODULE)
    except ImportError as e:
        return f"invariants.md: headings not checked: {REGISTRY_MODULE} cannot be imported ({e})"
    checks = getattr(module, "CHECKS", None)
    if not isinstance(checks, (list, tuple)):
        return f"invariants.md: headings not checked: {REGISTRY_MODULE}.CHECKS is not a sequence"
    return checks


def _read(path: Path, problems: list[str]) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        problems.append(f"{path.name}: cannot be read ({e.strerror or e})")
        return None


# -- the machine and the composite list -------------------------------------------------------


def check_machines(lc: Lifecycle) -> list[str]:
    """Each tier's built `transitions.Machine` holds exactly the tier's table rows."""
    problems: list[str] = []
    for tier in TIERS:
        table = lc.tables["residency"][str(tier)]
        machine = lc.machines[tier]
        states = [s["name"] for s in table["states"]]
        if list(machine.states) != states:
            problems.append(f"{tier} machine: states {list(machine.states)} != table {states}")
        if machine.initial != table["initial"]:
            problems.append(f"{tier} machine: initial {machine.initial} != table {table['initial']}")
        built = {
            (name, source, t.dest)
            for name, event in machine.events.items()
            for source, ts in event.transitions.items()
            for t in ts
        }
        rows = {(r["name"], r["from"], r["to"]) for r in table["transitions"]}
        for name, source, dest in sorted(rows - built):
            problems.append(f"{tier} machine: row {name} {source} -> {dest} is not in the machine")
        for name, source, dest in sorted(built - rows):
            problems.append(f"{tier} machine: edge {name} {source} -> {dest} is not a table row")
    return problems


def check_composites(lc: Lifecycle) -> list[str]:
    """The [[composite]] list names every reachable triple once, by the naming rule."""
    problems: list[str] = []
    seen_names: set[str] = set()
    seen_states: set[tuple[str, str, str]] = set()
    for c in lc.composites:
        if c.name in seen_names or c.states in seen_states:
            problems.append(f"lifecycle.toml: composite {c.name} {c.states} is listed twice")
        seen_names.add(c.name)
        seen_states.add(c.states)
        if c.name != composite_name(c.states):
            problems.append(
                f"lifecycle.toml: composite {c.name} {c.states}: the naming rule gives "
                f"{composite_name(c.states)}"
            )
    reachable = set(lc.reachable())
    for states in sorted(reachable - seen_states, key=composite_name):
        problems.append(
            f"lifecycle.toml: reachable state {composite_name(states)} {states} is not a "
            "[[composite]] entry"
        )
    for states in sorted(seen_states - reachable, key=composite_name):
        problems.append(f"lifecycle.toml: composite {composite_name(states)} {states} is not reachable")
    return problems


# -- lifecycle.md tables ------------------------------------------------------------------------


class TableSpec(NamedTuple):
    """What one lifecycle.md table must hold: its checked columns (the first `key_columns`
    of them identify a row) and the rows."""

    columns: tuple[str, ...]
    key_columns: int
    rows: list[Row]


def expected_tables(lc: Lifecycle) -> dict[str, TableSpec]:
    """What lifecycle.md's tables must say, by the header of their first column."""
    t = lc.tables
    counts = spec_counts(lc)
    constants = [
        {"Name": "TIERS", "Value": ", ".join(str(x) for x in TIERS)},
        {"Name": "OWNERSHIP_STATES", "Value": ", ".join(lc.ownership_states)},
        {"Name": "OWNERSHIP_INITIAL", "Value": t["ownership"]["initial"]},
    ] + [{"Name": k, "Value": str(v)} for k, v in counts.items()]
    residency = [
        {"tier": str(tier), "state": s["name"], "meaning": s["doc"]}
        for tier in TIERS for s in t["residency"][str(tier)]["states"]
    ]
    transitions = [
        {
            "transition": r["name"], "tier": str(tier), "kind": r["kind"],
            "direction": r.get("direction", ""), "from": r["from"], "to": r["to"],
            "trigger": r["trigger"], "guards": ", ".join(r.get("guards", [])),
            "effects": ", ".join(r.get("effects", [])), "trace event": r["name"],
        }
        for tier in TIERS for r in t["residency"][str(tier)]["transitions"]
    ]
    composites = [
        {"composite": c["name"], "L1": c["L1"], "L2": c["L2"], "L3": c["L3"],
         "write-ups' name": c.get("source_name", "")}
        for c in t.get("composite", [])
    ]
    tables: dict[str, list[Row]] = {
        "Name": constants,
        "ownership state": [{"ownership state": s["name"], "meaning": s["doc"]}
                            for s in t["ownership"]["states"]],
        "ownership transition": [
            {"ownership transition": r["name"], "from": r["from"], "to": r["to"],
             "trigger": r["trigger"]}
            for r in t["ownership"]["transitions"]
        ],
        "tier": residency,
        "transition": transitions,
        "composite": composites,
    }
    return {
        key: TableSpec(tuple(rows[0]) if rows else (key,), 2 if key == "tier" else 1, rows)
        for key, rows in tables.items()
    }


def check_lifecycle_tables(lc: Lifecycle, markdown: str) -> list[str]:
    """Every table of `expected_tables` appears in lifecycle.md (possibly split over several
    markdown tables with the same header), each row exactly once, every checked cell equal."""
    problems: list[str] = []
    found = parse_tables(markdown)
    for key, spec in expected_tables(lc).items():
        tables = [tb for tb in found if tb.headers and tb.headers[0] == key]
        if not tables:
            problems.append(f"lifecycle.md: no table whose first column is {key!r}")
            continue
        for tb in tables:
            absent = [c for c in spec.columns if c not in tb.headers]
            if absent:
                problems.append(f"lifecycle.md line {tb.line}: {key!r} table lacks column(s) {absent}")
        md_rows = [(line, row) for tb in tables for line, row in tb.rows]
        problems += compare_rows("lifecycle.md", key, spec, md_rows)
    return problems


def compare_rows(where: str, what: str, spec: TableSpec, found: Iterable[tuple[int, Row]]) -> list[str]:
    """Differences between the expected rows and rows found at lines of `where`, matched by
    their key columns; list-valued cells (guards, effects) compare item by item, in order."""
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
            problems.append(f"{where} line {line}: {what} `{name}` is not in lifecycle.toml")
            continue
        for col in columns:
            if col in row and _items(row[col]) != _items(_normalise(want[name][col])):
                problems.append(
                    f"{where} line {line}: {what} `{name}` column {col!r} says "
                    f"{row[col] or '-'!r}, lifecycle.toml says {want[name][col] or '-'!r}"
                )
    for name in want:
        if name not in seen:
            problems.append(f"{where}: {what} `{name}` of lifecycle.toml has no table row")
    return problems


def parse_tables(markdown: str) -> list[MdTable]:
    """Every pipe table (header, `---` separator, rows) in `markdown`, cells normalised:
    backticks removed, whitespace collapsed, a lone dash meaning empty."""
    tables: list[MdTable] = []
    lines = markdown.split("\n")
    i = 0
    while i + 1 < len(lines):
        if not (_is_row(lines[i]) and re.fullmatch(r"\|[\s:|-]*-[\s:|-]*\|?", lines[i + 1].strip())):
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
    return "" if text in {"-", "—", "–"} else text


def _items(cell: str) -> list[str]:
    return [item.strip() for item in cell.split(",") if item.strip()]


# -- the L3 header ----------------------------------------------------------------------------

L3_HEADER_COLUMNS = ("offset", "size", "field", "meaning")


def check_l3_header(readme: str) -> list[str]:
    """l3.md's table with columns `L3_HEADER_COLUMNS` lists `l3format.LAYOUT`, in order."""
    found = [t for t in parse_tables(readme) if t.headers == L3_HEADER_COLUMNS]
    if len(found) != 1:
        columns = ", ".join(L3_HEADER_COLUMNS)
        return [f"l3.md: {len(found)} L3 header tables (columns {columns}), want 1"]
    want = [(str(f.offset), str(f.size), f.name, _normalise(f.meaning)) for f in LAYOUT]
    have = [(line, tuple(row[c] for c in L3_HEADER_COLUMNS)) for line, row in found[0].rows]
    problems = [f"l3.md line {line}: L3 header row {' | '.join(row)!r}, "
                f"the code has {' | '.join(w)!r}" for (line, row), w in zip(have, want) if row != w]
    if len(have) != len(want):
        problems.append(f"l3.md: L3 header table has {len(have)} rows, the code {len(want)}")
    return problems


# -- diagrams ---------------------------------------------------------------------------------


def check_diagrams(lc: Lifecycle, markdown: str) -> list[str]:
    """Each embedded generated block equals what the tables generate now."""
    try:
        embedded = extract_blocks(markdown)
    except SpecError as e:
        return [f"lifecycle.md: {e}"]
    fix = "run `hicache spec write-diagrams`"
    problems: list[str] = []
    for name, text in all_diagrams(lc).items():
        if name not in embedded:
            problems.append(f"lifecycle.md: no generated block for diagram {name!r}")
            continue
        old, new = embedded[name].split("\n"), text.split("\n")
        if old != new:
            k = next((j for j, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
            was = old[k] if k < len(old) else "<end>"
            now = new[k] if k < len(new) else "<end>"
            problems.append(
                f"lifecycle.md: diagram {name!r} is stale: line {k + 1} is {was.strip()!r}, "
                f"the tables give {now.strip()!r}; {fix}"
            )
    for name in sorted(set(embedded) - set(DIAGRAMS)):
        problems.append(f"lifecycle.md: generated block {name!r} names no diagram ({', '.join(DIAGRAMS)})")
    return problems


# -- invariants.md ----------------------------------------------------------------------------

_HEADING = re.compile(r"^#{2,4}\s+([IS]\d+)\s+`([a-z0-9_]+)`\s*$")


def check_invariant_headings(checks: Sequence[CheckInfo], markdown: str) -> list[str]:
    """One heading `<id> `<name>`` per registered check, no other such heading, and each
    section names the checker `check_<name>` and its test `test_<name>_violation`."""
    problems: list[str] = []
    sections: dict[str, tuple[str, int, str]] = {}  # id -> (name, line, section text)
    lines = markdown.split("\n")
    starts = [(i, _HEADING.match(line)) for i, line in enumerate(lines)]
    heads = [(i, m) for i, m in starts if m is not None]
    for j, (i, m) in enumerate(heads):
        end = heads[j + 1][0] if j + 1 < len(heads) else len(lines)
        if m.group(1) in sections:
            problems.append(f"invariants.md line {i + 1}: {m.group(1)} has a second heading")
        sections[m.group(1)] = (m.group(2), i + 1, "\n".join(lines[i:end]))
    registered = {c.id: c for c in checks}
    for cid, c in registered.items():
        if c.func.__name__ != f"check_{c.name}":
            problems.append(f"registry: {cid} `{c.name}` is checked by {c.func.__name__}, not check_{c.name}")
        if cid not in sections:
            problems.append(f"invariants.md: no heading for {cid} `{c.name}` (registry)")
            continue
        name, line, text = sections[cid]
        if name != c.name:
            problems.append(
                f"invariants.md line {line}: heading {cid} `{name}`, registry names it `{c.name}`"
            )
            continue
        for needed in (f"check_{c.name}", f"test_{c.name}_violation"):
            if needed not in text:
                problems.append(f"invariants.md line {line}: section {cid} does not name `{needed}`")
    for cid in sorted(set(sections) - set(registered)):
        name, line, _ = sections[cid]
        problems.append(f"invariants.md line {line}: heading {cid} `{name}` is not in the registry")
    return problems


# -- trace schema -------------------------------------------------------------------------------


def check_trace_schema(lc: Lifecycle, schema_text: str, trace_md: str | None) -> list[str]:
    """The schema's event enum, per-tier event clauses, composite names and properties match
    the tables and `TraceEvent`; trace.md's event table lists the same events."""
    try:
        schema = json.loads(schema_text)
        props: Mapping[str, Any] = schema["properties"]
        events = list(props["event"]["enum"])
    except (ValueError, KeyError, TypeError) as e:
        return [f"trace.schema.json: properties.event.enum cannot be read ({type(e).__name__}: {e})"]
    want = list(lc.transitions) + list(NON_LIFECYCLE_EVENTS)
    problems = _set_diff("trace.schema.json event enum", events, want)
    fields = [f.name for f in dataclasses.fields(TraceEvent)]
    problems += _set_diff("trace.schema.json properties", list(props), fields)
    names = [c.name for c in lc.composites]
    for key in ("before", "after"):
        enum = list(props.get(key, {}).get("enum", []))
        problems += _set_diff(f"trace.schema.json {key} enum", enum, names)
    by_tier: dict[str, list[str]] = {}
    for clause in schema.get("allOf", []):
        tier = clause.get("then", {}).get("properties", {}).get("tier", {}).get("const")
        if isinstance(tier, str):
            by_tier.setdefault(tier, []).extend(clause["if"]["properties"]["event"]["enum"])
    for tier in TIERS:
        rows = [t.name for t in lc.transitions.values() if t.tier == tier]
        pinned = by_tier.get(str(tier), [])
        problems += _set_diff(f"trace.schema.json events pinned to tier {tier}", pinned, rows)
    if trace_md is not None:
        listed = [row.get("event", "") for tb in parse_tables(trace_md)
                  if tb.headers and tb.headers[0] == "event" for _, row in tb.rows]
        problems += _set_diff("trace.md event table", listed, want)
    return problems


def _set_diff(what: str, have: Sequence[str], want: Sequence[str]) -> list[str]:
    problems = [f"{what}: {x!r} is missing" for x in want if x not in have]
    problems += [f"{what}: {x!r} is not expected" for x in have if x not in want]
    problems += [f"{what}: {x!r} is listed twice" for x in sorted(set(have)) if have.count(x) > 1]
    return problems
