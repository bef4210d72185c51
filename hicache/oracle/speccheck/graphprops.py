"""The composite-graph properties of the lifecycle tables: each decided over every reachable
(L1, L2, L3) triple and edge (lock, tree and request guards taken as satisfiable, as for the
composite states of spec/lifecycle.md). Registered in `hicache.oracle.speccheck.properties`.
"""

from __future__ import annotations

import itertools

from hicache.core.lifecycle import RESIDENT, Lifecycle, States, composite_name
from hicache.core.tiers import TIERS, Direction, Tier
from hicache.errors import IllegalTransition
from hicache.oracle.speccheck.rowprops import Graph, pending_states, problem


def _unread_source(lc: Lifecycle, states: States) -> tuple[Direction, Tier] | None:
    """A transfer pending in `states` whose source tier is not RESIDENT, if there is one."""
    pending = pending_states(lc)
    for i, tier in enumerate(TIERS):
        d = pending.get((tier, states[i]))
        if d is not None and states[TIERS.index(d.source)] != RESIDENT:
            return d, tier
    return None


def source_resident_while_pending(lc: Lifecycle, graph: Graph) -> list[str]:
    """One problem per row that takes a good triple to a bad one (the edges between bad
    triples follow from those and are not reported)."""
    problems, reported = [], set()
    for before, edges in graph.items():  # breadth-first order: the first edge of each row
        if _unread_source(lc, before) is not None:
            continue
        for t, after in edges:
            found = _unread_source(lc, after)
            if found is None or t.name in reported:
                continue
            reported.add(t.name)
            d, tier = found
            problems.append(
                problem(
                    "source_resident_while_pending",
                    f"row {t.name} takes {composite_name(before)} to {composite_name(after)}: "
                    f"the {d} pending in {tier} reads {d.source}, which is "
                    f"{after[TIERS.index(d.source)]} there (I2, B04)",
                )
            )
    return problems


def every_legal_triple_reachable(lc: Lifecycle, graph: Graph) -> list[str]:
    problems = []
    every = itertools.product(*(lc.states[t] for t in TIERS))
    for triple in every:
        states: States = (triple[0], triple[1], triple[2])
        if states in graph or _unread_source(lc, states) is not None:
            continue
        problems.append(
            problem(
                "every_legal_triple_reachable",
                f"{composite_name(states)} {states} is legal (every pending transfer reads a "
                f"{RESIDENT} source) but unreachable: {_blocked(lc, graph, states)}",
            )
        )
    return problems


def _blocked(lc: Lifecycle, graph: Graph, target: States) -> str:
    """Which row's guard keeps `target` out of reach: a row into it from a reachable triple
    that differs from it in the row's tier only, and the guard that refuses it there."""
    for t in lc.transitions.values():
        i = TIERS.index(t.tier)
        if target[i] != t.dest:
            continue
        parts = list(target)
        parts[i] = t.source
        before: States = (parts[0], parts[1], parts[2])
        if before not in graph:
            continue
        try:
            lc.check(t.name, before)
        except IllegalTransition as e:
            return f"row {t.name} from {composite_name(before)} is refused ({e.why})"
    return "no row leads into it from a reachable state"


def drains_to_absent(lc: Lifecycle, graph: Graph) -> list[str]:
    start = lc.initial_states()
    into: dict[States, list[States]] = {s: [] for s in graph}
    for s, edges in graph.items():
        for _, d in edges:
            into.setdefault(d, []).append(s)
    drains, frontier = {start}, [start]
    while frontier:
        s = frontier.pop()
        for p in into.get(s, []):
            if p not in drains:
                drains.add(p)
                frontier.append(p)
    trapped = [s for s in graph if s not in drains]  # breadth-first order
    if not trapped:
        return []
    first = trapped[0]
    rows = ", ".join(dict.fromkeys(t.name for t, _ in graph[first])) or "none"
    return [
        problem(
            "drains_to_absent",
            f"no path of rows reaches {composite_name(start)} from {len(trapped)} reachable "
            f"state(s): {', '.join(composite_name(s) for s in trapped)}; from "
            f"{composite_name(first)} the rows {rows} lead only to such states: an op that "
            "cannot end or a copy that cannot be dropped (I6)",
        )
    ]
