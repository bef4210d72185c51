"""README's "Check your engine", run as written: every step of the section, in order, in a
temporary directory outside the repository, as a user who installed hicache runs them.

The steps are the section's code blocks up to its first unnumbered subsection: a ```python
block whose first line is `# NAME.py` is saved as NAME.py; each line of a ```bash block is
run with bash, and must exit with the status its `# exit N` comment says (0 without one). The
install line is not run: the runner has hicache installed already (`pip install -e .` in CI),
and the steps' `hicache` and `python3` are the runner's own (its environment: PATH leads to
its scripts, PYTHONPATH is left as the runner has it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="needs torch (`vectors run`): pip install -e '.[data]'")

import hicache
from hicache.oracle.checktrace.verdict import MALFORMED, VALID, VIOLATION

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
HEADING = "## Check your engine\n"
BLOCK = re.compile(r"^```(bash|python)\n(.*?)^```$", re.S | re.M)
EXIT = re.compile(r"#\s*exit (\d+)\b")
FILE = re.compile(r"# (\w+\.py)\b")
INSTALL = "pip install "
STEP_TIMEOUT_S = 600


def section() -> str:
    """The section's steps: from its heading to its first unnumbered subsection."""
    text = README.read_text(encoding="utf-8")
    start = text.index(HEADING)
    end = re.compile(r"^### (?!\d)", re.M).search(text, start)
    assert end is not None, "the section ends with the machine's details"
    return text[start : end.start()]


@dataclass(frozen=True)
class Step:
    """`kind` "file" (save `text` as `name`), "run" (run `text`, expect `status`) or
    "install" (the install line, not run)."""

    kind: str
    text: str
    status: int = 0
    name: str = ""


def steps() -> list[Step]:
    """The section's steps, in its order."""
    out: list[Step] = []
    for lang, body in BLOCK.findall(section()):
        if lang == "python":
            named = FILE.match(body)
            assert named, f"a python step names its file on its first line: {body[:60]!r}"
            out.append(Step("file", body, name=named.group(1)))
            continue
        for line in body.splitlines():
            command = line.strip()
            if not command or command.startswith("#"):
                continue
            status = EXIT.search(command)
            kind = "install" if command.startswith(INSTALL) else "run"
            out.append(Step(kind, command, int(status.group(1)) if status else 0))
    return out


def _environment() -> dict[str, str]:
    """The runner's environment, its scripts first on PATH (the `hicache` it installed)."""
    env = dict(os.environ)
    scripts = [sysconfig.get_path("scripts"), str(Path(sys.executable).parent)]
    env["PATH"] = os.pathsep.join([*scripts, env.get("PATH", "")])
    env.pop("HICACHE_HYPOTHESIS_PROFILE", None)  # the nightly profile's default is 250k steps
    return env


def test_the_section_documents_one_path_with_the_three_verdicts() -> None:
    """Install, the template, both commands with one factory, a trace, and each of
    check-trace's exit statuses shown once."""
    found = steps()
    commands = [s.text for s in found if s.kind == "run"]
    assert found[0].kind == "install"
    assert any("python3 -m hicache.testing.template > myengine.py" in c for c in commands)
    for command in ("hicache fuzz --adapter myengine:factory", "hicache vectors generate"):
        assert any(c.startswith(command) for c in commands), command
    assert any("vectors run" in c and "--adapter myengine:factory" in c for c in commands)
    checks = {s.status for s in found if s.text.startswith("hicache check-trace")}
    assert checks == {VALID, VIOLATION, MALFORMED}
    assert any(s.kind == "file" for s in found)


def test_the_steps_run_as_written_outside_the_repository(tmp_path: Path) -> None:
    work = tmp_path / "myproject"
    work.mkdir()
    # Verify the steps run outside the repository, on the hicache this test imports.
    assert not work.resolve().is_relative_to(ROOT)
    env = _environment()
    where = subprocess.run(
        ["python3", "-c", "import hicache; print(hicache.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT_S,
        check=True,
    )
    assert Path(where.stdout.strip()) == Path(hicache.__file__), where.stdout
    ran = 0
    for step in steps():
        if step.kind == "install":
            continue
        if step.kind == "file":
            (work / step.name).write_text(step.text, encoding="utf-8")
            continue
        done = subprocess.run(
            ["bash", "-c", step.text],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=STEP_TIMEOUT_S,
        )
        assert done.returncode == step.status, (
            f"README step `{step.text}` exited {done.returncode}, not {step.status}:\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
        ran += 1
    assert ran >= 8
