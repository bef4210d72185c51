"""Which spec transitions a search fired: an executor that records every row it runs.

Every residency transition of the control plane goes through `Executor.run` (hicache/
execute.py), so recording the row name there sees every transition exactly as it took effect;
a refused call never reaches `run` (its plan raised first). The set is shared by every copy of
the plane a search makes (hicache/modelcheck/clone.py copies the executor's fields).
"""

from __future__ import annotations

from hicache.control import ControlPlane
from hicache.execute import Executor, Step
from hicache.lifecycle import Lifecycle
from hicache.pages import Pages


class RecordingExecutor(Executor):
    """An `Executor` that adds each row's name to `fired` as it runs it."""

    fired: set[str]

    def run(self, step: Step) -> Pages:
        self.fired.add(step.transition.name)
        return super().run(step)


def record_into(cp: ControlPlane, fired: set[str]) -> None:
    """Make `cp` (and every later copy of it) record the rows it runs into `fired`."""
    ex = RecordingExecutor(cp.lifecycle, cp.tree, cp.tables, cp.tracer)
    ex.fired = fired
    cp.executor = ex


def spec_transitions(lc: Lifecycle) -> list[str]:
    """Every residency transition the tables name (spec/lifecycle.toml), in table order."""
    return list(lc.transitions)
