"""The row properties of the lifecycle tables: each decided row by row (or, for the
pending states, over the rows into and out of one state). Registered, with their statements,
in `hicache.oracle.speccheck.properties`; each check takes the loaded tables and the composite graph
(unused here) and returns one problem line per row or state that breaks it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from hicache.core.lifecycle import ABSENT, RESIDENT, Effect, Lifecycle, States, Transition
from hicache.core.tiers import TIERS, Direction, Tier

Graph = Mapping[States, Sequence[tuple[Transition, States]]]
"""The reachable composite graph: each triple -> the rows enabled there and where they lead."""

REQUEST_RANGE_GUARDS = ("aligned(range)", "range <= prompt", "no_private(request)")
"""The guards a request's own reservation (`compute`) must carry."""


def own_effect(t: Transition) -> Effect:
    """The row's one ownership effect (the load refuses a row without exactly one)."""
    return next(e for e in t.effects if e.op in ("reserve", "publish", "release", "free"))


def _locks(t: Transition) -> list[str]:
    return [str(e) for e in t.effects if e.op in ("lock", "unlock")]


def _guards(t: Transition) -> set[str]:
    return {g.text for g in t.guards}


def problem(name: str, detail: str) -> str:
    """One problem line of `spec check`: the property's name, then what breaks it."""
    return f"lifecycle.toml: property {name}: {detail}"


# -- row properties ----------------------------------------------------------------------------


def evict_leaf_only(lc: Lifecycle, graph: Graph) -> list[str]:
    return [
        problem(
            "evict_leaf_only",
            f"row {t.name} frees {t.tier} without the guard leaf({t.tier}): a node would lose "
            f"its {t.tier} copy under a child that holds {t.tier} (S6, B07)",
        )
        for t in lc.transitions.values()
        if own_effect(t).op == "free" and f"leaf({t.tier})" not in _guards(t)
    ]


def evict_unlocked(lc: Lifecycle, graph: Graph) -> list[str]:
    return [
        problem(
            "evict_unlocked",
            f"row {t.name} frees {t.tier} without the guard locks({t.tier}) == 0: a copy a "
            "request serves or a transfer reads could be freed (I2, B04)",
        )
        for t in lc.transitions.values()
        if own_effect(t).op == "free" and f"locks({t.tier}) == 0" not in _guards(t)
    ]


def issue_no_gap(lc: Lifecycle, graph: Graph) -> list[str]:
    return [
        problem(
            "issue_no_gap",
            f"row {t.name} issues a transfer into {t.tier} without the guard "
            f"parent({t.tier}) == RESIDENT: a child could be filled below a parent that "
            f"lacks {t.tier} (S6, B07)",
        )
        for t in lc.transitions.values()
        if t.direction is not None
        and own_effect(t).op == "reserve"
        and f"parent({t.tier}) == RESIDENT" not in _guards(t)
    ]


def compute_guarded(lc: Lifecycle, graph: Graph) -> list[str]:
    problems = []
    for t in lc.transitions.values():
        if t.direction is None and own_effect(t).op == "reserve":
            lacking = [g for g in REQUEST_RANGE_GUARDS if g not in _guards(t)]
            if lacking:
                problems.append(
                    problem(
                        "compute_guarded",
                        f"row {t.name} reserves {t.tier} pages for a request without the "
                        f"guard(s) {', '.join(lacking)}: a range that is not whole pages of "
                        "the prompt, or a second compute before insert (I3, B08)",
                    )
                )
    return problems


def source_locked(lc: Lifecycle, graph: Graph) -> list[str]:
    problems = []
    for t in lc.transitions.values():
        have, d = _locks(t), t.direction
        if d is None:
            want: list[str] = []
            why = "only a transfer holds a lock a row takes or releases (S7)"
        elif own_effect(t).op == "reserve":
            want = [f"lock({d.source})"]
            why = f"an {d} issue pins its source {d.source} for the op's life (I2, S7)"
        else:
            want = [f"unlock({d.source})"]
            why = (
                f"every end of an {d} releases the one lock its issue took on {d.source} "
                "(I2; S7: a lock never released, or released twice)"
            )
        if have != want:
            problems.append(
                problem(
                    "source_locked",
                    f"row {t.name} has lock effects [{', '.join(have)}], not "
                    f"[{', '.join(want)}]: {why}",
                )
            )
    return problems


def publish_on_complete_only(lc: Lifecycle, graph: Graph) -> list[str]:
    problems = []
    for t in lc.transitions.values():
        op = own_effect(t).op
        transfer = t.direction is not None
        if op == "publish" and t.kind != ("complete" if transfer else "insert"):
            problems.append(
                problem(
                    "publish_on_complete_only",
                    f"row {t.name} ({t.kind}) publishes {t.tier} pages: only an observed "
                    "completion (a complete row) or a request's insert may publish (I5, B01)",
                )
            )
        ending = {"complete": "publish", "fail": "release", "cancel": "release"}
        wanted = ending.get(t.kind) if transfer else {"abort": "release"}.get(t.kind)
        if wanted is not None and op != wanted:
            problems.append(
                problem(
                    "publish_on_complete_only",
                    f"row {t.name} is a {t.kind} but its effect is {op}({t.tier}), not "
                    f"{wanted}({t.tier}) (I5; B02: an end that keeps or frees pages it must not)",
                )
            )
    return problems


