"""The `hicache` command line: in-process through `main`, and once as `python -m hicache`."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import hicache.app.cli as cli
from hicache.app.cli import main
from hicache.core.diagram import DIAGRAMS, all_diagrams
from hicache.core.lifecycle import load_lifecycle
from hicache.invariants.registry import CHECKS
from hicache.spec import SPEC_DIR


def test_spec_check_ok(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["spec", "check"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK: ")
    assert "23 transitions, 23 composite states, 94 composite edges" in out
    assert f"{len(CHECKS)} invariant checks" in out


def test_spec_check_reports_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec"
    shutil.copytree(SPEC_DIR, spec, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    md = spec / "lifecycle.md"
    md.write_text(
        md.read_text(encoding="utf-8").replace("    TREE --> FREE: free\n", ""), encoding="utf-8"
    )
    assert main(["spec", "check", "--spec-dir", str(spec)]) == 1
    captured = capsys.readouterr()
    assert "diagram 'ownership' is stale" in captured.out
    assert "1 difference(s)" in captured.err
    # The fix it names is for this copy: without --spec-dir it would rewrite the installed spec.
    assert f"run `hicache spec write-diagrams --spec-dir {spec}`" in captured.out
    # write-diagrams repairs it in place; the check then passes.
    assert main(["spec", "write-diagrams", "--spec-dir", str(spec)]) == 0
    assert "rewrote ownership" in capsys.readouterr().out
    assert main(["spec", "check", "--spec-dir", str(spec)]) == 0
    assert main(["spec", "write-diagrams", "--spec-dir", str(spec)]) == 0
    assert "every diagram is current" in capsys.readouterr().out


@pytest.mark.parametrize("which", DIAGRAMS)
def test_spec_diagram_one(which: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["spec", "diagram", "--which", which]) == 0
    assert capsys.readouterr().out == all_diagrams(load_lifecycle())[which]


def test_spec_diagram_all(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["spec", "diagram"]) == 0
    out = capsys.readouterr().out
    assert [line[3:] for line in out.splitlines() if line.startswith("%% ")] == list(DIAGRAMS)
    assert out.count("stateDiagram-v2") == len(DIAGRAMS)


def test_invariants_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["invariants"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(CHECKS)
    for line, check in zip(lines, CHECKS):
        assert line.split()[:2] == [check.id, check.name]
        assert line.endswith(check.summary)


@pytest.mark.parametrize(
    "argv, option",
    [
        (["spec", "diagram", "--which", "L4"], "--which"),
        (["spec", "check", "--spec-dir", "/nonexistent/spec"], "--spec-dir"),
        (["spec", "frobnicate"], "ACTION"),
        (["bench", "nope"], "NAME"),
        ([], "COMMAND"),
    ],
)
def test_usage_errors_are_one_line(
    argv: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "error" in captured.err and option in captured.err


def test_delegated_command_runs_module_main(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    class Module:
        @staticmethod
        def main(argv: list[str]) -> int:
            seen.append(argv)
            return 3

    monkeypatch.setitem(sys.modules, "hicache_test_fake_bench", Module)
    monkeypatch.setitem(cli.DELEGATED, ("bench", "control"), "hicache_test_fake_bench")
    monkeypatch.setitem(cli.DELEGATED, ("demo",), "hicache_test_fake_bench")
    assert main(["bench", "control", "--pages", "8", "--help"]) == 3
    assert main(["demo", "-x"]) == 3
    assert seen == [["--pages", "8", "--help"], ["-x"]]


def test_delegated_module_missing_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(cli.DELEGATED, ("bench", "control"), "hicache.no_such_module")
    assert main(["bench", "control"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "hicache.no_such_module cannot be imported" in err


def test_python_dash_m() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hicache", "spec", "check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("OK: ")


# -- interruption, closed pipes, version and help ------------------------------------------------

REPO = Path(__file__).resolve().parent.parent


def run_python(code: str, *, stdout: int = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter that imports this checkout's hicache (stderr captured)."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        text=True,
        timeout=120,
        check=False,
        stdout=stdout,
        stderr=subprocess.PIPE,
    )


@pytest.mark.parametrize(
    "words, name",
    [
        (["demo", "--requests", "5"], "hicache demo"),
        (["bench", "control", "--tokens", "64"], "hicache bench control"),
    ],
)
def test_ctrl_c_in_a_delegated_command_is_one_line_and_status_130(
    words: list[str],
    name: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    class Module:
        @staticmethod
        def main(argv: list[str]) -> int:
            raise KeyboardInterrupt

    monkeypatch.setitem(sys.modules, "hicache_test_fake_command", Module)
    monkeypatch.setitem(cli.DELEGATED, tuple(words[:-2]), "hicache_test_fake_command")
    assert main(words) == 130
    assert capsys.readouterr().err == f"{name}: interrupted\n"


def test_ctrl_c_in_a_builtin_command_is_one_line_and_status_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "registry_checks", interrupted)
    assert main(["invariants"]) == 130
    assert capsys.readouterr().err == "hicache invariants: interrupted\n"


@pytest.mark.torch  # runs the demo
def test_sigint_during_the_demo_exits_130_with_one_line() -> None:
    """A real SIGINT in the middle of a real demo run (its L3 I/O threads running): the demo
    cleans up, the process exits 130, and stderr is one line -- it was a 15-line traceback."""
    code = (
        "import os, signal, sys\n"
        # Ctrl-C as an interactive shell delivers it: a process started from a background job
        # (bash without job control, CI runners) inherits SIGINT ignored, and Python then
        # installs no KeyboardInterrupt handler, so the demo rightly ran to the end (exit 0).
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "import hicache.app.serving as serving\n"
        "from hicache.app.cli import main\n"
        "step = serving.ServingLoop._decode_step\n"
        "calls = []\n"
        "def interrupted(self, batch):\n"
        "    calls.append(batch)\n"
        "    if len(calls) == 10:\n"
        "        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, delivered to this process\n"
        "    return step(self, batch)\n"
        "serving.ServingLoop._decode_step = interrupted\n"
        "sys.exit(main(['demo', '--device', 'cpu', '--requests', '40', '--check-mode', 'off', "
        "'--quiet']))\n"
    )
    done = run_python(code)
    assert done.returncode == 130, done.stderr
    assert done.stderr == "hicache demo: interrupted\n"


def test_stdout_closed_early_exits_141_without_a_traceback() -> None:
    """`hicache invariants | head -1`: the reader is gone before anything is written (its end
    of the pipe is closed before the command starts), so every write fails with EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = run_python(
            "import sys; from hicache.app.cli import main; sys.exit(main(['invariants']))",
            stdout=write_end,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 141
    assert done.stderr == ""


def test_version_comes_from_the_package_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"hicache {importlib.metadata.version('hicache')}\n"


def test_help_describes_every_command_in_one_real_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    top = " ".join(capsys.readouterr().out.split())
    groups = {}
    for group in sorted({w[0] for w in cli.DELEGATED if len(w) == 2}):  # bench, vectors
        assert main([group, "--help"]) == 0
        groups[group] = " ".join(capsys.readouterr().out.split())
    assert "run hicache." not in top and "bench: control" not in top
    for words in cli.DELEGATED:
        assert cli.SUMMARIES[words] in (top if len(words) == 1 else groups[words[0]])
    assert cli.SUMMARIES[("bench",)] in top
