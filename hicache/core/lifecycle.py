"""The lifecycle machine, built once from `spec/lifecycle.toml`.

A logical page's state is a triple of per-tier residency sub-states (L1, L2, L3). Each
transition acts on one tier's sub-machine, guarded by the other tiers' sub-states and by
lock counts. The composite states (every reachable triple) are derived by search and must
equal the named list in the tables (`hicache spec check`).

`Lifecycle.check` is a plain table lookup: the row named `event`, its source sub-state, its
guards. Nothing here keeps state: callers keep sub-states in compact fields and ask `check`
before they mutate anything, so a rejected transition changes nothing. The executor that runs
a row's effects is `hicache.core.execute`. The same tables' other reading, built apart with the
`transitions` library, is `hicache.core.pagemachine`; the walk (`hicache.core.tracewalk`)
checks every traced step against it, and `hicache spec check` the two composite graphs.

Guards come in three families (the vocabulary is the header of lifecycle.toml):

    sub-state   "L2 == RESIDENT", "L1 != H2D_PENDING"   read the page's triple
    lock        "locks(L1) == 0"                          read the node's lock counts
    context     "leaf(L1)", "parent(L2) == RESIDENT",     read the tree around the node, or
                "aligned(range)", ...                     the request's range (`GuardContext`)

Without a context (the composite-graph search) lock and context guards are taken as
satisfiable: every lock is eventually released, and the tree and the request are not part of
a logical page's state.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from hicache.core.tiers import TIERS, Direction, Tier
from hicache.errors import IllegalTransition, SpecError
from hicache.spec import LIFECYCLE_TOML, load_toml

States = tuple[str, str, str]
"""A logical page's residency sub-states, indexed L1, L2, L3."""

ABSENT = "ABSENT"
RESIDENT = "RESIDENT"
PRIVATE = "PRIVATE"

_GUARD_STATE = re.compile(r"^(L[123]) (==|!=) ([A-Z0-9_]+)$")
_GUARD_LOCK = re.compile(r"^locks\((L[123])\) == 0$")
_GUARD_LEAF = re.compile(r"^leaf\((L[123])\)$")
_GUARD_PARENT = re.compile(r"^parent\((L[123])\) == RESIDENT$")
_EFFECT = re.compile(r"^(reserve|publish|release|free|lock|unlock)\((L[123])\)$")


REQUEST_GUARDS: dict[str, str] = {
    "aligned(range)": "the request's range is a positive whole number of pages",
    "range <= prompt": (
        "the range ends no later than the end of the prompt's last (possibly partial) page"
    ),
    "no_private(request)": "the request holds no private pages (one compute between inserts)",
}
"""Guards on a request's range (the `compute` row), by their exact text."""

GUARD_VOCABULARY: dict[str, str] = {
    "Ln == S": "tier `Ln`'s sub-state of the same logical page is `S`",
    "Ln != S": "tier `Ln`'s sub-state is not `S`",
    "locks(Ln) == 0": "nobody (request or transfer) holds a lock on the node in tier `Ln`",
    "leaf(Ln)": "no child of the node is present (not `ABSENT`) in tier `Ln`",
    "parent(Ln) == RESIDENT": "the node's parent is the root, `RESIDENT` in `Ln`, or an earlier "
    "node of the same op: no gap before these pages in `Ln`",
    **REQUEST_GUARDS,
}
"""Every guard form the parser accepts -> when it holds (lifecycle.md's guard table)."""

HASH_KEYED_LIFTABLE = ("leaf(Ln)", "parent(Ln) == RESIDENT")
"""The guard forms `[hash_keyed].lifts` may name: the tree-shape guards. A hash-keyed tier
keeps its sub-state, lock and request guards (spec/tree.md, "Hash-keyed tiers"; R76)."""


@dataclass(frozen=True)
class ControlRule:
    """A precondition of a public operation that is no residency transition (`[[rule]]`)."""

    name: str
    operation: str
    condition: str
    why: str


