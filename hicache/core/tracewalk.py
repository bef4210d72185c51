"""The walk: every traced step judged by the `transitions` machine of the same tables.

The executor (hicache/core/execute.py) runs the lifecycle rows by hand; the walk replays what it
traced through an independent machine, `hicache.core.pagemachine.PageMachine` (the `transitions`
library's, built from lifecycle.toml's raw rows), and fails on the first step the two do not
agree about. It reads nothing but the events and the tables; it does not rebuild the control
plane. `first_non_edge` judges each event on its own:

    a lifecycle event with `before` and `after`   the machine, set to `before` and fired
                                                  `event`, must reach `after`
    a lifecycle event without them                allowed only for a row on a request's copy
                                                  (`compute`, `discard`): a duplicate copy,
                                                  which is outside the graph
    any other event                               not judged here (no row of the machine)

`first_break` also follows each node's walk: a node event's `before` must be the state the
node's previous event left it in (a `split` copies it to the new upper node, `node_remove`
needs it all-ABSENT), and a request-copy event on a node must agree with the tree's L1
(a contender's view over an L1-ABSENT node, a duplicate beside an L1 copy). Per-node state is
this walker's dict; the machine is one per tables, asked once per (state, event).

Where it runs: `walk` installs a checking sink (`first_break`'s rules, event by event) on a
tracer. A control plane calls it when its builder asks (`ControlPlane(..., walk=True)`).
`hicache check-trace` walks its reference plane always; `hicache fuzz` and the test suite walk
the planes built deep inside their code from outside (hicache/testing/walking.py).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import NamedTuple

from hicache.core.lifecycle import ABSENT, PRIVATE, RESIDENT, Lifecycle, States, load_lifecycle
from hicache.core.pagemachine import PageMachine, Row, page_machine
from hicache.core.trace import ListSink, TraceEvent, Tracer, TraceSink


class NonEdge(NamedTuple):
    """The first event that does not continue the walk, and why; `machine` is what the
    `transitions` machine does from the event's `before` when that is not the event's `after`
    (None when the break is no such disagreement)."""

    event: TraceEvent
    why: str
    machine: str | None = None


class TraceWalkError(AssertionError):
    """A control plane emitted an event that does not continue its walk: a bug in the
    reference (or in an edited table), never in its caller. Report the event.

    An AssertionError, not a HiCacheError, on purpose: callers catch HiCacheError as a refused
    operation (the fuzz, the model checker, check-trace), which would hide the bug."""

    def __init__(self, found: NonEdge, message: str = "") -> None:
        super().__init__(
            message or f"trace event {found.event.to_json()} breaks the walk: {found.why}"
        )
        self.found = found


class MachineDisagreement(TraceWalkError):
    """The executor traced a step the `transitions` machine of the same tables does not take:
    `event` on `node` from `before`; the executor says `executor` (the state it traced after),
    the machine says `machine` (the state it reaches, or why it refuses). One of the two
    readings of the tables is wrong (spec/README.md, "What is normative")."""

    def __init__(self, found: NonEdge) -> None:
        e = found.event
        self.event, self.node, self.before = e.event, e.node, e.before
        self.executor, self.machine = e.after, found.machine
        super().__init__(
            found,
            f"the executor and the transitions machine disagree on {e.event} "
            f"(node {e.node}, request {e.request}, op {e.op}) from {e.before}: the executor "
            f"traced {e.after}, the machine {found.machine}; event {e.to_json()}",
        )


def acts_on_copy(row: Row) -> bool:
    """Whether `row` acts on a request's private copy only and never writes a node
    (`compute`, `discard`): source or target PRIVATE, target not RESIDENT."""
    return PRIVATE in (row.source, row.dest) and row.dest != RESIDENT


class Judged(NamedTuple):
    """What one (event, before, after) means to the walk, worked out once per machine."""

    why: str | None  # why it is no step of the machine; None: it is one, or is not judged
    machine: str | None  # what the machine does from `before` instead (a disagreement)
    row: Row | None  # the event's row; None: no lifecycle event
    tree_before: States | None  # the tree's triple the node must be in (None: no states)
    tree_after: States | None  # ... and is in after it


_NOT_JUDGED = Judged(None, None, None, None, None)


def judged(machine: PageMachine, event: str, before: str | None, after: str | None) -> Judged:
    """`event` from `before` to `after` for the walk, the machine asked (see `Judged`)."""
    row = machine.rows.get(event)
    if row is None:
        return _NOT_JUDGED
    if before is None or after is None:
        if before is not None or after is not None:
            why = f"{event} names one of before and after: both, or neither"
        elif acts_on_copy(row):
            return Judged(None, None, row, None, None)  # a duplicate copy: outside the graph
        else:
            why = f"{event} acts on tree nodes and must name its before and after states"
        return Judged(why, None, row, None, None)
    answer = machine.answer(before, event)
    if answer.after is None or answer.after != after:
        why = f"{before} --{event}--> {after} is not an edge: the lifecycle machine {answer.says}"
        return Judged(why, answer.says, row, None, None)
    states, reached = machine.triples[before], machine.triples[after]
    # A request's view (L1 = its copy) shows the tree's L1 as ABSENT: it is a contender.
    tree = (ABSENT, states[1], states[2]) if PRIVATE in (row.source, row.dest) else states
    return Judged(None, None, row, tree, tree if acts_on_copy(row) else reached)


def judge(machine: PageMachine, e: TraceEvent) -> NonEdge | None:
    """Why `e` is not a step of the machine, or None when it is (or is not judged)."""
    j = judged(machine, e.event, e.before, e.after)
    return None if j.why is None else NonEdge(e, j.why, j.machine)


_NOWHERE: States = (ABSENT, ABSENT, ABSENT)
JUDGED_MAX = 4096
"""Most (event, before, after) a machine's walk memo holds: the tables have a few hundred
steps; a trace naming other states or events is judged afresh past this bound."""
_JUDGED: weakref.WeakKeyDictionary[PageMachine, dict[tuple[str, str | None, str | None], Judged]]
_JUDGED = weakref.WeakKeyDictionary()


class Walker:
    """Follows every node's walk through a trace of one control plane (node ids are never
    reused within it). `step` returns why an event breaks the walk, or None. What an
    (event, before, after) means is memoised per machine: the machine is deterministic."""

    def __init__(self, machine: PageMachine) -> None:
        self.machine = machine
        self.nodes: dict[int, States] = {}  # node id -> the tree's triple after its last event
        self.judged = _JUDGED.setdefault(machine, {})

    def step(self, e: TraceEvent) -> NonEdge | None:
        key = (e.event, e.before, e.after)
        j = self.judged.get(key)
        if j is None:
            j = judged(self.machine, *key)
            if len(self.judged) < JUDGED_MAX:
                self.judged[key] = j
        if j.why is not None:
            return NonEdge(e, j.why, j.machine)
        node = e.node
        if node is None:
            return None
        if j.row is None:
            return self._topology(e, node)
        known = self.nodes.get(node)
        if j.tree_before is None:  # a duplicate copy (no states)
            if known is not None and known[0] == ABSENT:
                why = f"{e.event} on node {node} claims a duplicate, but the tree's L1 is ABSENT"
                return NonEdge(e, why)
            return None
        if known is not None and known != j.tree_before:
            return NonEdge(
                e,
                f"node {node} is {self._name(known)} after its previous event, "
                f"this one starts from {self._name(j.tree_before)}",
            )
        assert j.tree_after is not None  # Verify: judged names both triples together.
        self.nodes[node] = j.tree_after
        return None

    def _topology(self, e: TraceEvent, node: int) -> NonEdge | None:
        """A node event of no row: a `split` gives the new upper node the node's triple, a
        `node_remove` needs it all-ABSENT."""
        if e.event == "split":
            upper = e.detail.get("upper")
            if isinstance(upper, int) and node in self.nodes:
                self.nodes[upper] = self.nodes[node]
        elif e.event == "node_remove":
            left = self.nodes.pop(node, _NOWHERE)
            if left != _NOWHERE:
                return NonEdge(e, f"node {node} removed while {self._name(left)}")
        return None

    def _name(self, states: States) -> str:
        return self.machine.names.get(states) or str(states)


def _machine(lc: Lifecycle | None) -> PageMachine:
    return page_machine((lc or load_lifecycle()).tables)


def first_break(events: Iterable[TraceEvent], lc: Lifecycle | None = None) -> NonEdge | None:
    """The first event of `events` (one control plane's trace, in order) that the machine of
    `lc`'s tables (default: the shipped ones) does not take, or that does not continue its
    node's walk; None when the whole trace is a walk."""
    walker = Walker(_machine(lc))
    for e in events:
        found = walker.step(e)
        if found is not None:
            return found
    return None


def first_non_edge(events: Iterable[TraceEvent], lc: Lifecycle | None = None) -> NonEdge | None:
    """The first event of `events` that is not a step of the machine of `lc`'s tables
    (default: the shipped ones), or None when every event is."""
    machine = _machine(lc)
    for e in events:
        found = judge(machine, e)
        if found is not None:
            return found
    return None


_WALKED = [0]  # events the walk sinks of this process have judged (`walked_events`)


def walked_events() -> int:
    """How many events the walk sinks of this process have judged (tests read it to show that
    the walk really ran). Counted in a one-item list: a class attribute written per event
    would cost more than the count."""
    return _WALKED[0]


class WalkSink:
    """Walks each event as it is emitted (`first_break`'s rules), then passes it on. A step
    the machine does not take raises MachineDisagreement, any other break TraceWalkError."""

    def __init__(self, machine: PageMachine, inner: TraceSink | None) -> None:
        self.walker, self.inner = Walker(machine), inner

    def emit(self, event: TraceEvent) -> None:
        _WALKED[0] += 1
        found = self.walker.step(event)
        if found is not None:
            raise (TraceWalkError if found.machine is None else MachineDisagreement)(found)
        inner = self.inner
        if type(inner) is ListSink:  # its `emit`, inline (the replay's sink)
            inner.events.append(event)
        elif inner is not None:
            inner.emit(event)


def walk(tracer: Tracer, lc: Lifecycle) -> None:
    """Make `tracer` walk every event it emits through the machine of `lc`'s tables (enabling
    it when it had no sink); nothing when it walks already."""
    if not isinstance(tracer.sink, WalkSink):
        tracer.sink = WalkSink(page_machine(lc.tables), tracer.sink)
