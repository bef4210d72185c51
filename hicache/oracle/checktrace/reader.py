"""Reading a trace: the header, then one checked `TraceEvent` per line, streamed.

`TraceReader` turns lines (a file, stdin, a list) into `Line`s one at a time, never holding
more than the line it reads. It raises `Malformed` -- the checker's exit 2 -- for anything
that is not a well-formed trace (spec/trace.md):

    what                                       message names
    -----------------------------------------  --------------------------------------------
    a missing or bad header (first line)       the header field (TraceHeader.from_json)
    a line that is not JSON                    the parse error
    an event outside spec/trace.schema.json    the key and the rule (schema.EventSchema)
    an unknown event name                      the name
    `seq` not 1, 2, 3, ... (a gap, a repeat)   the seq expected
    an event on a tier the header lacks        the tier (e.g. an L3 event, no L3)

Blank lines are skipped (they carry nothing); line numbers count them, from 1 for the header.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from hicache.core.lifecycle import Lifecycle
from hicache.core.trace import (
    TraceEvent,
    TraceFormatError,
    TraceHeader,
    adopt_event,
    new_event,
)
from hicache.oracle.checktrace.schema import EventSchema, load_event_schema


class Malformed(Exception):
    """The input is not a trace this checker can read: `line` (1 = the header), the event's
    `seq` when it could be read, and what is wrong."""

    def __init__(self, line: int, why: str, seq: int | None = None) -> None:
        self.line, self.why, self.seq = line, why, seq
        super().__init__(f"line {line}: {why}")


class Line(NamedTuple):
    """One event line: its number in the input, its text (stripped), and the event
    (immutable; a named tuple, built once per line at a fraction of a frozen dataclass's
    cost)."""

    number: int
    text: str
    event: TraceEvent


_LINE = tuple.__new__  # `Line(...)` without the named tuple's Python-level __new__
_NEW_EVENT, _SET_DICT = object.__new__, object.__setattr__  # `adopt_event`'s two steps


def _number(text: str) -> int | float:
    """A JSON number with a fraction or exponent: an int when it is whole (JSON Schema's
    integers include 2.0), else a float."""
    value = float(text)
    return int(value) if value.is_integer() else value


_DECODER = json.JSONDecoder(parse_float=_number)
_SCAN = _DECODER.scan_once  # type: ignore[attr-defined]  # set by __init__; typeshed omits it


def parse_json(text: str) -> Any:
    """One JSON value; ValueError when `text` is not JSON. The decoder's scanner reads a
    value that fills the whole text at once; anything else (leading or trailing text, bad
    JSON) takes `decode`'s path, for its answer and its error message."""
    try:
        value, end = _SCAN(text, 0)
    except StopIteration:
        value, end = None, -1
    if end == len(text):
        return value
    return _DECODER.decode(text)


def absent_tier_events(lc: Lifecycle, tiers: tuple[str, ...]) -> dict[str, str]:
    """Event name -> the tier it needs that `tiers` lacks: a transition of a tier not in the
    header, or a transfer reading one (s2h_* reads L3)."""
    out: dict[str, str] = {}
    for t in lc.transitions.values():
        ends = [str(t.tier)] + ([str(t.direction.source)] if t.direction is not None else [])
        missing = [e for e in ends if e not in tiers]
        if missing:
            out[t.name] = missing[0]
    return out


