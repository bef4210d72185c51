"""Progress lines for long Hypothesis runs: one line per `every` examples of a test.

A fuzz run (5,000 examples a test) otherwise shows nothing until a test ends, which can be
minutes. Counting is done by wrapping what Hypothesis calls once per example:

    test kind                          wrapped                          public hook used
    ---------------------------------  -------------------------------  --------------------------
    @given function                    `test.hypothesis.inner_test`     reassignable for plugins
    RuleBasedStateMachine.TestCase     the machine factory passed to    `run_state_machine_as_test`
                                       `run_state_machine_as_test`

Wrappers use `functools.wraps`, so Hypothesis' database key (a digest of the unwrapped source
and signature) and any `@seed`/`@reproduce_failure` stay what they were. Counts include the
examples Hypothesis runs while shrinking a failure.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, cast

import pytest
from hypothesis import is_hypothesis_test
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

# One annotation that suits every Hypothesis: older releases leave this untyped (a call is
# no-untyped-call), newer ones type its first argument as a machine class, not a factory.
_run_state_machine_as_test: Callable[..., None] = run_state_machine_as_test


class Progress:
    """Counts one test's examples and writes a line every `every` examples (every >= 1)."""

    def __init__(self, config: pytest.Config, nodeid: str, every: int) -> None:
        assert every >= 1, every
        self.config = config
        self.nodeid = nodeid
        self.every = every
        self.examples = 0
        self.started_s = 0.0

    def tick(self) -> None:
        if self.examples == 0:
            self.started_s = time.monotonic()
        self.examples += 1
        if self.examples % self.every == 0:
            elapsed_s = time.monotonic() - self.started_s
            write_line(
                self.config,
                f"progress: {self.nodeid}: {self.examples} examples run ({elapsed_s:.0f} s)",
            )


def write_line(config: pytest.Config, line: str) -> None:
    """Write `line` to the terminal now, even from inside a test (output capture is paused)."""
    capture = config.pluginmanager.getplugin("capturemanager")
    reporter = config.pluginmanager.getplugin("terminalreporter")
    if reporter is None:
        return
    if capture is None:
        reporter.write_line(line)
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line(line)


def install(item: pytest.Item, progress: Progress) -> bool:
    """Make `item` tick `progress` once per example; False if it is no Hypothesis test."""
    function = getattr(item, "obj", None)
    if not (
        isinstance(item, pytest.Function) and function is not None and is_hypothesis_test(function)
    ):
        return False
    machine = getattr(function, "_hypothesis_state_machine_class", None)
    if machine is not None:
        # pytest calls `item.obj` (the TestCase's bound runTest) to run a unittest item.
        item.obj = _machine_run(function, machine, progress)
    else:
        function.hypothesis.inner_test = _counted(function.hypothesis.inner_test, progress)
    return True


def _counted(inner: Callable[..., Any], progress: Progress) -> Callable[..., Any]:
    @functools.wraps(inner)
    def counted(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        progress.tick()
        return inner(*args, **kwargs)

    return counted


def _machine_run(
    run_test: Callable[[], None], machine: type[RuleBasedStateMachine], progress: Progress
) -> Callable[[], None]:
    """`run_test` (a machine's TestCase.runTest, bound) with a factory that ticks once per
    machine built, i.e. once per example."""

    @functools.wraps(machine, updated=())
    def factory() -> RuleBasedStateMachine:
        __tracebackhide__ = True
        progress.tick()
        return machine()

    # Hypothesis reads @seed / @reproduce_failure of a machine from its factory.
    for name in ("_hypothesis_internal_use_seed", "_hypothesis_internal_use_reproduce_failure"):
        if hasattr(machine, name):
            setattr(factory, name, getattr(machine, name))
    case_settings = cast("Any", run_test).__self__.settings  # its TestCase's

    @functools.wraps(run_test)
    def counted_run() -> None:
        __tracebackhide__ = True
        _run_state_machine_as_test(factory, settings=case_settings)

    return counted_run
