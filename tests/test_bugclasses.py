"""spec/bugclasses.md: every bug class the repository cites is defined there, every test the
page names exists, and the one class no other test showed (B06) is shown here."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from hicache.core.records import UnknownOp
from hicache.core.tiers import Direction
from hicache.errors import IllegalTransition
from tests.test_control import fingerprint, plane, served

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "spec" / "bugclasses.md"
BUG_ID = re.compile(r"\bB(\d\d)\b")
TEST_REF = re.compile(r"`tests/(test_\w+\.py)::(test_\w+)`")
CITING = ("spec", "hicache", "invariants", "tests")


def test_every_bug_class_has_a_section_and_a_summary_row() -> None:
    text = PAGE.read_text(encoding="utf-8")
    for n in range(1, 17):
        assert re.search(rf"^### B{n:02d} \w", text, re.M), f"no section for B{n:02d}"
        assert re.search(rf"^\| B{n:02d} \|", text, re.M), f"no summary row for B{n:02d}"


def test_every_cited_bug_class_is_defined() -> None:
    cited: dict[str, set[str]] = {}
    for top in CITING:
        for path in (ROOT / top).rglob("*"):
            if path.suffix not in (".py", ".md", ".toml") or not path.is_file():
                continue
            for match in BUG_ID.finditer(path.read_text(encoding="utf-8", errors="replace")):
                cited.setdefault(match.group(0), set()).add(str(path.relative_to(ROOT)))
    undefined = {bug: where for bug, where in cited.items() if not 1 <= int(bug[1:]) <= 16}
    assert not undefined, f"bug classes cited but not defined in spec/bugclasses.md: {undefined}"
    assert "B01" in cited and "B16" in cited  # the scan read the repository


def test_every_test_the_page_names_exists() -> None:
    refs = TEST_REF.findall(PAGE.read_text(encoding="utf-8"))
    assert len(refs) > 20  # the pattern still matches how the page names tests
    missing = [
        f"tests/{module}::{name}"
        for module, name in refs
        if not re.search(rf"^def {name}\(", (ROOT / "tests" / module).read_text(), re.M)
    ]
    assert not missing, f"spec/bugclasses.md names tests that do not exist: {missing}"


def test_an_op_split_in_flight_releases_each_page_once() -> None:
    """B06: a D2H over one node, split while in flight, fails: the op's one page list goes
    back to the free list once, page by page; a second end and a second release are refused
    with nothing changed."""
    cp, _ = plane((16, 16, 16))
    served(cp, 1, [1, 2, 3, 4, 5, 6])
    (node,) = list(cp.tree.nodes())
    op = cp.issue(Direction.D2H, [node])
    target = op.target_pages.copy()
    served(cp, 2, [1, 2, 3, 4, 9, 9])  # splits the pending node after 4 tokens
    assert len(op.nodes) == 2 and [n.num_pages for n in op.nodes] == [2, 1]
    assert cp.tables[1].free_count == 16 - 3
    cp.fail(op.op_id)
    assert cp.tables[1].free_count == 16
    assert all(n.state[1] == "ABSENT" and n.pending[1] is None for n in op.nodes)
    before = fingerprint(cp)
    with pytest.raises(UnknownOp):
        cp.fail(op.op_id)
    with pytest.raises(IllegalTransition):
        cp.tables[1].release(target)
    assert fingerprint(cp) == before
    assert np.array_equal(np.sort(cp.tables[1].free_pages()), np.arange(16))
