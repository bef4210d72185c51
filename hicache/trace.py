"""Trace events: one per lifecycle transition, to a pluggable sink (spec/trace.md).

Emission costs nothing when no sink is installed: producers test `tracer.enabled` before they
build an event, so the disabled path is one attribute read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import IO, Protocol


@dataclass(frozen=True)
class TraceEvent:
    """One transition as it took effect. Field names are the NDJSON keys (spec/trace.schema.json).

    `event` is the transition's name from spec/lifecycle.toml (or one of the non-lifecycle
    events listed in spec/trace.md: `request_*`, `cached_len`, `split`, `lock`, `unlock`).
    """

    seq: int
    event: str
    tier: str | None = None
    node: int | None = None
    op: int | None = None
    request: int | None = None
    token_start: int | None = None  # logical pages, as a page-aligned token range
    token_end: int | None = None
    pages: tuple[int, ...] = ()  # physical pages of `tier` touched
    before: str | None = None  # composite state before / after (lifecycle events; none for a
    # duplicate request copy's compute/discard: spec/lifecycle.md, "Whose state a composite is")
    after: str | None = None
    detail: dict[str, object] = field(default_factory=dict)

    def to_json(self) -> str:
        """One NDJSON line: the fields that are set, keys sorted. Read field by field rather
        than through `dataclasses.asdict`, whose deep copy was most of the cost; `json` writes
        the same text either way (tuples as lists, `detail` as an object)."""
        d = {k: v for k in _FIELDS if (v := getattr(self, k)) not in (None, (), {})}
        if "pages" in d:
            d["pages"] = list(self.pages)
        return json.dumps(d, separators=(",", ":"), sort_keys=True)

    @staticmethod
    def from_json(line: str) -> "TraceEvent":
        d = json.loads(line)
        d["pages"] = tuple(d.get("pages", ()))
        return TraceEvent(**d)


_FIELDS = tuple(f.name for f in fields(TraceEvent))


class TraceSink(Protocol):
    def emit(self, event: TraceEvent) -> None: ...


class ListSink:
    """Keeps events in memory (tests, the trace checker)."""

    def __init__(self) -> None:
        self.events: list[TraceEvent] = []

    def emit(self, event: TraceEvent) -> None:
        self.events.append(event)


class NdjsonSink:
    """Writes one JSON object per line to a text stream."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def emit(self, event: TraceEvent) -> None:
        self.stream.write(event.to_json() + "\n")


class Tracer:
    """Numbers events and hands them to the sink, if any."""

    def __init__(self, sink: TraceSink | None = None) -> None:
        self.sink = sink
        self.seq = 0

    @property
    def enabled(self) -> bool:
        return self.sink is not None

    def emit(self, event: str, **fields: object) -> None:
        """Build and emit one event; call only when `enabled` (the caller's fast path)."""
        assert self.sink is not None, "emit() called with tracing disabled; test .enabled first"
        self.seq += 1
        self.sink.emit(TraceEvent(seq=self.seq, event=event, **fields))  # type: ignore[arg-type]
