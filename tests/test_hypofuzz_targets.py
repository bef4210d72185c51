"""HypoFuzz targets (hicache/testing/hypofuzz_targets.py): pytest collects every machine of
the module, a target runs a few examples under plain pytest counting its steps
(hicache/testing/fuzzstats.py), a failing run is counted with its kind, and `hicache
hypofuzz` says what to install without HypoFuzz. With HypoFuzz installed (the `fuzz` extra;
skipped here otherwise) HypoFuzz's own collection takes every target, and the command fuzzes
one for a few seconds, finding a bug-zoo mutant when one is switched on."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
import unittest
from pathlib import Path

import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from hicache.testing import fuzzstats, hypofuzz_targets
from hicache.testing.fuzzstats import STATS_ENV, summarise, with_step_counts
from hicache.testing.hypofuzz_command import targets_file

REPO = Path(__file__).resolve().parent.parent
TARGETS = [
    "TestFuzzNull",
    "TestFuzzCpu",
    "TestFuzzDsv4",
    "TestFuzzDsv41",
    "TestFuzzCpuDsv4",
    "TestFuzzTp",
    "TestFuzzTpDsv4",
    "TestFuzzTemplate",
]


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def _run(
    argv: list[str], cwd: Path, timeout: float, **extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=cwd,
        env=_env(**extra),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _collect(cwd: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """pytest's collection of the targets file (`args` appended), in `cwd`, with `extra` env."""
    argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    return _run([*argv, targets_file(), *args], cwd, timeout=120, **extra)


def test_the_module_is_the_file_the_command_points_hypofuzz_at() -> None:
    assert Path(targets_file()) == Path(hypofuzz_targets.__file__)
    for name in TARGETS:
        case = getattr(hypofuzz_targets, name)
        assert issubclass(case, unittest.TestCase)
        assert case.settings.database == settings().database  # HypoFuzz fuzzes no other
    assert not hasattr(hypofuzz_targets, "TestFuzzAdapter")  # only with ADAPTER_ENV set


