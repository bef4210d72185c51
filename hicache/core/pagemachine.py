"""One logical page's residency as a `transitions` machine, built from lifecycle.toml's rows.

The reference reads the lifecycle tables twice, in code written apart on purpose:

    reading                       what it is                          who asks it
    ----------------------------  ----------------------------------  --------------------------
    hicache/core/lifecycle.py,         hand-written: rows parsed, guards   every public call of the
    hicache/core/execute.py            and effects run on the tree and     control plane (plan, run)
                                  page tables, composites by search
    this module                   the `transitions` library's         the walk (tracewalk.py):
                                  HierarchicalMachine: one parallel   every step the executor
                                  region per tier, one transition     traces, in every test, fuzz
                                  per row                             run and checked trace

The walk fails on the first step the two disagree about, so a bug in the hand-written
composition or executor (or in the library's reading) cannot pass unseen. The machine is
built from the raw rows (`Lifecycle.tables`), never from `Lifecycle`'s parsed rows or its
composite graph:

    page (parallel)
    ├── L1   ABSENT | PRIVATE | H2D_PENDING | RESIDENT      each region starts at its table's
    ├── L2   ABSENT | D2H_PENDING | S2H_PENDING | RESIDENT  `initial`; a state is
    └── L3   ABSENT | H2S_PENDING | RESIDENT                `page.<tier>.<state>`

    one transition per row: trigger = the row's name, source and dest = its `from` and `to`
    in its tier's region, conditions = its sub-state guards; no auto transitions.

What the machine checks of a row, and what it cannot:

    checks     the row's tier and `from` (no transition leaves another state: MachineError),
               its `to`, and its sub-state guards `Ln == S` / `Ln != S` (conditions the
               library evaluates on the other regions' states)
    cannot     `locks(Ln) == 0`, `leaf(Ln)`, `parent(Ln) == RESIDENT` and the request guards:
               they read the tree, the locks and the request, which are no part of one
               page's state (the executor's plan checks them); the effects (page ownership,
               locks), which the invariant checks judge after every call

Cost: the machine is built once per tables (about a millisecond; never per node or page:
each model costs ~16 KiB and `add_model` is quadratic). Per-node state lives in the walker's
dict; the machine has one model, set to the state asked about. Each (state, event) pair is
fired in the library once and its answer memoised (the machine is deterministic given its
state): the tables have a few hundred such pairs.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re
import sys
import threading
from collections.abc import Mapping
from types import ModuleType
from typing import Any, NamedTuple

from hicache.core.tiers import TIERS

States = tuple[str, str, str]
"""A logical page's sub-states, L1, L2, L3 (the tables' names)."""

ROOT = "page"
"""The parallel state whose regions are the tiers."""

ANSWERS_MAX = 4096
"""Most (state, event) answers a machine memoises: the tables have a few hundred pairs; a
question naming another state is asked afresh past this bound."""

_STATE_GUARD = re.compile(r"^(L[123]) (==|!=) ([A-Z0-9_]+)$")


class Row(NamedTuple):
    """What the machine took from one residency row of the tables."""

    name: str
    tier: str
    source: str
    dest: str
    checked: tuple[str, ...]  # guards the machine evaluates (sub-state guards)
    unchecked: tuple[str, ...]  # guards it cannot (tree, lock and request context)


class Answer(NamedTuple):
    """What the machine does with one event from one composite state: `after` is the
    composite it reaches (None: it refuses, or reaches a triple the tables name no composite);
    `says` is that in words, for a report."""

    after: str | None
    says: str


class _Page:
    """The machine's one model: a page whose state the machine sets before each question."""

    state: Any  # the library's: a list of `page.<tier>.<state>`, one per region


