"""The lifecycle machine, built once from `spec/lifecycle.toml`.

A logical page's state is a triple of per-tier residency sub-states (L1, L2, L3). Each
transition acts on one tier's sub-machine, guarded by the other tiers' sub-states and by
lock counts. The composite states (every reachable triple) are derived by search and must
equal the named list in the tables (`hicache spec check`).

The `transitions` library validates every step: one `Machine` per tier is built from the
tables, and `Lifecycle.check` asks it whether `event` leaves `source`. We do not keep a
`Machine` per page: callers keep sub-states in compact arrays/fields and ask `check` before
they mutate anything, so a rejected transition changes nothing.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from transitions import Machine

from hicache.errors import IllegalTransition, SpecError
from hicache.spec import LIFECYCLE_TOML, load_toml
from hicache.tiers import TIERS, Direction, Tier

States = tuple[str, str, str]
"""A logical page's residency sub-states, indexed L1, L2, L3."""

ABSENT = "ABSENT"
RESIDENT = "RESIDENT"
PRIVATE = "PRIVATE"

_GUARD_STATE = re.compile(r"^(L[123]) (==|!=) ([A-Z0-9_]+)$")
_GUARD_LOCK = re.compile(r"^locks\((L[123])\) == 0$")
_EFFECT = re.compile(r"^(reserve|publish|release|free|lock|unlock)\((L[123])\)$")


@dataclass(frozen=True)
class Guard:
    """One precondition: another tier's sub-state (`==`/`!=`), or no lock in a tier."""

    text: str
    tier: Tier
    op: str  # "==", "!=", or "unlocked"
    state: str = ""

    def holds(self, states: States, locks: tuple[int, int, int]) -> bool:
        i = TIERS.index(self.tier)
        if self.op == "unlocked":
            return locks[i] == 0
        return (states[i] == self.state) == (self.op == "==")


@dataclass(frozen=True)
class Effect:
    """One effect on ownership (reserve/publish/release/free) or locks (lock/unlock)."""

    op: str
    tier: Tier

    def __str__(self) -> str:
        return f"{self.op}({self.tier})"


@dataclass(frozen=True)
class Transition:
    """One row of a residency table; its `name` is also its trace event name."""

    name: str
    kind: str
    tier: Tier
    direction: Direction | None
    source: str
    dest: str
    trigger: str
    guards: tuple[Guard, ...]
    effects: tuple[Effect, ...]


@dataclass(frozen=True)
class OwnershipTransition:
    name: str
    source: str
    dest: str
    trigger: str


@dataclass(frozen=True)
class CompositeState:
    """A named, reachable triple of sub-states; `source_name` is the write-ups' name, if any."""

    name: str
    states: States
    source_name: str


def composite_name(states: States) -> str:
    """The canonical name of a triple: per tier, RESIDENT -> the tier's name, a pending or
    private sub-state -> its own name (L1's PRIVATE -> L1_PRIVATE), ABSENT -> nothing;
    joined by `_` in tier order. The all-absent triple is `ABSENT`."""
    parts: list[str] = []
    for tier, sub in zip(TIERS, states):
        if sub == RESIDENT:
            parts.append(str(tier))
        elif sub == PRIVATE:
            parts.append(f"{tier}_PRIVATE")
        elif sub != ABSENT:
            parts.append(sub)
    return "_".join(parts) if parts else ABSENT