def test_pytest_collects_every_target(tmp_path: Path) -> None:
    done = _collect(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    collected = {line.split("::")[1] for line in done.stdout.splitlines() if "::" in line}
    assert collected == set(TARGETS), done.stdout


def test_an_outside_adapter_is_a_target_when_named(tmp_path: Path) -> None:
    done = _collect(
        tmp_path,
        "-k",
        "Adapter",
        **{hypofuzz_targets.ADAPTER_ENV: "hicache.testing.template:factory"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "TestFuzzAdapter::runTest" in done.stdout, done.stdout


def test_a_target_runs_a_few_examples_and_counts_its_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STATS_ENV, str(tmp_path))
    for case in (hypofuzz_targets.TestFuzzNull, hypofuzz_targets.TestFuzzTemplate):
        result = unittest.TextTestRunner(stream=io.StringIO()).run(
            unittest.defaultTestLoader.loadTestsFromTestCase(case)
        )
        assert result.wasSuccessful(), result.failures + result.errors
    recorder = fuzzstats.recorder()
    assert recorder is not None
    recorder.write()  # the last second's steps (a worker writes at most every FLUSH_S)
    s = summarise(tmp_path)
    assert s.workers == 1 and s.per_worker[0]["pid"] == os.getpid()
    assert s.runs >= 2 * hypofuzz_targets.PYTEST_EXAMPLES  # (and what the database replays)
    assert s.steps >= s.runs and s.steps_per_s > 0
    assert s.failing_runs == 0 and s.first_failure == {} and s.failures == {}


class Breaks(RuleBasedStateMachine):
    """A machine whose second step fails."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    @rule(x=st.integers(0, 3))
    def step(self, x: int) -> None:
        self.n += 1
        if self.n == 2:
            raise ValueError(f"boom\nat step {self.n}")


def test_a_failing_run_is_counted_with_its_kind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STATS_ENV, str(tmp_path))
    counted = with_step_counts(Breaks, "Breaks")
    quick = settings(database=None, max_examples=5, phases=[Phase.generate], deadline=None)
    with pytest.raises(ValueError, match="boom"):
        run_state_machine_as_test(counted, settings=quick)
    s = summarise(tmp_path)  # written at the first failing run
    assert s.failing_runs >= 1 and s.runs >= s.failing_runs
    # Its kind: the type and the first line; the failing step itself is not a step counted.
    assert s.failures == {"Breaks": {"ValueError: boom": s.failing_runs}}
    assert s.first_step is not None and s.first_failure["Breaks"] >= s.first_step


class BreaksAtTeardown(RuleBasedStateMachine):
    """Every step passes; the run fails when it ends -- where the fuzz machines judge their
    oracle (hicache/testing/selfcheck.py raises in the teardown)."""

    @rule()
    def step(self) -> None:
        pass

    def teardown(self) -> None:
        raise AssertionError("self-check: check-trace accepted a corrupted trace")


def test_a_run_failing_in_its_teardown_is_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STATS_ENV, str(tmp_path))
    counted = with_step_counts(BreaksAtTeardown, "BreaksAtTeardown")
    quick = settings(database=None, max_examples=5, phases=[Phase.generate], deadline=None)
    with pytest.raises(AssertionError, match="self-check"):
        run_state_machine_as_test(counted, settings=quick)
    s = summarise(tmp_path)
    assert s.failing_runs >= 1, "a failure raised by the teardown was not counted"
    kind = "AssertionError: self-check: check-trace accepted a corrupted trace"
    assert s.failures == {"BreaksAtTeardown": {kind: s.failing_runs}}


def test_nothing_is_counted_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STATS_ENV, raising=False)
    assert fuzzstats.recorder() is None


def test_the_command_without_hypofuzz_says_what_to_install() -> None:
    probe = (
        "import sys; sys.modules['hypofuzz'] = None\n"
        "from hicache.app.cli import main\nsys.exit(main(['hypofuzz', '-n', '1']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert "needs hypofuzz" in done.stderr and "'.[fuzz]'" in done.stderr, done.stderr


def _fake_hypofuzz(root: Path, source: str) -> Path:
    """A package `hypofuzz` under `root` whose worker module is `source`."""
    package = root / "hypofuzz"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "hypofuzz.py").write_text(source)
    return root


def test_a_hypofuzz_that_would_crash_at_its_first_find_is_refused(tmp_path: Path) -> None:
    """HypoFuzz 25.11.1 reads a field Hypothesis 6.157.1 removed, after shrinking a failure:
    the pair is refused before any worker starts (exit 2, one line), never run to die at
    the first find; the HypoFuzz that does not read it is let through."""
    import dataclasses

    from hypothesis.internal.conjecture.data import ConjectureResult

    gone = "slice_comments" not in {f.name for f in dataclasses.fields(ConjectureResult)}
    reads = "data.slice_comments = shrinker.shrink_target.slice_comments\n"
    for name, source, refused in (("reads", reads, gone), ("clean", "x = 1\n", False)):
        root = _fake_hypofuzz(tmp_path / name, source)
        hicache = [sys.executable, "-m", "hicache", "hypofuzz", "-n", "1", "--seconds", "1"]
        done = _run(
            [*hicache, "-k", "NoSuchTarget"],
            tmp_path,
            120,
            PYTHONPATH=os.pathsep.join([str(root), str(REPO)]),
        )
        if refused:
            assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
            assert "slice_comments" in done.stderr and "hypothesis<6.157.1" in done.stderr
        else:
            assert "slice_comments" not in done.stderr, (name, done.stderr)


def test_sigterm_stops_the_workers_as_ctrl_c_does(tmp_path: Path) -> None:
    """`kill` of `hicache hypofuzz` (or a CI job's timeout) stops the fuzz it started -- its
    workers run in their own session, so nothing else would -- and still reports."""
    pidfile = tmp_path / "worker.pid"
    worker = (
        f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    )
    script = (
        "import sys, types\n"
        "sys.modules['hypofuzz'] = types.ModuleType('hypofuzz')\n"
        "from hicache.testing import hypofuzz_command as h\n"
        "h.shrink_incompatibility = lambda: None\n"
        f"h.fuzz_command = lambda args: [sys.executable, '-c', {worker!r}]\n"
        "sys.exit(h.main(['-n', '1']))\n"
    )
    run = subprocess.Popen(
        [sys.executable, "-c", script], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, text=True
    )
    try:
        deadline = time.time() + 60
        while not (pidfile.exists() and pidfile.read_text()) and time.time() < deadline:
            time.sleep(0.1)
        pid = int(pidfile.read_text())
        run.send_signal(signal.SIGTERM)
        out, _ = run.communicate(timeout=60)
        assert run.returncode == 130, out  # stopped, nothing found: as after Ctrl-C
        assert out.startswith("hypofuzz: 0 workers"), out  # the report (this worker counts nothing)
        gone = time.time() + 10
        while time.time() < gone:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
            raise AssertionError("the fuzz's worker outlived a SIGTERM to hicache hypofuzz")
    finally:
        run.kill()


def test_hypofuzz_collects_every_target(tmp_path: Path) -> None:
    pytest.importorskip("hypofuzz", reason="the fuzz extra: pip install -e '.[fuzz]'")
    probe = (
        "import sys\nfrom hypofuzz.collection import collect_tests\n"
        f"r = collect_tests([{targets_file()!r}, '-p', 'no:cacheprovider'])\n"
        "print(sorted(t.nodeid.split('::')[1] for t in r.fuzz_targets))\n"
        "print(r.not_collected)"
    )
    done = _run([sys.executable, "-c", probe], tmp_path, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[-2] == repr(sorted(TARGETS)) and lines[-1] == "{}", done.stdout


def test_hicache_hypofuzz_fuzzes_and_finds_a_mutant(tmp_path: Path) -> None:
    pytest.importorskip("hypofuzz", reason="the fuzz extra: pip install -e '.[fuzz]'")
    hicache = [sys.executable, "-m", "hicache", "hypofuzz", "-n", "1"]
    clean = _run(
        [*hicache, "--seconds", "25", "-k", "FuzzTemplate", "--stats", "clean"], tmp_path, 120
    )
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "hypofuzz: 1 workers" in clean.stdout and "0 target(s) failed" in clean.stdout
    assert summarise(tmp_path / "clean").steps > 0
    # checker-off: the checker's canary fails at the first step of any run.
    broken = _run(
        [*hicache, "--seconds", "40", "-k", "FuzzNull", "--mutant", "checker-off"], tmp_path, 150
    )
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "FuzzNull: first failing run after" in broken.stdout, broken.stdout
    assert "the checker misses" in broken.stdout, broken.stdout
