"""The incremental checks report exactly what the full checks report.

A controller trace is replayed with the touched all-clear after every call; at a drawn call
a drawn record the call touched (a node, its op, its request, a page it moved, the tree's
counters) is corrupted. Then `Checks.after` -- the all-clear, and the full checks when it
says no -- must report exactly what `check_all` on the whole state reports; and a trace
replayed without corruption never needs the full checks at all.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hicache.core.control import ControlPlane
from hicache.core.lifecycle import ABSENT, RESIDENT, load_lifecycle
from hicache.core.pages import FREE, PRIVATE, TREE
from hicache.core.tiers import TIERS, Direction
from hicache.invariants import check_all
from hicache.oracle.checktrace import VALID, check_lines
from hicache.oracle.checktrace.generate import controller_trace
from hicache.oracle.checktrace.invariants import Checks, Scope
from hicache.oracle.checktrace.reader import TraceReader
from hicache.oracle.checktrace.replay import Replay
from hicache.oracle.checktrace.touched import TouchedChecks


@functools.cache
def trace(seed: int) -> tuple[str, ...]:
    """Seeds 1-3 without faults, 4-5 with failed transfers and refused reservations."""
    return tuple(controller_trace(seed, 250, faults=seed > 3))


class Stop(Exception):
    pass


def _nodes(cp: ControlPlane, scope: Scope) -> list[Any]:
    live = cp.tree._nodes
    return [live[i] for i in sorted(scope.nodes) if i in live and i != cp.tree.root.node_id]


def _locked(cp: ControlPlane, scope: Scope) -> list[Any]:
    """The scope's nodes, and its locked paths' nodes and their ancestors (below the root):
    where the all-clear checks lock counts."""
    live, out = cp.tree._nodes, list(_nodes(cp, scope))
    for i in sorted(scope.path):
        n = live.get(i)
        while n is not None and n.parent is not None:
            if n not in out:
                out.append(n)
            n = n.parent
    return out


def corrupt(cp: ControlPlane, scope: Scope, kind: str, data: st.DataObject) -> bool:
    """Corrupt one record of the call's scope the way `kind` says; False if it has none."""
    nodes = _nodes(cp, scope)
    t = data.draw(st.integers(0, 2))
    if kind == "lock" and _locked(cp, scope):
        n = data.draw(st.sampled_from(_locked(cp, scope)))
        n.lock[t] += data.draw(st.sampled_from([-1, 1]))
    elif kind == "state" and nodes:
        n = data.draw(st.sampled_from(nodes))
        n.state[t] = ABSENT if n.state[t] == RESIDENT else RESIDENT
    elif kind == "value" and nodes:
        n = data.draw(st.sampled_from(nodes))
        v = n.value[t]
        if v is None:
            return False
        if data.draw(st.booleans()):
            n.value[t] = None
        else:
            v[data.draw(st.integers(0, v.size - 1))] = data.draw(
                st.integers(0, cp.tables[t].capacity - 1)
            )
    elif kind == "owner":
        moved = sorted(scope.pages[t])
        if not moved:
            return False
        cp.tables[t].owner[data.draw(st.sampled_from(moved))] = data.draw(
            st.sampled_from([FREE, PRIVATE, TREE])
        )
    elif kind == "counter":
        cp.tree.pages_held[t] += 1
    elif kind == "pending" and nodes:
        data.draw(st.sampled_from(nodes)).pending[t] = 999
    elif kind == "cached_len":
        live = [r for r in scope.requests if r in cp.requests]
        if not live:
            return False
        cp.requests[data.draw(st.sampled_from(live))].cached_len += cp.page_size
    elif kind == "private":
        live = [r for r in scope.requests if r in cp.requests]
        if not live:
            return False
        r = cp.requests[data.draw(st.sampled_from(live))]
        r.private_pages = np.append(
            r.private_pages, data.draw(st.integers(0, cp.tables[0].capacity - 1))
        )
    elif kind == "op":
        live = [o for o in scope.ops if o in cp.ops]
        if not live:
            return False
        op = cp.ops[data.draw(st.sampled_from(live))]
        arr = op.target_pages if data.draw(st.booleans()) else op.source_pages
        arr[0] = (int(arr[0]) + 1) % cp.tables[0].capacity
    elif kind == "link" and nodes:
        n = data.draw(st.sampled_from(nodes))
        del n.parent.children[n.key[: cp.page_size]]
    else:
        return False
    return True


