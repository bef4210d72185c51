"""`hicache check-trace` and a trace header's `hash_keyed_tiers` (spec/tree.md, "Hash-keyed
tiers"): an orphan store and an eviction before a child are judged legal in a declared tier,
and only there; serving an orphan stays a violation."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hicache.core.lifecycle import load_lifecycle
from hicache.core.trace import TraceFormatError, TraceHeader
from hicache.errors import SpecError
from hicache.oracle.checktrace import MALFORMED, VALID, VIOLATION, check_lines
from hicache.oracle.checktrace.reader import TraceReader
from hicache.oracle.checktrace.replay import Replay
from hicache.testing.adapters.vllm_trace import VLLMTrace

TOKENS = tuple(range(9))  # two whole pages of 4 tokens and a tail
P1, P2 = TOKENS[:4], TOKENS[:8]


def _trace(keyed: tuple[str, ...], orphan_store: bool, serve: str = "") -> list[str]:
    """Request 1 computes P1, P2 and stores both in L2 -- P2 before P1 (an orphan store)
    with `orphan_store`, else parent first -- then L2 evicts P1 while P2 stays, and L1 drops
    both. `serve` "hit": request 2 claims an L2 hit of both pages; "restore": it loads P2."""
    t = VLLMTrace(4, {"L1": 4, "L2": 4}, "test")
    t.header = dataclasses.replace(t.header, hash_keyed_tiers=keyed)
    t.begin(1, TOKENS, 0, 0)
    t.computed(1, P1, "")
    t.computed(1, P2, "")
    t.tail(1, 8, 12)
    for op, page in enumerate((P2, P1) if orphan_store else (P1, P2), 1):
        t.transfer("d2h_issue", "L2", op, [page], 1)
        t.transfer("d2h_complete", "L2", op, [page], 1)
    t.end(1, (8, 12))
    t.evicted("L2", [P1])  # P2, its child, stays in L2
    t.evicted("L1", [P1, P2])
    if serve:
        t.begin(2, TOKENS, 0, 8 if serve == "hit" else 0)
    if serve == "restore":
        t.transfer("h2d_issue", "L1", 3, [P2], 2)
    return t.lines()


@pytest.mark.parametrize(
    ("orphan_store", "guard"),
    [(True, "'parent(L2) == RESIDENT' fails"), (False, "'leaf(L2)' fails")],
)
def test_without_the_knob_a_hash_keyed_step_is_a_violation(orphan_store: bool, guard: str) -> None:
    verdict = check_lines(_trace((), orphan_store))
    assert verdict.exit_code == VIOLATION, verdict.message
    assert guard in verdict.message


@pytest.mark.parametrize("orphan_store", [True, False])
@pytest.mark.parametrize("full", [False, True])
def test_a_hash_keyed_l2_may_store_an_orphan_and_evict_a_parent_first(
    orphan_store: bool, full: bool
) -> None:
    """Judged valid with `hash_keyed_tiers: ["L2"]`, by the all-clear and the full checks
    (S6 is not required of L2). Failed before: the header had no such key."""
    verdict = check_lines(_trace(("L2",), orphan_store), full_checks=full)
    assert verdict.exit_code == VALID, verdict.message


@pytest.mark.parametrize(
    ("serve", "why"),
    [("restore", "'parent(L1) == RESIDENT' fails"), ("hit", "hit")],
)
def test_serving_an_orphan_stays_a_violation(serve: str, why: str) -> None:
    """A restore reading P2 past its missing parent, or a hit claiming it: L2 holds the
    orphan, but a hit is still the leading run of pages a tier holds."""
    verdict = check_lines(_trace(("L2",), True, serve))
    assert verdict.exit_code == VIOLATION, verdict.message
    assert why in verdict.message


def test_the_knob_lifts_nothing_in_another_tier() -> None:
    """Declaring L3 hash-keyed leaves L2's guards as written."""
    header = {"L1": 4, "L2": 4, "L3": 4}
    lines = _trace((), True)
    d = json.loads(lines[0])
    d["capacities"], d["hash_keyed_tiers"] = header, ["L3"]
    verdict = check_lines([json.dumps(d), *lines[1:]])
    assert verdict.exit_code == VIOLATION, verdict.message
    assert "'parent(L2) == RESIDENT' fails" in verdict.message


def test_l1_cannot_be_declared_hash_keyed() -> None:
    lines = _trace(("L1",), False)
    verdict = check_lines(lines)
    assert verdict.exit_code == MALFORMED, verdict.message
    assert "only ['L2', 'L3'] may be hash-keyed" in verdict.message
    with pytest.raises(SpecError, match="L1"):
        load_lifecycle().hash_keyed(["L1"])


@pytest.mark.parametrize("keyed", [["L3"], ["L2", "L2"]])
def test_a_header_naming_a_tier_it_lacks_or_twice_is_refused(keyed: list[str]) -> None:
    line = json.dumps(
        {
            "format": "hicache-trace",
            "version": 1,
            "page_size": 4,
            "capacities": {"L1": 4, "L2": 4},
            "hash_keyed_tiers": keyed,
        }
    )
    with pytest.raises(TraceFormatError, match="hash_keyed_tiers"):
        TraceHeader.from_json(line)


