"""Liveness, durability and efficiency: what the controller's fuzz machine judges beyond safety.

The invariants and the reference model judge every state the controller passes through; a
cache that never does what it promised -- deeper nodes that never reach L3, eviction out of
LRU order, a bad L3 copy never dropped, a write-back victim lost, a restore skipped -- passes
them all. These probes watch one controller (one `Liveness` per controller the adapter builds:
hicache/testing/adapters/controller.py) through its trace, its metrics and its tree, and judge
what it did against the spec. Each property is decidable from what the probes see:

    property                                  spec                           probe
    ----------------------------------------  -----------------------------  ------------------
    after a drain, what was owed is in L2/L3  policies.md, What a drain      backups.py
    or its drop was counted; every unbacked   guarantees; eviction.md, An
    L1 eviction counted once, by reason       L1 victim without an L2 copy
    each eviction loop's victims, in order,   eviction.md, One loop          evictions.py
    and how many
    a bad L3 copy gone by the end of the      restore.md, L3 faults; The     quarantine.py
    tick, unless a reader holds it            order of a controller's steps
    the restore offered is chosen and         policies.md, Restore           restores.py
    served, or a fallback says why; every     policies; restore.md, Stages
    fallback's reason allowed in its state    of a restore
    each counter grew by what the trace's     trace.md; controller/          counters.py
    events say (transfers' ends, evictions,   metrics.py
    invalidations, freed windows); none fell

A finding is a line the adapter's `check()` returns (the machine fails on it, naming the
property by its first two words: "backup undelivered", "eviction order", "quarantine kept",
"restore skipped", "counter", ...). A rank of a tensor-parallel cache gets the eviction,
backup and counter probes alone: its restores are agreed across ranks (spec/tp.md C1: the
hits, the choice, what every rank can serve) and so is a bad slot (C4: the first bad page any
rank found), which these one-controller rules do not model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from hicache.core.lifecycle import load_lifecycle
from hicache.core.trace import ListSink, TraceEvent
from hicache.testing.liveness.backups import BackupLedger
from hicache.testing.liveness.counters import CounterProbe
from hicache.testing.liveness.evictions import EvictionProbe
from hicache.testing.liveness.quarantine import Quarantine
from hicache.testing.liveness.restores import RestoreProbe

__all__ = ["Liveness", "ObservedSink"]


class ObservedSink(ListSink):
    """A `ListSink` that also hands each event, as it is emitted, to `observer`: what a
    dropped backup excuses depends on when its count grew (backups.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.observer: Callable[[TraceEvent], None] | None = None

    def emit(self, event: TraceEvent) -> None:
        self.events.append(event)
        if self.observer is not None:
            self.observer(event)


class Liveness:
    """The probes of one controller `ctl`, built with `setup` (the adapter's), its trace
    arriving through `sink`, each finding appended to `findings` (the adapter's: they outlive
    a restart). `tp`: the controller is one rank of a tensor-parallel cache, which gets the
    eviction and backup probes only (module docstring)."""

    def __init__(
        self, ctl: Any, setup: Any, sink: ObservedSink, findings: list[str], tp: bool = False
    ) -> None:
        self.findings = findings
        lifecycle = load_lifecycle()
        self.backups = BackupLedger(ctl, setup.write_policy, lifecycle, findings, tp)
        self.evictions = EvictionProbe(ctl.cp, lifecycle, findings)
        self.counters = CounterProbe(ctl, findings)
        self.quarantine = None if tp else Quarantine(ctl, findings)
        self.restores = (
            None if self.quarantine is None else RestoreProbe(ctl, setup, self.quarantine, findings)
        )
        sink.observer = self.event

    def event(self, e: TraceEvent) -> None:
        self.backups.event(e)
        self.counters.event(e)
        if self.restores is not None:
            self.restores.event(e)

    @contextlib.contextmanager
    def call(self, name: str, request_id: int | None = None) -> Iterator[None]:
        """Around one adapter call `name` ("submit", "prefill", "finish", "cancel_restore",
        "tick", "evict", "drain"; on `request_id`): what it starts from, then -- when it
        returns; a refusal or a crash is judged elsewhere -- what it did."""
        quarantine, restores = self.quarantine, self.restores
        flight = quarantine.in_flight() if quarantine is not None else {}
        before = restores.before() if restores is not None else None
        self.counters.inside = True
        try:
            yield
        finally:
            self.counters.inside = False
        if quarantine is not None:
            quarantine.after(name, flight)
        self.backups.after(name)
        self.counters.after(name)
        if restores is not None and before is not None:
            restores.after(name, request_id, before)
