"""`hicache check-trace` and the trace's own ids (spec/trace.md, "Partial traces"): an engine
may name a node id anew once its node is gone, whether or not its trace carries
`node_remove`; and a violation report names the trace's ids, not the reference's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hicache.core.control import ControlPlane
from hicache.core.tiers import Direction
from hicache.oracle.checktrace import VALID, VIOLATION, check_lines
from hicache.spec import load_toml
from tests.test_checktrace import events, lines_of, plane_trace, renumber
from tests.test_checktrace_ends import _spliced

EXAMPLES = Path(__file__).resolve().parents[1] / "spec" / "examples"


def _two_prompts(evict_first: bool) -> list[str]:
    """Request 1 inserts [1 2 3 4] (node 1); with `evict_first`, L1 is then evicted, which
    removes node 1; request 2 inserts [7 8 9 10] (node 2). Then both requests' nodes are
    evicted. The reference's own trace."""

    def script(cp: ControlPlane) -> None:
        cp.begin_request(1, [1, 2, 3, 4, 5])
        cp.compute(1, 6)
        cp.insert(1)
        cp.end_request(1)
        if evict_first:
            cp.evict("L1", 8)
        cp.begin_request(2, [7, 8, 9, 10, 11])
        cp.compute(2, 6)
        cp.insert(2)
        cp.end_request(2)
        cp.evict("L1", 8)

    return plane_trace(script)


def _named(lines: list[str], names: dict[int, int]) -> list[str]:
    """The trace with its node ids renamed by `names` (reference id -> the engine's)."""
    evs = events(lines)
    for e in evs:
        if "node" in e:
            e["node"] = names.get(e["node"], e["node"])
    return lines_of(lines[0], evs)


def _omitting(lines: list[str], omit: str) -> list[str]:
    """The trace as an engine that omits `omit` (`node_remove` or `locks`) would emit it."""
    header = json.loads(lines[0])
    header["omits"] = [omit]
    gone = {"node_remove": ("node_remove",), "locks": ("lock", "unlock")}[omit]
    kept = [e for e in events(lines) if e["event"] not in gone]
    for seq, e in enumerate(kept, 1):
        e["seq"] = seq
    return lines_of(json.dumps(header, sort_keys=True, separators=(",", ":")), kept)


@pytest.mark.parametrize("omit", [None, "node_remove", "locks"])
def test_a_node_id_named_anew_after_its_node_was_removed_is_accepted(omit: str | None) -> None:
    """The engine calls request 2's node 1 too (its node 1 was evicted and removed before).
    Before the fix the partial traces were violations ("trace node 1 is the reference's node
    1, but here the reference acts on its node 2"): the removal the trace leaves out was
    unbound before the eviction that removed it was compared, which bound the id again."""
    lines = _named(_two_prompts(evict_first=True), {2: 1})
    assert sum(e.get("event") == "insert" and e.get("node") == 1 for e in events(lines)) == 2
    trace = lines if omit is None else _omitting(lines, omit)
    verdict = check_lines(trace)
    assert verdict.exit_code == VALID, verdict.message


@pytest.mark.parametrize("omit", [None, "node_remove", "locks"])
def test_a_node_id_named_anew_while_its_node_lives_is_a_violation(omit: str | None) -> None:
    """Node 1 is still in L1 when the engine calls request 2's new node 1 as well."""
    lines = _named(_two_prompts(evict_first=False), {2: 1})
    trace = lines if omit is None else _omitting(lines, omit)
    verdict = check_lines(trace)
    assert verdict.exit_code == VIOLATION, verdict.message
    insert = next(e for e in events(trace) if e["event"] == "insert" and e["request"] == 2)
    assert verdict.seq == insert["seq"]
    assert "trace node 1 still names the reference's node" in verdict.message, verdict.message


MENTION = re.compile(r"([\w']*) (node|op|request)(?:s|\(s\))? (\[[0-9, ]*\]|[0-9]+\b)")
"""An id a report names, with the word before it (`trace`, or `reference's` for an id the
trace never named)."""
NODE, OP = 100, 50
"""`renumber`'s shifts: every trace node id is at least NODE, every trace op id at least OP."""


def _violations() -> list[tuple[str, list[str]]]:
    """A sample of violations in another engine's numbering (nodes +100, ops +50, pages
    moved): every violation example of spec/examples, a partial end of an H2D, a node id
    named anew while its node lives."""
    manifest = load_toml(EXAMPLES / "manifest.toml")
    sample = [
        (name, (EXAMPLES / name).read_text().splitlines())
        for name, entry in sorted(manifest.items())
        if entry["verdict"] == "violation"
    ]
    sample.append(("partial end of an H2D", _spliced(Direction.H2D)[0]))
    sample.append(("live reuse", _named(_two_prompts(evict_first=False), {2: 1})))
    return [(name, renumber(lines, NODE, OP)) for name, lines in sample]


@pytest.mark.parametrize(
    "name, lines", _violations(), ids=lambda x: x if isinstance(x, str) else ""
)
def test_a_violation_report_names_the_traces_own_ids(name: str, lines: list[str]) -> None:
    """Every node, op and request the report names is the trace's (`trace node 101`), or is
    marked as the reference's own where the trace has no name for it. Before, the reasons the
    reference gave ("nodes [1] are not RESIDENT", "request 2 still has ops [2] pending") and
    the state lines ("node 101: ...") named ids without saying whose, and the former were
    the reference's."""
    verdict = check_lines(lines)
    assert verdict.exit_code == VIOLATION, verdict.message
    report = [
        line
        for line in verdict.message.splitlines()[1:]  # the first line is the event itself
        if not line.startswith("  the reference emitted here (its own ids")
    ]
    named = [m for line in report for m in MENTION.finditer(line)]
    assert named, verdict.message
    for m in named:
        word, kind, ids = m.groups()
        assert word in ("trace", "reference's"), (m.group(0), verdict.message)
        least = {"node": NODE, "op": OP, "request": 0}[kind]
        if word == "trace":
            numbers = [int(i) for i in ids.strip("[]").split(",") if i.strip()]
            assert all(i >= least for i in numbers), (m.group(0), verdict.message)
