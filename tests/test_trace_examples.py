"""The trace examples of spec/examples/: every file is in the manifest and is what the
generator (hicache/oracle/checktrace/examples/) writes, and `check_lines` gives each the
manifest's verdict, first bad event and event count."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from hicache.core.trace import OMITTED_EVENTS, OMITTED_KEYS, TraceEvent, TraceHeader
from hicache.core.tracewalk import first_break
from hicache.oracle.checktrace import check_lines
from hicache.oracle.checktrace import examples as gen
from hicache.oracle.checktrace.examples import edits, partial, valid

EXAMPLES = Path(__file__).resolve().parents[1] / "spec" / "examples"
MANIFEST: dict[str, dict[str, Any]] = tomllib.loads((EXAMPLES / gen.MANIFEST).read_text())
EXIT = {"valid": 0, "violation": 1, "malformed": 2}


def test_every_file_is_in_the_manifest_and_the_manifest_names_only_files() -> None:
    on_disk = {p.name for p in EXAMPLES.iterdir()} - {gen.MANIFEST, "README.md"}
    assert on_disk == set(MANIFEST), (
        sorted(on_disk - set(MANIFEST)),
        sorted(set(MANIFEST) - on_disk),
    )
    readme = (EXAMPLES / "README.md").read_text()
    assert [f for f in MANIFEST if f"`{f}`" not in readme] == []  # README says what each shows


def test_the_committed_files_are_what_the_generator_writes() -> None:
    wanted = gen.files(gen.examples())
    stale = [name for name, text in wanted.items() if (EXAMPLES / name).read_text() != text]
    assert not stale, (
        f"rewrite with: python3 -m hicache.oracle.checktrace.examples spec/examples ({stale})"
    )


def test_the_check_option_names_a_stale_or_extra_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert gen.main([str(tmp_path)]) == 0
    assert gen.main(["--check", str(tmp_path)]) == 0
    (tmp_path / "backup_gap.ndjson").write_text("{}\n")
    (tmp_path / "mine.ndjson").write_text("{}\n")
    capsys.readouterr()
    assert gen.main(["--check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "backup_gap.ndjson: differs" in out and "mine.ndjson: not generated here" in out


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_check_trace_gives_the_manifest_verdict(name: str) -> None:
    want = MANIFEST[name]
    with open(EXAMPLES / name) as f:
        verdict = check_lines(f)
    # Verify the exit code first: a wrong seq means little under a wrong verdict.
    assert verdict.exit_code == EXIT[want["verdict"]], verdict.message
    if "seq" in want:
        assert verdict.seq == want["seq"], verdict.message
    if want["verdict"] == "valid":
        assert verdict.events == want["events"]


def test_every_violation_names_a_bug_class_of_the_spec_and_its_first_bad_event() -> None:
    classes = set(
        re.findall(r"^### (B\d\d) ", (EXAMPLES.parent / "bugclasses.md").read_text(), re.MULTILINE)
    )
    violations = {n: t for n, t in MANIFEST.items() if t["verdict"] == "violation"}
    assert len(violations) >= 10
    assert {
        n: t.get("bug_class") for n, t in violations.items() if t.get("bug_class") not in classes
    } == {}
    assert [n for n, t in violations.items() if "seq" not in t] == []


def test_valid_examples_are_walks_and_each_edit_is_at_or_before_its_first_bad_event() -> None:
    """The scripts' traces follow the composite graph (tracewalk); an edited one agrees with
    its base up to its edit, which is at or before the first bad event (what precedes the
    edit is valid by construction)."""
    found = {ex.name: ex for ex in gen.examples()}
    for name in valid.VALID:
        lines = found[name].lines
        assert first_break(TraceEvent.from_json(line) for line in lines[1:]) is None, name
    for edit in edits.EDITS:
        ex, base = found[edit.name], found[edit.base].lines
        if ex.verdict == "violation":
            assert ex.seq is not None
            edited_at = next(
                i for i, (a, b) in enumerate(zip(ex.lines, base)) if a != b
            )  # = its seq
            assert 1 <= edited_at <= ex.seq, (ex.name, edited_at, ex.seq)


def test_a_partial_trace_is_its_source_without_what_its_header_omits() -> None:
    found = {ex.name: ex for ex in gen.examples()}
    assert len(partial.PARTIALS) >= 5
    for p in partial.PARTIALS:
        ex, source = found[p.name], found[p.source]
        header = TraceHeader.from_json(ex.lines[0])
        assert (header.omits, header.tiers) == (p.omits, p.tiers)
        events = [json.loads(line) for line in ex.lines[1:]]
        gone_keys = {k for o in p.omits for k in OMITTED_KEYS.get(o, ())}
        gone_events = {e for o in p.omits for e in OMITTED_EVENTS.get(o, ())}
        assert [e for e in events if gone_keys & set(e) or e["event"] in gone_events] == []
        kept = [line for line in source.lines[1:] if json.loads(line)["event"] not in gone_events]
        assert len(events) == len(kept), p.name
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))


def test_an_edit_whose_event_is_gone_says_the_base_changed() -> None:
    with pytest.raises(LookupError, match="the base script changed"):
        edits._at([{"event": "insert"}], "h2d_cancel")
