"""Control plane: each spec transition through the public API, rejection leaves state
unchanged, traces name the transitions, and invariants hold after every step."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from hicache.core.control import ControlPlane
from hicache.core.records import UnknownOp
from hicache.core.tiers import Direction
from hicache.core.trace import ListSink, Tracer
from hicache.errors import IllegalTransition, OutOfPages

PS = 2


def plane(caps: tuple[int, int, int] = (16, 16, 16)) -> tuple[ControlPlane, ListSink]:
    sink = ListSink()
    return ControlPlane(PS, caps, check_mode="every", tracer=Tracer(sink)), sink


def served(cp: ControlPlane, rid: int, tokens: list[int]) -> None:
    """A request that computes and inserts its whole (page-aligned) prompt, then ends."""
    m = cp.begin_request(rid, tokens)
    todo = len(tokens) - m.lengths[0]
    if todo:
        cp.compute(rid, todo)
        cp.insert(rid)
    cp.end_request(rid)


def fingerprint(cp: ControlPlane) -> object:
    """Every piece of state a rejected transition must leave untouched."""
    s = cp.snapshot()
    nodes = sorted(
        (
            n.node_id,
            n.parent_id,
            n.key_tokens,
            tuple(sorted(n.states.items())),
            tuple(sorted(n.locks.items())),
            tuple(sorted(n.pending.items())),
            tuple(
                (k, None if v is None else tuple(v.tolist())) for k, v in sorted(n.values.items())
            ),
        )
        for n in s.nodes
    )
    owners = tuple(tuple(t.owner.tolist()) for t in s.tiers.values())
    return nodes, owners, tuple(sorted(cp.ops)), tuple(sorted(cp.requests))


def test_insert_publishes_and_advances_cached_len() -> None:
    cp, sink = plane()
    m = cp.begin_request(1, [1, 2, 3, 4, 5])
    assert m.lengths == (0, 0, 0)
    cp.compute(1, 4)
    assert cp.insert(1) == 4
    events = [e.event for e in sink.events]
    assert events[:4] == ["begin_request", "cached_len", "compute", "insert"]
    assert events[-1] == "cached_len" and sink.events[-1].token_end == 4
    cp.end_request(1)
    m = cp.begin_request(2, [1, 2, 3, 4, 9, 9])
    assert m.lengths == (4, 0, 0)


def test_duplicate_insert_discards_private_pages() -> None:
    cp, sink = plane()
    cp.begin_request(1, [1, 2, 3, 4])
    cp.begin_request(2, [1, 2, 3, 4])
    cp.compute(1, 4)
    cp.compute(2, 4)
    cp.insert(1)
    cp.insert(2)
    assert "discard" in [e.event for e in sink.events]
    cp.end_request(1)
    cp.end_request(2)
    assert cp.tables[0].free_count == 16 - 2


def test_backup_chain_and_restore() -> None:
    cp, sink = plane()
    served(cp, 1, [1, 2, 3, 4])
    (node,) = list(cp.tree.nodes())
    d2h = cp.issue(Direction.D2H, [node])
    assert node.state == ["RESIDENT", "D2H_PENDING", "ABSENT"]
    with pytest.raises(IllegalTransition):  # L1 is a source in flight (I2): not evictable
        cp.evict_node(node, "L1")
    cp.complete(d2h.op_id)
    h2s = cp.issue(Direction.H2S, [node])
    cp.complete(h2s.op_id)
    assert node.state == ["RESIDENT", "RESIDENT", "RESIDENT"]
    assert cp.evict("L1", 2) == 2 and cp.evict("L2", 2) == 2
    assert node.state == ["ABSENT", "ABSENT", "RESIDENT"]
    # Restore from L3: promote into L2, then load back into L1, then serve.
    m = cp.begin_request(2, [1, 2, 3, 4, 5])  # a hit leaves the last prompt token to compute
    assert m.lengths == (0, 0, 4)
    s2h = cp.issue(Direction.S2H, [node], request_id=2)
    cp.complete(s2h.op_id)
    h2d = cp.issue(Direction.H2D, [node], request_id=2)
    with pytest.raises(IllegalTransition):  # not published yet: I5
        cp.advance_cached_len(2, node)
    cp.complete(h2d.op_id)
    assert cp.advance_cached_len(2, node) == 4
    names = {e.event for e in sink.events}
    assert {
        "d2h_issue",
        "d2h_complete",
        "h2s_issue",
        "h2s_complete",
        "evict_l1",
        "evict_l2",
        "s2h_issue",
        "s2h_complete",
        "h2d_issue",
        "h2d_complete",
    } <= names


@pytest.mark.parametrize("outcome", ["fail", "cancel"])
def test_failed_restore_after_promotion_keeps_published_l2(outcome: str) -> None:
    """Bug class B02: after S2H published L2, a failed H2D must not free those L2 pages."""
    cp, _ = plane()
    served(cp, 1, [1, 2, 3, 4])
    (node,) = list(cp.tree.nodes())
    cp.complete(cp.issue(Direction.D2H, [node]).op_id)
    cp.complete(cp.issue(Direction.H2S, [node]).op_id)
    cp.evict("L1", 2)
    cp.evict("L2", 2)
    cp.complete(cp.issue(Direction.S2H, [node]).op_id)
    promoted = node.value[1]
    assert promoted is not None
    l2_pages = promoted.copy()
    h2d = cp.issue(Direction.H2D, [node])
    getattr(cp, outcome)(h2d.op_id)
    assert node.state == ["ABSENT", "RESIDENT", "RESIDENT"]
    assert node.value[1] is not None and np.array_equal(node.value[1], l2_pages)
    assert cp.tables[0].free_count == 16 and cp.tables[1].free_count == 14


def test_rejected_transitions_change_nothing() -> None:
    cp, _ = plane((16, 2, 16))
    served(cp, 1, [1, 2, 3, 4])
    served(cp, 2, [5, 6, 7, 8])
    a, b = sorted(cp.tree.nodes(), key=lambda n: n.node_id)
    cp.issue(Direction.D2H, [a])
    before = fingerprint(cp)
    with pytest.raises(OutOfPages):  # L2 has 2 pages, both reserved now
        cp.issue(Direction.D2H, [b])
    with pytest.raises(IllegalTransition):  # nothing in L2 yet to restore from
        cp.issue(Direction.H2D, [b])
    with pytest.raises(IllegalTransition):  # L3 needs L2 resident
        cp.issue(Direction.H2S, [a])
    with pytest.raises(UnknownOp):
        cp.complete(999)
    assert fingerprint(cp) == before


def test_backup_gap_is_rejected() -> None:
    """Bug class B07: a child may not be backed up while its parent is not."""
    cp, _ = plane()
    served(cp, 1, [1, 2])
    served(cp, 2, [1, 2, 3, 4])
    parent = cp.tree.match([1, 2]).path[-1]
    (child,) = list(parent.children.values())
    before = fingerprint(cp)
    with pytest.raises(IllegalTransition, match="backup gap"):
        cp.issue(Direction.D2H, [child])
    assert fingerprint(cp) == before
    op = cp.issue(Direction.D2H, [parent, child])
    cp.complete(op.op_id)
    assert parent.state[1] == child.state[1] == "RESIDENT"


def test_split_of_pending_node_keeps_op_whole() -> None:
    cp, _ = plane()
    served(cp, 1, [1, 2, 3, 4])
    (node,) = list(cp.tree.nodes())
    op = cp.issue(Direction.D2H, [node])
    served(cp, 2, [1, 2, 7, 7])  # splits the pending node at 2 tokens
    assert len(op.nodes) == 2
    cp.complete(op.op_id)
    assert all(n.state[1] == "RESIDENT" for n in op.nodes)


def test_abort_with_pending_restore_leaves_nothing_behind() -> None:
    """Bug class B03: abort while a load-back is pending -> cancel, end; no leak."""
    cp, _ = plane()
    served(cp, 1, [1, 2, 3, 4])
    (node,) = list(cp.tree.nodes())
    cp.complete(cp.issue(Direction.D2H, [node]).op_id)
    cp.evict("L1", 2)
    cp.begin_request(2, [1, 2, 3, 4, 5])
    op = cp.issue(Direction.H2D, [node], request_id=2)
    cp.cancel(op.op_id)
    cp.end_request(2)
    assert not cp.ops and not cp.requests
    assert cp.tables[0].free_count == 16
    assert all(n.lock == [0, 0, 0] for n in cp.tree.nodes())


def test_trace_events_are_lifecycle_names() -> None:
    cp, sink = plane()
    served(cp, 1, [1, 2, 3, 4])
    known = set(cp.lifecycle.transitions) | {
        "begin_request",
        "end_request",
        "cached_len",
        "split",
        "node_remove",
    }
    assert {e.event for e in sink.events} <= known
    seqs = [e.seq for e in sink.events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_no_trace_sink_costs_no_events() -> None:
    cp = ControlPlane(PS, (8, 8, 8), check_mode="off", walk=False)  # walked: a sink
    assert not cp.tracer.enabled
    served(cp, 1, [1, 2])
    assert cp.tracer.seq == 0


def test_invariant_checks_run_every_transition() -> None:
    cp, _ = plane()
    served(cp, 1, [1, 2, 3, 4])
    # begin_request, compute, insert, end_request: one check after each.
    assert cp.checker.checks_run == 4 and cp.checker.violations_found == 0


def test_deepcopy_free_snapshot_is_independent() -> None:
    cp, _ = plane()
    served(cp, 1, [1, 2])
    s = cp.snapshot()
    owner = copy.deepcopy(s.tiers["L1"].owner)
    cp.tables[0].reserve(1)
    assert np.array_equal(s.tiers["L1"].owner, owner)


def test_end_request_refuses_while_an_op_it_issued_is_pending() -> None:
    """A request's op owns private target pages; ending the request first would leave them
    with no owner to cancel them (spec/restore.md). Refused, nothing changed; after the
    cancel the request ends."""
    cp = ControlPlane(PS, (16, 16, 16), check_mode="every")
    prompt = list(range(9))
    cp.begin_request(1, prompt, match_len=0)
    cp.compute(1, 8)
    cp.insert(1)
    node = cp.prefix_node(1)
    op = cp.issue(Direction.D2H, cp.tree.path_to_root(node)[::-1], request_id=1)
    before = (dict(cp.requests), dict(cp.ops), [t.owner.copy() for t in cp.tables])
    with pytest.raises(IllegalTransition, match=f"ops \\[{op.op_id}\\] pending"):
        cp.end_request(1)
    assert (dict(cp.requests), dict(cp.ops)) == before[:2]
    assert all((t.owner == o).all() for t, o in zip(cp.tables, before[2]))
    cp.cancel(op.op_id)
    cp.end_request(1)
    assert not cp.requests and not cp.ops
