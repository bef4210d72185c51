"""Rule numbers: every MUST of spec/ is a numbered rule of SUMMARY.md, and code cites each.

Each failure test copies the spec directory (or writes a small code directory), plants one
mistake, and asserts that the check names it: a MUST without a rule id, a tag or a code
citation of a rule SUMMARY.md does not define, a rule no code cites.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hicache.app import cli
from hicache.oracle.speccheck import check_spec
from hicache.oracle.speccheck.rulenumbers import check_code, check_rule_numbers, defined_rules
from hicache.spec import SPEC_DIR


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    """A private copy of the shipped spec directory (tables and prose only)."""
    dest = tmp_path / "spec"
    shutil.copytree(SPEC_DIR, dest, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    return dest


def append(path: Path, text: str) -> int:
    """Append `text` as the last line of `path`; its line number."""
    lines = path.read_text(encoding="utf-8").splitlines()
    path.write_text("\n".join([*lines, text]) + "\n", encoding="utf-8")
    return len(lines) + 1


def has(problems: list[str], *parts: str) -> bool:
    """Some reported problem mentions every one of `parts`."""
    return any(all(p in line for p in parts) for line in problems)


def test_the_shipped_spec_numbers_every_must_and_code_cites_every_rule() -> None:
    assert check_rule_numbers(SPEC_DIR) == []


def test_summary_defines_rules_invariants_and_points_once() -> None:
    ids, twice = defined_rules((SPEC_DIR / "SUMMARY.md").read_text(encoding="utf-8"))
    assert twice == []
    assert {"R1", "I1", "I11", "S7", "C0", "C1a", "C6b", "C9"} <= set(ids)
    assert len(ids) == len(set(ids))


def test_spec_check_counts_the_rules(capsys: pytest.CaptureFixture[str]) -> None:
    ids, _ = defined_rules((SPEC_DIR / "SUMMARY.md").read_text(encoding="utf-8"))
    assert cli.main(["spec", "check"]) == 0
    assert f"{len(ids)} rules numbered and cited by code" in capsys.readouterr().out


def test_a_must_without_a_rule_id_fails(spec: Path) -> None:
    line = append(spec / "tree.md", "A split MUST keep both halves in the tree.")
    problems = check_spec(spec)
    assert has(problems, f"tree.md line {line}", "MUST without a rule id")


def test_a_must_with_its_rule_id_passes(spec: Path) -> None:
    append(spec / "tree.md", "A split MUST keep both halves in the tree (R18).")
    assert check_rule_numbers(spec) == []


def test_a_must_in_backticks_or_on_an_informative_page_needs_no_id(spec: Path) -> None:
    append(spec / "tree.md", "The key word `MUST` is used as in RFC 2119.")
    page = spec / "appendix-notes.md"
    page.write_text("# Notes\n\nInformative. Asides.\n\nAn engine MUST be fast.\n", "utf-8")
    assert check_rule_numbers(spec) == []


def test_a_tag_of_a_rule_summary_does_not_define_fails(spec: Path) -> None:
    line = append(spec / "l3.md", "A slot MUST be read whole (R999).")
    assert has(check_rule_numbers(spec), f"l3.md line {line}", "cites R999", "not define")


def test_an_invariant_tag_summary_does_not_define_fails(spec: Path) -> None:
    line = append(spec / "tp.md", "Every rank MUST agree (I12).")
    assert has(check_rule_numbers(spec), f"tp.md line {line}", "cites I12")


def test_a_rule_no_code_cites_fails(spec: Path) -> None:
    summary = spec / "SUMMARY.md"
    text = summary.read_text(encoding="utf-8")
    first = text.index("- **R1** ")
    summary.write_text(text[:first] + "- **R999** Nothing enforces this.\n" + text[first:])
    problems = check_rule_numbers(spec)
    assert has(problems, "rule R999 is cited by no code")
    assert not has(problems, "rule R1 is cited by no code")


def test_a_rule_defined_twice_fails(spec: Path) -> None:
    summary = spec / "SUMMARY.md"
    append(summary, "- **R1** A second rule under the first one's number.")
    assert has(check_rule_numbers(spec), "rule R1 is defined more than once")


def test_a_spec_without_summary_fails(spec: Path) -> None:
    (spec / "SUMMARY.md").unlink()
    assert has(check_rule_numbers(spec), "SUMMARY.md", "cannot be read")


def test_an_invariant_summary_does_not_list_fails(spec: Path) -> None:
    append(spec / "invariants.md", "\n### I12 `new_invariant`\n\nA new one.")
    assert has(check_rule_numbers(spec), "SUMMARY.md: I12 of invariants.md is not listed")


def test_an_agreement_point_summary_does_not_list_fails(spec: Path) -> None:
    append(spec / "tp.toml", '\n[[point]]\nid = "C10"\nname = "later"')
    assert has(check_rule_numbers(spec), "SUMMARY.md: C10 of tp.toml is not listed")


def test_summary_listing_an_invariant_nobody_defines_fails(spec: Path) -> None:
    summary = spec / "SUMMARY.md"
    text = summary.read_text(encoding="utf-8")
    summary.write_text(text.replace("| S7 | every lock count", "| S8 | every lock count"))
    problems = check_rule_numbers(spec)
    assert has(problems, "SUMMARY.md: lists S8, which neither invariants.md nor tp.toml")
    assert has(problems, "SUMMARY.md: S7 of invariants.md is not listed")


def test_code_that_cites_an_undefined_rule_fails(tmp_path: Path) -> None:
    code = tmp_path / "pkg"
    (code / "sub").mkdir(parents=True)
    (code / "sub" / "mod.py").write_text("x = 1\n# R2: the only way a page moves\n# R999\n")
    problems = check_code(code, ["R1", "R2"])
    assert has(problems, "pkg/sub/mod.py line 3", "cites R999")
    assert has(problems, "rule R1 is cited by no code")
    assert not has(problems, "rule R2 is cited by no code")


def test_the_spec_symlink_is_not_code(tmp_path: Path) -> None:
    """hicache/spec is the spec itself: a rule named there is not cited by code."""
    code = tmp_path / "pkg"
    (code / "spec").mkdir(parents=True)
    (code / "spec" / "__init__.py").write_text("# R1\n")
    assert has(check_code(code, ["R1"]), "rule R1 is cited by no code")
