"""The repository cites only what it contains: no tracked file may point a reader at the
project's private background notes, which are not in the repository. What a reader needs from
them belongs in spec/, in benchmarks/results/ or in the docstring itself."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRIVATE_NOTES = ("DESIGN", "LIMITS", "SOURCES", "BUGCLASSES", "MULTIPOOL")
# Built from parts so that this file does not cite them itself.
CITATION = re.compile(r"\b(" + "|".join(PRIVATE_NOTES) + r")\.md\b")
# Pointing at outside articles without naming a file cites them too ("as the article
# measures"): the text must state the fact itself. Built from parts, like CITATION.
OUTSIDE = re.compile(r"\b" + "write" + r"-?ups?\b|\bthe sources'", re.IGNORECASE)


def _tracked_files() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    listed = (
        subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    paths = [ROOT / name for name in listed if name]
    return [p for p in paths if p.is_file() and not p.is_symlink()]


def test_no_tracked_file_cites_the_private_notes() -> None:
    files = _tracked_files()
    assert any(p.name == "README.md" for p in files)  # the listing found the repository
    found = []
    for path in files:
        text = path.read_bytes().decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if CITATION.search(line) or OUTSIDE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "cites notes that are not in the repository:\n" + "\n".join(found)


README = ROOT / "README.md"
FIGURE = re.compile(r"(?<![\w.])~?\d[\d,.]*\s?(x|\u00d7|%|µs|us|ms|GB/s|GiB/s|MB/s)(?!\w)")
"""A measured figure in prose: a ratio, a share, a time or a bandwidth (`~7x`, `4.7%`)."""
RESULTS = re.compile(r"benchmarks/results/[\w./-]*[\w/]")
"""A committed measurement: a path under benchmarks/results/."""


def _prose_paragraphs(text: str) -> list[str]:
    """`text`'s paragraphs outside fenced code blocks (a transcript shows output, it states
    no figure), each a block of lines between blank ones."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return [p for p in re.split(r"\n\s*\n", prose) if p.strip()]


def test_every_figure_the_readme_states_cites_its_measurement() -> None:
    """A figure in the README is a measurement, and a reader must be able to find it: the
    paragraph that states it names a file or directory of benchmarks/results/, and every
    such name exists. The README said "~7x less time per collective than gloo on a 2-core
    box", which no committed run measured (measured from outside: 1.3x)."""
    text = README.read_text(encoding="utf-8")
    uncited = [
        f"{figure.group(0)!r} in: {' '.join(p.split())[:120]}"
        for p in _prose_paragraphs(text)
        if (figure := FIGURE.search(p)) and not RESULTS.search(p)
    ]
    assert not uncited, "cite the measurement (benchmarks/results/...):\n" + "\n".join(uncited)
    missing = [path for path in RESULTS.findall(text) if not (ROOT / path).exists()]
    assert not missing, f"the README cites results that are not committed: {missing}"
