"""Trace events: one per lifecycle transition, to a pluggable sink (spec/trace.md).

Emission costs nothing when no sink is installed: producers test `tracer.enabled` before they
build an event, so the disabled path is one attribute read.

A trace file starts with its header (`TraceHeader`), and every public sink that writes one
writes the header first: `NdjsonSink(stream, header)` takes it, or gets it from the engine
its tracer serves (`Tracer.begin`: a `ControlPlane` hands its own over when it is built, so
`CacheController(config, tracer=Tracer(NdjsonSink(f)))` writes a file `hicache check-trace`
reads). An event reaching an `NdjsonSink` that has no header is refused (TraceFormatError).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import IO, Protocol

from hicache.core.tiers import MAX_PAGES

FORMAT = "hicache-trace"
"""The header's `format`: what makes the first line of a file a hicache trace."""

VERSION = 1
"""The trace format's version (spec/trace.md, "Header"). A reader refuses any other."""

HEADER_OMITS = ("pages", "states", "locks", "node_remove", "split")
"""What an engine may leave out of its trace (spec/trace.md, "Partial traces"): `pages` (the
physical pages), `states` (`before`/`after`), `locks` (`lock`/`unlock` events),
`node_remove` and `split` events."""


OMITTED_KEYS: dict[str, tuple[str, ...]] = {"pages": ("pages",), "states": ("before", "after")}
"""Header `omits` entry -> the event keys a trace that omits it leaves out."""

OMITTED_EVENTS: dict[str, tuple[str, ...]] = {
    "locks": ("lock", "unlock"),
    "node_remove": ("node_remove",),
    "split": ("split",),
}
"""Header `omits` entry -> the events a trace that omits it leaves out (spec/trace.md's
"Partial traces" table; every HEADER_OMITS entry is in exactly one of the two tables)."""


class TraceFormatError(ValueError):
    """A header line that is not a hicache trace header: the message names the field."""


