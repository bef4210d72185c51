"""What a first `check-trace` in a process does not pay for: the collector walking the
caller's heap (`ownheap.own_heap`), and `transitions`' unused extensions (asyncio among them)
imported for the page machine (`pagemachine._nesting`)."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

import pytest

import hicache.oracle.checktrace.replay as replay_module
from hicache.oracle.checktrace import VALID, check_lines
from hicache.oracle.checktrace.ownheap import own_heap
from tests.test_checktrace import load_back, plane_trace


def _frozen_during_run(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """`gc.get_freeze_count()` seen while each replay runs."""
    seen: list[int] = []
    real = replay_module.Replay.run

    def run(self: replay_module.Replay) -> int:
        seen.append(gc.get_freeze_count())
        return real(self)

    monkeypatch.setattr(replay_module.Replay, "run", run)
    return seen


def test_the_callers_heap_is_frozen_while_a_trace_is_judged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The objects alive before the call are frozen for it (a full collection the check's
    allocations bring about walks only the check's own), and given back after."""
    assert gc.get_freeze_count() == 0, "the test process froze nothing itself"
    seen = _frozen_during_run(monkeypatch)
    held = [object() for _ in range(10_000)]  # a caller's heap
    assert check_lines(plane_trace(load_back)).exit_code == VALID
    assert seen and seen[0] >= len(held)
    assert gc.get_freeze_count() == 0


def test_a_heap_the_caller_froze_stays_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _frozen_during_run(monkeypatch)
    gc.freeze()
    try:
        mine = gc.get_freeze_count()
        assert check_lines(plane_trace(load_back)).exit_code == VALID
        assert seen == [mine] and gc.get_freeze_count() == mine
    finally:
        gc.unfreeze()


def test_the_heap_is_given_back_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError), own_heap():
        assert gc.get_freeze_count() > 0
        raise RuntimeError("a check that broke")
    assert gc.get_freeze_count() == 0


def test_a_first_check_imports_no_asyncio_and_transitions_imports_after_it() -> None:
    """In a fresh process: a check builds the page machine without running
    `transitions.extensions`' `__init__` (asyncio, diagrams), and the package then imports
    as usual, its nesting machine and the core's errors included."""
    code = textwrap.dedent(
        """
        import sys
        from hicache.oracle.checktrace import VALID, check_lines
        from tests.test_checktrace import load_back, plane_trace
        assert check_lines(plane_trace(load_back)).exit_code == VALID
        assert "asyncio" not in sys.modules, "the page machine imported asyncio"
        assert "transitions.extensions" not in sys.modules
        import transitions.extensions.nesting
        from transitions.extensions import HierarchicalMachine, MachineFactory
        from transitions import MachineError
        assert transitions.extensions.nesting.MachineError is MachineError
        HierarchicalMachine(states=["a", "b"], initial="a")
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
