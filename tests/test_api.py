"""The library surface: what `import hicache` exports (lazily, torch-free), and the README's
Python examples, executed so that they cannot rot."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import hicache
from hicache.app.extras import is_optional

README = Path(__file__).resolve().parents[1] / "README.md"
PRINTS = re.compile(r"# prints: (.+?)(?: \(.*\))?$", re.M)
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)
EXPORTS = {
    "ControlPlane",
    "CacheConfig",
    "CacheController",
    "Snapshot",
    "check_all",
    "Violation",
    "Tracer",
    "ListSink",
    "NdjsonSink",
    "HiCacheError",
}


def test_hicache_exports_the_starting_points_with_a_version() -> None:
    assert set(hicache.__all__) == EXPORTS | {"__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", hicache.__version__)
    assert EXPORTS <= set(dir(hicache))
    assert issubclass(hicache.HiCacheError, Exception)
    assert hicache.check_all is __import__("hicache.invariants", fromlist=["x"]).check_all
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        _ = hicache.NoSuchThing


def test_import_hicache_and_its_torch_free_names_load_no_torch() -> None:
    probe = (
        "import sys, hicache\n"
        "names = [n for n in hicache.__all__ if n != 'CacheController']\n"
        "values = [getattr(hicache, n) for n in names]\n"
        "print('torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "False", done.stderr


def _readme_blocks() -> list[str]:
    return PYTHON_BLOCK.findall(README.read_text(encoding="utf-8"))


def test_the_readme_has_its_python_examples() -> None:
    blocks = _readme_blocks()
    assert len(blocks) >= 2 and any("CacheController(" in b for b in blocks)
    assert any("ControlPlane(" in b and "CacheController" not in b for b in blocks)


@pytest.mark.parametrize("index", range(len(_readme_blocks())))
def test_readme_python_block_runs(index: int, capsys: pytest.CaptureFixture[str]) -> None:
    code = _readme_blocks()[index]
    try:
        exec(compile(code, f"README.md python block {index + 1}", "exec"), {"__name__": "readme"})
    except ModuleNotFoundError as e:
        if not is_optional(e.name):
            raise
        pytest.skip(f"README block {index + 1} needs {e.name}")
    out = capsys.readouterr().out
    assert out.strip(), "a README example should show its result"
    # A line's `# prints: X` comment is what it prints (X up to a parenthesised remark); the
    # example's first comments once said a hit of 12 tokens where it printed 8.
    for said in PRINTS.findall(code):
        assert said.strip() in out, (
            f"README block {index + 1} says it prints {said!r}; it printed {out!r}"
        )