@dataclass(frozen=True)
class TraceHeader:
    """The first line of an NDJSON trace (spec/trace.header.schema.json): what a reader needs
    to replay the events after it. `capacities` maps each tier the engine has -- `L1`, then
    `L2`, then `L3`, a prefix of that order -- to its page count; `omits` names the parts
    of HEADER_OMITS the engine does not emit; `geometry` (informative) describes one page's
    bytes (layers, heads, dtype, ...); `engine` names the writer. `pools` (a pool-group
    engine's; empty for one pool) names the group preset (`group`, spec/pools.toml), its hit
    policy (`hit_policy`) and the side pools' capacities where they differ from the anchor's
    times their ratio (`capacities`: tier -> pool -> pages): what the replay's plane needs.
    `hash_keyed_tiers` names the engine's tiers keyed by a chained hash of each page's prefix,
    each stored and evicted on its own (spec/tree.md, "Hash-keyed tiers"; empty: none).
    `stacked_tiers` names the tiers where the engine issues an op under its parent's pending
    op of the same direction, ending after it (spec/tree.md, "Stacked ops"; empty: none).
    `duplicate_copies`: the engine may hold a second L1 copy of a page a load-back is filling
    (spec/tree.md, "Duplicate copies"), which the reader does not model: it judges the trace
    up to the first such copy (exit code UNJUDGED)."""

    page_size: int
    capacities: Mapping[str, int]
    omits: tuple[str, ...] = ()
    geometry: Mapping[str, object] = field(default_factory=dict)
    engine: str = ""
    version: int = VERSION
    pools: Mapping[str, object] = field(default_factory=dict)
    hash_keyed_tiers: tuple[str, ...] = ()
    stacked_tiers: tuple[str, ...] = ()
    duplicate_copies: bool = False

    def __post_init__(self) -> None:
        tiers = sorted(self.capacities)
        if tiers != ["L1", "L2", "L3"][: len(tiers)] or not tiers:
            raise TraceFormatError(
                f"header capacities: tiers {list(self.capacities)} must be L1, L1+L2 or L1+L2+L3"
            )
        if list(self.capacities) != tiers:  # a JSON object's keys have no order: keep tier order
            object.__setattr__(self, "capacities", {t: self.capacities[t] for t in tiers})
        bad = {
            t: c
            for t, c in self.capacities.items()
            if not isinstance(c, int) or isinstance(c, bool) or not 0 <= c <= MAX_PAGES
        }
        if bad:
            raise TraceFormatError(
                f"header capacities: page counts must be integers in 0..{MAX_PAGES}, got {bad}"
            )
        if (
            not isinstance(self.page_size, int)
            or isinstance(self.page_size, bool)
            or self.page_size < 1
        ):
            raise TraceFormatError(f"header page_size: an integer >= 1, got {self.page_size!r}")
        unknown = [o for o in self.omits if o not in HEADER_OMITS]
        if unknown:
            raise TraceFormatError(f"header omits: {unknown} unknown; allowed {list(HEADER_OMITS)}")
        if len(set(self.omits)) != len(self.omits):
            raise TraceFormatError(f"header omits: {list(self.omits)} names a part twice")
        if not isinstance(self.engine, str):
            raise TraceFormatError(f"header engine: a string, got {self.engine!r}")
        if self.version != VERSION:
            raise TraceFormatError(
                f"header version {self.version!r}: this reader knows version {VERSION} only"
            )
        self._check_pools()
        if not isinstance(self.duplicate_copies, bool):
            raise TraceFormatError(
                f"header duplicate_copies: true or false, got {self.duplicate_copies!r}"
            )
        for key in ("hash_keyed_tiers", "stacked_tiers"):
            named = getattr(self, key)
            if len(set(named)) != len(named) or any(t not in self.capacities for t in named):
                raise TraceFormatError(
                    f"header {key}: {list(named)} must name tiers of capacities "
                    f"{list(self.capacities)}, each once"
                )

    def _check_pools(self) -> None:
        """`pools`' shape (its preset and policy are resolved by the reader's plane)."""
        p = self.pools
        if not p:
            return
        extra = sorted(set(p) - {"group", "hit_policy", "capacities"})
        if extra or not isinstance(p.get("group"), str):
            raise TraceFormatError(
                f"header pools: an object with a string 'group' and optional "
                f"'hit_policy' and 'capacities'; got {dict(p)!r}"
            )
        if not isinstance(p.get("hit_policy", ""), str):
            raise TraceFormatError(f"header pools.hit_policy: a string, got {p['hit_policy']!r}")
        caps = p.get("capacities", {})
        ok = isinstance(caps, dict) and all(
            t in self.capacities
            and isinstance(c, dict)
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in c.values())
            for t, c in caps.items()
        )
        if not ok:
            raise TraceFormatError(
                f"header pools.capacities: tier -> pool -> pages (integers >= "
                f"0) for tiers of capacities; got {caps!r}"
            )

    @property
    def tiers(self) -> tuple[str, ...]:
        return tuple(self.capacities)

    def to_json(self) -> str:
        d: dict[str, object] = {
            "format": FORMAT,
            "version": self.version,
            "page_size": self.page_size,
            "capacities": dict(self.capacities),
        }
        if self.omits:
            d["omits"] = list(self.omits)
        if self.geometry:
            d["geometry"] = dict(self.geometry)
        if self.engine:
            d["engine"] = self.engine
        if self.pools:
            d["pools"] = dict(self.pools)
        if self.hash_keyed_tiers:
            d["hash_keyed_tiers"] = list(self.hash_keyed_tiers)
        if self.stacked_tiers:
            d["stacked_tiers"] = list(self.stacked_tiers)
        if self.duplicate_copies:
            d["duplicate_copies"] = True
        return json.dumps(d, separators=(",", ":"), sort_keys=True)

    @staticmethod
    def from_json(line: str) -> TraceHeader:
        """Parse a header line; TraceFormatError naming what is wrong (also for bad JSON)."""
        try:
            d = json.loads(line)
        except ValueError as e:
            raise TraceFormatError(f"header: not JSON ({e})") from None
        if isinstance(d, dict) and "format" not in d and "event" in d:
            raise TraceFormatError(
                f"header: the first line is an event (seq {d.get('seq')!r}), not the header: a "
                f'trace starts with {{"format": "{FORMAT}", "version": {VERSION}, '
                '"page_size": ..., "capacities": {...}} (spec/trace.md, Header); NdjsonSink '
                "writes it when given the TraceHeader or put on a ControlPlane's tracer"
            )
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise TraceFormatError(
                f'header: the first line must be an object with "format": "{FORMAT}"'
            )
        extra = sorted(
            set(d)
            - {
                "format",
                "version",
                "page_size",
                "capacities",
                "omits",
                "geometry",
                "engine",
                "pools",
                "hash_keyed_tiers",
                "stacked_tiers",
                "duplicate_copies",
            }
        )
        if extra:
            raise TraceFormatError(f"header: unknown keys {extra}")
        for key in ("version", "page_size", "capacities"):
            if key not in d:
                raise TraceFormatError(f"header: {key!r} is missing")
        caps, omits, geometry = d["capacities"], d.get("omits", []), d.get("geometry", {})
        pools, keyed = d.get("pools", {}), d.get("hash_keyed_tiers", [])
        stacked = d.get("stacked_tiers", [])
        if (
            not isinstance(caps, dict)
            or not isinstance(omits, list)
            or not isinstance(keyed, list)
            or not isinstance(stacked, list)
            or not isinstance(geometry, dict)
            or not isinstance(pools, dict)
        ):
            raise TraceFormatError(
                "header: capacities, geometry and pools are objects, omits, "
                "hash_keyed_tiers and stacked_tiers lists"
            )
        return TraceHeader(
            page_size=d["page_size"],
            capacities=caps,
            omits=tuple(omits),
            geometry=geometry,
            engine=d.get("engine", ""),
            version=d["version"],
            pools=pools,
            hash_keyed_tiers=tuple(keyed),
            stacked_tiers=tuple(stacked),
            duplicate_copies=d.get("duplicate_copies", False),
        )


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
    def from_json(line: str) -> TraceEvent:
        d = json.loads(line)
        d["pages"] = tuple(d.get("pages", ()))
        return TraceEvent(**d)


