"""The drift check: the shipped spec is consistent, and each kind of drift is reported.

Each drift test copies the spec directory, makes one deliberate edit, and asserts that
`check_spec` names the difference (not merely that it fails).
"""

from __future__ import annotations

import functools
import io
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

import hicache.oracle.speccheck as speccheck
import hicache.oracle.speccheck.invariants as speccheck_invariants
import hicache.oracle.speccheck.rules as speccheck_rules
from hicache.core.control import ControlPlane
from hicache.core.diagram import all_diagrams, extract_blocks, replace_blocks
from hicache.core.lifecycle import load_lifecycle
from hicache.core.tiers import Direction
from hicache.core.trace import NdjsonSink, TraceHeader, Tracer
from hicache.errors import SpecError
from hicache.oracle.speccheck import check_spec, parse_tables
from hicache.spec import SPEC_DIR


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    """A private copy of the shipped spec directory (tables and prose only)."""
    dest = tmp_path / "spec"
    shutil.copytree(SPEC_DIR, dest, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    return dest


def edit(path: Path, old: str, new: str) -> None:
    """Replace the one occurrence of `old` in `path` (the test is wrong if there is not one)."""
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times in {path.name}"
    path.write_text(text.replace(old, new), encoding="utf-8")


def toml_row(name: str) -> str:
    """The text of one residency transition row of the shipped lifecycle.toml."""
    text = (SPEC_DIR / "lifecycle.toml").read_text(encoding="utf-8")
    m = re.search(rf'\[\[residency\.L\d\.transitions\]\]\nname = "{name}"\n(?:[^\[\n].*\n)*', text)
    assert m is not None, name
    return m.group(0)


def has(problems: list[str], *parts: str) -> bool:
    """Some reported difference mentions every one of `parts`."""
    return any(all(p in line for p in parts) for line in problems)


def test_shipped_spec_is_consistent() -> None:
    assert check_spec(SPEC_DIR) == []


def test_copy_is_consistent(spec: Path) -> None:
    # The drift tests below rely on an unedited copy passing.
    assert check_spec(spec) == []


# -- lifecycle.toml vs lifecycle.md, machine, composites ---------------------------------------


def test_changed_to_state_in_toml(spec: Path) -> None:
    row = toml_row("d2h_fail")
    edit(
        spec / "lifecycle.toml",
        row,
        row.replace('to = "ABSENT"', 'to = "RESIDENT"').replace(
            'effects = ["release(L2)"', 'effects = ["publish(L2)"'
        ),
    )
    problems = check_spec(spec)
    assert has(problems, "d2h_fail", "'to'", "'ABSENT'", "'RESIDENT'")
    assert has(problems, "d2h_fail", "'effects'", "publish(L2)")
    # The L2 diagram is generated from the tables, so it is stale too.
    assert has(problems, "diagram 'L2' is stale", "write-diagrams")


def test_effects_that_do_not_fit_the_states_do_not_load(spec: Path) -> None:
    """The executor runs any row that loads, so a row whose effects contradict its states is
    refused at load: here d2h_fail would reach RESIDENT while releasing its pages."""
    row = toml_row("d2h_fail")
    edit(spec / "lifecycle.toml", row, row.replace('to = "ABSENT"', 'to = "RESIDENT"'))
    (problem,) = check_spec(spec)
    assert "cannot be loaded" in problem and "d2h_fail" in problem and "release(L2)" in problem


def test_changed_guard_cell_in_markdown(spec: Path) -> None:
    edit(
        spec / "lifecycle.md",
        "`locks(L2) == 0`, `L1 != H2D_PENDING`, `L3 != H2S_PENDING`",
        "`locks(L2) == 0`, `L1 != H2D_PENDING`",
    )
    problems = check_spec(spec)
    assert has(problems, "lifecycle.md line", "evict_l2", "'guards'")
    assert len(problems) == 1


def test_effect_order_in_markdown_matters(spec: Path) -> None:
    edit(
        spec / "lifecycle.md", "| `publish(L1)`, `unlock(L2)` |", "| `unlock(L2)`, `publish(L1)` |"
    )
    assert has(check_spec(spec), "h2d_complete", "'effects'")


def test_missing_and_extra_markdown_rows(spec: Path) -> None:
    md = spec / "lifecycle.md"
    row = next(
        line
        for line in md.read_text(encoding="utf-8").splitlines()
        if line.startswith("| `s2h_cancel` |")
    )
    edit(md, row + "\n", row.replace("s2h_cancel", "s2h_abort") + "\n")
    problems = check_spec(spec)
    assert has(problems, "s2h_cancel", "has no table row")
    assert has(problems, "s2h_abort", "is not in lifecycle.toml")


def test_stale_diagram_and_its_fix(spec: Path) -> None:
    md = spec / "lifecycle.md"
    edit(
        md,
        "    D2H_PENDING --> RESIDENT: d2h_complete\n",
        "    D2H_PENDING --> RESIDENT: d2h_done\n",
    )
    problems = check_spec(spec)
    assert has(problems, "diagram 'L2' is stale", "d2h_done", "d2h_complete")
    # `hicache spec write-diagrams` is how an author fixes it.
    fixed, changed = replace_blocks(md.read_text(encoding="utf-8"), all_diagrams(load_lifecycle()))
    assert changed == ["L2"]
    md.write_text(fixed, encoding="utf-8")
    assert check_spec(spec) == []


def test_removed_composite_state(spec: Path) -> None:
    edit(
        spec / "lifecycle.toml",
        '[[composite]]\nname = "L1_L3"\nL1 = "RESIDENT"\nL2 = "ABSENT"\nL3 = "RESIDENT"\n\n',
        "",
    )
    problems = check_spec(spec)
    assert has(problems, "reachable state L1_L3", "not a [[composite]] entry")
    assert has(problems, "composite `L1_L3`", "not in lifecycle.toml")


def test_misnamed_and_unreachable_composites(spec: Path) -> None:
    toml = spec / "lifecycle.toml"
    edit(toml, 'name = "L1_L3"\n', 'name = "L3_L1"\n')
    with toml.open("a", encoding="utf-8") as f:
        f.write(
            '\n[[composite]]\nname = "H2D_PENDING"\nL1 = "H2D_PENDING"\nL2 = "ABSENT"\n'
            'L3 = "ABSENT"\n'
        )
    problems = check_spec(spec)
    assert has(problems, "composite L3_L1", "the naming rule gives L1_L3")
    assert has(problems, "composite H2D_PENDING", "is not reachable")


def test_unloadable_toml(spec: Path) -> None:
    edit(
        spec / "lifecycle.toml",
        'guards = ["L2 == RESIDENT", "parent(L1) == RESIDENT"]',
        'guards = ["L2 == RESIDNT", "parent(L1) == RESIDENT"]',
    )
    (problem,) = check_spec(spec)
    assert "lifecycle.toml: cannot be loaded" in problem and "RESIDNT" in problem


def test_unknown_guard_form_does_not_load(spec: Path) -> None:
    edit(spec / "lifecycle.toml", '"leaf(L1)"]', '"leafy(L1)"]')
    (problem,) = check_spec(spec)
    assert "cannot be loaded" in problem and "leafy(L1)" in problem and "leaf(Ln)" in problem


def test_guard_vocabulary_table_is_checked(spec: Path) -> None:
    md = spec / "lifecycle.md"
    row = next(
        line
        for line in md.read_text(encoding="utf-8").splitlines()
        if line.startswith("| `leaf(Ln)` |")
    )
    edit(md, row + "\n", "")
    assert has(check_spec(spec), "guard `leaf(Ln)`", "has no table row")


def test_control_plane_rule_must_be_enforced(spec: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A [[rule]] of lifecycle.toml is probed against the reference: a rule it does not enforce,
    and a rule without a probe, are reported."""
    monkeypatch.setitem(speccheck_rules.PROBES, "match_short_of_last_token", lambda: "accepted it")
    assert has(check_spec(spec), "rule match_short_of_last_token is not enforced", "accepted it")
    monkeypatch.undo()
    edit(spec / "lifecycle.toml", 'name = "match_short_of_last_token"', 'name = "another_rule"')
    problems = check_spec(spec)
    assert has(problems, "rule another_rule has no probe")
    assert has(problems, "probe match_short_of_last_token names no [[rule]]")


# -- invariants.md vs the registry ---------------------------------------------------------------


def test_invariant_heading_renamed(spec: Path) -> None:
    edit(spec / "invariants.md", "### I2 `inflight_source_pinned`", "### I2 `source_pinned`")
    problems = check_spec(spec)
    assert has(problems, "heading I2 `source_pinned`", "registry names it `inflight_source_pinned`")


def test_invariant_section_must_name_checker_and_test(spec: Path) -> None:
    edit(spec / "invariants.md", "Test: `test_no_dead_node_violation`.", "Test: none.")
    assert has(check_spec(spec), "section S2", "test_no_dead_node_violation")


def test_invariant_heading_without_check(spec: Path) -> None:
    with (spec / "invariants.md").open("a", encoding="utf-8") as f:
        f.write("\n### S8 `no_such_check`\n")
    assert has(check_spec(spec), "heading S8 `no_such_check` is not in the registry")


def test_unimportable_registry_is_reported_not_raised(
    spec: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        speccheck_invariants, "REGISTRY_MODULE", "hicache.invariants.no_such_registry"
    )
    assert has(check_spec(spec), "invariants.md: headings not checked", "no_such_registry")


# -- trace schema --------------------------------------------------------------------------------


def test_schema_event_enum_drift(spec: Path) -> None:
    schema_path = spec / "trace.schema.json"
    schema = json.loads(schema_path.read_text(encoding="utf-8"))
    schema["properties"]["event"]["enum"].remove("node_remove")
    schema["properties"]["event"]["enum"].append("evict_l4")
    schema_path.write_text(json.dumps(schema), encoding="utf-8")
    problems = check_spec(spec)
    assert has(problems, "event enum", "'node_remove' is missing")
    assert has(problems, "event enum", "'evict_l4' is not expected")


def test_schema_tier_clause_drift(spec: Path) -> None:
    schema_path = spec / "trace.schema.json"
    schema = json.loads(schema_path.read_text(encoding="utf-8"))
    l1_clause = schema["allOf"][0]
    assert l1_clause["then"]["properties"]["tier"]["const"] == "L1"
    l1_clause["if"]["properties"]["event"]["enum"].remove("evict_l1")
    schema_path.write_text(json.dumps(schema), encoding="utf-8")
    assert has(check_spec(spec), "pinned to tier L1", "'evict_l1' is missing")


def test_trace_md_event_table_drift(spec: Path) -> None:
    md = spec / "trace.md"
    row = next(
        line
        for line in md.read_text(encoding="utf-8").splitlines()
        if line.startswith("| `split` |")
    )
    edit(md, row + "\n", "")
    assert has(check_spec(spec), "trace.md event table", "'split' is missing")


def _validator() -> Any:
    """A draft 2020-12 validator of the shipped schema (built once; the schema is checked too)."""
    jsonschema = pytest.importorskip("jsonschema")
    return _build_validator(jsonschema)


@functools.lru_cache(maxsize=1)
def _build_validator(jsonschema: Any) -> Any:
    schema = json.loads((SPEC_DIR / "trace.schema.json").read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_header_schema_drift(spec: Path) -> None:
    """The header schema's keys are TraceHeader's fields; its `omits` enum is HEADER_OMITS."""
    edit(spec / "trace.header.schema.json", '"engine": {', '"writer": {')
    edit(spec / "trace.header.schema.json", '"split"\n', '"split",\n          "bytes"\n')
    problems = check_spec(spec)
    assert has(problems, "trace.header.schema.json properties", "'engine' is missing")
    assert has(problems, "trace.header.schema.json properties", "'writer' is not expected")
    assert has(problems, "trace.header.schema.json omits", "'bytes' is not expected")


def test_reference_trace_matches_schema() -> None:
    validator = _validator()
    out = io.StringIO()
    cp = ControlPlane(2, [8, 8, 8], tracer=Tracer(NdjsonSink(out)))
    cp.begin_request(1, [1, 2, 3, 4, 5])
    cp.compute(1, 4)
    cp.insert(1)
    path = list(cp.tree.match([1, 2, 3, 4]).path)
    cp.complete(cp.issue(Direction.D2H, path).op_id)
    cp.cancel(cp.issue(Direction.H2S, path).op_id)
    cp.end_request(1)
    cp.begin_request(2, [1, 2, 9, 9])  # splits node 1
    cp.end_request(2)
    cp.evict("L1", 8)
    cp.evict("L2", 8)
    header, *lines = out.getvalue().splitlines()  # the plane handed the sink its header
    assert json.loads(header)["format"] == "hicache-trace"
    events = {json.loads(line)["event"] for line in lines}
    assert {
        "split",
        "d2h_complete",
        "h2s_cancel",
        "evict_l2",
        "node_remove",
        "cached_len",
    } <= events
    for line in lines:
        errors = [e.message for e in validator.iter_errors(json.loads(line))]
        assert errors == [], line


def test_trace_md_example_matches_schema() -> None:
    validator = _validator()
    text = (SPEC_DIR / "trace.md").read_text(encoding="utf-8")
    block = text.split("```json\n", 1)[1].split("```", 1)[0]
    header, *lines = block.strip().splitlines()
    jsonschema = pytest.importorskip("jsonschema")
    header_schema = json.loads((SPEC_DIR / "trace.header.schema.json").read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(header_schema)
    assert (
        list(jsonschema.Draft202012Validator(header_schema).iter_errors(json.loads(header))) == []
    )
    assert TraceHeader.from_json(header).capacities == {"L1": 8, "L2": 8, "L3": 8}
    assert [json.loads(line)["seq"] for line in lines] == list(range(1, len(lines) + 1))
    for line in lines:
        assert list(validator.iter_errors(json.loads(line))) == [], line


@pytest.mark.parametrize(
    "event, why",
    [
        ({"seq": 1, "event": "evict_l4"}, "unknown event"),
        (
            {
                "seq": 1,
                "event": "h2d_issue",
                "tier": "L2",
                "before": "L2",
                "after": "H2D_PENDING_L2",
            },
            "wrong tier",
        ),
        ({"seq": 1, "event": "d2h_issue", "tier": "L2"}, "no before/after"),
        ({"seq": 1, "event": "cached_len", "request": 3}, "no token_end"),
        ({"seq": 0, "event": "end_request", "request": 3}, "seq starts at 1"),
        ({"seq": 1, "event": "split", "node": 4, "detail": {"upper": 5}}, "split without at"),
        ({"seq": 1, "event": "node_remove", "node": 4, "colour": "red"}, "unknown key"),
        (
            {"seq": 1, "event": "evict_l1", "tier": "L1", "before": "L1", "after": "NOWHERE"},
            "unknown composite",
        ),
    ],
)
def test_schema_rejects(event: dict[str, object], why: str) -> None:
    assert list(_validator().iter_errors(event)), why


# -- helpers -------------------------------------------------------------------------------------


EMPTY_L1 = "<!-- BEGIN GENERATED: L1 -->\n<!-- END GENERATED -->\n"


def test_generated_block_errors() -> None:
    diagrams = all_diagrams(load_lifecycle())
    with pytest.raises(SpecError, match="no generated block for composite"):
        replace_blocks(EMPTY_L1, {"composite": diagrams["composite"]})
    with pytest.raises(SpecError, match="not closed before the next one"):
        extract_blocks(
            "<!-- BEGIN GENERATED: L1 -->\n<!-- BEGIN GENERATED: L2 -->\n<!-- END GENERATED -->\n"
        )
    with pytest.raises(SpecError, match="appears twice"):
        extract_blocks(EMPTY_L1 * 2)
    with pytest.raises(SpecError, match="mermaid fence"):
        extract_blocks("<!-- BEGIN GENERATED: L1 -->\nhand-written\n<!-- END GENERATED -->\n")
    # Empty markers are filled in, and the rest of the document is left as it was.
    text, changed = replace_blocks(f"a\n{EMPTY_L1}b", {"L1": diagrams["L1"]})
    assert changed == ["L1"]
    assert text.startswith("a\n<!-- BEGIN GENERATED: L1 -->\n```mermaid\nstateDiagram-v2\n")
    assert text.endswith("```\n<!-- END GENERATED -->\nb")
    assert extract_blocks(text) == {"L1": diagrams["L1"]}


def test_parse_tables_normalises_cells() -> None:
    (table,) = parse_tables("x\n| a | b |\n|---|:--:|\n| `c` | x \\| y |\n| — |  d   e |\n\nafter")
    assert table.line == 2 and table.headers == ("a", "b")
    assert [row for _, row in table.rows] == [{"a": "c", "b": "x | y"}, {"a": "", "b": "d e"}]


def test_composite_diagram_covers_every_reachable_edge() -> None:
    lc = load_lifecycle()
    text = all_diagrams(lc)["composite"]
    labels = sum(
        len(line.split(": ", 1)[1].split(", ")) for line in text.splitlines() if ": " in line
    )
    assert labels == speccheck.spec_counts(lc)["COMPOSITE_EDGES"] == 94


def test_spec_check_covers_the_pages(spec: Path) -> None:
    """The reading order, bug-class ids and metric names of the pages are checked against
    the pages and the code: each drift below is reported."""
    assert check_spec(spec) == []
    edit(spec / "README.md", ". [bugclasses.md](bugclasses.md)", ". [bugs.md](bugs.md)")
    undefined = "B" + "17"  # built from parts: test_bugclasses scans this file for ids too
    (spec / "extra.md").write_text(f"# An unlisted page\n\nCites {undefined}.\n", encoding="utf-8")
    edit(spec / "restore.md", "`transfers_cancelled_total`", "`transfers_canceled_total`")
    edit(spec / "restore.md", "`fallbacks_total{reason}`", "`fallbacks_total{cause}`")
    problems = check_spec(spec)
    assert has(problems, "reading order lists bugs.md, which does not exist")
    assert has(problems, "bugclasses.md: not in README.md's reading order")
    assert has(problems, "extra.md: not in README.md's reading order")
    assert has(problems, "extra.md line 3", undefined)
    assert has(problems, "restore.md", "`transfers_canceled_total` is not a metric")
    assert has(problems, "restore.md", "`fallbacks_total` has no label 'cause'")
    assert len(problems) == 6, problems


def test_spec_check_knows_the_label_values() -> None:
    from hicache.oracle.speccheck.pages import check_metric_names, exported_metrics

    exported = exported_metrics(
        'hicache_fallbacks_total{reason="no_room"} 0\nhicache_restores_total 3\n'
    )
    assert exported == {"fallbacks_total": {"reason": frozenset({"no_room"})}, "restores_total": {}}
    pages = {
        "a.md": 'x `fallbacks_total{reason="no_room"}` `restores_total`\n'
        'y `fallbacks_total{reason="gone"}`\n'
    }
    assert check_metric_names(pages, exported) == [
        "a.md line 2: `fallbacks_total` has no reason='gone' (it has no_room)"
    ]
