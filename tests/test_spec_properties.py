"""The properties the lifecycle tables must have: a wrong table fails `spec check` on its own.

The drift check compares the tables with their derivations (prose, diagrams, schema, the
`transitions` machine). Each mutant of the catalogue below is a wrong table edited
*consistently*: the toml rows edited, and every derivation brought in line with them (the
composite list, lifecycle.md's tables and diagrams, the trace schema and trace.md), so the
drift check alone finds nothing. `check_spec` must still fail, naming the property the edit
breaks and the row that breaks it (hicache/oracle/speccheck/properties.py). The shipped tables pass.

The catalogue's first entries are the zoo's table mutants (hicache/testing/mutants/tables.py),
which `hicache fuzz` catches too (benchmarks/results/2026-12-04-zoo-tables.md); the rest are
caught by `spec check` alone, that file says why.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from hicache.app import cli
from hicache.core.diagram import all_diagrams, replace_blocks
from hicache.core.lifecycle import Lifecycle, composite_name, load_lifecycle
from hicache.oracle.speccheck import check_spec, parse_tables
from hicache.oracle.speccheck.properties import PROPERTIES, check_properties
from hicache.oracle.speccheck.tables import expected_tables
from hicache.oracle.speccheck.trace import NON_LIFECYCLE_EVENTS
from hicache.spec import SPEC_DIR, load_toml
from hicache.testing.mutants import tables as table_mutants
from hicache.testing.mutants.tables import RowEdit

# name -> (the edits, the property that must fail, the row or state its message names)
CATALOGUE: dict[str, tuple[tuple[RowEdit, ...], str, str]] = {
    "unpinned-load-back": (table_mutants.UNPINNED_LOAD_BACK, "source_locked", "row h2d_issue"),
    "failed-load-back-published": (
        table_mutants.FAILED_LOAD_BACK_PUBLISHED,
        "publish_on_complete_only",
        "row h2d_fail",
    ),
    "backup-keeps-lock": (table_mutants.BACKUP_KEEPS_ITS_LOCK, "source_locked", "row h2s_complete"),
    "evict-l2-not-leaf": (
        (
            RowEdit(
                "evict_l2", "guards", ("locks(L2) == 0", "L1 != H2D_PENDING", "L3 != H2S_PENDING")
            ),
        ),
        "evict_leaf_only",
        "row evict_l2",
    ),
    "invalidate-not-leaf": (
        (RowEdit("invalidate_l3", "guards", ("locks(L3) == 0", "L2 != S2H_PENDING")),),
        "evict_leaf_only",
        "row invalidate_l3",
    ),
    "evict-l1-locked": (
        (RowEdit("evict_l1", "guards", ("L2 != D2H_PENDING", "leaf(L1)")),),
        "evict_unlocked",
        "row evict_l1",
    ),
    "backup-gap": (
        (RowEdit("d2h_issue", "guards", ("L1 == RESIDENT",)),),
        "issue_no_gap",
        "row d2h_issue",
    ),
    "load-back-from-nothing": (
        (RowEdit("h2d_issue", "guards", ("parent(L1) == RESIDENT",)),),
        "source_resident_while_pending",
        "row h2d_issue",
    ),
    "evict-l1-under-backup": (
        (RowEdit("evict_l1", "guards", ("locks(L1) == 0", "leaf(L1)")),),
        "source_resident_while_pending",
        "row evict_l1",
    ),
    "evict-l2-under-l3-backup": (
        (RowEdit("evict_l2", "guards", ("locks(L2) == 0", "L1 != H2D_PENDING", "leaf(L2)")),),
        "source_resident_while_pending",
        "row evict_l2",
    ),
    "promotion-locks-l1": (
        table_mutants.PROMOTION_LOCKS_L1,
        "source_locked",
        "row s2h_issue",
    ),
    "cancelled-backup-published": (
        (
            RowEdit("d2h_cancel", "to", "RESIDENT"),
            RowEdit("d2h_cancel", "effects", ("publish(L2)", "unlock(L1)")),
        ),
        "publish_on_complete_only",
        "row d2h_cancel",
    ),
    "backup-never-cancelled": (
        (RowEdit("d2h_cancel"),),
        "pending_exits",
        "D2H_PENDING (the D2H op's pending state) has 0 cancel rows",
    ),
    "promotion-ends-as-load-back": (
        (RowEdit("s2h_fail", "direction", "H2D"),),
        "pending_exits",
        "row s2h_fail",
    ),
    "no-discard": (
        (RowEdit("discard"),),
        "pages_balance",
        "L1 PRIVATE is left by no row that does release(L1)",
    ),
    "l3-never-dropped": (
        (RowEdit("evict_l3"), RowEdit("invalidate_l3")),
        "drains_to_absent",
        "no path of rows reaches ABSENT from 11 reachable state(s)",
    ),
    "compute-unaligned": (
        (RowEdit("compute", "guards", ("range <= prompt", "no_private(request)")),),
        "compute_guarded",
        "row compute",
    ),
    "no-l2-refill-under-l3": (
        (
            RowEdit(
                "d2h_issue",
                "guards",
                ("L1 == RESIDENT", "L3 != RESIDENT", "parent(L2) == RESIDENT"),
            ),
        ),
        "every_legal_triple_reachable",
        "row d2h_issue from L1_L3 is refused",
    ),
}


# -- a consistent copy: the toml edited, every derivation brought in line -------------------------


def _row_block(text: str, name: str) -> re.Match[str]:
    m = re.search(rf'\[\[residency\.L\d\.transitions\]\]\nname = "{name}"\n(?:[^\[\n].*\n)*', text)
    assert m is not None, f"no row {name} in lifecycle.toml"
    return m


def _edit_toml(text: str, e: RowEdit) -> str:
    """`e` applied to lifecycle.toml's text (the row's field line rewritten, or the row cut)."""
    m = _row_block(text, e.row)
    block = m.group(0)
    if e.field is None:
        new = ""
        end = m.end() + 1 if text[m.end() : m.end() + 1] == "\n" else m.end()
        return text[: m.start()] + new + text[end:]
    value = json.dumps(list(e.value) if isinstance(e.value, tuple) else e.value)
    line = re.compile(rf"^{e.field} = .*$", re.MULTILINE)
    if line.search(block):
        block = line.sub(lambda _: f"{e.field} = {value}", block)
    else:
        block = block.replace(f'name = "{e.row}"\n', f'name = "{e.row}"\n{e.field} = {value}\n')
    return text[: m.start()] + block + text[m.end() :]


def _composites_toml(text: str, lc: Lifecycle) -> str:
    """The [[composite]] list rewritten to the reachable set (path names kept)."""
    path_names = {c.name: c.path_name for c in lc.composites}
    head = text[: text.index("\n[[composite]]\n") + 1]
    blocks = []
    for states in sorted(lc.reachable(), key=composite_name):
        name = composite_name(states)
        block = f'[[composite]]\nname = "{name}"\n'
        block += "".join(f'{t} = "{s}"\n' for t, s in zip(("L1", "L2", "L3"), states))
        if path_names.get(name):
            block += f'path_name = "{path_names[name]}"\n'
        blocks.append(block)
    return head + "\n".join(blocks)


def _sync_markdown_tables(md: str, lc: Lifecycle) -> str:
    """lifecycle.md's checked tables (constants, transitions, composites) rewritten to `lc`:
    rows edited, removed or added; unchecked columns keep their text."""
    expected = expected_tables(lc)
    lines = md.split("\n")
    drop: set[int] = set()
    after: dict[int, list[str]] = {}
    for key in ("Name", "transition", "composite"):
        tables = [tb for tb in parse_tables(md) if tb.headers and tb.headers[0] == key]
        want = {row[key]: row for row in expected[key].rows}
        for tb in tables:
            for line_no, row in tb.rows:
                if row[key] not in want:
                    drop.add(line_no - 1)
                    continue
                raw = re.split(r"(?<!\\)\|", lines[line_no - 1].strip())[1:-1]
                cells = [
                    want[row[key]].get(h, raw[i].strip()) or "—" for i, h in enumerate(tb.headers)
                ]
                lines[line_no - 1] = "| " + " | ".join(cells) + " |"
                want.pop(row[key])
        if want:  # new rows (new composites): after the last row of the key's last table
            last = tables[-1].rows[-1][0] - 1
            after[last] = [
                "| " + " | ".join(row.get(h, "") or "—" for h in tables[-1].headers) + " |"
                for row in want.values()
            ]
    out = []
    for i, line in enumerate(lines):
        if i not in drop:
            out.append(line)
        out.extend(after.get(i, []))
    return "\n".join(out)


def _sync_schema(schema: dict[str, Any], lc: Lifecycle) -> None:
    """trace.schema.json's event lists and composite enums rewritten to `lc` (rows removed)."""
    events = set(lc.transitions) | set(NON_LIFECYCLE_EVENTS)
    props = schema["properties"]
    props["event"]["enum"] = [e for e in props["event"]["enum"] if e in events]
    for key in ("before", "after"):
        props[key]["enum"] = sorted(composite_name(s) for s in lc.reachable())
    for clause in schema.get("allOf", []):
        enum = clause.get("if", {}).get("properties", {}).get("event", {}).get("enum")
        if enum is not None:
            clause["if"]["properties"]["event"]["enum"] = [e for e in enum if e in events]