class GuardContext(Protocol):
    """What context guards read: the tree around one node, and the request's range."""

    def leaf(self, tier: Tier) -> bool:
        """No child of the node is present (non-ABSENT) in `tier`."""

    def parent_resident(self, tier: Tier) -> bool:
        """The node's parent is the root, RESIDENT in `tier`, or filled by the same step."""

    def parent_in(self, tier: Tier, state: str) -> bool:
        """`parent_resident`, or the parent's sub-state in `tier` is `state` (a stacked
        tier's issue: the parent's op of the same direction is pending)."""

    def children_settled(self, tier: Tier) -> bool:
        """No child of the node is pending in `tier` but those the same step ends."""

    def request(self, rule: str) -> bool:
        """The request guard `rule` (a key of REQUEST_GUARDS) holds."""


@dataclass(frozen=True)
class Guard:
    """One precondition. `op`: "==" / "!=" (another tier's sub-state), "unlocked" (no lock in
    `tier`), "leaf", "parent" (the tree around the node) or "request" (the request's range)."""

    text: str
    tier: Tier | None
    op: str
    state: str = ""

    @property
    def form(self) -> str:
        """The guard's vocabulary form: its text with the tier written `Ln`."""
        return self.text if self.tier is None else self.text.replace(str(self.tier), "Ln")

    def meaning(self) -> str:
        """What a failure of this guard means, for the error message ("" when plain)."""
        if self.op == "leaf":
            return (
                f": a child holds {self.tier}, so the node is not a leaf there; "
                "evict the child first"
            )
        if self.op == "parent":
            return (
                f": the parent node does not hold {self.tier} (a backup gap); include the "
                "parent in the chain, parent first"
            )
        if self.op == "parent_in":
            return (
                f": the parent node neither holds {self.tier} nor has its own {self.state} op "
                'in flight (a stacked tier, spec/tree.md "Stacked ops")'
            )
        if self.op == "settled":
            return (
                f": a child's op into {self.tier} stacked on this one is still in flight; "
                'end the child\'s op first (spec/tree.md "Stacked ops")'
            )
        if self.op == "request":
            return f": {REQUEST_GUARDS[self.text]}"
        return ""

    def holds(
        self, states: States, locks: tuple[int, int, int], ctx: GuardContext | None = None
    ) -> bool:
        """Whether the guard holds; lock and context guards hold when their input is absent
        (`locks` all zero and no `ctx` is what the composite-graph search passes)."""
        if self.op == "request":
            return ctx is None or ctx.request(self.text)
        assert self.tier is not None  # Verify: only request guards name no tier.
        i = TIERS.index(self.tier)
        if self.op == "unlocked":
            return locks[i] == 0
        if self.op == "leaf":
            return ctx is None or ctx.leaf(self.tier)
        if self.op == "parent":
            return ctx is None or ctx.parent_resident(self.tier)
        if self.op == "parent_in":
            return ctx is None or ctx.parent_in(self.tier, self.state)
        if self.op == "settled":
            return ctx is None or ctx.children_settled(self.tier)
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

    @property
    def acts_on_copy(self) -> bool:
        """Whether the row acts on a request's private copy only and never writes a node
        (`compute`, `discard`): source or target PRIVATE, target not RESIDENT. Its events carry
        no `before`/`after` when the copy is a duplicate (spec/lifecycle.md, "Whose state a
        composite is")."""
        return PRIVATE in (self.source, self.dest) and self.dest != RESIDENT


@dataclass(frozen=True)
class OwnershipTransition:
    name: str
    source: str
    dest: str
    trigger: str


@dataclass(frozen=True)
class CompositeState:
    """A named, reachable triple of sub-states; `path_name` is its linear-path label, if it has one
    (spec/lifecycle.md, "Linear paths")."""

    name: str
    states: States
    path_name: str


