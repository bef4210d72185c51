"""`hicache check-trace`: valid traces pass, renumbered ids and pages map, violations and
malformed input give exit 1 / 2 with the first bad event."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hicache.core.control import ControlPlane
from hicache.core.lifecycle import load_lifecycle
from hicache.core.pages import FREE
from hicache.core.tiers import Direction
from hicache.core.trace import NdjsonSink, Tracer
from hicache.oracle.checktrace import MALFORMED, VALID, VIOLATION, check_lines
from hicache.oracle.checktrace.generate import controller_trace
from hicache.oracle.checktrace.reader import TraceReader
from hicache.oracle.checktrace.replay import Replay
from hicache.testing.adapters.controller import Setup

ROOT = Path(__file__).resolve().parents[1]
NON_LIFECYCLE = {
    "begin_request",
    "end_request",
    "cached_len",
    "split",
    "lock",
    "unlock",
    "node_remove",
}


def plane_trace(
    script: Callable[[ControlPlane], None],
    capacities: tuple[int, int, int] = (8, 8, 8),
    page_size: int = 2,
) -> list[str]:
    """The NDJSON lines (header first) the reference emits while `script` drives it."""
    out = io.StringIO()
    cp = ControlPlane(page_size, capacities)
    cp.tracer = Tracer(NdjsonSink(out, cp.trace_header()))
    cp.executor.tracer = cp.tracer
    script(cp)
    return out.getvalue().splitlines()


def write_through(cp: ControlPlane) -> None:
    """Request 1 computes and inserts 4 tokens, backed up to L2 then L3; request 2 shares
    the first page (a split); L1 and L2 are evicted; a promotion from L3 fails."""
    cp.begin_request(1, [1, 2, 3, 4, 5])
    cp.compute(1, 4)
    cp.insert(1)
    node = cp.prefix_node(1)
    cp.complete(cp.issue(Direction.D2H, [node]).op_id)
    cp.complete(cp.issue(Direction.H2S, [node]).op_id)
    cp.end_request(1)
    cp.begin_request(2, [1, 2, 9, 9])
    cp.end_request(2)
    cp.evict("L1", 8)
    cp.evict("L2", 8)
    chain = list(reversed(cp.tree.path_to_root(node)))
    cp.fail(cp.issue(Direction.S2H, chain).op_id)


def load_back(cp: ControlPlane) -> None:
    """Request 1 inserts 4 tokens, backed up to L2; L1 is evicted; request 2 loads them back
    (h2d) and serves them (cached_len with the node)."""
    cp.begin_request(1, [1, 2, 3, 4, 5])
    cp.compute(1, 4)
    cp.insert(1)
    node = cp.prefix_node(1)
    cp.complete(cp.issue(Direction.D2H, [node]).op_id)
    cp.end_request(1)
    cp.evict("L1", 8)
    cp.begin_request(2, [1, 2, 3, 4, 9])
    cp.complete(cp.issue(Direction.H2D, [node], 2).op_id)
    cp.advance_cached_len(2, node)
    cp.end_request(2)


def two_requests(cp: ControlPlane) -> None:
    """Request 1 inserts [1 2 3 4]; request 2, another prompt, computes 4 tokens."""
    cp.begin_request(1, [1, 2, 3, 4, 5])
    cp.compute(1, 4)
    cp.insert(1)
    cp.begin_request(2, [7, 8, 9, 9, 9])
    cp.compute(2, 4)
    cp.insert(2)


def events(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(x) for x in lines[1:]]


def lines_of(header: str, evs: list[dict[str, Any]]) -> list[str]:
    return [header, *(json.dumps(e, sort_keys=True, separators=(",", ":")) for e in evs)]


def renumber(lines: list[str], node: int = 100, op: int = 50, page: int = 1000) -> list[str]:
    """The same trace in another engine's numbering: node, op and page ids shifted (pages
    per tier: tier L2's page p becomes page + 2p + 1, ...), detail.upper too."""
    out = []
    for e in events(lines):
        if "node" in e:
            e["node"] += node
        if "op" in e:
            e["op"] += op
        if "pages" in e:
            e["pages"] = [page + 3 * p + int(e["tier"][1]) for p in e["pages"]]
        if e["event"] == "split":
            e["detail"]["upper"] += node
        out.append(e)
    return lines_of(lines[0], out)


def edit(lines: list[str], seq: int, **changes: Any) -> list[str]:
    evs = events(lines)
    evs[seq - 1].update(changes)
    return lines_of(lines[0], evs)


def insert_before(lines: list[str], seq: int, event: dict[str, Any]) -> list[str]:
    """`event` inserted as event `seq`, the later events renumbered."""
    evs = events(lines)
    evs = (
        evs[: seq - 1]
        + [{**event, "seq": seq}]
        + [{**e, "seq": e["seq"] + 1} for e in evs[seq - 1 :]]
    )
    return lines_of(lines[0], evs)


