"""`check_lines`: replay a trace through the reference control plane and judge it.

    header ─► ControlPlane(page size, capacities[, pool group]), no data plane
    events ─► decide the call they stand for (dispatch.py) ─► run it on the reference
           ─► compare what it emitted with the trace, event by event (compare.py)
           ─► the invariants: after each call on what it touched, or on the whole state
              every N events (invariants.py, touched.py)

The reference runs on no data plane at all: only its records change. The first event that
is not enabled (the reference refuses the call), that differs from what the reference emitted,
that owns a page twice, or after which an invariant fails ends the replay with a report;
the trace's own ids and pages are mapped onto the reference's (maps.py), never compared raw.
A trace may stop anywhere: nothing is checked for quiescence at its end.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Iterable, Iterator

from hicache.core.control import ControlPlane
from hicache.core.lifecycle import Lifecycle, load_lifecycle
from hicache.core.tiers import Direction
from hicache.core.trace import OMITTED_EVENTS, ListSink, TraceEvent, TraceHeader, Tracer
from hicache.core.tracewalk import WalkSink, walk
from hicache.errors import (
    ConfigError,
    HiCacheError,
    IllegalTransition,
    InvariantViolation,
    SpecError,
    TreeError,
)
from hicache.oracle.checktrace.compare import Comparer, DoubleOwnership, Mismatch
from hicache.oracle.checktrace.dispatch import Ambiguous, Call, Resolver, Unreplayable, decide
from hicache.oracle.checktrace.invariants import Checks, scope_before
from hicache.oracle.checktrace.maps import IdMap
from hicache.oracle.checktrace.names import TraceNames
from hicache.oracle.checktrace.ownheap import own_heap
from hicache.oracle.checktrace.pagetable import RunIndexTable
from hicache.oracle.checktrace.reader import Line, Malformed, TraceReader
from hicache.oracle.checktrace.report import Before
from hicache.oracle.checktrace.verdict import MALFORMED, UNJUDGED, VALID, VIOLATION, Verdict
from hicache.pools.hits import ALL_POOLS
from hicache.pools.presets import group as preset_group

DROPPED_BY_OMIT = {**OMITTED_EVENTS, "locks": (*OMITTED_EVENTS["locks"], "node_remove")}
"""Header `omits` entry -> the events left out of the comparison: the reference's are not
compared, the trace's (should it carry some anyway) are read and skipped. Without locks the
reference holds no restore pins, so it may remove a node earlier than the engine, whose pin
kept it: removals are not compared then either."""


class Violation(Exception):
    """The first bad event: its line, why, and the record of the state before its call."""

    def __init__(
        self,
        line: Line,
        why: str,
        call: Call | None = None,
        before: Before | None = None,
        ref: TraceEvent | None = None,
    ) -> None:
        self.line, self.why, self.call, self.before, self.ref = line, why, call, before, ref
        super().__init__(why)


class _Buffer:
    """The look-ahead: lines read but not yet consumed, oldest first; events of the `skip`
    kinds are read (and counted in `skipped`) but never buffered."""

    def __init__(self, reader: TraceReader, skip: frozenset[str]) -> None:
        self.reader, self.skip = reader, skip
        self.lines: deque[Line] = deque()
        self.done = False
        self.skipped = 0
        self.read = 0  # lines read from the reader so far (skipped ones too)

    def peek(self, i: int) -> Line | None:
        lines = self.lines
        n = len(lines)
        if i < n:
            return lines[i]  # the common case: already read
        while n <= i and not self.done:
            try:
                line = next(self.reader)
            except StopIteration:
                self.done = True
                break
            self.read += 1
            if line.event.event in self.skip:
                self.skipped += 1
            else:
                lines.append(line)
                n += 1
        return lines[i] if i < n else None

    def pop(self) -> Line:
        return self.lines.popleft()


def plane_for(header: TraceHeader, lc: Lifecycle) -> ControlPlane:
    """The reference a trace with `header` replays on: its page size and capacities,
    invariants off (the replay runs them itself), each single-pool table a `RunIndexTable`
    (its choices, at a cost per page moved). A tier the header does not have gets one page
    (a page table of none is refused): no event can use it, since an event on a tier the
    header lacks is malformed. A tier declared with 0 pages gets one too."""
    caps = [max(header.capacities.get(t, 0), 1) for t in ("L1", "L2", "L3")]
    p = header.pools
    if not p:
        cp = ControlPlane(
            header.page_size, caps, check_mode="off", tracer=Tracer(ListSink()), lifecycle=lc
        )
        for table in cp.tables:  # the same pages, found without scanning the whole table
            RunIndexTable.adopt(table, log=False)
        return cp
    try:  # a pool group's plane: the preset, its policy and side capacities, as declared
        group = preset_group(str(p["group"]))
        return ControlPlane(
            header.page_size,
            caps,
            check_mode="off",
            tracer=Tracer(ListSink()),
            lifecycle=lc,
            pools=group,
            hit_policy=str(p.get("hit_policy", ALL_POOLS)),
            pool_capacities=p.get("capacities") or None,  # type: ignore[arg-type]
        )
    except ConfigError as e:
        raise Malformed(1, f"header pools: {e}") from None


def keyed_lifecycle(header: TraceHeader, lc: Lifecycle) -> Lifecycle:
    """`lc` with the guards a hash-keyed tier lifts lifted in the header's `hash_keyed_tiers`
    (spec/tree.md, "Hash-keyed tiers") and the rows of the header's `stacked_tiers` stacked
    ("Stacked ops"); `lc` itself for a header naming neither. Malformed (line 1) for a tier
    the tables do not let be either."""
    try:
        keyed = lc.hash_keyed(header.hash_keyed_tiers)
    except SpecError as e:
        raise Malformed(1, f"header hash_keyed_tiers: {e}") from None
    try:
        return keyed.stacked(header.stacked_tiers)
    except SpecError as e:
        raise Malformed(1, f"header stacked_tiers: {e}") from None


class Replay:
    """One trace's replay; `run` returns the number of events checked or raises Violation."""

    def __init__(
        self, reader: TraceReader, lc: Lifecycle, check_every: int, full: bool = False
    ) -> None:
        self.header = reader.header
        self.lc = keyed_lifecycle(self.header, lc)
        lc = self.lc
        self.cp = plane_for(self.header, lc)
        # Every step the executor takes here is walked through the tables' `transitions`
        # machine (tracewalk.py): a disagreement raises MachineDisagreement, a reference bug.
        walk(self.cp.tracer, lc)
        sink = self.cp.tracer.sink
        # Verify the plane's events reach our list, behind the walk.
        assert isinstance(sink, WalkSink) and isinstance(sink.inner, ListSink)
        self.sink = sink.inner
        self.compare = Comparer(self.cp, lc, self.header.omits)
        self.resolve = Resolver(
            self.cp, self.compare.nodes, "split" in self.header.omits, self.compare.pages
        )
        self.dropped = frozenset(e for o in self.header.omits for e in DROPPED_BY_OMIT.get(o, ()))
        self.buffer = _Buffer(reader, self.dropped)
        self.names = TraceNames(self.compare.nodes, self.compare.ops, self.compare.pages)
        self.checks = Checks(self.cp, check_every, full, self.names.violation)
        self.events = 0
        self.requests = 0  # begin_request events (counts, not sets: memory stays bounded)
        self.ops = 0

    def run(self) -> int:
        decide, execute = self.decide, self.execute
        while (decided := decide()) is not None:  # `step`, inline
            execute(*decided)
        return self.events + self.buffer.skipped

    def step(self) -> bool:
        """Replay the call the next events stand for; False when none is left (the trace
        ended, or only splits are left). Violation or Malformed at a bad event."""
        decided = self.decide()
        if decided is None:
            return False
        self.execute(*decided)
        return True

    def decide(self) -> tuple[Call, Line] | None:
        """The call the next events stand for and its first event, read but not run (the
        reference's state is as it was); None when none is left. `step` runs it."""
        lines = self.buffer.lines
        head = lines[0] if lines else self.buffer.peek(0)
        if head is None:
            return None
        try:
            call = decide(self.cp, self.buffer, self.resolve, self.compare.ops)
        except Ambiguous as e:
            raise Malformed(e.line.number, e.why, e.line.event.seq) from None
        except Unreplayable as e:
            raise Violation(
                e.line, f"not enabled: {e.why}", None, self._concerned(e.line)
            ) from None
        if call is None:  # only splits left: the trace stops inside a call
            while self.buffer.peek(0) is not None:
                self.buffer.pop()
                self.events += 1
            return None
        if call.alternative is not None and not self._emits_the_rest(call):
            call = call.alternative
        return call, head

    @property
    def consumed(self) -> int:
        """Event lines read and consumed (checked) so far: where the next call starts."""
        return self.buffer.read - len(self.buffer.lines)

    def _emits_the_rest(self, call: Call) -> bool:
        """Whether `call`, run on a copy of the reference (and of the id maps), emits the
        events the trace has left, each matching: how a run cut by the trace's end tells its
        call (`Call.alternative`). The copy is made once, at the end of a trace."""
        assert call.on is not None  # Verify: a call with an alternative can run on a copy.
        left: list[Line] = []
        while (line := self.buffer.peek(len(left))) is not None:
            left.append(line)
        plane, compare, sink = copy.deepcopy(
            (self.cp, self.compare, self.sink), {id(self.lc): self.lc}
        )
        sink.events.clear()
        try:
            call.on(plane)
            emitted = [ev for ev in sink.events if ev.event not in self.dropped]
            if not emitted:
                return False
            for ref, line in zip(_unbinding(sink.events, self.dropped, compare.nodes), left):
                compare.compare(ref, line.event)
        except (HiCacheError, Mismatch, DoubleOwnership):
            return False
        return True

    def _concerned(self, line: Line) -> Before:
        """The record of what an event names that the reference knows (its node, its
        request), for a report on an event no call could be found for."""
        ref = None if line.event.node is None else self.compare.nodes.to_ref.get(line.event.node)
        node = None if ref is None else self.cp.tree.get(ref)
        return Before.capture(self.cp, [] if node is None else [node], line.event.request)

    def execute(self, call: Call, head: Line) -> None:
        """Run `call`, whose first event is `head`, and compare and check what it emits."""
        before = Before.capture(self.cp, call.nodes, call.request)
        scope = (
            scope_before(self.cp, call.nodes, call.request, call.op)
            if self.checks.needs_scope
            else None
        )
        self.sink.events.clear()
        try:
            call.run()
        except InvariantViolation as e:
            said = "; ".join(self.names.violation(v) for v in e.violations)
            raise Violation(head, f"invariant: {said}", call, before) from None
        except IllegalTransition as e:
            # The call's own rule refused it: blame the event that stands for the call (an
            # end_request's unlocks before it were enabled), else the run's first event.
            blamed = head if call.blame is None else self.buffer.peek(call.blame) or head
            said = self.names.text(str(e))
            raise Violation(blamed, f"not enabled: {said}", call, before) from None
        except HiCacheError as e:
            raise Violation(head, f"not enabled: {self.names.text(str(e))}", call, before) from None
        events, dropped = self.sink.events, self.dropped
        emitted = [ev for ev in events if ev.event not in dropped] if dropped else events
        if not emitted:
            raise Violation(
                head,
                f"not enabled: the reference's {call.label} changes nothing here (emits no event)",
                call,
                before,
            )
        buffer, compare = self.buffer, self.compare
        for ref in _unbinding(events, dropped, compare.nodes) if dropped else events:
            line = buffer.lines[0] if buffer.lines else buffer.peek(0)
            if line is None:
                break  # the trace stops inside this call
            try:
                compare.compare(ref, line.event)
            except Mismatch as e:
                raise Violation(
                    line, f"differs from the reference: {e.why}", call, before, e.ref
                ) from None
            except DoubleOwnership as e:
                raise Violation(
                    line, f"invariant {e.invariant}: {e.why}", call, before, ref
                ) from None
            buffer.lines.popleft()
            self.events += 1
            name = ref.event
            if name == "begin_request":
                self.requests += 1
            elif ref is emitted[0] and ref.op is not None and name.endswith("_issue"):
                self.ops += 1
        compare.retire_ops()
        if scope is not None:
            scope.add(events)
            scope.add_holders(self.cp)
        found = self.checks.after(len(emitted), scope)
        if found:
            raise Violation(head, "invariant: " + "; ".join(found), call, before)


