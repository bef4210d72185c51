"""A valid trace as the catalogue of illegal edits reads it (hicache/oracle/checktrace/illegal.py).

`Trace` holds a trace's events and lines, the ids and pages it uses, the state before each
event (`StateBefore`: live nodes, owned pages per tier, pending ops) and each event's *run*:
the events of one call as the trace has them, and whether the state before it fixes them
(illegal.py's docstring says which runs are determined, and why that matters to an edit).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from hicache.core.lifecycle import Lifecycle, load_lifecycle
from hicache.core.trace import TraceEvent
from hicache.oracle.checktrace.compare import ownership_ops

ENDS = ("complete", "fail", "cancel")


class Trace:
    """A valid trace's events and lines, what an edit reads: the ids and pages it uses, the
    state before each event (live nodes, owned pages, pending ops), its runs."""

    def __init__(
        self, events: Sequence[TraceEvent], page_size: int, lc: Lifecycle | None = None
    ) -> None:
        self.events = list(events)
        self.lines = [e.to_json() for e in self.events]
        self.page_size = page_size
        lc = lc or load_lifecycle()
        self.ownership = ownership_ops(lc)
        self.states = sorted(c.name for c in lc.composites)
        nodes = [e.node for e in self.events if e.node is not None]
        nodes += [u for e in self.events if isinstance(u := e.detail.get("upper"), int)]
        self.fresh_node = max(nodes, default=0) + 1
        self.fresh_op = max((e.op for e in self.events if e.op is not None), default=0) + 1
        self.fresh_page = max((max(e.pages) for e in self.events if e.pages), default=0) + 1
        self.runs = _runs(self.events)

    def states_before(self, start: int) -> Iterator[tuple[int, StateBefore]]:
        """(index, the state before that event) for each event from `start` on, then from 0
        up to `start` (the search wraps around); each state is good until the next is read."""
        state = StateBefore()
        for i, e in enumerate(self.events):
            if i >= start:
                yield i, state
            state.advance(e, self.ownership)
        state = StateBefore()
        for i, e in enumerate(self.events[:start]):
            yield i, state
            state.advance(e, self.ownership)


class StateBefore:
    """What the events before one have left: live node ids, owned pages per tier, pending
    ops."""

    def __init__(self) -> None:
        self.live: set[int] = set()
        self.owned: dict[str, set[int]] = {"L1": set(), "L2": set(), "L3": set()}
        self.pending: set[int] = set()

    def advance(self, e: TraceEvent, ownership: dict[str, str]) -> None:
        if e.node is not None:
            self.live.add(e.node)
        upper = e.detail.get("upper") if e.event == "split" else None
        if isinstance(upper, int):
            self.live.add(upper)
        if e.event == "node_remove" and e.node is not None:
            self.live.discard(e.node)
        op = ownership.get(e.event)
        if op == "reserve" and e.tier is not None:
            self.owned[e.tier].update(e.pages)
        elif op in ("release", "free") and e.tier is not None:
            self.owned[e.tier].difference_update(e.pages)
        if e.op is not None:
            if e.event.endswith("_issue"):
                self.pending.add(e.op)
            else:
                self.pending.discard(e.op)


def is_end(e: TraceEvent) -> bool:
    return e.op is not None and e.event.rsplit("_", 1)[-1] in ENDS


def _runs(events: Sequence[TraceEvent]) -> list[tuple[int, int, bool]]:
    """Per event, its run (start, stop, determined): the module docstring's determined runs,
    an issue's or a compute's events (not determined), else a run of one (not determined)."""
    out = [(i, i + 1, False) for i in range(len(events))]
    i = 0
    while i < len(events):
        stop, determined = _run_at(events, i)
        for k in range(i, stop):
            out[k] = (i, stop, determined)
        i = stop
    return out


def _run_at(events: Sequence[TraceEvent], i: int) -> tuple[int, bool]:
    """The run starting at event `i`: its stop and whether it is determined."""
    e, n = events[i], len(events)
    j = i + 1
    if is_end(e):
        while j < n and is_end(events[j]) and events[j].op == e.op:
            j += 1
        return j, True
    if e.event.endswith("_issue") or e.event == "compute":
        while j < n and (events[j].event, events[j].op, events[j].request) == (
            e.event,
            e.op,
            e.request,
        ):
            j += 1
        return j, False
    if e.event.startswith("evict_") or e.event == "invalidate_l3":
        if j < n and events[j].event == "node_remove" and events[j].node == e.node:
            j += 1
        return j, True
    k = i
    while k < n and events[k].event == "split":  # splits lead a match or an insert
        k += 1
    if k < n and events[k].event == "begin_request":
        j = k + 1
        if j < n and events[j].event == "cached_len" and events[j].request == events[k].request:
            j += 1
        return j, True
    if k < n and events[k].event in ("insert", "discard", "revive", "unlock"):
        return _insert_or_end(events, i, k)
    return i + 1, False


def _insert_or_end(events: Sequence[TraceEvent], i: int, k: int) -> tuple[int, bool]:
    """From `i` (splits up to `k`): an insert's events and then its cached_len (or whatever
    follows them), or unlocks, discards and node_removes ending at end_request."""
    r, n = events[k].request, len(events)
    j = k
    while j < n and (
        (events[j].event in ("insert", "discard", "revive", "unlock") and events[j].request == r)
        or events[j].event == "node_remove"
    ):
        j += 1
    inserted = all(events[m].event in ("insert", "discard", "revive") for m in range(k, j))
    last = events[j] if j < n else None
    if last is not None and last.request == r and last.event == "end_request":
        return j + 1, True
    if not inserted:
        return i + 1, False  # unlocks (unpins: which pins is the engine's choice)
    if last is not None and last.event == "cached_len" and last.request == r and last.node is None:
        return j + 1, True
    return j, True