def first(lines: list[str], name: str) -> int:
    return int(next(e["seq"] for e in events(lines) if e["event"] == name))


# -- valid traces -------------------------------------------------------------------------------


def test_the_reference_example_is_valid() -> None:
    lines = plane_trace(write_through)
    v = check_lines(lines)
    assert (v.exit_code, v.events, v.seq) == (VALID, len(lines) - 1, None)
    assert (
        v.message
        == f"OK: {len(lines) - 1} events, 2 requests, 3 ops, checked after every call; full trace"
    )


def test_renumbered_ids_and_pages_are_mapped() -> None:
    lines = renumber(plane_trace(write_through))
    assert check_lines(lines).exit_code == VALID
    long = controller_trace(2, 300, faults=True)
    v = check_lines(renumber(long, node=7_000_000, op=3, page=11))
    assert (v.exit_code, v.events) == (VALID, len(long) - 1), v.message


@pytest.mark.parametrize("seed", [1, 2])
def test_controller_traces_are_valid(seed: int) -> None:
    lines = controller_trace(seed, 400)
    v = check_lines(lines)
    assert v.exit_code == VALID, v.message
    assert v.events == len(lines) - 1 > 300


def test_controller_traces_with_faults_are_valid() -> None:
    """Failed and cancelled transfers, refused reservations, write-back: all pass."""
    seen: set[str] = set()
    for seed in (1, 2, 3):
        setup = Setup(
            l1_pages=9, l2_pages=5, l3_slots=4, write_policy="write_back", check_mode="off"
        )
        for lines in (
            controller_trace(seed, 300, faults=True),
            controller_trace(seed, 300, setup, faults=True),
        ):
            v = check_lines(lines)
            assert v.exit_code == VALID, v.message
            seen.update(e["event"] for e in events(lines))
    rows = set(load_lifecycle().transitions)
    assert (
        {"d2h_fail", "h2s_fail", "h2d_cancel", "h2s_cancel", "evict_l3"}
        <= seen
        <= rows | NON_LIFECYCLE
    )


def test_the_maps_hold_only_what_is_live() -> None:
    """Ids and pages are unbound when the reference retires them, so a replay's memory is
    bounded by the live state, whatever the trace's length (streaming)."""
    lc = load_lifecycle()
    replay = Replay(TraceReader(controller_trace(3, 400), lc), lc, 1)
    replay.run()
    cp, c = replay.cp, replay.compare
    assert set(c.nodes.to_engine) <= {n.node_id for n in cp.tree.nodes()}
    assert set(c.ops.to_engine) == set(cp.ops)
    for t, table in zip(("L1", "L2", "L3"), cp.tables):
        assert all(table.owner[r] != FREE for r in c.pages[t].to_engine)


def test_a_trace_cut_at_any_line_is_valid() -> None:
    """A trace may stop anywhere (spec/trace.md). A cut inside end_request's discards (before
    its end_request) used to be read as insert(r), which emits nothing there: a violation at
    every such cut (20 of 264 cuts of the examples; 26 of 726 of four controller traces)."""
    examples = [
        p.read_text().splitlines() for p in sorted((ROOT / "spec" / "examples").glob("*.ndjson"))
    ]
    traces = [t for t in examples if check_lines(t).exit_code == VALID] + [controller_trace(0, 150)]
    assert len(traces) > 10
    cut_in_discards = 0
    for lines in traces:
        for k in range(2, len(lines)):
            v = check_lines(lines[:k])
            assert (v.exit_code, v.events) == (VALID, k - 1), f"cut after line {k}: {v.message}"
            cut_in_discards += (
                json.loads(lines[k - 1])["event"] == "discard"
                and json.loads(lines[k])["event"] == "end_request"
            )
    assert cut_in_discards > 10


def test_a_cut_discard_neither_call_emits_is_a_violation() -> None:
    """Where the trace stops inside discards, the discards are still checked: against
    end_request(r) when insert(r) would not emit them."""

    def abort(cp: ControlPlane) -> None:
        cp.begin_request(1, [1, 2, 3, 4, 5])
        cp.compute(1, 6)
        cp.end_request(1)  # an abort: every computed page discarded, none inserted

    lines = plane_trace(abort)
    last = events(lines)[-2]
    assert last["event"] == "discard" and events(lines)[-1]["event"] == "end_request"
    cut = lines[:-1]
    assert check_lines(cut).exit_code == VALID  # insert(1) would emit insert, not discard
    v = check_lines(edit(cut, last["seq"], token_start=2))
    assert (v.exit_code, v.seq) == (VIOLATION, last["seq"])
    assert "end_request(trace request 1)" in v.message and "token_start" in v.message


