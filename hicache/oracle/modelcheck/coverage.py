"""Which spec transitions a search fired: an executor that records every row it runs.

Every residency transition of the control plane goes through `Executor.run` (hicache/
execute.py), so recording there sees every transition exactly as it took effect; a refused
call never reaches `run` (its plan raised first). Two sets, shared by every copy of the plane
a search makes (`ControlPlane.clone` copies the executor's fields):

    fired   row names (spec/lifecycle.toml's transitions)
    steps   (composite state before, row name) of every segment a trace event names with
            its states: the composite graph's edges (spec/lifecycle.md), since the state
            after is the one the row leads to
"""

from __future__ import annotations

from hicache.core.control import ControlPlane
from hicache.core.execute import Executor, Step
from hicache.core.lifecycle import Lifecycle, States, composite_name
from hicache.core.pages import Pages

Step_ = tuple[States, str]
"""(composite state before, row name): one step of the composite graph."""


class RecordingExecutor(Executor):
    """An `Executor` that records each row it runs (module docstring)."""

    fired: set[str]
    steps: set[Step_]

    def run(self, step: Step) -> Pages:
        name = step.transition.name
        self.fired.add(name)
        self.steps.update([(seg.before, name) for seg in step.segments if not seg.duplicate])
        return super().run(step)


def record_into(cp: ControlPlane, fired: set[str], steps: set[Step_]) -> None:
    """Make `cp` (and every later copy of it) record the rows it runs into `fired` and
    `steps`."""
    ex = RecordingExecutor(cp.lifecycle, cp.tree, cp.tables, cp.tracer)
    ex.fired, ex.steps = fired, steps
    cp.executor = ex


def composite_edges(lc: Lifecycle, steps: set[Step_]) -> set[tuple[str, str, str]]:
    """`steps` as composite-graph edges (before, row, after), by name."""
    return {
        (composite_name(before), name, composite_name(lc.check(name, before)))
        for before, name in steps
    }


def graph_edges(lc: Lifecycle) -> set[tuple[str, str, str]]:
    """Every edge of `lc`'s composite graph (spec/lifecycle.md), by name."""
    return {
        (composite_name(s), t.name, composite_name(d))
        for s, out in lc.reachable().items()
        for t, d in out
    }


def spec_transitions(lc: Lifecycle) -> list[str]:
    """Every residency transition the tables name (spec/lifecycle.toml), in table order."""
    return list(lc.transitions)