KINDS = [
    "lock",
    "state",
    "value",
    "owner",
    "counter",
    "pending",
    "cached_len",
    "private",
    "op",
    "link",
]


def replay_until(
    lines: tuple[str, ...], at: int, hook: Callable[[Replay, Scope], bool | None]
) -> None:
    """Replay `lines` with the touched checks; from the `at`-th call on, run `hook` after
    each call until it returns anything but False, then stop."""
    lc = load_lifecycle()
    replay = Replay(TraceReader(lines, lc), lc, 1)
    calls = [0]
    after = replay.checks.after

    def spy(n_events: int, scope: Scope | None) -> list[str]:
        assert scope is not None
        calls[0] += 1
        if calls[0] >= at and hook(replay, scope) is not False:
            raise Stop
        return after(n_events, scope)

    replay.checks.after = spy  # type: ignore[method-assign]
    try:
        replay.run()
    except Stop:
        return


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(1, 5), at=st.integers(1, 150), kind=st.sampled_from(KINDS), data=st.data())
def test_the_touched_checks_report_what_the_full_checks_report(
    seed: int, at: int, kind: str, data: st.DataObject
) -> None:
    def hook(replay: Replay, scope: Scope) -> None:
        if not corrupt(replay.cp, scope, kind, data):
            return
        full = [replay.names.violation(v) for v in check_all(replay.cp.snapshot())]
        checks = replay.checks
        assert isinstance(checks, Checks)
        got = Checks.after(checks, 1, scope)
        assert got == full, (kind, got, full)

    replay_until(trace(seed), at, hook)


OP_CORRUPTIONS: dict[str, Callable[[ControlPlane, Any], None]] = {
    "source page": lambda cp, op: op.source_pages.__setitem__(0, (int(op.source_pages[0]) + 1) % 4),
    "target page": lambda cp, op: op.target_pages.__setitem__(0, (int(op.target_pages[0]) + 1) % 4),
    "source unlocked": lambda cp, op: op.nodes[-1].lock.__setitem__(
        TIERS.index(op.direction.source), op.nodes[-1].lock[TIERS.index(op.direction.source)] - 1
    ),
    "pending cleared": lambda cp, op: op.nodes[0].pending.__setitem__(
        TIERS.index(op.direction.target), None
    ),
}


def test_every_op_corruption_is_reported_as_the_full_checks_report() -> None:
    """Each corruption of a pending op, at the first call that leaves one in its scope."""
    for name, spoil in OP_CORRUPTIONS.items():
        for seed in (1, 4):
            seen = _spoil_first_pending_op(name, spoil, seed)
            assert seen, f"{name}: no call left an op pending in seed {seed}"


def _spoil_first_pending_op(
    name: str, spoil: Callable[[ControlPlane, Any], None], seed: int
) -> list[list[str]]:
    """Replays `seed`'s trace until a call leaves an op in scope, spoils the first such op and
    checks the touched checks report what the full checks do; what they reported, if any."""
    seen: list[list[str]] = []

    def hook(replay: Replay, scope: Scope) -> bool:
        live = [o for o in sorted(scope.ops) if o in replay.cp.ops]
        if not live:
            return False
        spoil(replay.cp, replay.cp.ops[live[0]])
        full = [replay.names.violation(v) for v in check_all(replay.cp.snapshot())]
        got = Checks.after(replay.checks, 1, scope)
        assert got == full and full, (name, got, full)
        seen.append(got)
        return True

    replay_until(trace(seed), 1, hook)
    return seen


