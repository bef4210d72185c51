"""After an InvariantViolation the control plane is poisoned (spec/invariants.md, "A poisoned
plane"): snapshot(), the tree's read-only queries and the trace stay available; every
transition and every tree mutation raises PlanePoisoned, naming the cause, with nothing
changed."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import numpy as np
import pytest

from hicache.core.control import READS, ControlPlane
from hicache.core.queries import PlaneQueries
from hicache.core.snapshot import Snapshot
from hicache.core.tiers import Direction
from hicache.core.trace import ListSink, Tracer
from hicache.errors import HiCacheError, InvariantViolation, PlanePoisoned
from hicache.invariants import check_all

PS = 4
PROMPT = list(range(9))


def poisoned_plane() -> tuple[ControlPlane, ListSink]:
    """Request 1 holds [0..8) in L1; a lock no holder records is then taken behind the plane's
    back, and request 2's begin_request (the next transition) finds it (S7)."""
    sink = ListSink()
    cp = ControlPlane(PS, (16, 16, 16), check_mode="every", tracer=Tracer(sink))
    cp.begin_request(1, PROMPT, match_len=0)
    cp.compute(1, 8)
    cp.insert(1)
    cp.tree.lock(cp.requests[1].locked, 1)
    with pytest.raises(InvariantViolation, match="S7"):
        cp.begin_request(2, PROMPT, match_len=8)
    return cp, sink


def records(s: Snapshot) -> tuple[object, ...]:
    """Everything a snapshot holds, comparable with ==."""
    nodes = tuple(
        (
            n.node_id,
            n.parent_id,
            n.child_ids,
            dict(n.states),
            dict(n.locks),
            {t: None if v is None else v.tolist() for t, v in n.values.items()},
        )
        for n in s.nodes
    )
    owners = tuple(v.owner.tolist() for v in s.tiers.values())
    reqs = tuple((r.request_id, r.cached_len, r.locked_node_id, r.pins) for r in s.requests)
    return nodes, owners, reqs, tuple(op.op_id for op in s.ops)


def public_methods() -> list[str]:
    """The transitions: every public method ControlPlane defines itself but its reads (queries
    are inherited from PlaneQueries and stay available, as do `READS`)."""
    return [
        name
        for name, fn in vars(ControlPlane).items()
        if inspect.isfunction(fn) and not name.startswith("_") and name not in READS
    ]


def query_methods() -> list[str]:
    return [
        name
        for name, fn in vars(PlaneQueries).items()
        if inspect.isfunction(fn) and not name.startswith("_")
    ] + list(READS)


def test_the_violation_poisons_the_plane_and_its_tree() -> None:
    cp, _ = poisoned_plane()
    assert isinstance(cp.poisoned, InvariantViolation) and cp.poisoned.context == "begin_request 2"
    assert cp.tree.poisoned is cp.poisoned
    assert ControlPlane(PS, (16, 16, 16)).poisoned is None  # per plane, not global


@pytest.mark.parametrize("name", public_methods())
def test_every_transition_is_refused_with_nothing_changed(name: str) -> None:
    """Whatever the arguments: the refusal comes before the method reads them."""
    cp, sink = poisoned_plane()
    before, events = records(cp.snapshot()), len(sink.events)
    with pytest.raises(PlanePoisoned) as err:
        getattr(cp, name)(2)
    assert err.value.attempted == name and err.value.cause is cp.poisoned
    assert isinstance(err.value, HiCacheError)
    text = str(err.value)
    assert "nothing changed" in text and "begin_request 2" in text and "S7" in text
    assert "new control plane" in text  # what to do
    assert records(cp.snapshot()) == before and len(sink.events) == events