class TraceReader:
    """Header first, then `Line`s; `Malformed` at the first bad line."""

    def __init__(
        self, lines: Iterable[str], lc: Lifecycle, schema: EventSchema | None = None
    ) -> None:
        self._lines = iter(lines)
        self.lifecycle = lc
        self.number = 0  # the last line read
        self.seq = 0  # the last event's seq
        self.header = self._read_header()
        self.schema = schema or load_event_schema(omits=self.header.omits)
        self._absent = absent_tier_events(lc, self.header.tiers)
        self._shapes = self.schema.shapes  # `EventSchema.shape`'s predicates, as compiled
        self._adopt = self.schema.keys_are_fields  # the schema holds every key to a field
        self._tiers = self.header.tiers

    @property
    def source(self) -> Iterator[str]:
        """The iterator the reader takes its lines from (a copy made with `copy.deepcopy`
        may be given another in its memo: it then reads that one)."""
        return self._lines

    def _next_text(self) -> str | None:
        for raw in self._lines:
            self.number += 1
            text = raw.strip()
            if text:
                return text
        return None

    def _read_header(self) -> TraceHeader:
        text = self._next_text()
        if text is not None:
            text = text.lstrip("\ufeff")  # a byte-order mark some editors write first
        if text is None:
            raise Malformed(
                max(self.number, 1),
                "empty input: a trace starts with its header line (spec/trace.md, Header)",
            )
        try:
            return TraceHeader.from_json(text)
        except TraceFormatError as e:
            raise Malformed(self.number, str(e)) from None

    def __iter__(self) -> Iterator[Line]:
        return self

    def __next__(self) -> Line:
        for raw in self._lines:  # `_next_text`, inline: a call per line saved
            self.number += 1
            text = raw.strip()
            if text:
                return self.parse(text)
        raise StopIteration

    def parse(self, text: str) -> Line:
        """Check one event line (JSON, schema, seq, tiers) and build its event."""
        n = self.number
        try:  # `parse_json`, inline
            try:
                d, end = _SCAN(text, 0)
            except StopIteration:
                d, end = None, -1
            if end != len(text):
                d = _DECODER.decode(text)
        except ValueError as e:
            raise Malformed(n, f"not JSON ({e})", None) from None
        if type(d) is dict:  # the common case: an event its name's fast predicate passes
            name = d.get("event")
            if type(name) is str:  # the predicate for its name and its keys in their order
                shape = (name, *d)
                fast = self._shapes.get(shape) or self.schema.shape(shape)
                if fast is not None and fast(d):
                    seq, tier = d.get("seq"), d.get("tier")
                    if (
                        seq == self.seq + 1
                        and name not in self._absent
                        and (tier is None or tier in self._tiers)
                    ):  # `_event`'s tests pass (inline): its event, built as `_event` does
                        self.seq = seq
                        if "pages" in d:
                            d["pages"] = tuple(d["pages"])
                        if self._adopt:  # `adopt_event(d)`, inline
                            if "detail" not in d:
                                d["detail"] = {}
                            ev = _NEW_EVENT(TraceEvent)
                            _SET_DICT(ev, "__dict__", d)
                        else:
                            ev = new_event(d, owned=True)
                        return _LINE(Line, (n, text, ev))
                    return self._event(n, text, d, name, seq)
        return self._checked(n, text, d)

    def _checked(self, n: int, text: str, d: Any) -> Line:
        """`parse`'s path for any value (Malformed naming the first thing wrong)."""
        seq = d.get("seq") if isinstance(d, dict) else None
        seq = seq if isinstance(seq, int) and not isinstance(seq, bool) else None
        name = d.get("event") if isinstance(d, dict) else None
        if isinstance(name, str) and name not in self.schema.by_event:
            raise Malformed(n, f"unknown event {name!r} (spec/trace.md lists the events)", seq)
        why = self.schema.check(d)
        if why is not None:
            raise Malformed(n, f"schema: {why}", seq)
        return self._event(n, text, d, name, seq)

    def _event(self, n: int, text: str, d: dict[str, Any], name: Any, seq: Any) -> Line:
        """The event of line `n`, whose value `d` the schema passed: its seq and tiers
        checked (Malformed else)."""
        if seq != self.seq + 1:
            raise Malformed(
                n,
                f"seq {seq} where {self.seq + 1} is due (seq starts at 1 and grows by "
                "1 per event: a line was lost, repeated or reordered)",
                seq,
            )
        missing = self._absent.get(name) if isinstance(name, str) else None
        tier = d.get("tier")
        if missing is None and tier is not None and tier not in self.header.tiers:
            missing = tier
        if missing is not None:
            raise Malformed(
                n,
                f"{name} needs tier {missing}, which the header's capacities "
                f"{list(self.header.tiers)} do not have",
                seq,
            )
        self.seq = seq
        if "pages" in d:
            d["pages"] = tuple(d["pages"])
        return Line(n, text, adopt_event(d) if self._adopt else new_event(d, owned=True))
