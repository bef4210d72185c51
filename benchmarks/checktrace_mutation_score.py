"""check-trace's mutation score: which of the oracle mutants its own tests kill.

    CI=true PYTHONPATH=. python3 benchmarks/checktrace_mutation_score.py [--with-selfcheck]

For each mutant of hicache/testing/mutants/oracle.py (a bug planted in check-trace), runs
check-trace's test files (tests/test_checktrace*.py, tests/test_trace*.py) in this process
with the mutant switched on (`mutants.activate`, entered by a pytest plugin for the session)
and stops at the first failure: a failure kills the mutant. The fuzz's self-check
(hicache/testing/selfcheck.py) is switched off, so that a test that runs `hicache fuzz` does
not kill the mutant through it: the score is check-trace's own tests'. `--with-selfcheck`:
the self-check on, and tests/test_selfcheck.py added. First the same files run clean (they
must pass). Prints one line per mutant (killed by which test, or survived) and `killed K/N`.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import sys
from collections.abc import Sequence
from typing import Any
from unittest import mock

import pytest

from hicache.testing import selfcheck
from hicache.testing.mutants import activate, oracle


class _Switched:
    """A pytest plugin: the session runs with mutant `name` switched on (None: clean); the
    first failed test's id is kept."""

    def __init__(self, name: str | None, selfcheck: bool) -> None:
        self.name, self.selfcheck = name, selfcheck
        self.stack = contextlib.ExitStack()
        self.failed: str | None = None

    def pytest_sessionstart(self, session: Any) -> None:
        if self.name is not None:
            self.stack.enter_context(activate(self.name))
        if not self.selfcheck:  # every run judged as passing it
            self.stack.enter_context(mock.patch.object(selfcheck, "judge_run", _judged_clean))

    def pytest_sessionfinish(self, session: Any, exitstatus: int) -> None:
        self.stack.close()

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.failed and self.failed is None:
            self.failed = report.nodeid


def _judged_clean(*args: Any, **kwargs: Any) -> None:
    return None


def _run(files: Sequence[str], name: str | None, on: bool) -> tuple[int, str | None]:
    plugin = _Switched(name, on)
    status = pytest.main(["-q", "-x", "-p", "no:cacheprovider", "--no-header", *files], [plugin])
    return int(status), plugin.failed


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--with-selfcheck", action="store_true", help="add tests/test_selfcheck.py")
    args = p.parse_args(argv)
    files = sorted(glob.glob("tests/test_checktrace*.py") + glob.glob("tests/test_trace*.py"))
    if args.with_selfcheck:
        files.append("tests/test_selfcheck.py")
    on = args.with_selfcheck
    status, failed = _run(files, None, on)
    if status != 0:
        print(f"the clean tests fail ({failed}): no score", file=sys.stderr)
        return 2
    lines, killed = [], 0
    for m in oracle.ZOO:
        status, failed = _run(files, m.name, on)
        killed += status == 1
        lines.append(f"{m.name:<20} {'killed by ' + str(failed) if status == 1 else 'survived'}")
    print("\n".join(lines))
    what = "with" if on else "without"
    print(f"killed {killed}/{len(oracle.ZOO)} ({len(files)} test files, {what} the self-check)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