def test_a_prefix_lock_no_event_names_is_in_scope() -> None:
    """begin_request locks its L1 hit, a node no event of the call names: a wrong count there
    must still be reported (the scope takes the requests' locked nodes after the call)."""
    seen: list[list[str]] = []

    def hook(replay: Replay, scope: Scope) -> bool:
        emitted = [e for e in replay.sink.events if e.event == "begin_request"]
        live = [replay.cp.requests[e.request] for e in emitted if e.request in replay.cp.requests]
        if not live or live[0].locked.parent is None:
            return False
        live[0].locked.lock[0] += 1
        full = [replay.names.violation(v) for v in check_all(replay.cp.snapshot())]
        got = Checks.after(replay.checks, 1, scope)
        assert got == full and full
        seen.append(got)
        return True

    replay_until(trace(1), 1, hook)
    assert seen, "no begin_request with an L1 hit in the trace"


def test_a_lock_on_a_locked_paths_ancestor_no_event_names_is_in_scope() -> None:
    """A request's locked path is checked for lock counts up to the root's child, though
    no event of the call names it: a wrong count on an ancestor of the locked node must be
    reported as the full checks report it."""
    seen: list[list[str]] = []

    def hook(replay: Replay, scope: Scope) -> bool:
        live = replay.cp.tree._nodes
        for i in sorted(scope.path):
            n = live.get(i)
            up = None if n is None else n.parent
            while up is not None and (up.node_id in scope.nodes or up.node_id in scope.path):
                up = up.parent  # to an ancestor nothing but the walk up the path reaches
            if up is None or up.parent is None:
                continue
            up.lock[0] += 1
            full = [replay.names.violation(v) for v in check_all(replay.cp.snapshot())]
            got = Checks.after(replay.checks, 1, scope)
            assert got == full and full
            seen.append(got)
            return True
        return False

    for seed in (1, 2, 3, 4, 5):
        replay_until(trace(seed), 1, hook)
        if seen:
            break
    assert seen, "no call whose locked node has an ancestor no event names"


def test_valid_traces_never_need_the_full_checks() -> None:
    for seed in (1, 2, 3, 4, 5):
        lc = load_lifecycle()
        replay = Replay(TraceReader(trace(seed), lc), lc, 1)
        assert replay.run() == len(trace(seed)) - 1
        assert replay.checks.full_runs == 0
        assert check_all(replay.cp.snapshot()) == []


def test_full_checks_on_request_agree_on_valid_traces() -> None:
    for seed in (1, 2):
        v = check_lines(trace(seed), full_checks=True)
        assert v.exit_code == VALID and v.message == check_lines(trace(seed)).message


def test_a_child_no_event_names_is_checked_against_its_touched_parent() -> None:
    """A call that drops a parent's L2 copy under a child holding L2 (a bug: evict_l2 takes
    tier leaves only) breaks the child's S6 alone, and no event names the child: the
    all-clear must still say no (it checks each touched node's children against it)."""
    cp = ControlPlane(2, (16, 16, 16), check_mode="off")
    for rid, tokens in ((1, [1, 2, 3, 4, 5]), (2, [1, 2, 3, 4, 5, 6, 7, 8, 9])):
        m = cp.begin_request(rid, tokens)
        cp.compute(rid, -(-len(tokens) // 2) * 2 - m.lengths[0])
        cp.insert(rid)
        cp.end_request(rid)
    parent, child = sorted(cp.tree.nodes(), key=lambda n: n.node_id)
    assert child.parent is parent
    cp.complete(cp.issue(Direction.D2H, [parent, child]).op_id)
    checks = TouchedChecks(cp)
    checks.rebuild()
    assert checks.clear([], [], [], [set(), set(), set()])
    dropped = parent.value[1]
    assert dropped is not None
    cp.tables[1].free(dropped)
    cp.tree.set_value(parent, 1, None, ABSENT)
    found = check_all(cp.snapshot())
    assert [(v.invariant, v.nodes) for v in found] == [("S6", (child.node_id,))]
    assert not checks.clear([parent.node_id], [], [], [set(), set(dropped.tolist()), set()])
