"""Rule numbers: every MUST of the spec is a numbered rule of SUMMARY.md, and code cites each.

SUMMARY.md defines the rules: `R<n>` as a list item that starts `- **R<n>**`, and the
invariants (`I<n>`, `S<n>`) and agreement points (`C<n>`, `C<n>a`) as the ids in the first
cell of its tables' rows (two ids a row are allowed). Those ids are rule ids too.

    tagged     every line of a page under spec/ that uses MUST (outside `code spans` and
               fenced blocks) carries a tag: a parenthesised list of rule ids, `(R<n>)` or
               `(R<n>, S6)`. A page whose opening says it is informative is exempt.
    defined    every tag on a page, and every `R<n>` the code names, is defined in SUMMARY.md
    cited      every rule of SUMMARY.md is named by some code under hicache/ (outside the spec
               itself): the place that enforces it, in a comment or in its error's text
    complete   SUMMARY.md lists every invariant of invariants.md (its `### I<n>` and `### S<n>`
               headings) and every agreement point of tp.toml, and no other

An edited copy of the spec is checked as it stands; the code checked is the installed
package's (or `code_dir`, for tests).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import hicache

RULE_ID = r"(?:R\d+|[IS]\d+|C\d+[a-c]?)"
DEFINED_RULE = re.compile(r"^- \*\*(R\d+)\*\*", re.M)
TABLE_ID = re.compile(rf"^\|\s*({RULE_ID})\s*\|(?:[^|\n]*\|\s*({RULE_ID})\s*\|[^|\n]*\|)?", re.M)
TAG = re.compile(rf"\(({RULE_ID}(?:,\s*{RULE_ID})*)\)")
MUST = re.compile(r"\bMUST\b")
CODE_SPAN = re.compile(r"`[^`\n]*`")
CODE_RULE = re.compile(r"\bR\d+\b")
INFORMATIVE = re.compile(r"^\**Informative\b", re.M)
OPENING_LINES = 12  # an informative page says so before its first section
INVARIANT_HEADING = re.compile(r"^### ([IS]\d+) ", re.M)
POINT_ID = re.compile(r'^id = "(C\d+[a-c]?)"', re.M)


def defined_rules(summary: str) -> tuple[list[str], list[str]]:
    """The rule ids SUMMARY.md defines, in order, and one problem per id defined twice."""
    ids = DEFINED_RULE.findall(summary)
    for first, second in TABLE_ID.findall(summary):
        ids += [first] + ([second] if second else [])
    twice = sorted(i for i, n in Counter(ids).items() if n > 1)
    return ids, [f"SUMMARY.md: rule {i} is defined more than once" for i in twice]


def informative(text: str) -> bool:
    """Whether a page marks itself informative in its opening lines (then no MUST needs a tag)."""
    return INFORMATIVE.search("\n".join(text.splitlines()[:OPENING_LINES])) is not None


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line without code spans) for every line outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield number, CODE_SPAN.sub("", line)


def check_pages(pages: dict[str, str], defined: set[str]) -> list[str]:
    """A MUST line without a tag, and a tag naming an undefined rule, one problem each."""
    problems: list[str] = []
    for name, text in sorted(pages.items()):
        exempt = informative(text)
        for number, line in prose_lines(text):
            tags = [i.strip() for group in TAG.findall(line) for i in group.split(",")]
            if MUST.search(line) and not tags and not exempt:
                problems.append(
                    f"{name} line {number}: MUST without a rule id: tag it with the rule of "
                    "SUMMARY.md it states, as (R12), or add the rule there"
                )
            problems += [
                f"{name} line {number}: cites {i}, which SUMMARY.md does not define"
                for i in tags
                if i not in defined
            ]
    return problems


def code_files(code_dir: Path) -> Iterator[Path]:
    """The package's Python files, the spec directory (a symlink to spec/) and this module
    excepted: a rule named only by its own checker is cited by nothing."""
    this = Path(__file__).resolve()
    for path in sorted(code_dir.rglob("*.py")):
        relative = path.relative_to(code_dir).parts
        if relative[0] != "spec" and path.resolve() != this:
            yield path


def check_code(code_dir: Path, rules: list[str]) -> list[str]:
    """An `R<n>` the code names that is not defined, and a rule no code names."""
    problems: list[str] = []
    cited: set[str] = set()
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, rules)) + r")\b") if rules else None
    for path in code_files(code_dir):
        text = path.read_text(encoding="utf-8")
        where = f"{code_dir.name}/{path.relative_to(code_dir)}"
        for number, line in enumerate(text.splitlines(), 1):
            problems += [
                f"{where} line {number}: cites {i}, which SUMMARY.md does not define"
                for i in CODE_RULE.findall(line)
                if i not in rules
            ]
        if pattern is not None:
            cited.update(pattern.findall(text))
    problems += [
        f"SUMMARY.md: rule {i} is cited by no code under {code_dir.name}/: cite it where "
        f"the reference enforces it (# {i}: ...), or make the rule informative"
        for i in rules
        if i not in cited
    ]
    return problems


def check_complete(rules: list[str], invariants_md: str, tp_toml: str) -> list[str]:
    """SUMMARY.md's invariant and agreement-point ids against the pages that define them."""
    listed = {i for i in rules if not i.startswith("R")}
    wanted = {
        "invariants.md": set(INVARIANT_HEADING.findall(invariants_md)),
        "tp.toml": set(POINT_ID.findall(tp_toml)),
    }
    problems = []
    for source, ids in wanted.items():
        problems += [f"SUMMARY.md: {i} of {source} is not listed" for i in sorted(ids - listed)]
    known: set[str] = set().union(*wanted.values())
    problems += [
        f"SUMMARY.md: lists {i}, which neither invariants.md nor tp.toml defines"
        for i in sorted(listed - known)
    ]
    return problems


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return ""  # a missing table is reported by the check that reads it


def check_rule_numbers(spec_dir: Path, code_dir: Path | None = None) -> list[str]:
    """Every MUST numbered, every number defined, every rule cited by code; empty: all hold."""
    summary_path = spec_dir / "SUMMARY.md"
    try:
        summary = summary_path.read_text(encoding="utf-8")
    except OSError as e:
        return [f"SUMMARY.md: cannot be read ({e.strerror or e}): it defines the rule ids"]
    rules, problems = defined_rules(summary)
    pages = {
        str(p.relative_to(spec_dir)): p.read_text(encoding="utf-8")
        for p in sorted(spec_dir.rglob("*.md"))
    }
    problems += check_pages(pages, set(rules))
    problems += check_complete(rules, pages.get("invariants.md", ""), _text(spec_dir / "tp.toml"))
    if code_dir is None:
        code_dir = Path(hicache.__file__).resolve().parent
    return problems + check_code(code_dir, rules)