def test_the_header_round_trips_and_is_absent_by_default() -> None:
    h = TraceHeader(4, {"L1": 4, "L2": 4}, hash_keyed_tiers=("L2",))
    assert TraceHeader.from_json(h.to_json()) == h
    assert "hash_keyed_tiers" not in TraceHeader(4, {"L1": 4}).to_json()


def test_the_lifted_guards_are_the_tables() -> None:
    """`[hash_keyed].lifts` in lifecycle.toml says which guards go; the rest stay."""
    lc = load_lifecycle()
    keyed = lc.hash_keyed(["L2"])
    assert keyed.hash_keyed_tiers == {"L2"} and lc.hash_keyed_tiers == frozenset()
    for name, row in lc.transitions.items():
        kept = [g.text for g in keyed.transitions[name].guards]
        want = [g.text for g in row.guards if g.text not in ("leaf(L2)", "parent(L2) == RESIDENT")]
        assert kept == want, name
    assert lc.hash_keyed([]) is lc and lc.hash_keyed(["L2"]) is keyed


def _load_under(evicted: tuple[int, ...]) -> list[str]:
    """P1 stays in L1 and both pages in L2; request 2 loads P2 from L2 and, while the load is
    in flight, L2 evicts `evicted` (P1: the loaded page's parent, not read; P2: the page the
    load reads)."""
    t = VLLMTrace(4, {"L1": 4, "L2": 4}, "test", ("L2",))
    t.begin(1, TOKENS, 0, 0)
    t.computed(1, P1, "")
    t.computed(1, P2, "")
    t.tail(1, 8, 12)
    t.transfer("d2h_issue", "L2", 1, [P1, P2], 1)
    t.transfer("d2h_complete", "L2", 1, [P1, P2], 1)
    t.end(1, (8, 12))
    t.evicted("L1", [P2])
    t.begin(2, TOKENS, 4, 8)
    t.transfer("h2d_issue", "L1", 2, [P2], 2)
    t.evicted("L2", [evicted])
    return t.lines()


def test_a_load_pins_the_page_it_reads_not_its_parent_in_a_hash_keyed_tier() -> None:
    """`own_locks`: the load of P2 locks P2 in L2, and its path lock on P1 does not hold P1
    there. Failed before ("guard 'locks(L2) == 0' fails" on P1, raw vLLM traces arc-11 and
    lru-11 of the results); without the knob it still does."""
    ok = check_lines(_load_under(P1))
    assert ok.exit_code == VALID, ok.message
    d = json.loads(_load_under(P1)[0])
    del d["hash_keyed_tiers"]
    plain = check_lines([json.dumps(d), *_load_under(P1)[1:]])
    assert plain.exit_code == VIOLATION and "'locks(L2) == 0' fails" in plain.message
    read = check_lines(_load_under(P2))
    assert read.exit_code == VIOLATION and "'locks(L2) == 0' fails" in read.message


def test_a_store_job_that_skips_a_page_is_traced_as_one_op_per_chain() -> None:
    """vLLM's job 2 stores P1 and P3 (L2 holds P2 already): a spec op is one parent-first
    chain, so the writer traces the job as two ops, each page's end naming its own. Failed
    before (the job was one op: "node ... is not a child of ...", raw vLLM traces arc-2,
    arc-9, arc-15, lru-3, lru-9 of the results)."""
    tokens = tuple(range(13))
    p3 = tokens[:12]
    t = VLLMTrace(4, {"L1": 4, "L2": 4}, "test", ("L2",))
    t.begin(1, tokens, 0, 0)
    for page in (P1, P2, p3):
        t.computed(1, page, "")
    t.tail(1, 12, 16)
    t.transfer("d2h_issue", "L2", 1, [P2], 1)
    t.transfer("d2h_complete", "L2", 1, [P2], 1)
    t.transfer("d2h_issue", "L2", 2, [p3, P1], 1)
    t.transfer("d2h_complete", "L2", 2, [P1, p3], 1)
    t.end(1, (12, 16))
    ops = [(e.event, e.op, e.token_end) for e in t.events if e.event.startswith("d2h")]
    assert ops[2:] == [
        ("d2h_issue", 2, 4),
        ("d2h_issue", 3, 12),
        ("d2h_complete", 2, 4),
        ("d2h_complete", 3, 12),
    ]
    verdict = check_lines(t.lines())
    assert verdict.exit_code == VALID, verdict.message


@pytest.mark.parametrize("lines", [_trace(("L2",), True), _load_under(P1)], ids=["store", "load"])
def test_the_all_clear_needs_no_full_checks_for_an_orphan(lines: list[str]) -> None:
    """The touched all-clear skips S6 in a hash-keyed tier as the full checks do: an orphan
    does not send every call after it to the full checks (only their cost would show)."""
    lc = load_lifecycle()
    replay = Replay(TraceReader(lines, lc), lc, 1)
    assert replay.run() == len(lines) - 1
    assert replay.checks.full_runs == 0