def _unbinding(
    events: Iterable[TraceEvent], dropped: frozenset[str], nodes: IdMap
) -> Iterator[TraceEvent]:
    """`events` without the kinds the trace omits, in order. A `node_remove` left out unbinds
    its node as the walk passes it -- after the call's events before it were compared, never
    before (they name the node) -- so a trace without `node_remove` (or `locks`) may name the
    id anew once the reference removed its node (spec/trace.md, "Partial traces")."""
    for ev in events:
        if ev.event not in dropped:
            yield ev
        elif ev.event == "node_remove" and ev.node is not None:
            nodes.drop_ref(ev.node)


def check_lines(
    lines: Iterable[str],
    *,
    check_every: int = 1,
    full_checks: bool = False,
    lifecycle: Lifecycle | None = None,
) -> Verdict:
    """Judge a trace (the header line first); streams, never holds the whole trace.

    `check_every` 1: the invariants after every call, incrementally on what it touched
    (`full_checks`: on the whole state); N > 1: on the whole state once every N events; 0:
    never. Returns the verdict (exit code 0 valid, 1 a violation, 2 malformed input); never
    raises on bad input."""
    lc = lifecycle or load_lifecycle()
    replay: Replay | None = None
    with own_heap():
        try:
            reader = TraceReader(lines, lc)
            replay = Replay(reader, lc, check_every, full_checks)
            n = replay.run()
        except (Malformed, Violation) as e:
            return rejected(replay, e)
        return accepted(replay, n, check_every)


