"""The house's floors: the checker imports the core, never the reverse; and no module of
hicache imports, through others, a module that imports it, but the known circles below.

The core vocabulary (`hicache.core.pages`: `Pages`, `pages()`, FREE / PRIVATE / TREE;
`hicache.core.snapshot`: `Snapshot` and its records) lives in the core. Code outside `invariants/`
may import from `hicache.invariants` only its entry points (`hicache.invariants.ENTRY_POINTS`,
documented in invariants/__init__.py); the check functions themselves are the checker's own
business and its own test's (tests/test_invariants.py).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections import deque
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
    "hicache.core.pages",
    "hicache.core.snapshot",
    "hicache.core.tiers",
    "hicache.core.tree",
    "hicache.core.lifecycle",
    "hicache.core.trace",
)
# What the checker may import from the rest of hicache: the core it reads, nothing above it.
CHECKER_READS = ("hicache.errors", "hicache.core.pages", "hicache.core.snapshot", CHECKER)


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
    assert wrong == [], (
        "import these from the core (hicache.core.pages, hicache.core.snapshot) instead"
    )


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


def package_modules(top: Path) -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package) for every .py file under the package directory
    `top` (symlinked subpackages followed: hicache/invariants, kernels and spec are hicache's)."""
    out = {}
    for folder, dirs, files in os.walk(top, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = Path(folder) / name
                parts = path.relative_to(top.parent).with_suffix("").parts
                package = parts[-1] == "__init__"
                out[".".join(parts[:-1] if package else parts)] = (path, package)
    return out


def imported_modules(name: str, path: Path, package: bool, known: set[str]) -> set[str]:
    """The modules of `known` that module `name` imports anywhere in its file. `from M import
    n` counts M.n where that is a module, else M; a package's __init__ counts only where
    something is imported from it (not as the parent every submodule's import runs)."""

    def known_prefix(module: str) -> str | None:
        parts = module.split(".")
        while parts and ".".join(parts) not in known:
            parts.pop()
        return ".".join(parts) or None

    here = name.split(".") if package else name.split(".")[:-1]
    found: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found |= {known_prefix(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            for a in node.names:
                sub = f"{module}.{a.name}"
                found.add(sub if sub in known else known_prefix(module))
    return {m for m in found if m is not None and m != name}


def import_graph(top: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    modules = package_modules(top)
    known = set(modules)
    return {m: imported_modules(m, p, package, known) for m, (p, package) in modules.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: set[str] = set()
            while not component or v not in component:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
            if len(component) > 1:
                out.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out, key=sorted)


def one_circle(graph: dict[str, set[str]], component: frozenset[str]) -> str:
    """A shortest circle through the component's first module, as `a -> b -> a`."""
    start = min(component)
    came: dict[str, str] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(graph[v] & component):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(came[path[-1]])
                return " -> ".join([start, *reversed(path[:-1]), start])
            if w not in came:
                came[w] = v
                queue.append(w)
    raise AssertionError(f"{sorted(component)} is not a circle")


def test_no_import_cycles_among_hicache_modules() -> None:
    """No import circle among hicache's modules: no strongly connected component of the
    import graph (every import counts: module level, in a function, under TYPE_CHECKING)."""
    graph = import_graph(ROOT / "hicache")
    cycles = import_cycles(graph)
    assert [one_circle(graph, c) for c in cycles] == [], (
        "untangle the circle: move what both modules need into a third, or make the "
        "dependency one-way (an import moved into a function is still a circle)"
    )


def test_the_cycle_scan_finds_every_kind_of_import(tmp_path: Path) -> None:
    """The scan itself works: module-level, in-function, relative and TYPE_CHECKING imports
    each close a circle; a package's __init__ counts only where names come from it."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "import pkg.b\n",
        "b.py": "def f():\n    from pkg import a\n",  # in a function: a -> b -> a
        "c.py": "from .sub import d\n",  # relative, a submodule by name
        "sub/__init__.py": "from pkg.sub.e import E\n",
        "sub/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..c import x\n",
        "sub/e.py": "from pkg.sub.f import y\nE = 1\n",
        "sub/f.py": "from . import g\n",
        "sub/g.py": "import os\nfrom pkg.a import z\n",  # only pkg.a: its parents are not edges
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = import_graph(pkg)
    assert graph["pkg.c"] == {"pkg.sub.d"}
    assert graph["pkg.sub.f"] == {"pkg.sub.g"}
    assert graph["pkg.sub.g"] == {"pkg.a"}
    cycles = import_cycles(graph)
    assert cycles == [frozenset({"pkg.a", "pkg.b"}), frozenset({"pkg.c", "pkg.sub.d"})]
    assert one_circle(graph, cycles[1]) == "pkg.c -> pkg.sub.d -> pkg.c"


def _imported(path: Path) -> set[str]:
    """Every module `path` imports from, at module level, in a function or under
    TYPE_CHECKING (a type-only import still ties the two modules' types together); for
    `from package import name`, both the package and package.name."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_below_the_controller_nothing_imports_it() -> None:
    """The controller imports hicache.distributed (agreement, collectives, ledger, rankview);
    those import no part of the controller, so no circle closes through them. cluster.py
    builds controllers (a harness above them) and no module of the controller imports it."""
    wrong = []
    for path in sorted((ROOT / "hicache" / "distributed").glob("*.py")):
        if path.name != "cluster.py":
            wrong += [
                f"{path.name}: {m}" for m in _imported(path) if m.startswith("hicache.controller")
            ]
    for path in sorted((ROOT / "hicache" / "controller").glob("*.py")):
        wrong += [
            f"{path.name}: {m}" for m in _imported(path) if m == "hicache.distributed.cluster"
        ]
    assert wrong == []


# -- private reaches -------------------------------------------------------------------------
# A module reads another module's objects through their public names only: a private field
# or method (`_name`) is its own class's business. The rule is static and practical: flag
# `x._name` (and getattr / hasattr / setattr of the literal "_name") where `x` is not
# self / cls / super() and `_name` is defined (assigned as `self._name`, or declared in a
# class body) in a class of another hicache module and in no class of the reading module (a
# module whose own class overrides the hook, e.g. a handle wrapping another handle, calls it
# on its kind). Namedtuple methods are public API. hicache/testing/adapters/ drives
# third-party engines through their privates: exempt (its own classes still count as owners).
NAMEDTUPLE = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}
REACH_EXEMPT = ("hicache.testing.adapters.",)


def hicache_modules() -> dict[str, Path]:
    """Module name -> file for every module of hicache/, its linked packages included."""
    out: dict[str, Path] = {}
    for top, _, names in os.walk(ROOT / "hicache", followlinks=True):
        for name in names:
            if name.endswith(".py"):
                path = Path(top) / name
                parts = path.relative_to(ROOT).with_suffix("").parts
                out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return dict(sorted(out.items()))


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _owners(trees: dict[str, ast.Module]) -> dict[str, set[str]]:
    """Private attribute name -> the modules whose classes define it."""
    owners: dict[str, set[str]] = {}
    for module, tree in trees.items():
        for cls in ast.walk(tree):
            if not isinstance(cls, ast.ClassDef):
                continue
            names: list[str] = []
            for st in cls.body:
                if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.append(st.name)
                elif isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                    names.append(st.target.id)
                elif isinstance(st, ast.Assign):
                    names += [t.id for t in st.targets if isinstance(t, ast.Name)]
            for node in ast.walk(cls):
                targets: list[ast.expr] = []
                if isinstance(node, ast.Assign):
                    targets = node.targets
                elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                    targets = [node.target]
                names += [
                    a.attr
                    for t in targets
                    for a in ast.walk(t)
                    if isinstance(a, ast.Attribute)
                    and isinstance(a.value, ast.Name)
                    and a.value.id == "self"
                ]
            for name in names:
                if _private(name):
                    owners.setdefault(name, set()).add(module)
    return owners


def _own_object(expr: ast.expr) -> bool:
    """self, cls or super(): the reading class's own object."""
    if isinstance(expr, ast.Name):
        return expr.id in ("self", "cls")
    return (
        isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "super"
    )


def private_reaches(trees: dict[str, ast.Module]) -> list[str]:
    """'module:line: expression' for every read of another module's class's private name."""
    owners = _owners(trees)
    found = []
    for module, tree in trees.items():
        if module.startswith(REACH_EXEMPT):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute | ast.Call):
                continue
            name = None
            if isinstance(node, ast.Attribute) and not _own_object(node.value):
                name = node.attr
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr", "setattr")
                and len(node.args) >= 2
                and not _own_object(node.args[0])
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
            ):
                name = node.args[1].value
            if name is None or not _private(name) or name in NAMEDTUPLE:
                continue
            defined = owners.get(name, set())
            if defined - {module} and module not in defined:
                found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_reads_another_modules_private_fields() -> None:
    trees = {m: ast.parse(p.read_text(), str(p)) for m, p in hicache_modules().items()}
    assert private_reaches(trees) == [], "give the owning class a public query instead"


def test_the_rule_catches_a_private_reach() -> None:
    """The scan itself works: a reach into another module's class is found, its own class's
    reads, self / super(), namedtuple methods and the adapters are not."""
    owner = (
        "class Tree:\n"
        "    _cache: dict[int, int]\n"
        "    def __init__(self):\n"
        "        self._nodes = {}\n"
        "    def _hook(self): ...\n"
        "    def same(self, other):\n"
        "        return other._nodes\n"
    )
    reader = (
        "def f(t, p):\n"
        "    a = t._nodes, t.tree._cache, getattr(t, '_hook', None), t._unknown\n"
        "    return p._replace(x=1), p._asdict()\n"
        "class Sub(Tree):\n"
        "    def g(self):\n"
        "        return self._nodes, super()._hook()\n"
    )
    adapter = "def h(t):\n    return t._nodes\n"
    trees = {
        "hicache.core.tree": ast.parse(owner),
        "hicache.reader": ast.parse(reader),
        "hicache.testing.adapters.x": ast.parse(adapter),
    }
    assert private_reaches(trees) == [
        "hicache.reader:2: t._nodes",
        "hicache.reader:2: t.tree._cache",
        "hicache.reader:2: getattr(t, '_hook', None)",
    ]


# -- a single pool is a group of one (issue 34) ---------------------------------------------------

GROUP_TYPES = ("TierPools", "TierTable", "GroupTable")
"""The tier tables' classes: only hicache/pools/ may ask which one it holds; everyone else
asks the group interface (`pools`, `pool_tables()`, `held_by`, ...: hicache/pools/tiertable.py)."""


def table_type_branches(trees: dict[str, ast.Module]) -> list[str]:
    """`module:line: expression` for every isinstance / issubclass call and every `is` / `==`
    comparison naming a tier table class, outside hicache.pools (by module, then line)."""
    found: list[tuple[str, int, str]] = []
    for module, tree in trees.items():
        if module == "hicache.pools" or module.startswith("hicache.pools."):
            continue
        for node in ast.walk(tree):
            names: list[ast.expr] = []
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("isinstance", "issubclass")
                and len(node.args) == 2
            ):
                names = [node.args[1]]
            elif isinstance(node, ast.Compare) and any(
                isinstance(op, ast.Is | ast.IsNot | ast.Eq | ast.NotEq) for op in node.ops
            ):
                names = [node.left, *node.comparators]
            named = {
                n.id if isinstance(n, ast.Name) else n.attr
                for expr in names
                for n in ast.walk(expr)
                if isinstance(n, ast.Name | ast.Attribute)
            }
            if named & set(GROUP_TYPES) and isinstance(node, ast.expr):
                found.append((module, node.lineno, ast.unparse(node)))
    return [f"{m}:{line}: {text}" for m, line, text in sorted(found)]


def test_no_module_outside_pools_branches_on_the_tier_tables_type() -> None:
    trees = {m: ast.parse(p.read_text(), str(p)) for m, p in hicache_modules().items()}
    assert table_type_branches(trees) == [], (
        "ask the group interface instead (a single pool is a group of one: "
        "hicache/pools/tiertable.py); `len(table.pools) > 1` where a record names the group"
    )


def test_the_rule_catches_a_branch_on_the_table_type() -> None:
    src = (
        "def f(t, tables):\n"
        "    a = isinstance(t, TierPools)\n"
        "    b = any(isinstance(x, (PageTable, tierpools.TierPools)) for x in tables)\n"
        "    c = type(t) is TierTable\n"
        "    d = isinstance(t, PageTable), t.pools == ('kv',)\n"
    )
    trees = {"hicache.core.queries": ast.parse(src), "hicache.pools.windows": ast.parse(src)}
    assert table_type_branches(trees) == [
        "hicache.core.queries:2: isinstance(t, TierPools)",
        "hicache.core.queries:3: isinstance(x, (PageTable, tierpools.TierPools))",
        "hicache.core.queries:4: type(t) is TierTable",
    ]


def test_the_top_level_shows_the_layers() -> None:
    """hicache/ holds the layer folders and only the shared vocabulary beside them; each
    folder is named, with what it holds, in the package docstring (the reader's map)."""
    import hicache

    top = ROOT / "hicache"
    modules = sorted(p.name for p in top.glob("*.py"))
    assert modules == ["__init__.py", "__main__.py", "choices.py", "errors.py"], modules
    folders = sorted(p.name for p in top.iterdir() if p.is_dir() and p.name != "__pycache__")
    doc = hicache.__doc__ or ""
    missing = [f for f in folders if f"    {f}/" not in doc]
    assert missing == [], f"name these folders in hicache/__init__.py's layer list: {missing}"
    listed = {
        line.split()[0].rstrip("/")
        for line in doc.splitlines()
        if line.startswith("    ") and line.split()[0].endswith("/")
    }
    assert listed <= set(folders), (
        f"the layer list names folders that do not exist: {listed - set(folders)}"
    )