def consistent_copy(tmp_path: Path, edits: tuple[RowEdit, ...]) -> Path:
    """A copy of the shipped spec with `edits` made to lifecycle.toml and everything the
    drift check derives from it brought in line: what a careful author of a wrong table
    would commit."""
    spec = tmp_path / "spec"
    shutil.copytree(SPEC_DIR, spec, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    toml = spec / "lifecycle.toml"
    text = toml.read_text(encoding="utf-8")
    for e in edits:
        text = _edit_toml(text, e)
    toml.write_text(text, encoding="utf-8")
    text = _composites_toml(text, Lifecycle(load_toml(toml)))
    toml.write_text(text, encoding="utf-8")
    lc = Lifecycle(load_toml(toml))
    md = spec / "lifecycle.md"
    synced, _ = replace_blocks(
        _sync_markdown_tables(md.read_text(encoding="utf-8"), lc), all_diagrams(lc)
    )
    md.write_text(synced, encoding="utf-8")
    schema_path = spec / "trace.schema.json"
    schema = json.loads(schema_path.read_text(encoding="utf-8"))
    _sync_schema(schema, lc)
    schema_path.write_text(json.dumps(schema, indent=2) + "\n", encoding="utf-8")
    trace_md = spec / "trace.md"
    kept = [
        line
        for line in trace_md.read_text(encoding="utf-8").split("\n")
        if not (m := re.match(r"\| `?([a-z0-9_]+)`? \|", line))
        or m.group(1) not in {r.row for r in edits if r.field is None}
    ]
    trace_md.write_text("\n".join(kept), encoding="utf-8")
    return spec


# -- the tests ---------------------------------------------------------------------------------


def test_the_shipped_tables_have_every_property() -> None:
    assert check_properties(load_lifecycle()) == []


def test_a_consistent_copy_of_the_shipped_tables_passes(tmp_path: Path) -> None:
    """The copy machinery changes nothing by itself: the mutants below differ by their edits."""
    assert check_spec(consistent_copy(tmp_path, ())) == []


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_a_consistently_wrong_table_fails_spec_check_by_its_property(
    name: str, tmp_path: Path
) -> None:
    edits, prop, where = CATALOGUE[name]
    problems = check_spec(consistent_copy(tmp_path, edits))
    drift = [p for p in problems if not p.startswith("lifecycle.toml: property ")]
    assert drift == [], f"{name}: the copy is not consistent, the drift check sees {drift}"
    named = [p for p in problems if p.startswith(f"lifecycle.toml: property {prop}: ")]
    assert any(where in p for p in named), f"{name}: no {prop} problem naming {where!r}: {problems}"


def test_every_property_has_a_mutant_it_catches() -> None:
    assert {prop for _, prop, _ in CATALOGUE.values()} == {p.name for p in PROPERTIES}


def test_the_zoo_table_mutants_are_in_the_catalogue() -> None:
    assert {m.name for m in table_mutants.ZOO} == set(table_mutants.EDITS)
    catalogued = [edits for edits, _, _ in CATALOGUE.values()]
    assert all(edits in catalogued for edits in table_mutants.EDITS.values())


def test_the_property_table_of_lifecycle_md_is_checked(tmp_path: Path) -> None:
    spec = consistent_copy(tmp_path, ())
    md = spec / "lifecycle.md"
    text = md.read_text(encoding="utf-8")
    row = next(line for line in text.split("\n") if line.startswith("| `drains_to_absent` |"))
    md.write_text(text.replace(row + "\n", ""), encoding="utf-8")
    problems = check_spec(spec)
    assert problems == [
        "lifecycle.md: property `drains_to_absent` of the property registry has no table row"
    ]


def test_spec_check_names_the_properties_proven(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["spec", "check"]) == 0
    assert f"{len(PROPERTIES)} table properties proven" in capsys.readouterr().out


def test_a_table_mutant_loads_its_tables_only_inside_its_block() -> None:
    """The zoo's table mutants switch the loaded tables (the executor's and the walk's) and
    switch them back; the properties catch the tables they load."""
    shipped = load_lifecycle()
    with table_mutants.patched(table_mutants.BACKUP_KEEPS_ITS_LOCK):
        wrong = load_lifecycle()
        assert [str(e) for e in wrong.transitions["h2s_complete"].effects] == ["publish(L3)"]
        assert any("property source_locked: row h2s_complete" in p for p in check_properties(wrong))
    assert load_lifecycle() is shipped