def composite_name(states: States) -> str:
    """The canonical name of a triple: per tier, RESIDENT -> the tier's name, a pending or
    private sub-state -> its own name (L1's PRIVATE -> L1_PRIVATE), ABSENT -> nothing;
    joined by `_` in tier order. The all-absent triple is `ABSENT`. Memoised per triple
    (names are asked for on every event)."""
    if type(states) is not tuple:  # a list (hashable triples only are memoised)
        return _composite_name(states)
    found = _COMPOSITE_NAMES.get(states)
    if found is None:
        found = _composite_name(states)
        if len(_COMPOSITE_NAMES) < 4096:  # bounded: the tables name a few dozen triples
            _COMPOSITE_NAMES[states] = found
    return found


_COMPOSITE_NAMES: dict[States, str] = {}


def _composite_name(states: States) -> str:
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
    """The tables, parsed and cross-checked: states, rows (guards, effects), composites. The
    reference's only source of states and transitions (R1): nothing else names a row."""

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
        for tier in TIERS:  # all states first: guards name other tiers' states
            names = tuple(st["name"] for st in tables["residency"][str(tier)]["states"])
            if len(set(names)) != len(names):
                raise SpecError(f"{tier}: duplicate residency state in {names}")
            self.states[tier] = names
        for tier in TIERS:
            self._load_tier(tier, tables["residency"][str(tier)])
        self.composites: tuple[CompositeState, ...] = tuple(
            CompositeState(c["name"], (c["L1"], c["L2"], c["L3"]), c.get("path_name", ""))
            for c in tables.get("composite", [])
        )
        self._composite_by_states = {c.states: c for c in self.composites}
        self.rules: tuple[ControlRule, ...] = tuple(
            ControlRule(r["name"], r["operation"], r["condition"], r["why"])
            for r in tables.get("rule", [])
        )
        keyed = tables.get("hash_keyed", {})
        self.hash_keyed_may: frozenset[Tier] = frozenset(Tier(t) for t in keyed.get("tiers", ()))
        self.hash_keyed_lifts: tuple[str, ...] = tuple(keyed.get("lifts", ()))
        bad = [g for g in self.hash_keyed_lifts if g not in HASH_KEYED_LIFTABLE]
        if bad:
            raise SpecError(f"[hash_keyed] lifts {bad}: only {list(HASH_KEYED_LIFTABLE)} may be")
        self.hash_keyed_own_locks = bool(keyed.get("own_locks", False))
        self.hash_keyed_tiers: frozenset[Tier] = frozenset()  # none: every guard holds
        self.own_lock_tiers: frozenset[int] = frozenset()  # tier indices (Executor reads)
        self._keyed: dict[frozenset[Tier], Lifecycle] = {}
        stacked = tables.get("stacked", {})
        self.stacked_may: frozenset[Tier] = frozenset(Tier(t) for t in stacked.get("tiers", ()))
        self.stacked_tiers: frozenset[Tier] = frozenset()  # none: every op waits its parent
        self._stacked: dict[frozenset[Tier], Lifecycle] = {}

    def hash_keyed(self, tiers: Iterable[Tier | str]) -> Lifecycle:
        """These tables for an engine whose `tiers` are hash-keyed (spec/tree.md, "Hash-keyed
        tiers"): on every row, a guard of a form `[hash_keyed].lifts` names, on one of
        `tiers`, is dropped, and with `[hash_keyed].own_locks` the executor reads
        `locks(Ln) == 0` there as the node's own locks (`own_lock_tiers`); all else is as
        here. `self` for no tiers. SpecError for a tier `[hash_keyed].tiers` does not allow.
        Built once per set of tiers."""
        keyed = _declared(tiers, self.hash_keyed_may, "hash-keyed", "hash_keyed")
        if not keyed:
            return self
        found = self._keyed.get(keyed)
        if found is None:
            found = copy.copy(self)
            found.hash_keyed_tiers, found._keyed, found._stacked = keyed, {}, {}
            if self.hash_keyed_own_locks:
                found.own_lock_tiers = frozenset(TIERS.index(t) for t in keyed)
            found.transitions = {
                name: replace(t, guards=tuple(g for g in t.guards if not self._lifted(g, keyed)))
                for name, t in self.transitions.items()
            }
            self._keyed[keyed] = found
        return found

    def stacked(self, tiers: Iterable[Tier | str]) -> Lifecycle:
        """These tables for an engine whose `tiers` are stacked (spec/tree.md, "Stacked ops";
        R81): in such a tier T an `*_issue` row's `parent(T) == RESIDENT` also holds while
        the parent's own op of the row's direction into T is pending; an `*_complete` row
        into T needs the parent RESIDENT in T (a child's op ends after its parent's); an
        `*_fail` or `*_cancel` row into T needs no child's op stacked on the node still in
        flight. So every published copy keeps its parent (S6). `self` for no tiers;
        SpecError for a tier `[stacked].tiers` does not allow. Built once per set."""
        stacked = _declared(tiers, self.stacked_may, "stacked", "stacked")
        if not stacked:
            return self
        found = self._stacked.get(stacked)
        if found is None:
            found = copy.copy(self)
            found.stacked_tiers, found._keyed, found._stacked = stacked, {}, {}
            found.transitions = {
                name: t if t.tier not in stacked else replace(t, guards=_stacked_guards(t))
                for name, t in self.transitions.items()
            }
            self._stacked[stacked] = found
        return found

    def _lifted(self, g: Guard, keyed: frozenset[Tier]) -> bool:
        return g.tier in keyed and g.form in self.hash_keyed_lifts

    def _load_tier(self, tier: Tier, table: Mapping[str, Any]) -> None:
        if table["initial"] not in self.states[tier]:
            raise SpecError(f"{tier}: initial state {table['initial']!r} is not an {tier} state")
        self.initial[tier] = table["initial"]
        for row in table["transitions"]:
            t = _parse_transition(tier, row, self.states)
            if t.name in self.transitions:
                raise SpecError(f"transition name {t.name!r} is used twice; names must be unique")
            self.transitions[t.name] = t

    # -- validation -------------------------------------------------------------------

    def check(
        self,
        name: str,
        states: States,
        locks: tuple[int, int, int] = (0, 0, 0),
        ctx: GuardContext | None = None,
    ) -> States:
        """The triple after transition `name` from `states`; raises IllegalTransition, changing
        nothing, when the transition is unknown, leaves another sub-state, or a guard fails.
        Context guards are checked only when `ctx` is given (see the module docstring)."""
        t = self.transitions.get(name)
        if t is None:
            raise IllegalTransition(name, "-", composite_name(states), "no such transition")
        i = TIERS.index(t.tier)
        if states[i] != t.source:
            raise IllegalTransition(
                name,
                str(t.tier),
                composite_name(states),
                f"{t.tier} is {states[i]}, the transition leaves {t.source} (R3)",
            )
        for g in t.guards:
            if not g.holds(states, locks, ctx):
                raise IllegalTransition(
                    name,
                    str(t.tier),
                    composite_name(states),
                    f"guard {g.text!r} fails{g.meaning()} (R3)",
                )
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


