"""The `hicache` command line: in-process through `main`, and once as `python -m hicache`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import hicache.cli as cli
from hicache.cli import main
from hicache.diagram import DIAGRAMS, all_diagrams
from hicache.invariants.registry import CHECKS
from hicache.lifecycle import load_lifecycle
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
    md.write_text(md.read_text(encoding="utf-8").replace("    TREE --> FREE: free\n", ""), encoding="utf-8")
    assert main(["spec", "check", "--spec-dir", str(spec)]) == 1
    captured = capsys.readouterr()
    assert "diagram 'ownership' is stale" in captured.out
    assert "1 difference(s)" in captured.err
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


@pytest.mark.parametrize("argv, option", [
    (["spec", "diagram", "--which", "L4"], "--which"),
    (["spec", "check", "--spec-dir", "/nonexistent/spec"], "--spec-dir"),
    (["spec", "frobnicate"], "ACTION"),
    (["bench", "nope"], "NAME"),
    ([], "COMMAND"),
])
def test_usage_errors_are_one_line(argv: list[str], option: str, capsys: pytest.CaptureFixture[str]) -> None:
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
    done = subprocess.run([sys.executable, "-m", "hicache", "spec", "check"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("OK: ")
