"""Every trace the reference emits is a walk of its tables' composite graph, as the
`transitions` machine of those tables takes it (spec/lifecycle.md, "Whose state a composite
is"; hicache/core/tracewalk.py, hicache/core/pagemachine.py).

What is covered, and how: a plane walks its trace as it is emitted when its builder asks
(`ControlPlane(..., walk=True)`; a tracer without a sink gets one), and the first event that
is not an edge, or does not continue its node's walk, fails the test that caused it. The tests
tests/conftest.py runs walked build every plane so -- directly, through a controller, or
inside a `hicache demo` they run (hicache/testing/walking.py). This module checks the switch,
runs the demo under it and counts what was walked, replays
the cases the spec names (two requests computing the same tokens, a compute over a pending
load-back, a recompute over L2), and shows the walker catching the traces the reference used
to emit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json

import pytest

from hicache.app import demo
from hicache.core.control import ControlPlane
from hicache.core.lifecycle import load_lifecycle
from hicache.core.tiers import Direction
from hicache.core.trace import ListSink, TraceEvent, Tracer
from hicache.core.tracewalk import (
    MachineDisagreement,
    TraceWalkError,
    WalkSink,
    first_break,
    first_non_edge,
    walked_events,
)
from hicache.core.tree import TreeNode
from hicache.errors import HiCacheError
from hicache.testing.walking import every_plane_walked

PS = 2


def plane() -> tuple[ControlPlane, ListSink]:
    sink = ListSink()
    return ControlPlane(PS, (16, 16, 16), check_mode="every", tracer=Tracer(sink)), sink


def states(sink: ListSink, event: str) -> list[tuple[int | None, str | None, str | None]]:
    """(node, before, after) of every `event` in the trace, in order."""
    return [(e.node, e.before, e.after) for e in sink.events if e.event == event]


def served(cp: ControlPlane, rid: int, tokens: list[int]) -> None:
    m = cp.begin_request(rid, tokens)
    cp.compute(rid, -(-len(tokens) // PS) * PS - m.lengths[0])  # through the tail page
    cp.insert(rid)
    cp.end_request(rid)


def only_in_l2() -> tuple[ControlPlane, ListSink, TreeNode]:
    """A plane whose one node, tokens [0, 4) of [1, 2, 3, 4, 5], is held in L2 only."""
    cp, sink = plane()
    served(cp, 1, [1, 2, 3, 4, 5])
    (node,) = list(cp.tree.nodes())
    cp.complete(cp.issue(Direction.D2H, [node]).op_id)
    cp.evict("L1", 8)
    return cp, sink, node


@pytest.mark.torch  # runs the demo
def test_demo_trace_is_a_walk() -> None:
    before = walked_events()
    with contextlib.redirect_stdout(io.StringIO()), every_plane_walked():
        assert (
            demo.main(
                [
                    "--device",
                    "cpu",
                    "--l1-pages",
                    "40",
                    "--l2-pages",
                    "8",
                    "--l3-slots",
                    "8",
                    "--requests",
                    "40",
                ]
            )
            == 0
        )
    # Hundreds of events, each judged as it was emitted (a break would have raised).
    assert walked_events() - before > 300


def test_two_requests_computing_the_same_tokens() -> None:
    cp, sink = plane()
    cp.begin_request(1, [1, 2, 3, 4, 5])
    cp.begin_request(2, [1, 2, 3, 4, 5])
    cp.compute(1, 6)
    cp.compute(2, 6)
    cp.insert(1)
    assert cp.insert(2) == 4  # served from request 1's copy
    cp.end_request(1)
    cp.end_request(2)
    assert states(sink, "compute") == [(None, "ABSENT", "L1_PRIVATE")] * 2
    (node,) = list(cp.tree.nodes())
    assert states(sink, "insert") == [(node.node_id, "L1_PRIVATE", "L1")]
    # Request 2's copy of [0, 4) is a duplicate: no states; the tail pages are candidates.
    assert states(sink, "discard") == [
        (node.node_id, None, None),
        (None, "L1_PRIVATE", "ABSENT"),
        (None, "L1_PRIVATE", "ABSENT"),
    ]
    assert first_break(sink.events) is None


def test_compute_over_a_pending_load_back_is_a_duplicate() -> None:
    cp, sink, node = only_in_l2()
    cp.begin_request(2, [1, 2, 3, 4, 5])
    h2d = cp.issue(Direction.H2D, [node], request_id=2)
    cp.begin_request(3, [1, 2, 3, 4, 5])  # misses L1: the load-back is not published yet
    cp.compute(3, 6)
    assert cp.insert(3) == 0  # stops before the pending node: the pages stay private
    cp.complete(h2d.op_id)
    cp.end_request(3)
    cp.end_request(2)
    # Request 3's copy of [0, 4) sits beside the tree's L1 copy in flight: a duplicate.
    assert states(sink, "compute")[-2:] == [
        (node.node_id, None, None),
        (None, "ABSENT", "L1_PRIVATE"),
    ]
    assert states(sink, "discard")[-2:] == [
        (node.node_id, None, None),
        (None, "L1_PRIVATE", "ABSENT"),
    ]
    assert first_break(sink.events) is None


def test_recompute_over_l2_is_a_view_of_the_node() -> None:
    cp, sink, node = only_in_l2()
    cp.begin_request(2, [1, 2, 3, 4, 5])  # the policy would restore; this request recomputes
    cp.compute(2, 6)
    cp.insert(2)
    cp.end_request(2)
    assert states(sink, "compute")[-2:] == [
        (node.node_id, "L2", "L1_PRIVATE_L2"),
        (None, "ABSENT", "L1_PRIVATE"),
    ]
    assert (node.node_id, "L1_PRIVATE_L2", "L1_L2") in states(sink, "insert")
    assert first_break(sink.events) is None


def test_end_request_discard_reads_the_tree() -> None:
    """A request ending with private pages over a node L2 holds: `L1_PRIVATE_L2 -> L2`."""
    cp, sink, node = only_in_l2()
    cp.begin_request(2, [1, 2, 3, 4, 5])
    cp.compute(2, 4)
    cp.end_request(2)  # aborted before insert
    assert states(sink, "discard")[-1:] == [(node.node_id, "L1_PRIVATE_L2", "L2")]
    assert first_break(sink.events) is None


def test_every_removed_node_is_traced() -> None:
    """Every node that leaves the tree has a `node_remove` event (removals go through one
    helper of the control plane, whatever causes them)."""
    cp, sink = plane()
    for rid, tokens in enumerate(([1, 2, 3, 4, 5], [1, 2, 7, 7, 7], [9, 9, 9]), start=1):
        served(cp, rid, tokens)
    for node in list(cp.tree.nodes()):
        if cp.tree.contains(node) and not [c for c in node.children.values()]:
            path = list(reversed(cp.tree.path_to_root(node)))
            cp.complete(cp.issue(Direction.D2H, [n for n in path if n.state[1] == "ABSENT"]).op_id)
    for tier in ("L1", "L2", "L3"):
        cp.evict(tier, 16)
    seen = {e.node for e in sink.events if e.node is not None}
    seen |= {int(u) for e in sink.events if e.event == "split" for u in [e.detail["upper"]]}  # type: ignore[call-overload]
    removed = [e.node for e in sink.events if e.event == "node_remove"]
    assert removed and len(removed) == len(set(removed))
    assert set(removed) == seen - {n.node_id for n in cp.tree.nodes()}
    assert len(cp.tree) == 0 and first_break(sink.events) is None


# -- the walker on the traces the reference used to emit ------------------------------------


def ev(
    seq: int, event: str, node: int | None, before: str | None, after: str | None, **extra: object
) -> TraceEvent:
    tier = {
        "compute": "L1",
        "insert": "L1",
        "discard": "L1",
        "d2h_issue": "L2",
        "d2h_complete": "L2",
        "evict_l1": "L1",
    }.get(event)
    return TraceEvent(
        seq=seq,
        event=event,
        tier=tier,
        node=node,
        before=before,
        after=after,
        **extra,  # type: ignore[arg-type]
    )


#   node 1: inserted, backed up to L2, evicted from L1: it is `L2`.
PREFIX = [
    ev(1, "compute", None, "ABSENT", "L1_PRIVATE", request=1),
    ev(2, "insert", 1, "L1_PRIVATE", "L1", request=1),
    ev(3, "d2h_issue", 1, "L1", "L1_D2H_PENDING", op=1),
    ev(4, "d2h_complete", 1, "L1_D2H_PENDING", "L1_L2", op=1),
    ev(5, "evict_l1", 1, "L1_L2", "L2"),
]


def test_the_walk_accepts_the_reference_shape() -> None:
    good = PREFIX + [
        ev(6, "compute", 1, "L2", "L1_PRIVATE_L2", request=2),
        ev(7, "discard", 1, "L1_PRIVATE_L2", "L2", request=2),
    ]
    assert first_non_edge(good) is None and first_break(good) is None


@pytest.mark.parametrize(
    "bad, why",
    [
        # The duplicate discard the reference used to trace: not an edge of the graph.
        (ev(6, "discard", 1, "L1_PRIVATE_L2", "L1_L2", request=2), "is not an edge"),
        # compute over node 1 traced from ABSENT although L2 holds it: an edge, but not node 1's.
        (ev(6, "compute", 1, "ABSENT", "L1_PRIVATE", request=2), "node 1 is L2"),
        # end_request's discard always traced `L1_PRIVATE -> ABSENT`: again not node 1's walk.
        (ev(6, "discard", 1, "L1_PRIVATE", "ABSENT", request=2), "node 1 is L2"),
        # A node row without states, and a duplicate claimed where the tree's L1 is ABSENT.
        (ev(6, "evict_l2", 1, None, None), "must name its before and after"),
        (ev(6, "compute", 1, None, None, request=2), "claims a duplicate"),
        (ev(6, "node_remove", 1, None, None), "removed while L2"),
    ],
)
def test_the_walk_finds_the_first_break(bad: TraceEvent, why: str) -> None:
    found = first_break(PREFIX + [bad, ev(7, "evict_l1", 9, "L1", "ABSENT")])
    assert found is not None and found.event is bad and why in found.why


def test_a_walk_sink_raises_at_the_break() -> None:
    tracer = Tracer(ListSink())
    cp = ControlPlane(PS, (4, 4, 4), tracer=tracer, walk=True)
    assert isinstance(tracer.sink, WalkSink)
    with pytest.raises(MachineDisagreement, match="disagree on discard") as raised:
        tracer.emit("discard", tier="L1", request=1, before="L1_PRIVATE_L2", after="L1_L2")
    said = raised.value
    assert (said.event, said.node, said.before) == ("discard", None, "L1_PRIVATE_L2")
    assert (said.executor, said.machine) == ("L1_L2", "reaches L2")
    assert isinstance(said, TraceWalkError) and not isinstance(said, HiCacheError)
    with pytest.raises(TraceWalkError, match="must name its before and after"):
        tracer.emit("evict_l1", tier="L1", node=3)
    assert cp.lifecycle is load_lifecycle()


def test_trace_json_is_every_set_field() -> None:
    """`to_json` reads fields one by one: the same text as the dataclass's own dict view."""
    e = TraceEvent(
        seq=3,
        event="split",
        tier="L1",
        node=4,
        op=0,
        request=None,
        token_start=0,
        token_end=16,
        pages=(5, 6),
        before="A",
        after="B",
        detail={"upper": 7, "hit": [1, (2, 3)], "nested": {"x": None}},
    )
    want = {k: v for k, v in dataclasses.asdict(e).items() if v not in (None, (), {})}
    want["pages"] = [5, 6]
    assert e.to_json() == json.dumps(want, separators=(",", ":"), sort_keys=True)
    assert TraceEvent.from_json(e.to_json()).to_json() == e.to_json()
    assert TraceEvent(seq=1, event="lock").to_json() == '{"event":"lock","seq":1}'
