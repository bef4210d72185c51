"""Replay a trace against the composite graph: every event's `before -> after` is an edge.

This is the seed of `hicache check-trace`. It reads nothing but the events and the lifecycle
tables; it does not rebuild the control plane. `first_non_edge` judges each event on its own:

    a lifecycle event with `before` and `after`   (before, event, after) must be an edge of the
                                                  composite graph (spec/lifecycle.md)
    a lifecycle event without them                allowed only for a row on a request's copy
                                                  (`compute`, `discard`): a duplicate copy,
                                                  which is outside the graph
    any other event                               not judged here

`first_break` also follows each node's walk: a node event's `before` must be the state the
node's previous event left it in (a `split` copies it to the new upper node, `node_remove`
needs it all-ABSENT), and a request-copy event on a node must agree with the tree's L1
(a contender's view over an L1-ABSENT node, a duplicate beside an L1 copy).

`walk_hook` installs a checking sink (`first_break`'s rules, event by event) on a control plane's
tracer when the environment variable HICACHE_TRACE_WALK is set (the test suite sets it, so every
trace a test produces is walked as it is emitted).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import NamedTuple

from hicache.lifecycle import ABSENT, PRIVATE, Lifecycle, States, composite_name, load_lifecycle
from hicache.trace import TraceEvent, Tracer, TraceSink

ENV_VAR = "HICACHE_TRACE_WALK"
"""Set (to anything but "" or "0") to walk every control plane's trace as it is emitted."""


class NonEdge(NamedTuple):
    """The first event that is not a step of the composite graph, and why."""

    event: TraceEvent
    why: str


class TraceWalkError(AssertionError):
    """A control plane emitted an event that is not an edge of its own composite graph: a bug
    in the reference (or in an edited table), never in its caller. Report the event."""

    def __init__(self, found: NonEdge) -> None:
        super().__init__(
            f"trace event {found.event.to_json()} is not a composite edge: {found.why}"
        )
        self.found = found


class Graph:
    """The composite graph of a lifecycle, as a set of (before, event, after) names."""

    def __init__(self, lc: Lifecycle) -> None:
        self.lifecycle = lc
        self.states = {c.name: c.states for c in lc.composites}
        self.edges = {
            (composite_name(s), t.name, composite_name(d))
            for s, out in lc.reachable().items()
            for t, d in out
        }

    def judge(self, e: TraceEvent) -> str | None:
        """Why `e` is not a step of the graph, or None when it is (or is not judged)."""
        t = self.lifecycle.transitions.get(e.event)
        if t is None:
            return None
        if e.before is None and e.after is None:
            if t.acts_on_copy:
                return None  # a duplicate request copy: outside the graph by definition
            return f"{e.event} acts on tree nodes and must name its before and after states"
        if (e.before, e.event, e.after) not in self.edges:
            return f"{e.before} --{e.event}--> {e.after} is not an edge"
        return None


_NOWHERE: States = (ABSENT, ABSENT, ABSENT)


class Walker:
    """Follows every node's walk through a trace of one control plane (node ids are never
    reused within it). `step` returns why an event breaks the walk, or None."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.nodes: dict[int, States] = {}  # node id -> the tree's triple after its last event

    def step(self, e: TraceEvent) -> str | None:
        why = self.graph.judge(e)
        if why is not None or e.node is None:
            return why
        if e.event == "split":
            upper = e.detail.get("upper")
            if isinstance(upper, int) and e.node in self.nodes:
                self.nodes[upper] = self.nodes[e.node]
            return None
        if e.event == "node_remove":
            left = self.nodes.pop(e.node, _NOWHERE)
            return (
                None if left == _NOWHERE else f"node {e.node} removed while {composite_name(left)}"
            )
        t = self.graph.lifecycle.transitions.get(e.event)
        if t is None:
            return None
        known = self.nodes.get(e.node)
        if e.before is None or e.after is None:  # a duplicate copy (judge allowed it)
            if known is not None and known[0] == ABSENT:
                return f"{e.event} on node {e.node} claims a duplicate, but the tree's L1 is ABSENT"
            return None
        before, after = self.graph.states[e.before], self.graph.states[e.after]
        # A request's view (L1 = its copy) shows the tree's L1 as ABSENT: it is a contender.
        tree_before = (ABSENT, before[1], before[2]) if PRIVATE in (t.source, t.dest) else before
        if known is not None and known != tree_before:
            return (
                f"node {e.node} is {composite_name(known)} after its previous event, "
                f"this one starts from {composite_name(tree_before)}"
            )
        self.nodes[e.node] = tree_before if t.acts_on_copy else after
        return None


def first_break(events: Iterable[TraceEvent], lc: Lifecycle | None = None) -> NonEdge | None:
    """The first event of `events` (one control plane's trace, in order) that is not an edge or
    does not continue its node's walk; None when the whole trace is a walk."""
    walker = Walker(Graph(lc or load_lifecycle()))
    for e in events:
        why = walker.step(e)
        if why is not None:
            return NonEdge(e, why)
    return None


def first_non_edge(events: Iterable[TraceEvent], lc: Lifecycle | None = None) -> NonEdge | None:
    """The first event of `events` that is not a step of `lc`'s composite graph (default: the
    shipped tables), or None when every event is."""
    graph = Graph(lc or load_lifecycle())
    for e in events:
        why = graph.judge(e)
        if why is not None:
            return NonEdge(e, why)
    return None


class WalkCount:
    """How many events the walk sinks of this process have judged (tests read it to show that
    the walk really ran)."""

    events = 0


class WalkSink:
    """Walks each event as it is emitted (`first_break`'s rules; TraceWalkError on a break),
    then passes it on."""

    def __init__(self, graph: Graph, inner: TraceSink | None) -> None:
        self.walker, self.inner = Walker(graph), inner

    def emit(self, event: TraceEvent) -> None:
        WalkCount.events += 1
        why = self.walker.step(event)
        if why is not None:
            raise TraceWalkError(NonEdge(event, why))
        if self.inner is not None:
            self.inner.emit(event)


_GRAPHS: dict[int, Graph] = {}


def walk_hook(tracer: Tracer, lc: Lifecycle) -> None:
    """With HICACHE_TRACE_WALK set, make `tracer` walk every event it emits through `lc`'s
    composite graph (enabling it when it had no sink); without it, do nothing."""
    if os.environ.get(ENV_VAR, "") in ("", "0") or isinstance(tracer.sink, WalkSink):
        return
    graph = _GRAPHS.get(id(lc))
    if graph is None or graph.lifecycle is not lc:
        graph = _GRAPHS[id(lc)] = Graph(lc)
    tracer.sink = WalkSink(graph, tracer.sink)
