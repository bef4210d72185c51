"""The controller's counters against the trace events that move them.

A counter that counts wrong passes every other probe: the invariants and the reference judge
the cache's state, and the metrics are no part of it. Each counter here moves with events
the trace names exactly, so after every adapter call each one's growth since the probe began
must equal what the trace says happened (spec/trace.md names the events; the metrics'
module docstring, hicache/controller/metrics.py, the counters):

    counter                                  the trace's events since the probe began
    ---------------------------------------  -------------------------------------------------
    transfers_done_total{d}                  ops of direction d whose nodes ended `<d>_complete`
    transfers_failed_total{d}                ... with a `<d>_fail` (an S2H that stopped part
                                             way is failed though the nodes it kept complete;
                                             when it kept every node, the trace shows only
                                             `s2h_complete`: so an S2H traced complete may
                                             count as failed, never the other way)
    transfers_cancelled_total{d}             ... with a `<d>_cancel`
    evicted_pages_total{L1}                  pages of `evict_l1` (every L1 eviction is the
                                             controller's make-room, pressure)
    evicted_pages_total{L3} +                pages of `evict_l3` (pressure, or the healthy
    l3_invalidated_pages_total{below_bad_slot}  copies below a bad one, dropped first)
    the other l3_invalidated_pages_total     pages of `invalidate_l3`
    window_freed_pages_total                 pages of `tombstone` inside a controller call
                                             (the fuzz also frees windows itself, between
                                             calls, as window pressure would: not counted)
    prompt_tokens_total                      `tokens` of every `begin_request` (an admission)
    evicted_pages_total{L2}                  at most the pages of `evict_l2` (without
                                             promotion a restore also gives up L2 copies it
                                             promoted, R42: not pressure, not counted)

and every counter of the metrics' summary -- these and the rest (hits, drops, fallbacks,
seconds, ...; not the derived `token_shares` and `gib_per_s`) -- only grows (the metrics'
contract), from 0 in a new controller. A mismatch is a finding, "counter <name>: ...".
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hicache.core.tiers import Direction
from hicache.core.trace import TraceEvent

OUTCOMES = ("cancel", "fail", "complete")  # an op's outcome: the first of these it has
STATS = {"complete": "count", "fail": "failed", "cancel": "cancelled"}
PRESSURE_L3 = "below_bad_slot"  # the invalidation reason traced as `evict_l3`


class CounterProbe:
    """The counters of one controller `ctl` against its trace (module docstring)."""

    def __init__(self, ctl: Any, findings: list[str]) -> None:
        self.metrics = ctl.metrics
        self.findings = findings
        self.start = self._counters()
        self.last = _flat(self.metrics.summary())
        started = {k: v for k, v in self.last.items() if v}
        if started:
            findings.append(f"counter start: a new controller's counters are not 0: {started}")
        self.ends: dict[tuple[str, int], set[str]] = {}  # (direction, op) -> outcome events
        self.tallies: Counter[str] = Counter()  # event name -> pages (prompt tokens: tokens)
        self.inside = False  # in a controller call (`Liveness.call` says)

    def event(self, e: TraceEvent) -> None:
        name = e.event
        if name == "tombstone" and not self.inside:
            return  # the fuzz's own (module docstring)
        if name.startswith(("evict_", "invalidate_")) or name == "tombstone":
            self.tallies[name] += len(e.pages)
            return
        if name == "begin_request":
            tokens = e.detail.get("tokens")
            self.tallies["begin_request"] += tokens if isinstance(tokens, int) else 0
            return
        direction, _, outcome = name.partition("_")
        if outcome in STATS and e.op is not None:
            self.ends.setdefault((direction.upper(), e.op), set()).add(outcome)

    def after(self, call: str) -> None:
        """After one adapter call `call`: every counter against the trace so far."""
        every = _flat(self.metrics.summary())
        for key, value in every.items():
            if value < self.last.get(key, 0):
                self.findings.append(
                    f"counter {key}: fell from {self.last[key]} to {value} in {call} "
                    "(counters only grow)"
                )
        self.last = every
        now = self._counters()
        grown = {key: value - self.start[key] for key, value in now.items()}
        got: Counter[str] = Counter()
        want: Counter[str] = Counter()
        for d in Direction:
            for stat in STATS.values():
                got[f"transfers.{d.value}.{stat}"] = grown[f"transfers.{d.value}.{stat}"]
        for (direction, _), outcomes in self.ends.items():
            outcome = next(o for o in OUTCOMES if o in outcomes)
            want[f"transfers.{direction}.{STATS[outcome]}"] += 1
        invalidated = sum(v for k, v in grown.items() if k.startswith("invalidated."))
        got["evicted.L1"] = grown["evicted.L1"]
        got["evicted.L3 + invalidated.below_bad_slot"] = (
            grown["evicted.L3"] + grown[f"invalidated.{PRESSURE_L3}"]
        )
        got["invalidated (other reasons)"] = invalidated - grown[f"invalidated.{PRESSURE_L3}"]
        got["prompt_tokens"] = grown["prompt_tokens"]
        want["prompt_tokens"] = self.tallies["begin_request"]
        got["window_freed"] = grown["window_freed"]
        want["window_freed"] = self.tallies["tombstone"]
        want["evicted.L1"] = self.tallies["evict_l1"]
        want["evicted.L3 + invalidated.below_bad_slot"] = self.tallies["evict_l3"]
        want["invalidated (other reasons)"] = self.tallies["invalidate_l3"]
        clamped = got["transfers.S2H.failed"] - want["transfers.S2H.failed"]
        if 0 < clamped <= want["transfers.S2H.count"]:  # kept every node (module docstring)
            want["transfers.S2H.failed"] += clamped
            want["transfers.S2H.count"] -= clamped
        for key in sorted(set(got) | set(want)):
            if got[key] != want[key]:
                self.findings.append(
                    f"counter {key}: grew by {got[key]} in all, the trace says {want[key]} "
                    f"(after {call})"
                )
        if grown["evicted.L2"] > self.tallies["evict_l2"]:
            self.findings.append(
                f"counter evicted.L2: grew by {grown['evicted.L2']} pages in all, the trace "
                f"evicted {self.tallies['evict_l2']} from L2 (after {call})"
            )

    def _counters(self) -> dict[str, int]:
        """The integer counters this probe judges, by a flat name."""
        m = self.metrics
        out = {f"evicted.{t}": int(n) for t, n in m.evicted_pages.items()}
        out["window_freed"] = int(m.window_freed_pages)
        out["prompt_tokens"] = int(m.prompt_tokens)
        out |= {f"invalidated.{r}": int(n) for r, n in m.l3_invalidated_pages.items()}
        for d, stats in m.directions.items():
            for stat in STATS.values():
                out[f"transfers.{d}.{stat}"] = int(getattr(stats, stat))
        return out


DERIVED = ("token_shares", "gib_per_s")  # computed from counters, not counters themselves


def _flat(summary: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The summary's numbers by dotted name (nested dicts flattened, `DERIVED` left out)."""
    out: dict[str, float] = {}
    for key, value in summary.items():
        if key in DERIVED:
            continue
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out |= _flat(value, f"{name}.")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = float(value)
    return out