# -- per-direction and per-state properties ---------------------------------------------------


def pending_states(lc: Lifecycle) -> dict[tuple[Tier, str], Direction]:
    """(tier, state) -> the direction whose issue enters it (a transfer's pending state)."""
    return {
        (t.tier, t.dest): t.direction
        for t in lc.transitions.values()
        if t.direction is not None and own_effect(t).op == "reserve"
    }


def pending_exits(lc: Lifecycle, graph: Graph) -> list[str]:
    problems = []
    rows = list(lc.transitions.values())
    for d in sorted({t.direction for t in rows if t.direction is not None}):
        issues = [t for t in rows if t.direction is d and own_effect(t).op == "reserve"]
        if len(issues) != 1:
            names = ", ".join(t.name for t in issues) or "none"
            problems.append(problem("pending_exits", f"{d} has one issue row, not: {names}"))
            continue
        issue = issues[0]
        tier, pending = issue.tier, issue.dest
        if tier != d.target:
            problems.append(
                problem("pending_exits", f"row {issue.name} fills {tier}, an {d} fills {d.target}")
            )
        for t in rows:
            if t.tier == tier and t.dest == pending and t is not issue:
                problems.append(
                    problem(
                        "pending_exits",
                        f"row {t.name} enters {tier} {pending}, which only {issue.name} may "
                        "enter: no other party's pages are pending there",
                    )
                )
        exits = [t for t in rows if t.tier == tier and t.source == pending]
        problems += _exit_problems(d, tier, pending, exits)
    problems += _partial_end_problems(lc)
    return problems


_ENDS = {"complete": RESIDENT, "fail": ABSENT, "cancel": ABSENT}
"""An op's ways out of its pending state: the row's kind -> the state it leaves the tier in."""


def _exit_problems(d: Direction, tier: Tier, pending: str, exits: list[Transition]) -> list[str]:
    """The rows leaving `pending` must be exactly one complete, one fail, one cancel of `d`."""
    problems = []
    for t in exits:
        if t.direction is not d or t.kind not in _ENDS or t.dest != _ENDS[t.kind]:
            problems.append(
                problem(
                    "pending_exits",
                    f"row {t.name} ({t.kind}, {t.direction or 'no direction'}) leaves {tier} "
                    f"{pending} for {t.dest}: only the {d} op's complete (to {RESIDENT}), fail "
                    f"and cancel (to {ABSENT}) end it",
                )
            )
    for kind in _ENDS:
        n = sum(1 for t in exits if t.direction is d and t.kind == kind)
        if n != 1:
            problems.append(
                problem(
                    "pending_exits",
                    f"{tier} {pending} (the {d} op's pending state) has {n} {kind} rows, not "
                    f"one: every op must end by exactly one {kind} when it "
                    + {"complete": "succeeds", "fail": "fails", "cancel": "is cancelled"}[kind],
                )
            )
    return problems


def _partial_end_problems(lc: Lifecycle) -> list[str]:
    """A partial end (`complete_part`) is one direction's complete on the first nodes and its
    fail on the rest: the rule must name exactly those two rows, of one direction."""
    problems = []
    for rule in lc.rules:
        if "complete_part" not in rule.operation:
            continue
        named = [
            lc.transitions[w]
            for w in dict.fromkeys(re.findall(r"[a-z0-9_]+", rule.condition))
            if w in lc.transitions
        ]
        kinds = sorted(t.kind for t in named)
        directions = sorted({str(t.direction) for t in named})
        if kinds != ["complete", "fail"] or len(directions) != 1:
            problems.append(
                problem(
                    "pending_exits",
                    f"rule {rule.name} names rows {[t.name for t in named]} (directions "
                    f"{directions}): a partial end is one direction's complete on its first "
                    "nodes, then its fail on the rest",
                )
            )
    return problems


def pages_balance(lc: Lifecycle, graph: Graph) -> list[str]:
    problems = []
    for tier in TIERS:
        rows = [t for t in lc.transitions.values() if t.tier == tier]
        for state in lc.states[tier]:
            if state == ABSENT:
                continue
            leaving = {own_effect(t).op for t in rows if t.source == state}
            entered = any(t.dest == state for t in rows)
            need = ("free",) if state == RESIDENT else ("publish", "release")
            for op in need:
                if entered and op not in leaving:
                    problems.append(
                        problem(
                            "pages_balance",
                            f"{tier} {state} is left by no row that does {op}({tier}): "
                            + _stuck(tier, state, op),
                        )
                    )
    return problems


def _stuck(tier: Tier, state: str, op: str) -> str:
    if op == "free":
        return f"published {tier} pages could never return to the free list (I6)"
    if op == "release":
        return f"pages reserved for {state} leak when it ends without success (I6, B03)"
    return f"pages reserved for {state} could never be published (I1)"
