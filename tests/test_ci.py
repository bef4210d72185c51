"""CI checks with the tools it pins and runs the README's test command (README, "Contributing").

`.ci/run` installs `.ci/requirements-dev.txt`, the lock `.ci/lock` makes from pyproject.toml:
a lock that misses a dependency, or pins a version pyproject.toml no longer admits, would let
a fresh machine check with a tool nobody chose. These tests keep the three files in step.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LOCKED_EXTRAS = ("test", "dev")  # .ci/lock's --extra options; torch (`data`) is not locked


def _readme_test_command() -> str:
    block = (ROOT / "README.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    tests = [line for line in lines if "pytest" in line]
    # Verify the README opens with one test command (the second of its two commands).
    assert len(tests) == 1, lines
    return tests[0]


def _lock() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / ".ci" / "requirements-dev.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version
    return pins


def _locked_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in LOCKED_EXTRAS:
        wanted += project["optional-dependencies"][extra]
    return [Requirement(r) for r in wanted]


def test_ci_runs_exactly_the_readmes_test_command() -> None:
    run = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert shlex.split(run[-1]) == shlex.split(_readme_test_command())


def test_ci_installs_its_tools_from_the_lock_and_checks_format_lint_and_types() -> None:
    run = (ROOT / ".ci" / "run").read_text()
    assert "-r .ci/requirements-dev.txt" in run
    for check in ("ruff format --check .", "ruff check .", "mypy --strict -p hicache"):
        assert check in run, check


def test_the_lock_pins_every_dependency_at_a_version_pyproject_admits() -> None:
    pins = _lock()
    for requirement in _locked_requirements():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not in the lock: run .ci/lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"the lock pins {name}=={pins[name]}, which {requirement} excludes: run .ci/lock"
        )


def test_the_lock_pins_exact_versions_only() -> None:
    text = (ROOT / ".ci" / "requirements-dev.txt").read_text()
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        assert not line or re.fullmatch(r"[A-Za-z0-9_.\-]+==[A-Za-z0-9_.+\-]+", line), line
