"""The fuzz judges the walk: a run's trace is a walk, and no walk continues some corruptions.

The walk (hicache/core/tracewalk.py: every traced step through the `transitions` machine built
from the lifecycle tables, and each node's states continued from event to event) judges the
fuzz's planes live, as they emit. A walk that stopped judging something would never show
there: the reference's events are right. So the self-check (hicache/testing/selfcheck.py)
also walks each engine's trace as written -- it must be a walk -- and, for each corruption
of the catalogue (hicache/oracle/checktrace/illegal.py) that no walk can continue, requires
`first_break` to find the break. Which edits break every walk BY CONSTRUCTION, given that
the trace before the edit is one (a node's walk continues where its previous event left it,
and a row's `after` is the one its machine reaches from `before`; a node's "next event" is
the next that moves its walk: a state event on it, or its removal -- a lock, an unlock, a
split, or an event on a request's copy (`compute`, `discard`: the node as a contender sees
it) leaves its states as they are; the edits below never touch a copy event either, since a
copy repeated or changed may be another contender's):

    edit         where                                            the walk breaks at
    -----------  -----------------------------------------------  -----------------------------
    before       a state event whose node has an earlier one      the edited event: not where
                                                                  the node's walk left it
    after        a state event whose node has a next event        the edited event (the row
                                                                  leads elsewhere) or the next
    duplicated   a state event that changes the node's state      the copy: the node left
                                                                  `before` already
    dropped      the same, when the node has an earlier and a     that next event: the node is
                 next event                                       still in the dropped `before`

A node's walk starts where its first event says (an insert publishes a request's private
pages: its node starts at `L1_PRIVATE`), so an edit that removes or changes a node's first
event may leave a walk. Every other edit (pages, ids, ops, token ranges, format) is outside
what the walk reads, and these kinds elsewhere (a copy event, a node's first event) may be a
walk too: those are judged by check-trace alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from hicache.core.lifecycle import load_lifecycle
from hicache.core.pagemachine import page_machine
from hicache.core.trace import TraceEvent
from hicache.core.tracewalk import NonEdge, acts_on_copy, first_break
from hicache.oracle.checktrace.illegal import Edited

REMOVE = "node_remove"
"""The topology event that ends a node's walk (`node_remove` needs it all-ABSENT)."""
WALK_EDITS = ("before", "after", "duplicated", "dropped")
"""The catalogue's edits that can break every walk (the module docstring says where). Not
`reordered`: the events of a run it swaps are about different nodes (a chain's, an
eviction's and its removal), so each node's walk is unchanged."""


@cache
def _copy_events() -> frozenset[str]:
    """The rows that act on a request's copy, never a node (`compute`, `discard`): their
    events show the node as a contender sees it and leave its walk where it was."""
    rows = page_machine(load_lifecycle().tables).rows
    return frozenset(name for name, row in rows.items() if acts_on_copy(row))


def _states(e: TraceEvent) -> bool:
    """Whether `e` moves its node's walk: a state event of a row that writes the node."""
    return (
        e.node is not None
        and e.before is not None
        and e.after is not None
        and e.event not in _copy_events()
    )


def _next_on_node(events: Sequence[TraceEvent], i: int) -> TraceEvent | None:
    """The node's next event after index `i` (the module docstring's: one that moves the
    walk of `events[i]`'s node), or None."""
    node = events[i].node
    moves = (e for e in events[i + 1 :] if e.node == node and (_states(e) or e.event == REMOVE))
    return next(moves, None)


def must_break(events: Sequence[TraceEvent], ed: Edited) -> bool:
    """Whether edit `ed` of `events` (a walk) leaves a trace no walk continues (table above)."""
    if ed.kind not in WALK_EDITS or ed.at >= len(events):
        return False
    e = events[ed.at]
    if not _states(e):
        return False
    walked = any(x.node == e.node and _states(x) for x in events[: ed.at])
    if ed.kind == "before":
        return walked
    if ed.kind == "after":
        return _next_on_node(events, ed.at) is not None
    changes = e.before != e.after
    if ed.kind == "duplicated":
        return changes
    # dropped: a node's first event may start its walk anywhere (an insert)
    return changes and walked and _next_on_node(events, ed.at) is not None


def walk_edited(events: Sequence[TraceEvent], ed: Edited, tail: Sequence[str]) -> NonEdge | None:
    """`first_break` of `events` with edit `ed` applied: the events before its first changed
    line, then `tail` (the edited lines from there on, as `ed.tail` gave them)."""
    edited = [*events[: ed.first], *(TraceEvent.from_json(line) for line in tail)]
    return first_break(edited)
