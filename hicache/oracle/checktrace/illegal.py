"""The catalogue of illegal edits: one valid trace, changed so that no engine could have written it.

`hicache fuzz` judges its oracle with these (hicache/testing/selfcheck.py): every run's trace
must pass check-trace, and the same trace with one edit of this catalogue at a drawn event
must not. Each edit is illegal BY CONSTRUCTION -- it breaks a rule of spec/trace.md (or an
invariant it names) whatever the rest of the trace holds -- and applies only where that is
so: a choice the engine makes freely (which node to evict or back up, an op's or a new
node's id, a fresh page a reserve takes, which pins to release, a whole call left out, a
trace cut anywhere) is never edited, since another engine may have chosen otherwise.

    edit             at (an event of the trace)       the edit              the rule it breaks
    ---------------  -------------------------------  --------------------  ----------------------
    pages-freed      evict_lN, invalidate_l3          one page -> one the   an event's pages are
    pages-released   discard, *_fail, *_cancel        trace holds else-     those its ownership
    pages-published  insert, *_complete               where, or one it      effect moves: the ones
                                                      never reserved        reserved for it
    pages-reserved   compute, *_issue                 one page -> one       I1: a reserve takes
                                                      still owned, or       free pages
                                                      named twice
    pages-reordered  a free, release or publish of    two pages swapped     pages in token order
                     2+ pages
    node-second-id   an end, insert, discard,         the node -> an id     a live node has one
                     compute, split, node_remove,     never used            id (bound where the
                     revive on a live node                                  node was created)
    node-unknown     an eviction, issue, lock,        the node -> an id     a node is introduced
                     unlock, tombstone, cached_len    never used            by the event that
                     on a live node                                         creates it
    node-swapped     node-second-id's events, an      the node -> another   the call decides the
                     eviction or tombstone (their     live node's id        node (its op, its
                     pages name the node)                                   request, its pages)
    before, after    an event with `before`/`after`   another composite     the state the call
                                                      state                 finds / leaves
    op-ended         *_complete, *_fail, *_cancel     the op -> an id       rule 4: an end names
                                                      never issued          the op issued
    op-other         the same, another op pending     the op -> that op's   rule 4: its own nodes
    token-range      an event with a token range      moved by a page       the node's range
    dropped          an event of a determined run,    removed               rules 2, 4: a call
                     not its last                                           emits all its events
    duplicated       a lifecycle event, begin_/end_   written twice         rule 3: a transition
                     request, split, node_remove                            takes effect once
    reordered        two different adjacent events    swapped               rule 2: parent first,
                     of a run (determined, issue,                           token order, the
                     compute), not two unlocks                              call's own order
    seq-repeated     any event                        its line twice, the   rule 1 (malformed)
                                                      same seq
    key-dropped      a lifecycle event                its `tier` removed    the schema (malformed)

A run is a call's events as the trace has them; a *determined* run is one whose events the
state before it fixes: an op's ends (one op), an eviction and the `node_remove` after it, the
splits, `begin_request` and `cached_len` of an admission, an insert's events and its
`cached_len`, and the `unlock`s, `discard`s and `node_remove`s that end at `end_request`.
A run's last event is never dropped: at the trace's end that is a legal cut (a trace may
stop anywhere), and before another call's events the rest may read as other legal calls (an
insert that only discards, its `cached_len` left out, reads as the `end_request` after it);
an issue's or a compute's last event left out is a shorter chain or computation, legal, so
those runs are only reordered; two `unlock`s
swapped are two `unpin`s in the other order, legal. A duplicated `cached_len`, `lock`,
`unlock` or `tombstone` may be a second legal call; those are not duplicated.

`edit(trace, kind, at, salt)` applies `kind` at the first event from index `at` on where it
applies (wrapping around; None where it applies nowhere); `salt` picks among the choices
(which page, which state, which id). Seqs after an inserted or removed event are renumbered,
as the broken engine would have numbered them; only `seq-repeated` keeps them.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from hicache.core.trace import TraceEvent
from hicache.oracle.checktrace.traceview import StateBefore, Trace, is_end

FREES = {"free"}
RELEASES = {"release"}
PUBLISHES = {"publish"}
COMPARED_NODE = ("insert", "discard", "compute", "split", "node_remove", "revive")
"""Events whose node the reference's call emits and the replay compares through its id map
(an op's end events too): a second id for a live node is the map's to refuse."""
RESOLVED_NODE = ("lock", "unlock", "tombstone", "cached_len")
"""Events whose node the replay resolves to find the call (evictions and issues too)."""
DUPLICABLE = ("begin_request", "end_request", "split", "node_remove")
"""Non-lifecycle events that cannot take effect twice (every lifecycle event cannot either)."""


@dataclass(frozen=True)
class Edited:
    """One edit of a trace: its `kind`, the event it edits (`at`, an index of the trace's
    events), the first event line that differs (`first`), the edited lines from there on
    (`tail`, lazily renumbered), a line saying `what` changed, and whether the edit breaks
    the format (`malformed`: check-trace's exit 2) rather than a rule (exit 1)."""

    kind: str
    at: int
    first: int
    tail: Iterator[str] = field(repr=False, compare=False)
    what: str
    malformed: bool = False


def _line(d: dict[str, object]) -> str:
    return json.dumps(d, separators=(",", ":"), sort_keys=True)


def _renumbered(lines: Sequence[str], start: int, delta: int) -> Iterator[str]:
    """`lines[start:]` with each seq moved by `delta` (read lazily: a replay stops early)."""
    for text in lines[start:]:
        d = json.loads(text)
        d["seq"] += delta
        yield _line(d)


# -- the edits -----------------------------------------------------------------------------

Edit = Callable[["Trace", int, StateBefore, random.Random], "Edited | None"]


def _changed(trace: Trace, kind: str, i: int, d: dict[str, object], what: str) -> Edited:
    """Event i's line replaced by `d`'s: the lines after it as they were."""
    tail = iter([_line(d), *trace.lines[i + 1 :]])
    return Edited(kind, i, i, tail, what)


def _fields(trace: Trace, i: int) -> dict[str, object]:
    d: dict[str, object] = json.loads(trace.lines[i])
    return d


def _pages(effects: set[str]) -> Edit:
    def edit(trace: Trace, i: int, before: StateBefore, rng: random.Random) -> Edited | None:
        e = trace.events[i]
        if trace.ownership.get(e.event) not in effects or not e.pages or e.tier is None:
            return None
        k = rng.randrange(len(e.pages))
        held = sorted(before.owned[e.tier] - set(e.pages))
        other = rng.choice(held) if held and rng.random() < 0.5 else trace.fresh_page
        d = _fields(trace, i)
        d["pages"] = [*e.pages[:k], other, *e.pages[k + 1 :]]
        return _changed(trace, "", i, d, f"page {e.pages[k]} -> {other}")

    return edit


def _reserved(trace: Trace, i: int, before: StateBefore, rng: random.Random) -> Edited | None:
    e = trace.events[i]
    if trace.ownership.get(e.event) != "reserve" or not e.pages or e.tier is None:
        return None
    k = rng.randrange(len(e.pages))
    owned = sorted(before.owned[e.tier] - set(e.pages))  # still owned: I1
    twice = [p for j, p in enumerate(e.pages) if j != k]  # named twice: I1
    choices = owned + twice
    if not choices:
        return None
    other = rng.choice(choices)
    d = _fields(trace, i)
    d["pages"] = [*e.pages[:k], other, *e.pages[k + 1 :]]
    why = "still owned" if other in owned else "named twice"
    return _changed(trace, "", i, d, f"page {e.pages[k]} -> {other} ({why})")


def _reordered_pages(
    trace: Trace, i: int, before: StateBefore, rng: random.Random
) -> Edited | None:
    e = trace.events[i]
    if trace.ownership.get(e.event) not in ("publish", "release", "free"):
        return None
    if len(set(e.pages)) < 2:
        return None
    a = rng.randrange(len(e.pages) - 1)
    b = next(j for j in range(a + 1, len(e.pages)) if e.pages[j] != e.pages[a])
    pages = list(e.pages)
    pages[a], pages[b] = pages[b], pages[a]
    d = _fields(trace, i)
    d["pages"] = pages
    return _changed(trace, "", i, d, f"pages {list(e.pages)} -> {pages}")


def _id_changed(
    trace: Trace,
    i: int,
    key: str,
    was: int,
    others: set[int] | None,
    fresh: int,
    rng: random.Random,
) -> Edited | None:
    """Event i's `key` id `was` replaced by another of `others` (None: by an id never used,
    `fresh` or one of the next few); None when `others` holds no other."""
    if others is None:
        other = fresh + rng.randrange(8)
    else:
        choices = sorted(others - {was})
        if not choices:
            return None
        other = rng.choice(choices)
    d = _fields(trace, i)
    d[key] = other
    return _changed(trace, "", i, d, f"{key} {was} -> {other}")


def _node(kinds: Callable[[TraceEvent], bool], swap: bool) -> Edit:
    def edit(trace: Trace, i: int, before: StateBefore, rng: random.Random) -> Edited | None:
        e = trace.events[i]
        if e.node is None or e.node not in before.live or not kinds(e):
            return None
        others = before.live if swap else None
        return _id_changed(trace, i, "node", e.node, others, trace.fresh_node, rng)

    return edit


def _compared(e: TraceEvent) -> bool:
    return is_end(e) or e.event in COMPARED_NODE


def _resolved(e: TraceEvent) -> bool:
    return (
        e.event.startswith("evict_")
        or e.event in ("invalidate_l3", *RESOLVED_NODE)
        or e.event.endswith("_issue")
    )


def _tied(e: TraceEvent) -> bool:
    """Events whose node the call decides: its op, its request's pages, or its own pages."""
    return _compared(e) or e.event.startswith("evict_") or e.event in ("invalidate_l3", "tombstone")


def _state(key: str) -> Edit:
    def edit(trace: Trace, i: int, before: StateBefore, rng: random.Random) -> Edited | None:
        was = getattr(trace.events[i], key)
        if was is None:
            return None
        other = rng.choice([s for s in trace.states if s != was])
        d = _fields(trace, i)
        d[key] = other
        return _changed(trace, "", i, d, f"{key} {was} -> {other}")

    return edit


def _op(other_pending: bool) -> Edit:
    def edit(trace: Trace, i: int, before: StateBefore, rng: random.Random) -> Edited | None:
        e = trace.events[i]
        if not is_end(e):
            return None
        assert e.op is not None  # Verify: an end names its op.
        others = before.pending if other_pending else None
        return _id_changed(trace, i, "op", e.op, others, trace.fresh_op, rng)

    return edit


def _token_range(trace: Trace, i: int, before: StateBefore, rng: random.Random) -> Edited | None:
    e = trace.events[i]
    if e.token_end is None:
        return None
    d = _fields(trace, i)
    d["token_end"] = e.token_end + trace.page_size
    if e.token_start is not None:
        d["token_start"] = e.token_start + trace.page_size
    return _changed(trace, "", i, d, f"token range moved {trace.page_size} tokens on")


def _dropped(trace: Trace, i: int, before: StateBefore, rng: random.Random) -> Edited | None:
    _, stop, determined = trace.runs[i]
    if not determined or i + 1 >= stop:
        return None  # a run's last event left out may leave another legal call
    return Edited("", i, i, _renumbered(trace.lines, i + 1, -1), "event removed")


def _duplicated(trace: Trace, i: int, before: StateBefore, rng: random.Random) -> Edited | None:
    e = trace.events[i]
    if e.event not in trace.ownership and e.event not in DUPLICABLE:
        return None
    d = _fields(trace, i)
    d["seq"] = e.seq + 1
    tail = iter([_line(d), *_renumbered(trace.lines, i + 1, 1)])
    return Edited("", i, i + 1, tail, "event written twice")


def _reordered(trace: Trace, i: int, before: StateBefore, rng: random.Random) -> Edited | None:
    start, stop, _ = trace.runs[i]
    if i + 1 >= stop or stop - start < 2:
        return None
    a, b = trace.events[i], trace.events[i + 1]
    first, second = _fields(trace, i + 1), _fields(trace, i)
    first["seq"], second["seq"] = a.seq, b.seq
    if a.event == b.event == "unlock" or first == {**second, "seq": a.seq}:
        return None  # two unpins, in either order legal; or the same event twice
    tail = iter([_line(first), _line(second), *trace.lines[i + 2 :]])
    return Edited("", i, i, tail, f"{a.event} and the {b.event} after it swapped")


def _seq_repeated(trace: Trace, i: int, before: StateBefore, rng: random.Random) -> Edited | None:
    tail = iter([trace.lines[i], *trace.lines[i + 1 :]])
    return Edited("", i, i + 1, tail, "the line written twice, its seq unchanged", True)


def _key_dropped(trace: Trace, i: int, before: StateBefore, rng: random.Random) -> Edited | None:
    if trace.events[i].event not in trace.ownership:
        return None
    d = _fields(trace, i)
    del d["tier"]
    edited = _changed(trace, "", i, d, "its tier removed")
    return Edited("", i, i, edited.tail, edited.what, True)


CATALOGUE: dict[str, Edit] = {
    "pages-freed": _pages(FREES),
    "pages-released": _pages(RELEASES),
    "pages-published": _pages(PUBLISHES),
    "pages-reserved": _reserved,
    "pages-reordered": _reordered_pages,
    "node-second-id": _node(_compared, swap=False),
    "node-unknown": _node(_resolved, swap=False),
    "node-swapped": _node(_tied, swap=True),
    "before": _state("before"),
    "after": _state("after"),
    "op-ended": _op(other_pending=False),
    "op-other": _op(other_pending=True),
    "token-range": _token_range,
    "dropped": _dropped,
    "duplicated": _duplicated,
    "reordered": _reordered,
    "seq-repeated": _seq_repeated,
    "key-dropped": _key_dropped,
}
"""Every edit of the module docstring's table, by name (the order `hicache fuzz` draws from)."""


def edit(trace: Trace, kind: str, at: int, salt: int) -> Edited | None:
    """`kind` applied at the first event from index `at` on where it applies (wrapping
    around), its choices drawn from `salt`; None when it applies to no event of `trace`."""
    change = CATALOGUE[kind]
    rng = random.Random(salt)
    for i, before in trace.states_before(at % max(len(trace.events), 1)):
        found = change(trace, i, before, rng)
        if found is not None:
            return Edited(kind, found.at, found.first, found.tail, found.what, found.malformed)
    return None