def rejected(replay: Replay | None, e: Malformed | Violation) -> Verdict:
    """The verdict on a trace whose replay (None: not started, a bad header) raised `e`."""
    if isinstance(e, Malformed):
        events = 0 if replay is None else replay.events
        return Verdict(MALFORMED, events, e.seq, f"malformed: line {e.line}: {e.why}")
    assert replay is not None  # Verify: a violation comes from a replay.
    copy_of = _duplicate_copy(replay, e)
    if copy_of is not None:
        seq = e.line.event.seq
        return Verdict(
            UNJUDGED,
            replay.events,
            seq,
            f"unjudged from event {seq} on: it inserts a second L1 copy of node {copy_of}, "
            "which a load-back is filling; the header's duplicate_copies allows that "
            '(spec/tree.md, "Duplicate copies") and this reference holds one copy per page. '
            f"The {replay.events} events before it are valid.",
        )
    return Verdict(VIOLATION, replay.events, e.line.event.seq, _violation_text(replay, e))


def _duplicate_copy(replay: Replay, v: Violation) -> int | None:
    """The trace's id of the node event `v.line` inserts a second L1 copy of, when the header
    declares `duplicate_copies` and the reference refused an `insert` of a node whose L1 copy
    a load-back is filling (the reference stops a request's insert there: S5); else None."""
    ev = v.line.event
    if not replay.header.duplicate_copies or ev.event != "insert" or ev.node is None:
        return None
    ref = replay.compare.nodes.to_ref.get(ev.node)
    try:
        node = None if ref is None else replay.cp.tree.node(ref)
    except TreeError:
        return None
    filling = node is not None and node.state[0] == f"{Direction.H2D.value}_PENDING"
    return ev.node if filling else None