_FIELDS = tuple(f.name for f in fields(TraceEvent))
_FIELD_SET = frozenset(_FIELDS)


def new_event(d: Mapping[str, object], *, owned: bool = False) -> TraceEvent:
    """`TraceEvent(**d)` without the frozen dataclass's per-field `__setattr__`: the same
    object at a third of the cost (events are built on every call). `d` holds `seq`, `event`
    and any other fields; an absent `detail` is a fresh {} (no event shares a mutable
    default); an absent field reads its default from the class, as the dataclass put it
    there. `owned`: `d` is a dict no one else holds (a call's keyword arguments, a line just
    parsed), which becomes the event's own (no copy). A key that is no field, or a missing
    `seq`/`event`, takes the constructor's path and its TypeError."""
    if not d.keys() <= _FIELD_SET or "seq" not in d or "event" not in d:
        return TraceEvent(**d)  # type: ignore[arg-type]
    event = object.__new__(TraceEvent)
    if owned and type(d) is dict:
        if "detail" not in d:
            d["detail"] = {}
        object.__setattr__(event, "__dict__", d)
    else:
        object.__setattr__(event, "__dict__", {"detail": {}, **d})
    return event


def adopt_event(d: dict[str, object]) -> TraceEvent:
    """`new_event(d, owned=True)` for a dict whose keys the caller has already held to
    `TraceEvent`'s fields, `seq` and `event` among them (the reader, under a schema that
    allows no other key and requires those two: `EventSchema.keys_are_fields`): no key
    test. An absent `detail` is a fresh {}."""
    if "detail" not in d:
        d["detail"] = {}
    event = object.__new__(TraceEvent)
    object.__setattr__(event, "__dict__", d)
    return event


