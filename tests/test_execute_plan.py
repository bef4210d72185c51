"""`Executor.plan` tests a row's source sub-state and guards itself (sub-state and lock guards
inline, the rest through `Guard.holds`), and `Executor.run` builds its events without
`new_event`: both must answer as `Lifecycle.check` and `TraceEvent(**fields)` do."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import fields

import pytest

from hicache.core.control import ControlPlane
from hicache.core.execute import Segment, _Context, _locks
from hicache.core.lifecycle import Lifecycle, States, load_lifecycle
from hicache.core.tiers import TIERS, Direction
from hicache.core.trace import ListSink, TraceEvent, Tracer
from hicache.core.tree import TreeNode
from hicache.errors import IllegalTransition, OutOfPages

PS = 2
FIELDS = {f.name for f in fields(TraceEvent)}


def _lifecycles() -> list[tuple[str, Lifecycle]]:
    lc = load_lifecycle()
    return [
        ("shipped", lc),
        ("hash-keyed", lc.hash_keyed(lc.hash_keyed_may)),
        ("stacked", lc.stacked(lc.stacked_may)),
    ]


def _plane(lc: Lifecycle) -> tuple[ControlPlane, ListSink]:
    sink = ListSink()
    return ControlPlane(PS, (16, 16, 16), tracer=Tracer(sink), lifecycle=lc), sink


def _chain(cp: ControlPlane) -> list[TreeNode]:
    """A parent and a child node in L1 and L2 (the child's parent is a tree node)."""
    cp.begin_request(1, [1, 2, 3, 4, 5])
    cp.compute(1, 6)
    cp.insert(1)
    cp.end_request(1)
    (parent,) = list(cp.tree.nodes())
    cp.begin_request(2, [1, 2, 3, 4, 7, 8, 9])
    cp.compute(2, 4)
    cp.insert(2)
    cp.end_request(2)
    child = next(n for n in cp.tree.nodes() if n is not parent)
    cp.complete(cp.issue(Direction.D2H, [parent, child]).op_id)
    return [parent, child]


def _says(f: Callable[..., object], *args: object, **kwargs: object) -> str:
    try:
        f(*args, **kwargs)
    except (IllegalTransition, OutOfPages) as e:
        return f"{type(e).__name__}: {e}"
    return "ok"


@pytest.mark.parametrize("which", ["shipped", "hash-keyed", "stacked"])
def test_plan_refuses_as_lifecycle_check_does(which: str) -> None:
    """Every row, on every triple of sub-states, on a node with and without locks (its
    parent a tree node or the root), and on no node: where `Lifecycle.check` refuses, plan
    raises its error, word for word; where it passes, plan's triple after is check's and any
    refusal of plan is one of its own (R7's pending slot,
    the pages to move or free, a lock's node)."""
    lc = dict(_lifecycles())[which]
    cp, _ = _plane(lc)
    nodes = _chain(cp)
    ex = cp.executor
    triples: list[States] = [
        (a, b, c) for a, b, c in itertools.product(*(lc.states[t] for t in TIERS))
    ]
    checked = refused = 0
    saved = [list(n.lock) for n in nodes]
    for locks in ([0, 0, 0], [1, 1, 1], [0, 2, 0]):
        for n in nodes:  # the parent's own locks (hash-keyed) are its count less the child's
            n.lock[:] = locks
        try:
            for node in [None, *nodes]:
                for name in lc.transitions:
                    for before in triples:
                        seg = Segment(node, 0, PS, before)
                        own = ex.lifecycle.own_lock_tiers
                        lk = (0, 0, 0) if node is None else _locks(node, own)
                        ctx = _Context(seg, [] if node is None else [node], None)
                        want = _says(lc.check, name, before, lk, ctx)
                        got = _says(ex.plan, name, [seg], op_id=7)
                        checked += 1
                        if want != "ok":
                            refused += 1
                            assert got == want, (name, before, locks)
                            continue
                        assert got == "ok" or any(
                            w in got
                            for w in (
                                "(R7)",
                                "pages to move",
                                "needs a node",
                                "holds nothing",
                                "OutOfPages",
                            )
                        ), (name, before, locks, got)
                        if got == "ok":
                            step = ex.plan(name, [seg], op_id=7)
                            assert step.afters == (lc.check(name, before),)
        finally:
            for n, lock in zip(nodes, saved):
                n.lock[:] = lock
    assert refused and refused < checked


def test_plan_reads_a_row_replaced_under_its_name() -> None:
    """The executor's read of a row follows the tables: a row replaced in `transitions`
    (the same name) is read again, its guards with it."""
    lc = Lifecycle(load_lifecycle().tables)
    cp, _ = _plane(lc)
    parent, _child = _chain(cp)
    with pytest.raises(IllegalTransition, match="leaf"):
        cp.executor.plan("evict_l1", [Segment(parent, 0, 4, ("RESIDENT", "RESIDENT", "ABSENT"))])
    row = lc.transitions["evict_l1"]
    lc.transitions["evict_l1"] = row.__class__(
        **{**row.__dict__, "guards": tuple(g for g in row.guards if g.op != "leaf")}
    )
    step = cp.executor.plan(
        "evict_l1",
        [Segment(parent, 0, 4, ("RESIDENT", "RESIDENT", "ABSENT"))],
    )
    assert step.afters == (("ABSENT", "RESIDENT", "ABSENT"),)


def test_the_planes_events_are_the_constructors() -> None:
    """Each event the plane emits (`run`'s per segment, and its own: begin_request with its
    detail, cached_len, lock, unlock, end_request, split, node_remove) holds only
    `TraceEvent` fields, a `detail` of its own, and is the event `TraceEvent(**fields)`
    builds (equal, same line, same repr)."""
    cp, sink = _plane(load_lifecycle())
    _parent, child = _chain(cp)
    cp.begin_request(3, [1, 2, 3, 4, 7, 8, 9])
    cp.pin(3, child, "L2")
    cp.unpin(3)
    cp.end_request(3)
    cp.begin_request(4, [1, 2, 5, 6, 7])  # splits the parent
    cp.end_request(4)
    cp.evict("L1", 16)
    cp.evict("L2", 16)
    names = {e.event for e in sink.events}
    want_names = {"begin_request", "cached_len", "lock", "unlock", "end_request", "split"}
    assert want_names | {"node_remove", "compute", "insert", "evict_l1"} <= names, names
    for e in sink.events:
        assert set(e.__dict__) <= FIELDS, set(e.__dict__) - FIELDS
        want = TraceEvent(**e.__dict__)
        assert e == want and e.to_json() == want.to_json() and repr(e) == repr(want)
    details = [e.detail for e in sink.events]
    assert len({id(d) for d in details}) == len(details)  # no event shares another's detail