class PageMachine:
    """The `transitions` machine of one lifecycle's tables (see the module docstring).
    `answer` is safe to call from several threads (tensor-parallel ranks share it)."""

    def __init__(self, tables: Mapping[str, Any]) -> None:
        nesting = _nesting()
        HierarchicalMachine, NestedState = nesting.HierarchicalMachine, nesting.NestedState

        class _DotState(NestedState):  # type: ignore[misc, valid-type]
            separator = "."  # state names hold `_` (H2D_PENDING), the default separator

        class _Machine(HierarchicalMachine):  # type: ignore[misc, valid-type]
            state_cls = _DotState

        residency = tables["residency"]
        self.rows: dict[str, Row] = {}
        regions: list[dict[str, Any]] = []
        for tier in map(str, TIERS):
            table = residency[tier]
            names = [s["name"] for s in table["states"]]
            regions.append({"name": tier, "children": names, "initial": table["initial"]})
            for row in table["transitions"]:
                guards = tuple(row.get("guards", ()))
                checked = tuple(g for g in guards if _STATE_GUARD.match(g))
                unchecked = tuple(g for g in guards if g not in checked)
                self.rows[row["name"]] = Row(
                    row["name"], tier, row["from"], row["to"], checked, unchecked
                )
        self.names: dict[States, str] = {
            (c["L1"], c["L2"], c["L3"]): c["name"] for c in tables.get("composite", ())
        }
        self.triples: dict[str, States] = {n: s for s, n in self.names.items()}
        self._failed: list[str] = []  # the guards that failed during the current trigger
        self._page = _Page()
        self.machine = _Machine(
            model=self._page,
            states=[{"name": ROOT, "parallel": regions}],
            initial=ROOT,
            transitions=[
                {
                    "trigger": r.name,
                    "source": f"{ROOT}.{r.tier}.{r.source}",
                    "dest": f"{ROOT}.{r.tier}.{r.dest}",
                    "conditions": [self._condition(g) for g in r.checked],
                }
                for r in self.rows.values()
            ],
            auto_transitions=False,
            send_event=True,
        )
        self.start: States = self._triple(self._page.state)  # each region's `initial`
        self._answers: dict[tuple[str, str], Answer] = {}
        self._lock = threading.Lock()

    def __deepcopy__(self, memo: dict[int, object]) -> PageMachine:
        return self  # immutable to its callers (its answers are memoised): share it

    def _condition(self, guard: str) -> Any:
        """The library condition for sub-state guard `guard` ("L2 == RESIDENT")."""
        m = _STATE_GUARD.match(guard)
        assert m is not None  # Verify: only sub-state guards become conditions.
        name, equal = f"{ROOT}.{m.group(1)}.{m.group(3)}", m.group(2) == "=="

        def holds(event: Any) -> bool:
            ok = (name in event.model.state) == equal
            if not ok:
                self._failed.append(guard)
            return ok

        return holds

    def fire(self, states: States, event: str) -> tuple[States | None, str]:
        """Set the model to `states`, fire `event` in the library; the triple it reaches (None
        when it refuses) and why it refuses ("" when it does not)."""
        from transitions import MachineError

        with self._lock:
            self.machine.set_state(
                [f"{ROOT}.{t}.{s}" for t, s in zip(map(str, TIERS), states)], model=self._page
            )
            self._failed.clear()
            try:
                moved = self.machine.trigger_event(self._page, event)
            except MachineError:
                row = self.rows[event]
                sub = states[[str(t) for t in TIERS].index(row.tier)]
                return None, f"refuses: no {event} transition leaves {row.tier} {sub}"
            if not moved:
                return None, f"refuses: guard {', '.join(map(repr, self._failed))} fails"
            return self._triple(self._page.state), ""

    def graph(self) -> dict[States, list[tuple[str, States]]]:
        """Every triple the library reaches from `start` (breadth first, every row fired
        from every triple reached) -> its edges (event, triple after): the composite graph
        by the library's own composition of the regions, for `hicache spec check` to compare
        with the hand-written one (`Lifecycle.reachable`)."""
        found: dict[States, list[tuple[str, States]]] = {}
        frontier = [self.start]
        while frontier:
            states = frontier.pop(0)
            if states in found:
                continue
            found[states] = []
            for event in self.rows:
                after, _ = self.fire(states, event)
                if after is not None:
                    found[states].append((event, after))
                    frontier.append(after)
        return found

    def answer(self, before: str, event: str) -> Answer:
        """What the machine does with `event` (a row's name) from composite `before`;
        memoised per pair."""
        key = (before, event)
        found = self._answers.get(key)
        if found is None:
            found = self._ask(before, event)
            if len(self._answers) < ANSWERS_MAX:
                self._answers[key] = found
        return found

    def _ask(self, before: str, event: str) -> Answer:
        states = self.triples.get(before)
        if states is None:
            return Answer(None, f"has no composite state {before} (the tables name none)")
        after, why = self.fire(states, event)
        if after is None:
            return Answer(None, why)
        name = self.names.get(after)
        if name is None:
            return Answer(None, f"reaches {after}, which the tables name no composite")
        return Answer(name, f"reaches {name}")

    def _triple(self, state: Any) -> States:
        """The model's state (the library's list of `page.<tier>.<state>`) as a triple."""
        subs = {}
        for full in state:
            _, tier, sub = str(full).split(".")
            subs[tier] = sub
        return (subs["L1"], subs["L2"], subs["L3"])


_MACHINES: dict[int, tuple[Mapping[str, Any], PageMachine]] = {}
_MACHINES_MAX = 64  # distinct tables at once (tests edit copies); then start over
_BUILDING = threading.Lock()


def page_machine(tables: Mapping[str, Any]) -> PageMachine:
    """The machine of `tables` (a lifecycle's raw tables), built once per tables object."""
    with _BUILDING:
        found = _MACHINES.get(id(tables))
        if found is None or found[0] is not tables:
            if len(_MACHINES) >= _MACHINES_MAX:
                _MACHINES.clear()
            found = _MACHINES[id(tables)] = (tables, PageMachine(tables))
        return found[1]


NESTING = "transitions.extensions.nesting"


@functools.cache
def _nesting() -> ModuleType:
    """`transitions.extensions.nesting`, without running `transitions.extensions`' own
    `__init__` when nothing has yet: that imports every extension -- diagrams, locking and
    the asyncio machines, hence asyncio (~30 ms, a first `check-trace`'s largest import) --
    and the machine needs nesting alone. The module is imported under an unexecuted package
    and both are taken out of `sys.modules` again: the machine keeps its own copy of
    nesting, and a later `import transitions.extensions...` anywhere imports the package as
    usual (nesting shares `transitions.core`, so `MachineError` is the same class)."""
    if NESTING in sys.modules or "transitions.extensions" in sys.modules:
        return importlib.import_module(NESTING)
    spec = importlib.util.find_spec("transitions.extensions")
    assert spec is not None, "transitions is a dependency: its extensions are installed"
    sys.modules["transitions.extensions"] = importlib.util.module_from_spec(spec)
    try:
        return importlib.import_module(NESTING)
    finally:
        sys.modules.pop(NESTING, None)
        del sys.modules["transitions.extensions"]
