"""`hicache check-trace` and a trace header's `stacked_tiers` (spec/tree.md, "Stacked ops";
R81): a child's op issued under its parent's pending op of the same direction is legal in a
declared tier and only there; it must end after its parent's, and the parent's op may not
fail under it."""

from __future__ import annotations

import dataclasses

import pytest

from hicache.core.lifecycle import load_lifecycle
from hicache.errors import SpecError
from hicache.oracle.checktrace import MALFORMED, VALID, VIOLATION, check_lines
from hicache.testing.adapters.vllm_trace import VLLMTrace

TOKENS = tuple(range(9))  # two whole pages of 4 tokens and a tail
P1, P2 = TOKENS[:4], TOKENS[:8]
ENDS = {
    "in order": [("d2h_complete", 1, P1), ("d2h_complete", 2, P2)],
    "child first": [("d2h_complete", 2, P2), ("d2h_complete", 1, P1)],
    "parent fails first": [("d2h_fail", 1, P1), ("d2h_fail", 2, P2)],
    "child fails first": [("d2h_fail", 2, P2), ("d2h_fail", 1, P1)],
    "parent cancelled first": [("d2h_cancel", 1, P1), ("d2h_cancel", 2, P2)],
}


def _trace(stacked: tuple[str, ...], ends: str) -> list[str]:
    """Request 1 computes P1 and P2; P1's backup (op 1) is issued, then P2's (op 2) while
    op 1 is in flight -- SGLang's order -- and the two end as `ends` says."""
    t = VLLMTrace(4, {"L1": 4, "L2": 4}, "test")
    t.header = dataclasses.replace(t.header, stacked_tiers=stacked)
    t.begin(1, TOKENS, 0, 0)
    t.computed(1, P1, "")
    t.computed(1, P2, "")
    t.tail(1, 8, 12)
    t.transfer("d2h_issue", "L2", 1, [P1], 1)
    t.transfer("d2h_issue", "L2", 2, [P2], 1)
    for event, op, page in ENDS[ends]:
        t.transfer(event, "L2", op, [page], 1)
    t.end(1, (8, 12))
    return t.lines()


def test_without_the_knob_a_stacked_issue_is_a_backup_gap() -> None:
    verdict = check_lines(_trace((), "in order"))
    assert verdict.exit_code == VIOLATION, verdict.message
    assert verdict.seq is not None and "'parent(L2) == RESIDENT' fails" in verdict.message


@pytest.mark.parametrize("ends", ["in order", "child fails first"])
@pytest.mark.parametrize("full", [False, True])
def test_a_stacked_l2_issues_under_a_pending_parent(ends: str, full: bool) -> None:
    """Valid with `stacked_tiers: ["L2"]`, by the all-clear and the full checks (S6 lets the
    pending child sit under its parent's pending op). Failed before: no such header key."""
    verdict = check_lines(_trace(("L2",), ends), full_checks=full)
    assert verdict.exit_code == VALID, verdict.message


@pytest.mark.parametrize(
    ("ends", "why"),
    [
        ("child first", "'parent(L2) == RESIDENT' fails"),
        ("parent fails first", "'children(L2) settled' fails"),
        ("parent cancelled first", "'children(L2) settled' fails"),
    ],
)
def test_a_stacked_op_ends_after_its_parent_and_the_parent_does_not_fail_under_it(
    ends: str, why: str
) -> None:
    """A child completing first would publish a page under a gap; a parent failing or
    cancelled under a child's op in flight would leave the child landing under one."""
    verdict = check_lines(_trace(("L2",), ends))
    assert verdict.exit_code == VIOLATION, verdict.message
    assert why in verdict.message


def test_only_l1_and_l2_may_be_stacked() -> None:
    lines = _trace(("L2",), "in order")
    lines[0] = lines[0].replace('"stacked_tiers":["L2"]', '"stacked_tiers":["L3"]')
    caps = lines[0].replace('"capacities":{"L1":4,"L2":4}', '"capacities":{"L1":4,"L2":4,"L3":4}')
    verdict = check_lines([caps, *lines[1:]])
    assert verdict.exit_code == MALFORMED, verdict.message
    assert "stacked_tiers" in verdict.message
    with pytest.raises(SpecError, match="only"):
        load_lifecycle().stacked(["L3"])


def test_the_stacked_tables_change_only_the_declared_tiers_rows() -> None:
    base = load_lifecycle()
    stacked = base.stacked(["L2"])
    changed = {n for n, t in stacked.transitions.items() if t != base.transitions[n]}
    assert changed == {n for n, t in base.transitions.items() if t.tier == "L2"} & {
        n for n, t in base.transitions.items() if t.kind in ("issue", "complete", "fail", "cancel")
    }
    assert base.stacked([]) is base and base.stacked(["L2"]) is stacked
