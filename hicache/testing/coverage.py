"""Coverage of the spec by fuzz runs: transitions, composite states, fault sites.

    goal               the full set, read when asked (never a copy)      counted from
    -----------------  ------------------------------------------------  ----------------------
    transitions        every row of spec/lifecycle.toml (issue,          trace events named
                       complete, fail, cancel, evict, invalidate, ...)   after the row
    composite states   every `[[composite]]` of spec/lifecycle.toml      each event's before
                                                                         and after
    fault sites        every `hicache.dataplane.faults.FaultSite`        what the injector
                       member (sites added later count automatically)   fired

`Coverage.missing()` names what no run reached; a gate test fails listing it. `digest` is a
running hash of every event (JSON) and fault count, in order: two runs with the same seed
must end with the same digest (`hicache fuzz` and its test compare them).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping

from hicache.core.lifecycle import Lifecycle, load_lifecycle
from hicache.core.trace import TraceEvent
from hicache.dataplane.faults import FaultSite
from hicache.testing.selfcheck import SelfCheckCounts


class Coverage:
    """Counts, over every run given to `add`, of transitions, composite states and sites."""

    def __init__(self, lifecycle: Lifecycle | None = None) -> None:
        self.lifecycle = lifecycle or load_lifecycle()
        self.transitions: Counter[str] = Counter()
        self.states: Counter[str] = Counter()
        self.sites: Counter[str] = Counter()
        self.edges: Counter[tuple[str, str, str]] = Counter()
        self.runs = 0
        self.steps = 0  # machine steps (rules run), counted by the machine
        self.rules: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()  # illegal calls refused, by kind (illegal/)
        self.events = 0
        self.selfcheck = SelfCheckCounts()  # check-trace judged by the fuzz (selfcheck.py)
        self._hash = hashlib.sha256()

    def add(self, events: Iterable[TraceEvent], fired: Mapping[str, int]) -> None:
        """One run's trace and fault counts."""
        self.runs += 1
        for e in events:
            self.events += 1
            self._hash.update(e.to_json().encode())
            if e.event in self.lifecycle.transitions:
                self.transitions[e.event] += 1
                for state in (e.before, e.after):
                    if state is not None:
                        self.states[state] += 1
                if e.before is not None and e.after is not None:
                    self.edges[(e.before, e.event, e.after)] += 1
        for site, n in sorted(fired.items()):
            self.sites[site] += n
            self._hash.update(f"{site}={n}".encode())

    @property
    def digest(self) -> str:
        return self._hash.hexdigest()

    def goals(self) -> dict[str, list[str]]:
        """What must be reached: transitions, composite states, fault sites (read now)."""
        return {
            "transition": sorted(self.lifecycle.transitions),
            "composite state": sorted(c.name for c in self.lifecycle.composites),
            "fault site": sorted(s.value for s in FaultSite),
        }

    def missing(self) -> dict[str, list[str]]:
        """Per kind, the goals nothing reached (kinds with none left out)."""
        reached = {
            "transition": self.transitions,
            "composite state": self.states,
            "fault site": self.sites,
        }
        out = {
            kind: [g for g in goal if reached[kind][g] == 0] for kind, goal in self.goals().items()
        }
        return {kind: names for kind, names in out.items() if names}

    def report(self) -> str:
        """Per-edge, per-state and per-site counts, then what was not reached."""
        lines = [
            f"coverage: {self.runs} runs, {self.steps} steps, {self.events} trace events",
            "rules run: " + ", ".join(f"{r} {n}" for r, n in sorted(self.rules.items())),
            f"illegal calls refused: {sum(self.refused.values())} ("
            + ", ".join(f"{k} {n}" for k, n in sorted(self.refused.items()))
            + ")",
        ]
        goals = self.goals()
        counted = {
            "transition": self.transitions,
            "composite state": self.states,
            "fault site": self.sites,
        }
        for kind, names in goals.items():
            reached = sum(1 for n in names if counted[kind][n])
            lines.append(f"{kind}s: {reached}/{len(names)} reached")
            lines.extend(f"  {n:<40} {counted[kind][n]}" for n in names)
        lines.append(f"composite edges taken: {len(self.edges)}")
        lines.extend(f"  {b} --{t}--> {a}  {n}" for (b, t, a), n in sorted(self.edges.items()))
        lines.append(self.selfcheck.report())
        missing = self.missing()
        lines.append(
            "not reached: "
            + (
                "nothing"
                if not missing
                else "; ".join(f"{k}s {', '.join(v)}" for k, v in missing.items())
            )
        )
        return "\n".join(lines)
