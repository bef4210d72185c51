"""How an op ends (spec/lifecycle.md, rule `partial_end_s2h_only`; spec/trace.md, rule 4): one
way on every node it covers, or, for an S2H only, the partial end -- `s2h_complete` on its
first nodes, then `s2h_fail` on the rest. The reference refuses a partial end of any other
direction, and `hicache check-trace` judges a complete-then-fail trace of one a violation
naming the rule."""

from __future__ import annotations

import json

import pytest

from hicache.core.control import ControlPlane
from hicache.core.tiers import Direction
from hicache.core.tree import TreeNode
from hicache.errors import IllegalTransition
from hicache.oracle.checktrace import VALID, VIOLATION, check_lines
from tests.test_checktrace import plane_trace

ENDED = {
    Direction.D2H: (),
    Direction.H2S: (Direction.D2H,),
    Direction.H2D: (Direction.D2H,),
    Direction.S2H: (Direction.D2H, Direction.H2S),
}
"""Direction -> the backups that must complete before an op of it over the chain can go."""


def _chain(cp: ControlPlane, direction: Direction) -> list[TreeNode]:
    """A two-node chain ready for an op of `direction`: request 1's [1 2 3 4], split at 2 by
    request 2's match, backed up as far as the direction needs, the tiers above its source
    evicted."""
    cp.begin_request(1, [1, 2, 3, 4, 5])
    cp.compute(1, 6)
    cp.insert(1)
    cp.end_request(1)
    cp.begin_request(2, [1, 2, 9, 9])  # matches [1 2]: node 1 is split at 2
    cp.end_request(2)
    chain = list(cp.tree.match([1, 2, 3, 4]).path)
    assert len(chain) == 2
    for backup in ENDED[direction]:
        cp.complete(cp.issue(backup, chain).op_id)
    if direction in (Direction.H2D, Direction.S2H):
        cp.evict("L1", 8)
    if direction is Direction.S2H:
        cp.evict("L2", 8)
    return chain


def _ended(direction: Direction, end: str) -> list[str]:
    """The reference's trace of an op of `direction` over the chain, ended by `end`
    (`complete`, `fail`, or `part`: the partial end keeping the first node)."""

    def script(cp: ControlPlane) -> None:
        chain = _chain(cp, direction)
        op = cp.issue(direction, chain)
        if end == "part":
            cp.complete_part(op.op_id, 1)
        else:
            getattr(cp, end)(op.op_id)

    return plane_trace(script)


def _spliced(direction: Direction) -> tuple[list[str], int]:
    """A complete-then-fail end of the op, as an engine would trace one: the completed trace
    up to its first `<dir>_complete`, then the failed trace's `<dir>_fail` of the second node
    (the same seq: both traces agree up to the op's end). Returns the lines and the seq of
    the first end event."""
    d = direction.value.lower()
    done, failed = _ended(direction, "complete"), _ended(direction, "fail")
    first = next(i for i, line in enumerate(done) if f'"{d}_complete"' in line)
    assert done[:first] == failed[:first]  # Verify: the two runs agree before the op's end.
    second = failed[first + 1]
    assert json.loads(second)["event"] == f"{d}_fail"
    return [*done[: first + 1], second], int(json.loads(done[first])["seq"])


@pytest.mark.parametrize("direction", [Direction.D2H, Direction.H2S, Direction.H2D])
def test_a_complete_then_fail_end_of_a_copy_or_write_is_a_violation_naming_the_rule(
    direction: Direction,
) -> None:
    """Before the rule, check-trace replayed these as `complete_part` and judged them valid."""
    lines, seq = _spliced(direction)
    verdict = check_lines(lines)
    assert verdict.exit_code == VIOLATION, verdict.message
    assert verdict.seq == seq
    assert "partial_end_s2h_only" in verdict.message, verdict.message


def test_an_s2h_partial_end_is_valid_and_is_what_the_reference_emits() -> None:
    """The same splice of an S2H is the reference's own partial end, event for event."""
    lines, _ = _spliced(Direction.S2H)
    part = _ended(Direction.S2H, "part")
    assert part[: len(lines)] == lines
    verdict = check_lines(part)
    assert verdict.exit_code == VALID, verdict.message


@pytest.mark.parametrize("direction", [Direction.D2H, Direction.H2S, Direction.H2D])
def test_the_reference_refuses_a_partial_end_of_another_direction(direction: Direction) -> None:
    """Refused with nothing changed: the op still pending on both nodes, no lock moved."""
    cp = ControlPlane(2, (8, 8, 8))
    chain = _chain(cp, direction)
    op = cp.issue(direction, chain)
    before = _records(cp)
    with pytest.raises(IllegalTransition, match="partial_end_s2h_only"):
        cp.complete_part(op.op_id, 1)
    assert _records(cp) == before
    assert op.op_id in cp.ops


def _records(cp: ControlPlane) -> object:
    """What a refused end could have changed: per node its states, locks and pending ops;
    the free pages per tier; the pending ops' nodes."""
    nodes = [(n.node_id, tuple(n.state), tuple(n.lock), tuple(n.pending)) for n in cp.tree.nodes()]
    free = [cp.free_pages(t) for t in ("L1", "L2", "L3")]
    ops = {o: [n.node_id for n in op.nodes] for o, op in cp.ops.items()}
    return nodes, free, ops


def test_an_s2h_partial_end_moves_one_source_lock() -> None:
    """The lock movement the spec states: the op's one L3 lock goes, none is left behind,
    and S7 (checked after the step, check mode `every`) holds."""
    cp = ControlPlane(2, (8, 8, 8))
    chain = _chain(cp, Direction.S2H)
    unlocked = [n.lock[2] for n in chain]
    op = cp.issue(Direction.S2H, chain)
    assert [n.lock[2] for n in chain] == [u + 1 for u in unlocked]
    cp.complete_part(op.op_id, 1)
    assert [n.lock[2] for n in chain] == unlocked
    assert [n.state[1] for n in chain] == ["RESIDENT", "ABSENT"]
