"""lifecycle.toml against itself and against lifecycle.md: composites, tables, diagrams.

[[composite]] list   the reachable set, the naming rule, no duplicates
lifecycle.md tables  constants, ownership, residency, transitions, composites, the guard
                     vocabulary and the control-plane rules: every row once, cells equal
generated diagrams   the embedded Mermaid blocks equal what the tables generate
"""

from __future__ import annotations

from hicache.core.diagram import DIAGRAMS, all_diagrams, extract_blocks
from hicache.core.lifecycle import GUARD_VOCABULARY, Lifecycle, composite_name
from hicache.core.tiers import TIERS
from hicache.errors import SpecError
from hicache.oracle.speccheck.mdtables import Row, TableSpec, compare_rows, parse_tables


def spec_counts(lc: Lifecycle) -> dict[str, int]:
    """The sizes the spec quotes (lifecycle.md constants; `hicache spec check` prints them)."""
    graph = lc.reachable()
    return {
        "TRANSITIONS": len(lc.transitions),
        "COMPOSITE_STATES": len(graph),
        "COMPOSITE_EDGES": sum(len(edges) for edges in graph.values()),
    }


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
        problems.append(
            f"lifecycle.toml: composite {composite_name(states)} {states} is not reachable"
        )
    return problems


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
        for tier in TIERS
        for s in t["residency"][str(tier)]["states"]
    ]
    transitions = [
        {
            "transition": r["name"],
            "tier": str(tier),
            "kind": r["kind"],
            "direction": r.get("direction", ""),
            "from": r["from"],
            "to": r["to"],
            "trigger": r["trigger"],
            "guards": ", ".join(r.get("guards", [])),
            "effects": ", ".join(r.get("effects", [])),
            "trace event": r["name"],
        }
        for tier in TIERS
        for r in t["residency"][str(tier)]["transitions"]
    ]
    composites = [
        {
            "composite": c["name"],
            "L1": c["L1"],
            "L2": c["L2"],
            "L3": c["L3"],
            "linear-path name": c.get("path_name", ""),
        }
        for c in t.get("composite", [])
    ]
    tables: dict[str, list[Row]] = {
        "Name": constants,
        "ownership state": [
            {"ownership state": s["name"], "meaning": s["doc"]} for s in t["ownership"]["states"]
        ],
        "ownership transition": [
            {
                "ownership transition": r["name"],
                "from": r["from"],
                "to": r["to"],
                "trigger": r["trigger"],
            }
            for r in t["ownership"]["transitions"]
        ],
        "tier": residency,
        "guard": [{"guard": k, "holds when": v} for k, v in GUARD_VOCABULARY.items()],
        "transition": transitions,
        "rule": [
            {"rule": r.name, "operation": r.operation, "condition": r.condition, "why": r.why}
            for r in lc.rules
        ],
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
                problems.append(
                    f"lifecycle.md line {tb.line}: {key!r} table lacks column(s) {absent}"
                )
        md_rows = [(line, row) for tb in tables for line, row in tb.rows]
        problems += compare_rows("lifecycle.md", key, spec, md_rows)
    return problems


def check_diagrams(lc: Lifecycle, markdown: str, spec_dir: str | None = None) -> list[str]:
    """Each embedded generated block equals what the tables generate now. `spec_dir`: the
    spec folder checked, when it is not the installed one (the fix's command names it)."""
    try:
        embedded = extract_blocks(markdown)
    except SpecError as e:
        return [f"lifecycle.md: {e}"]
    fix = "run `hicache spec write-diagrams" + (f" --spec-dir {spec_dir}`" if spec_dir else "`")
    problems: list[str] = []
    for name, text in all_diagrams(lc).items():
        if name not in embedded:
            problems.append(f"lifecycle.md: no generated block for diagram {name!r}")
            continue
        old, new = embedded[name].split("\n"), text.split("\n")
        if old != new:
            k = next(
                (j for j, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new))
            )
            was = old[k] if k < len(old) else "<end>"
            now = new[k] if k < len(new) else "<end>"
            problems.append(
                f"lifecycle.md: diagram {name!r} is stale: line {k + 1} is {was.strip()!r}, "
                f"the tables give {now.strip()!r}; {fix}"
            )
    for name in sorted(set(embedded) - set(DIAGRAMS)):
        problems.append(
            f"lifecycle.md: generated block {name!r} names no diagram ({', '.join(DIAGRAMS)})"
        )
    return problems