def test_observation_still_works() -> None:
    cp, sink = poisoned_plane()
    s = cp.snapshot()
    assert {v.invariant for v in check_all(s)} == {"S7"}  # the cause is still visible
    # The request the violating transition began is there: the check ran after it applied.
    assert sorted(cp.requests) == [1, 2]
    assert any(e.event == "begin_request" and e.request == 2 for e in sink.events)
    node = cp.requests[1].locked
    m = cp.tree.match(PROMPT, split=False, touch=False)
    assert m.lengths[0] == 8 and cp.tree.cut([0, 1, 2, 3, 50]) is not None
    assert cp.tree.candidates(0) == [] and cp.tree.audit() == []
    assert cp.tree.path_to_root(node)[0] is node


def test_tree_mutations_are_refused_with_nothing_changed() -> None:
    cp, _ = poisoned_plane()
    node = cp.requests[1].locked
    before = records(cp.snapshot())
    mutations: dict[str, Callable[[], object]] = {
        "tree.lock": lambda: cp.tree.lock(node, 0),
        "tree.unlock": lambda: cp.tree.unlock(node, 1),
        "tree.set_value": lambda: cp.tree.set_value(node, 1, np.arange(2), "RESIDENT"),
        "tree.set_pending": lambda: cp.tree.set_pending(node, 1, 99),
        "tree.split": lambda: cp.tree.split(node, PS),
        "tree.add_child": lambda: cp.tree.add_child(node, [7, 7, 7, 7]),
        "tree.remove_if_dead": lambda: cp.tree.remove_if_dead(node),
        "tree.touch": lambda: cp.tree.touch(node, 0),
        "tree.match (with split or touch)": lambda: cp.tree.match([0, 1, 2, 3, 50]),
    }
    for attempted, mutate in mutations.items():
        with pytest.raises(PlanePoisoned) as err:
            mutate()
        assert err.value.attempted == attempted
    assert records(cp.snapshot()) == before


def test_periodic_mode_poisons_when_the_check_runs() -> None:
    """With `periodic N` the plane is poisoned at the check that finds the violation, up to
    N - 1 transitions after the one that caused it; transitions before that still run."""
    cp = ControlPlane(PS, (16, 16, 16), check_mode="periodic 3")
    cp.begin_request(1, PROMPT, match_len=0)  # transition 1
    cp.compute(1, 8)  # 2
    cp.insert(1)  # 3: checked, clean
    cp.tree.lock(cp.requests[1].locked, 1)
    cp.issue(Direction.D2H, [cp.requests[1].locked])  # 4: not checked, so not poisoned
    assert cp.poisoned is None
    cp.begin_request(2, [5, 5, 5, 5])  # 5
    with pytest.raises(InvariantViolation):
        cp.end_request(2)  # 6: checked
    with pytest.raises(PlanePoisoned):
        cp.end_request(1)


def test_every_method_is_a_transition_or_a_query() -> None:
    """A public method is refused on a poisoned plane unless it is one of PlaneQueries' (which
    change nothing); none is both, and the split leaves no public method unclassified."""
    every = {
        name
        for name, _ in inspect.getmembers(ControlPlane, inspect.isfunction)
        if not name.startswith("_")
    }
    assert every == set(public_methods()) | set(query_methods())
    assert not set(public_methods()) & set(query_methods())
    assert {"issue", "evict", "pin", "apply", "end_request"} <= set(public_methods())
    assert {"snapshot", "candidates", "usage", "cached_len", "holds"} <= set(query_methods())


def test_a_poisoned_plane_is_copied_poisoned() -> None:
    cp, _ = poisoned_plane()
    twin = cp.clone()
    assert twin.poisoned is cp.poisoned and twin.tree.poisoned is cp.poisoned
    assert records(twin.snapshot()) == records(cp.snapshot())
    with pytest.raises(PlanePoisoned):
        twin.end_request(1)


def test_queries_still_answer() -> None:
    cp, _ = poisoned_plane()
    node = cp.requests[1].locked
    assert cp.holds(node, "L1") and not cp.holds(node, "L2")
    assert cp.cached_len(1) == 8 and cp.prefix_node(1) is node
    assert cp.candidates("L1") == [] and cp.usage("L1")["tree"] == 2  # two pages of 4
    assert cp.is_live(node) and cp.residency(node, "L2") == "ABSENT"