def accepted(replay: Replay, n: int, check_every: int) -> Verdict:
    """The verdict on a trace whose `n` events `replay` accepted, checked per `check_every`."""
    every = (
        "checked after every call"
        if check_every == 1
        else f"checked every {check_every} events"
        if check_every
        else "invariants not checked"
    )
    omitted = f"omits {', '.join(replay.header.omits)}" if replay.header.omits else "full trace"
    return Verdict(
        VALID,
        n,
        None,
        f"OK: {n} events, {replay.requests} requests, {replay.ops} ops, {every}; {omitted}",
    )


def _violation_text(replay: Replay, v: Violation) -> str:
    nodes, ops = replay.compare.nodes, replay.compare.ops
    out = [f"event {v.line.event.seq}: {v.line.text}", f"  why: {v.why}"]
    if v.ref is not None:
        out.append(f"  the reference emitted here (its own ids and pages): {v.ref.to_json()}")
    if v.call is not None:
        out.append(f"  the reference's call for it, in the trace's ids: {v.call.label}")
    if v.before is not None:
        out.append("  enabled before it:")
        out += [f"    {s}" for s in v.before.enabled(replay.lc, nodes, ops)] or [
            "    (nothing it concerns)"
        ]
        out.append("  state before it:")
        out += [f"    {s}" for s in v.before.state(nodes, ops)] or ["    (nothing it concerns)"]
    return "\n".join(out)