class TraceSink(Protocol):
    def emit(self, event: TraceEvent) -> None: ...


class ListSink:
    """Keeps events in memory (tests, the trace checker)."""

    def __init__(self) -> None:
        self.events: list[TraceEvent] = []

    def emit(self, event: TraceEvent) -> None:
        self.events.append(event)


class NdjsonSink:
    """Writes one JSON object per line to a text stream: the trace's header first, then one
    line per event. The header is `header`, or the one the tracer hands over (`begin`) when
    the sink serves a `ControlPlane`'s tracer; `engine`, when given, names the writer in it."""

    def __init__(
        self, stream: IO[str], header: TraceHeader | None = None, engine: str = ""
    ) -> None:
        self.stream, self.engine = stream, engine
        self.header: TraceHeader | None = None
        if header is not None:
            self.begin(header)

    def begin(self, header: TraceHeader) -> None:
        """Write `header` as the first line, once (a sink that has one keeps it)."""
        if self.header is None:
            self.header = replace(header, engine=self.engine) if self.engine else header
            self.stream.write(self.header.to_json() + "\n")

    def emit(self, event: TraceEvent) -> None:
        if self.header is None:  # Verify the header leads: without it no reader can replay
            raise TraceFormatError(
                "NdjsonSink: an event before the trace's header; give NdjsonSink(stream, "
                "header) a TraceHeader, or put it on a ControlPlane's (or CacheController's) "
                "tracer, which hands the plane's header over (spec/trace.md, Header)"
            )
        self.stream.write(event.to_json() + "\n")


class Tracer:
    """Numbers events and hands them to the sink, if any; hands the sink the trace's header
    (`begin`) when the sink takes one, whichever of the two comes first."""

    def __init__(self, sink: TraceSink | None = None) -> None:
        self._sink = sink
        self.header: TraceHeader | None = None
        self.seq = 0

    @property
    def sink(self) -> TraceSink | None:
        return self._sink

    @sink.setter
    def sink(self, sink: TraceSink | None) -> None:
        self._sink = sink
        self._hand_over()

    @property
    def enabled(self) -> bool:
        return self._sink is not None

    def begin(self, header: TraceHeader) -> None:
        """The header of the trace this tracer writes (the engine it serves calls this when
        built: ControlPlane); a sink that takes a header (`begin`) gets it now or when set."""
        self.header = header
        self._hand_over()

    def _hand_over(self) -> None:
        take = getattr(self._sink, "begin", None)
        if self.header is not None and callable(take):
            take(self.header)

    def emit(self, event: str, **fields: object) -> None:
        """Build and emit one event; call only when `enabled` (the caller's fast path)."""
        assert self._sink is not None, "emit() called with tracing disabled; test .enabled first"
        self.seq += 1  # R75: 1, 2, ... with no gap, so a reader detects a lost line
        fields["seq"], fields["event"] = self.seq, event
        self._sink.emit(new_event(fields, owned=True))

    def emit_fields(self, fields: dict[str, object]) -> None:
        """`emit(fields["event"], **the rest)` for a dict the caller built for this call and
        gives away, whose keys are written out as `TraceEvent` fields other than `seq` (the
        control plane's events, the executor's one per segment): the event takes the dict as
        it is, without `new_event`'s key test; an absent `detail` is a fresh {}. Call only
        when `enabled`."""
        assert self._sink is not None, "emit() called with tracing disabled; test .enabled first"
        self.seq += 1  # R75: 1, 2, ... with no gap, so a reader detects a lost line
        fields["seq"] = self.seq
        if "detail" not in fields:
            fields["detail"] = {}
        event = object.__new__(TraceEvent)
        object.__setattr__(event, "__dict__", fields)
        self._sink.emit(event)