def _parse_transition(
    tier: Tier, row: Mapping[str, Any], states: Mapping[Tier, tuple[str, ...]]
) -> Transition:
    name = row["name"]
    for key in ("from", "to"):
        if row[key] not in states[tier]:
            raise SpecError(f"{name}: {key} state {row[key]!r} is not an {tier} state")
    guards = tuple(_parse_guard(name, g, states) for g in row.get("guards", []))
    effects = []
    for e in row.get("effects", []):
        m = _EFFECT.match(e)
        if m is None:
            raise SpecError(
                f"{name}: effect {e!r} is not reserve|publish|release|free|lock|unlock(Ln)"
            )
        effects.append(Effect(m.group(1), Tier(m.group(2))))
    direction = Direction(row["direction"]) if "direction" in row else None
    t = Transition(
        name,
        row["kind"],
        tier,
        direction,
        row["from"],
        row["to"],
        row["trigger"],
        guards,
        tuple(effects),
    )
    _check_effects(t)
    return t


_OWNERSHIP_EFFECTS = {
    # effect: (what the row's source must be, what its target must be), "moving" = a private
    # or pending sub-state (the pages are PRIVATE while the tier is in it)
    "reserve": ("ABSENT", "moving"),
    "publish": ("moving", RESIDENT),
    "release": ("moving", ABSENT),
    "free": (RESIDENT, ABSENT),
}


