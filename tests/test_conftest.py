"""The shared test setup (tests/conftest.py) run on an inner, always-failing Hypothesis test:
the replay section it prints must name a seed and a command that, when run, fails the same
way; the `@reproduce_failure` blob it repeats must too; progress lines only when asked."""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import pytest

from tests.conftest import WALK_BOTH, WALK_ONLY, plane_walks, progress_every
from tests.replay import Failure, replay_lines

REPO = Path(__file__).resolve().parents[1]

INNER = """
import os
from hypothesis import Phase, given, settings, strategies as st

# REUSE_ONLY=1: run only examples from the database (and shrink them); nothing new is drawn.
reuse = settings(phases=(Phase.reuse, Phase.shrink)) if os.environ.get("REUSE_ONLY") else None


def maybe(decorator):
    return decorator if decorator is not None else (lambda f: f)


@maybe(reuse)
@given(st.integers(0, 1000))
def test_fails(x):
    assert x < 500
"""
# Hypothesis' report of the shrunk example ("Falsifying example:" or, since 6.16x, "Failing
# test case:"), then the argument.
FALSIFIED = ["*: test_fails(", "*x=500,"]


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytester directory that loads tests/conftest.py as a plugin, under the dev profile."""
    for name in ("CI", "HICACHE_HYPOTHESIS_PROFILE", "HICACHE_PROGRESS_EVERY", "REUSE_ONLY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    pytester.makeini("[pytest]\n")  # the rootdir (and so the example database) is this dir
    pytester.makepyfile(test_inner=INNER)
    return pytester


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        "-p", "tests.conftest", "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning", *args
    )


def _replay(result: pytest.RunResult) -> list[str]:
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if line.startswith("replay: "))
    return [lines[start]] + [line for line in lines[start + 1 :] if line.startswith("  ")]


def test_a_failure_prints_a_seed_and_replays_that_fail_the_same_way(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _run(inner)
    first.assert_outcomes(failed=1)
    first.stdout.fnmatch_lines(FALSIFIED)
    replay = _replay(first)
    assert replay[0] == (
        "replay: HICACHE_HYPOTHESIS_PROFILE=dev python3 -m pytest "
        "test_inner.py::test_fails -p no:cacheprovider"
    )
    assert any(re.fullmatch(r"  seed \d+ .*", line) for line in replay), replay
    database = inner.path / ".hypothesis" / "examples"
    assert any(str(database) in line for line in replay), replay
    # 1. The printed command, with drawing switched off: only the database can make it fail.
    env, _python, _m, _pytest, *args = shlex.split(replay[0].removeprefix("replay: "))
    assert env == "HICACHE_HYPOTHESIS_PROFILE=dev"
    monkeypatch.setenv("REUSE_ONLY", "1")
    again = _run(inner, *args)
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines(FALSIFIED)
    # 2. The blob alone, under the `ci` profile (derandomised, no database).
    blob = re.search(r"@reproduce_failure\(.*\)", "\n".join(replay))
    assert blob is not None, replay
    inner.makepyfile(
        test_inner=INNER.replace(
            "from hypothesis import", "from hypothesis import reproduce_failure,"
        ).replace("@maybe(reuse)", blob.group(0))
    )
    monkeypatch.setenv("CI", "true")
    exact = _run(inner)
    exact.assert_outcomes(failed=1)
    exact.stdout.fnmatch_lines(FALSIFIED)
    assert _replay(exact)[0].startswith("replay: CI=true python3 -m pytest test_inner.py")


def test_replay_lines_say_why_each_replay_works() -> None:
    failure = Failure(
        nodeid="tests/t.py::test_x[a b]",
        profile="ci",
        report_text="... adding @reproduce_failure('6.1', b'AA==') as ...",
        hypothesis_test=True,
        forced_seed=None,
        generated_seed=None,
        database=None,
    )
    assert replay_lines(failure) == [
        "replay: CI=true python3 -m pytest 'tests/t.py::test_x[a b]' -p no:cacheprovider",
        "  derandomised: the same examples unless other test modules load; the blob below is exact",
        "  exact, on any machine: decorate the test with @reproduce_failure('6.1', b'AA==')",
    ]
    forced = dataclasses.replace(failure, profile="fuzz", forced_seed="7", report_text="")
    lines = replay_lines(forced)
    assert lines[0].startswith("replay: HICACHE_HYPOTHESIS_PROFILE=fuzz python3 -m pytest")
    assert lines[0].endswith(" --hypothesis-seed=7") and "database off" in lines[1]
    words = dataclasses.replace(forced, forced_seed="any string")  # Hypothesis takes strings
    assert replay_lines(words)[0].endswith(" '--hypothesis-seed=any string'")
    plain = dataclasses.replace(failure, hypothesis_test=False)
    assert len(replay_lines(plain)) == 1


def test_progress_lines_count_examples_of_given_and_stateful_tests(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    inner.makepyfile(
        test_inner="""
from hypothesis import given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule


@settings(max_examples=25)
@given(st.integers())
def test_passes(x):
    pass


class Machine(RuleBasedStateMachine):
    @rule()
    def step(self):
        pass


Machine.TestCase.settings = settings(max_examples=25, stateful_step_count=2)
TestMachine = Machine.TestCase
"""
    )
    monkeypatch.setenv("HICACHE_PROGRESS_EVERY", "10")
    result = _run(inner)
    result.assert_outcomes(passed=2)
    result.stdout.re_match_lines(
        [
            r"progress: test_inner.py::test_passes: 10 examples run \(\d+ s\)",
            r"progress: test_inner.py::test_passes: 20 examples run \(\d+ s\)",
            r"progress: test_inner.py::TestMachine::runTest: 10 examples run \(\d+ s\)",
            r"progress: test_inner.py::TestMachine::runTest: 20 examples run \(\d+ s\)",
        ]
    )


def test_progress_is_on_for_fuzz_only_unless_asked() -> None:
    assert progress_every("fuzz", {}) == 1000
    assert progress_every("dev", {}) == 0 and progress_every("ci", {}) == 0
    assert progress_every("dev", {"HICACHE_PROGRESS_EVERY": "50"}) == 50
    assert progress_every("fuzz", {"HICACHE_PROGRESS_EVERY": "0"}) == 0
    with pytest.raises(pytest.UsageError, match="HICACHE_PROGRESS_EVERY='ten'"):
        progress_every("dev", {"HICACHE_PROGRESS_EVERY": "ten"})


def test_the_walked_modules_exist_and_the_rest_run_unwalked() -> None:
    listed = WALK_BOTH | WALK_ONLY
    assert not WALK_BOTH & WALK_ONLY
    assert sorted(m for m in listed if not (REPO / "tests" / f"{m}.py").exists()) == []
    assert plane_walks("test_control") == ("walked", "unwalked")
    assert plane_walks("test_testing_machine") == ("walked",)
    assert plane_walks("test_spec") == ("unwalked",)
