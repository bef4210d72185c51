"""The all-clear's lock-holder records (holders.py) stay what every live holder reads now.

`LockHolders.refresh` re-reads only the holders a call named or whose paths pass a node it
touched; a holder it missed would leave a stale path or lock count. After every call of
seeded controller traces (with and without faults) the kept records must equal a
recomputation from every live holder, and the lock counts they add up to must be the tree's.
"""

from __future__ import annotations

import functools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hicache.core.control import ControlPlane
from hicache.core.lifecycle import load_lifecycle
from hicache.core.trace import ListSink, Tracer
from hicache.oracle.checktrace.generate import controller_trace
from hicache.oracle.checktrace.holders import LockHolders
from hicache.oracle.checktrace.invariants import Scope, scope_before
from hicache.oracle.checktrace.reader import TraceReader
from hicache.oracle.checktrace.replay import Replay
from hicache.oracle.checktrace.touched import TouchedChecks


@functools.cache
def trace(seed: int, faults: bool) -> tuple[str, ...]:
    return tuple(controller_trace(seed, 120, faults=faults))


def _touched(replay: Replay) -> TouchedChecks:
    touched = replay.checks.touched
    assert touched is not None
    return touched


def _replay_comparing(lines: tuple[str, ...]) -> int:
    """Replay `lines` with the all-clear; after every call compare the kept holder records
        with a recomputation and with the tree's lock counts, and require the all-clear never to
    have said no (a no rebuilds the records, which would hide a stale one). Returns the calls
    compared."""
    lc = load_lifecycle()
    replay = Replay(TraceReader(lines, lc), lc, 1)
    after = replay.checks.after
    calls = [0]

    def spy(n_events: int, scope: Scope | None) -> list[str]:
        found = after(n_events, scope)
        assert replay.checks.full_runs == 0, calls[0]  # a no rebuilds: stale records hide
        holders = _touched(replay).holders
        paths, expected = holders.recompute()
        assert holders.whole
        assert holders.paths == paths, calls[0]
        assert holders.expected == expected, calls[0]
        for n in replay.cp.tree.nodes():
            if n.parent is not None:
                assert n.lock == expected.get(n.node_id, [0, 0, 0]), (calls[0], n.node_id)
        through: dict[int, set[tuple[str, int]]] = {}
        for key, held in paths.items():
            for path, _ in held:
                for i in path:
                    through.setdefault(i, set()).add(key)
        assert holders.through == through, calls[0]
        calls[0] += 1
        return found

    replay.checks.after = spy  # type: ignore[method-assign]
    assert replay.run() == len(lines) - 1
    return calls[0]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(1, 10_000), faults=st.booleans())
def test_the_kept_holder_records_equal_a_recomputation_after_every_call(
    seed: int, faults: bool
) -> None:
    assert _replay_comparing(trace(seed, faults)) > 0


def test_the_records_follow_splits_removals_and_ended_holders() -> None:
    """Seeds 1-5 (4-5 with faults): the kind of trace tests/test_checktrace_touched.py
    corrupts, compared whole."""
    for seed in (1, 2, 3, 4, 5):
        assert _replay_comparing(tuple(controller_trace(seed, 250, faults=seed > 3))) > 0


def test_a_holder_whose_node_left_the_tree_is_a_no_and_the_next_call_rebuilds() -> None:
    cp = ControlPlane(2, (16, 16, 16), check_mode="off")
    m = cp.begin_request(1, [1, 2, 3, 4])
    cp.compute(1, 4 - m.lengths[0])
    cp.insert(1)
    holders = LockHolders(cp)
    r = cp.requests[1]
    node = r.locked
    assert node.parent is not None
    assert holders.expected == {node.node_id: [1, 0, 0]}
    del cp.tree._nodes[node.node_id]  # the locked node is no longer in the tree
    assert holders.refresh([], [1], []) is None
    assert not holders.whole
    cp.tree._nodes[node.node_id] = node
    assert holders.refresh([], [], []) == [1]  # rebuilt first: every live request re-read
    assert holders.whole and holders.expected == {node.node_id: [1, 0, 0]}
    cp.end_request(1)
    assert holders.refresh([], [1], []) == [1]
    assert holders.paths == {} and holders.expected == {} and holders.through == {}


def test_a_split_above_a_locked_node_moves_its_holders_path() -> None:
    """Request 2's match splits node N, which request 1 holds locked: no event names request
    1, yet its path gains the new upper node (the split names N): the all-clear's records
    must follow it (the traces above never split a locked node)."""
    sink = ListSink()
    cp = ControlPlane(2, (32, 32, 32), check_mode="off", tracer=Tracer(sink))
    m = cp.begin_request(1, [1, 2, 3, 4, 5, 6, 7, 8])
    cp.compute(1, 8 - m.lengths[0])
    cp.insert(1)
    checks = TouchedChecks(cp)
    checks.rebuild()
    locked = cp.requests[1].locked
    assert checks.holders.paths == {("request", 1): (((locked.node_id,), 0),)}
    sink.events.clear()
    scope = scope_before(cp, [], 2, None)
    cp.begin_request(2, [1, 2, 3, 4, 9, 9])
    upper = locked.parent
    assert upper is not None and upper.parent is cp.tree.root and upper.lock[0] == 2
    scope.add(sink.events)
    scope.add_holders(cp)
    assert checks.clear(scope.nodes, scope.ops, scope.requests, scope.pages, scope.path)
    assert checks.holders.paths[("request", 1)] == (((locked.node_id, upper.node_id), 0),)
    assert (checks.holders.paths, checks.holders.expected) == checks.holders.recompute()
    assert checks.holders.expected[upper.node_id] == [2, 0, 0]