# -- violations ---------------------------------------------------------------------------------


def test_a_wrong_after_state_is_a_violation_at_its_event() -> None:
    lines = plane_trace(write_through)
    seq = next(e["seq"] for e in events(lines) if e["event"] == "d2h_complete")
    v = check_lines(edit(lines, seq, after="L1"))
    assert (v.exit_code, v.seq) == (VIOLATION, seq)
    assert v.message.startswith(f"event {seq}: ")
    assert "after: the trace has L1, the reference L1_L2" in v.message


def test_a_complete_for_an_op_never_issued_is_a_violation() -> None:
    lines = plane_trace(write_through)
    extra = {
        "event": "d2h_complete",
        "op": 77,
        "node": 1,
        "tier": "L2",
        "before": "L1_D2H_PENDING",
        "after": "L1_L2",
        "pages": [0],
        "token_start": 0,
        "token_end": 2,
    }
    v = check_lines(insert_before(lines, 6, extra))
    assert (v.exit_code, v.seq) == (VIOLATION, 6)
    assert "op 77 is not pending" in v.message


def test_a_page_reserved_while_still_owned_is_a_double_ownership() -> None:
    """Request 2's compute names L1 page 0, which node 1 still holds (TREE): I1."""
    lines = plane_trace(two_requests)
    seq = [e["seq"] for e in events(lines) if e["event"] == "compute"][1]
    v = check_lines(edit(lines, seq, pages=[0, 2]))
    assert (v.exit_code, v.seq) == (VIOLATION, seq)
    assert "I1 ownership_disjoint" in v.message
    assert "trace L1 page 0: reserved while still TREE (held by trace node 1)" in v.message


def test_an_eviction_of_a_locked_node_is_not_enabled() -> None:
    """Node 1 is locked by request 1 (its prefix): evict_l1's guard refuses it; the report
    lists what was enabled and the node's state before."""
    lines = plane_trace(write_through)
    seq = first(lines, "d2h_issue")
    evict = {
        "event": "evict_l1",
        "node": 1,
        "tier": "L1",
        "before": "L1",
        "after": "ABSENT",
        "pages": [0, 1],
        "token_start": 0,
        "token_end": 4,
    }
    v = check_lines(insert_before(lines, seq, evict))
    assert (v.exit_code, v.seq) == (VIOLATION, seq)
    assert "guard 'locks(L1) == 0' fails" in v.message
    assert "enabled before it:\n    trace node 1: d2h_issue" in v.message
    state = "state before it:\n    trace node 1: L1; locks L1=1 L2=0 L3=0; pending: none"
    assert state in v.message


def test_a_cached_len_before_publication_is_not_enabled() -> None:
    """Request 2 serves node 1 while its load-back (h2d) is still pending: I5's order."""
    lines = plane_trace(load_back)
    seq = first(lines, "h2d_complete")
    early = {"event": "cached_len", "node": 1, "request": 2, "token_end": 4}
    v = check_lines(insert_before(lines, seq, early))
    assert (v.exit_code, v.seq) == (VIOLATION, seq)
    assert "not RESIDENT in L1 yet" in v.message


def test_a_hit_the_reference_disagrees_with_is_a_violation() -> None:
    lines = plane_trace(load_back)
    seq = [e["seq"] for e in events(lines) if e["event"] == "begin_request"][1]
    v = check_lines(
        edit(lines, seq, detail={"hit": [4, 4, 0], "prompt": [1, 2, 3, 4, 9], "tokens": 5})
    )
    assert (v.exit_code, v.seq) == (VIOLATION, seq)
    assert "detail.hit: the trace has [4,4,0], the reference [0,4,0]" in v.message


def test_an_event_the_reference_does_not_emit_is_a_divergence() -> None:
    """The trace says the backup completed into a different state: after the same call the
    reference's next event differs, and the report names what it emitted there."""
    lines = plane_trace(load_back)
    seq = first(lines, "h2d_issue")
    v = check_lines(edit(lines, seq, token_end=2))
    assert (v.exit_code, v.seq) == (VIOLATION, seq)
    assert "token_end: the trace has 2, the reference 4" in v.message
    assert "the reference emitted here" in v.message


# -- malformed ----------------------------------------------------------------------------------


def test_a_gap_in_seq_is_malformed_naming_the_line() -> None:
    lines = plane_trace(write_through)
    v = check_lines(lines[:3] + lines[4:])
    assert (v.exit_code, v.seq) == (MALFORMED, 4)
    assert v.message.startswith("malformed: line 4: seq 4 where 3 is due")


def test_the_cli_streams_stdin() -> None:
    lines = plane_trace(write_through)
    done = subprocess.run(
        [sys.executable, "-m", "hicache", "check-trace", "-"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == VALID, done.stderr
    assert done.stdout.startswith("OK: ")
