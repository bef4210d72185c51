"""The house's floors: the checker imports the core, never the reverse.

The core vocabulary (`hicache.pages`: `Pages`, `pages()`, FREE / PRIVATE / TREE;
`hicache.snapshot`: `Snapshot` and its records) lives in the core. Code outside `invariants/`
may import from `hicache.invariants` only its entry points (`hicache.invariants.ENTRY_POINTS`,
documented in invariants/__init__.py); the check functions themselves are the checker's own
business and its own test's (tests/test_invariants.py).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from hicache.invariants import ENTRY_POINTS

ROOT = Path(__file__).resolve().parent.parent
CHECKER = "hicache.invariants"
ENTRY_MODULES = {CHECKER, f"{CHECKER}.checker", f"{CHECKER}.registry", f"{CHECKER}.violation"}
# The checker's own tests reach its individual checks; this file reads ENTRY_POINTS itself.
EXEMPT = {
    ROOT / "tests" / "test_invariants.py",
    ROOT / "tests" / "test_invariants_fast.py",
    Path(__file__).resolve(),
}
# Imported by the checker, so they must import no part of it (not even an entry point).
CORE = (
    "hicache.errors",
    "hicache.pages",
    "hicache.snapshot",
    "hicache.tiers",
    "hicache.tree",
    "hicache.lifecycle",
    "hicache.trace",
)
# What the checker may import from the rest of hicache: the core it reads, nothing above it.
CHECKER_READS = ("hicache.errors", "hicache.pages", "hicache.snapshot", CHECKER)


def python_files() -> list[Path]:
    """Every .py file of the repository outside invariants/ (real files: symlinks skipped)."""
    out = []
    for top in ("hicache", "kernels", "spec", "tests", "benchmarks"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).parts
            if rel[:2] in {("hicache", "invariants"), ("hicache", "kernels"), ("hicache", "spec")}:
                continue  # symlinks to invariants/, kernels/, spec/: scanned there (or skipped)
            out.append(path)
    return out


def checker_imports(path: Path) -> list[tuple[int, str, str]]:
    """(line, module, name) for every name `path` takes from hicache.invariants; name "*" for
    `import hicache.invariants...` and for module names in string constants (importlib; not
    in tests, which name modules that do not exist on purpose)."""
    lazy = "tests" not in path.relative_to(ROOT).parts if path.is_relative_to(ROOT) else True
    found: list[tuple[int, str, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(CHECKER):
            found += [(node.lineno, node.module or "", a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "hicache":
            found += [(node.lineno, CHECKER, "*") for a in node.names if a.name == "invariants"]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, "*") for a in node.names if a.name.startswith(CHECKER)]
        elif (
            lazy
            and isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.startswith(CHECKER + ".")
            and " " not in node.value
        ):
            found.append((node.lineno, node.value, "*"))
    return found


def test_only_entry_points_are_imported_from_the_checker() -> None:
    wrong = []
    for path in python_files():
        if path in EXEMPT:
            continue
        for line, module, name in checker_imports(path):
            if module not in ENTRY_MODULES or (name != "*" and name not in ENTRY_POINTS):
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {name} from {module}")
    assert wrong == [], "import these from the core (hicache.pages, hicache.snapshot) instead"


def test_the_core_imports_nothing_from_the_checker() -> None:
    wrong = [
        f"{m}:{line} {module}"
        for m in CORE
        for line, module, _ in checker_imports(ROOT / (m.replace(".", "/") + ".py"))
    ]
    assert wrong == []
    # And at run time: loading the core vocabulary does not load the checker.
    code = (
        f"import sys; import {', '.join(CORE)}; "
        f"print(sorted(m for m in sys.modules if m.startswith('{CHECKER}')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert done.stdout.strip() == "[]"


def test_the_checker_reads_only_the_core() -> None:
    wrong = []
    for path in sorted((ROOT / "invariants").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom) or node.module is None:
                continue
            if node.module.startswith("hicache") and not node.module.startswith(CHECKER_READS):
                wrong.append(f"{path.name}:{node.lineno}: {node.module}")
    assert wrong == []


def test_the_rule_catches_a_core_name_taken_from_the_checker(tmp_path: Path) -> None:
    """The scan itself works: each way of reaching past the entry points is found."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from hicache.invariants.ownership import RESIDENT\n"
        "from hicache.invariants import check_all, check_publish_order\n"
        "import hicache.invariants.structure\n"
        "MODULE = 'hicache.invariants.bytes'\n"
    )
    found = checker_imports(probe)
    assert [(m, n) for _, m, n in found] == [
        (f"{CHECKER}.ownership", "RESIDENT"),
        (CHECKER, "check_all"),
        (CHECKER, "check_publish_order"),
        (f"{CHECKER}.structure", "*"),
        (f"{CHECKER}.bytes", "*"),
    ]
    allowed = [
        (m, n) for _, m, n in found if m in ENTRY_MODULES and (n == "*" or n in ENTRY_POINTS)
    ]
    assert allowed == [(CHECKER, "check_all")]
