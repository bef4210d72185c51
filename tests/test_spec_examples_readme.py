"""spec/examples/README.md's account of the bug classes without an example, against the code:
every class of spec/bugclasses.md has an example or a reason, and the reasons say what a
trace can name now (a pool group through the header's `pools`; one rank's events)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from hicache.core.trace import TraceHeader
from hicache.spec import load_toml

SPEC = Path(__file__).resolve().parents[1] / "spec"
EXAMPLES = SPEC / "examples"


def _without_example() -> str:
    """The README's paragraph on the classes that have no example, whitespace collapsed."""
    text = " ".join((EXAMPLES / "README.md").read_text(encoding="utf-8").split())
    found = re.search(r"The other classes have no example (.*?)## ", text)
    assert found, "README.md has no paragraph on the classes without an example"
    return found.group(1)


def test_every_bug_class_has_an_example_or_a_reason() -> None:
    classes = set(re.findall(r"^### (B\d\d) ", (SPEC / "bugclasses.md").read_text(), re.M))
    shown = {e.get("bug_class") for e in load_toml(EXAMPLES / "manifest.toml").values()} - {None}
    explained = set(re.findall(r"\bB\d\d\b", _without_example()))
    assert classes and classes == shown | explained, sorted(classes - shown - explained)


def test_the_reasons_say_what_a_trace_can_name() -> None:
    """Before, the README said a trace does not name a group's pools and the reference does
    not model ranks; a trace's header has named its group (`pools`) since, and the ranks'
    rules are the cross-rank invariants'."""
    said = _without_example()
    assert "pools" in {f.name for f in dataclasses.fields(TraceHeader)}
    assert "the header's `pools`" in said and "which a trace does not name" not in said
    assert "does not model" not in said and "I11" in said