class Lifecycle:
    """The tables, parsed and cross-checked, plus one `transitions.Machine` per tier."""

    def __init__(self, tables: Mapping[str, Any]) -> None:
        self.tables = tables
        own = tables["ownership"]
        self.ownership_states: tuple[str, ...] = tuple(s["name"] for s in own["states"])
        self.ownership_transitions: tuple[OwnershipTransition, ...] = tuple(
            OwnershipTransition(t["name"], t["from"], t["to"], t["trigger"])
            for t in own["transitions"]
        )
        self.states: dict[Tier, tuple[str, ...]] = {}
        self.initial: dict[Tier, str] = {}
        self.transitions: dict[str, Transition] = {}
        self.machines: dict[Tier, Machine] = {}
        for tier in TIERS:  # all states first: guards name other tiers' states
            names = tuple(st["name"] for st in tables["residency"][str(tier)]["states"])
            if len(set(names)) != len(names):
                raise SpecError(f"{tier}: duplicate residency state in {names}")
            self.states[tier] = names
        for tier in TIERS:
            self._load_tier(tier, tables["residency"][str(tier)])
        self.composites: tuple[CompositeState, ...] = tuple(
            CompositeState(c["name"], (c["L1"], c["L2"], c["L3"]), c.get("source_name", ""))
            for c in tables.get("composite", [])
        )
        self._composite_by_states = {c.states: c for c in self.composites}

    def _load_tier(self, tier: Tier, table: Mapping[str, Any]) -> None:
        names = self.states[tier]
        self.initial[tier] = table["initial"]
        rows = []
        for row in table["transitions"]:
            t = _parse_transition(tier, row, self.states)
            if t.name in self.transitions:
                raise SpecError(f"transition name {t.name!r} is used twice; names must be unique")
            self.transitions[t.name] = t
            rows.append({"trigger": t.name, "source": t.source, "dest": t.dest})
        self.machines[tier] = Machine(
            model=None, states=list(names), transitions=rows,
            initial=table["initial"], auto_transitions=False,
        )

    # -- validation -------------------------------------------------------------------

    def check(self, name: str, states: States, locks: tuple[int, int, int] = (0, 0, 0)) -> States:
        """The triple after transition `name` from `states`; raises IllegalTransition, changing
        nothing, when the transition is unknown, leaves another sub-state, or a guard fails."""
        t = self.transitions.get(name)
        if t is None:
            raise IllegalTransition(name, "-", composite_name(states), "no such transition")
        i = TIERS.index(t.tier)
        rows = self.machines[t.tier].get_transitions(trigger=name, source=states[i])
        if not rows:
            raise IllegalTransition(
                name, str(t.tier), composite_name(states),
                f"{t.tier} is {states[i]}, the transition leaves {t.source}",
            )
        for g in t.guards:
            if not g.holds(states, locks):
                raise IllegalTransition(name, str(t.tier), composite_name(states), f"guard {g.text!r} fails")
        # Verify the machine's row agrees with the table's (it was built from it).
        assert rows[0].dest == t.dest, f"{name}: machine and table disagree on the target state"
        dest = list(states)
        dest[i] = t.dest
        return (dest[0], dest[1], dest[2])

    def composite(self, states: States) -> CompositeState:
        """The named composite state of a triple; SpecError if the triple is not named."""
        c = self._composite_by_states.get(states)
        if c is None:
            raise SpecError(f"triple {states} is not a named composite state")
        return c

    def initial_states(self) -> States:
        return (self.initial[Tier.L1], self.initial[Tier.L2], self.initial[Tier.L3])

    def successors(self, states: States) -> Iterator[tuple[Transition, States]]:
        """Every transition enabled from `states` (locks assumed releasable) and its result."""
        for t in self.transitions.values():
            try:
                yield t, self.check(t.name, states)
            except IllegalTransition:
                continue

    def reachable(self) -> dict[States, list[tuple[Transition, States]]]:
        """Breadth-first search from the initial triple: every reachable triple and its edges."""
        start = self.initial_states()
        graph: dict[States, list[tuple[Transition, States]]] = {}
        frontier = [start]
        while frontier:
            nxt: list[States] = []
            for s in frontier:
                if s in graph:
                    continue
                graph[s] = list(self.successors(s))
                nxt.extend(d for _, d in graph[s] if d not in graph)
            frontier = nxt
        return graph


def _parse_transition(tier: Tier, row: Mapping[str, Any], states: Mapping[Tier, tuple[str, ...]]) -> Transition:
    name = row["name"]
    for key in ("from", "to"):
        if row[key] not in states[tier]:
            raise SpecError(f"{name}: {key} state {row[key]!r} is not an {tier} state")
    guards = tuple(_parse_guard(name, g, states) for g in row.get("guards", []))
    effects = []
    for e in row.get("effects", []):
        m = _EFFECT.match(e)
        if m is None:
            raise SpecError(f"{name}: effect {e!r} is not reserve|publish|release|free|lock|unlock(Ln)")
        effects.append(Effect(m.group(1), Tier(m.group(2))))
    direction = Direction(row["direction"]) if "direction" in row else None
    return Transition(name, row["kind"], tier, direction, row["from"], row["to"],
                      row["trigger"], guards, tuple(effects))


def _parse_guard(name: str, text: str, states: Mapping[Tier, tuple[str, ...]]) -> Guard:
    m = _GUARD_STATE.match(text)
    if m is not None:
        tier = Tier(m.group(1))
        if m.group(3) not in states[tier]:
            raise SpecError(f"{name}: guard {text!r} names no {tier} state")
        return Guard(text, tier, m.group(2), m.group(3))
    m = _GUARD_LOCK.match(text)
    if m is not None:
        return Guard(text, Tier(m.group(1)), "unlocked")
    raise SpecError(f"{name}: guard {text!r} is not 'Ln == S', 'Ln != S' or 'locks(Ln) == 0'")


@functools.lru_cache(maxsize=None)
def _load_cached(path: str) -> Lifecycle:
    return Lifecycle(load_toml(Path(path)))


def load_lifecycle(path: Path | None = None) -> Lifecycle:
    """The lifecycle built from `path` (default: the shipped spec), parsed once per path."""
    return _load_cached(str(path or LIFECYCLE_TOML))