def _check_effects(t: Transition) -> None:
    """SpecError unless the row's effects agree with its states, so that the executor can run
    any loadable row: exactly one ownership effect, on the row's own tier, and of the kind its
    source and target states imply; lock effects on other tiers only."""
    own = [e for e in t.effects if e.op in _OWNERSHIP_EFFECTS]
    if len(own) != 1 or own[0].tier != t.tier:
        raise SpecError(
            f"{t.name}: needs exactly one of reserve|publish|release|free({t.tier}), "
            f"has {[str(e) for e in own]}"
        )
    want = _OWNERSHIP_EFFECTS[own[0].op]
    for state, need in zip((t.source, t.dest), want):
        moving = state not in (ABSENT, RESIDENT)
        if (need == "moving") != moving or (not moving and state != need):
            raise SpecError(
                f"{t.name}: effect {own[0]} does not fit {t.source} -> {t.dest} "
                f"(it moves pages {need if need != 'moving' else 'PRIVATE/pending'} "
                "at that end)"
            )
    for e in t.effects:
        if e.op in ("lock", "unlock") and e.tier == t.tier:
            raise SpecError(f"{t.name}: {e} locks the row's own tier; a transfer locks its source")


def _declared(
    tiers: Iterable[Tier | str], may: frozenset[Tier], what: str, table: str
) -> frozenset[Tier]:
    """The tiers an engine declares `what` (hash-keyed, stacked); SpecError naming any the
    tables' `[table].tiers` do not allow."""
    chosen = frozenset(Tier(t) for t in tiers)
    refused = sorted(str(t) for t in chosen - may)
    if refused:
        raise SpecError(
            f"{what} tiers {refused}: only {sorted(map(str, may))} may be {what} "
            f"(spec/lifecycle.toml [{table}].tiers)"
        )
    return chosen


def _stacked_guards(t: Transition) -> tuple[Guard, ...]:
    """Row `t`'s guards in a stacked tier (`Lifecycle.stacked`): an issue's parent guard
    widened to the parent's pending op of the same direction, a complete's parent guard and
    a fail's or cancel's settled children added; other rows as they are."""
    tier = t.tier
    if t.kind == "issue":
        return tuple(
            Guard(f"parent({tier}) == RESIDENT or {t.dest}", tier, "parent_in", t.dest)
            if g.op == "parent" and g.tier == tier
            else g
            for g in t.guards
        )
    if t.kind == "complete":
        return (*t.guards, Guard(f"parent({tier}) == RESIDENT", tier, "parent"))
    if t.kind in ("fail", "cancel"):
        return (*t.guards, Guard(f"children({tier}) settled", tier, "settled"))
    return t.guards


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
    m = _GUARD_LEAF.match(text)
    if m is not None:
        return Guard(text, Tier(m.group(1)), "leaf")
    m = _GUARD_PARENT.match(text)
    if m is not None:
        return Guard(text, Tier(m.group(1)), "parent")
    if text in REQUEST_GUARDS:
        return Guard(text, None, "request")
    raise SpecError(
        f"{name}: guard {text!r} is not 'Ln == S', 'Ln != S', 'locks(Ln) == 0', "
        f"'leaf(Ln)', 'parent(Ln) == RESIDENT' or one of {sorted(REQUEST_GUARDS)}"
    )


@functools.cache
def _load_cached(path: str) -> Lifecycle:
    return Lifecycle(load_toml(Path(path)))


def load_lifecycle(path: Path | None = None) -> Lifecycle:
    """The lifecycle built from `path` (default: the shipped spec), parsed once per path."""
    return _load_cached(str(path or LIFECYCLE_TOML))
