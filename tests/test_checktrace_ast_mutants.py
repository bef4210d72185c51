"""The AST mutant generator (benchmarks/ast_mutants.py) of benchmarks/checktrace_ast_mutants.py
and engine_ast_mutants.py: its sites are the same on every call, and each mutant differs from
the source at exactly one site (no test runs here)."""

from __future__ import annotations

import ast
import difflib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "checktrace_ast_mutants.py"

SOURCE = '''"""a module"""
LIMIT = 3


def judge(xs, problems):
    for x in xs:
        if x == LIMIT and not x < 0:
            problems.append(x)
            continue
        if x is None:
            raise ValueError(f"{x} at {1}")
    return len(problems) > 0
'''


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("checktrace_ast_mutants", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_sites_are_enumerated_deterministically_and_cover_every_kind() -> None:
    gen = _generator()
    first = gen.sites_of("m.py", SOURCE)
    assert first == gen.sites_of("m.py", SOURCE)
    assert [(s.line, s.col, s.kind) for s in first] == sorted(
        (s.line, s.col, s.kind) for s in first
    )
    kinds = {s.kind.split(":")[0] for s in first}
    assert kinds == {
        "int+1",
        "int-1",
        "cmp0",
        "boolop",
        "not-removed",
        "if-true",
        "if-false",
        "stmt-removed",
        "continue->break",
        "return-negated",
    }
    # the docstring and the f-string's parts are not sites; the constant 3 and the 0 are
    assert {s.new for s in first if s.kind.startswith("int")} == {"(4)", "(2)", "(1)", "(-1)"}
    # the real sources: the same list twice, in file order
    assert gen.all_sites() == gen.all_sites()
    assert len(gen.all_sites()) > 1000


def test_each_mutant_changes_exactly_one_site() -> None:
    gen = _generator()
    base = ast.unparse(ast.parse(SOURCE)).splitlines()
    for site in gen.sites_of("m.py", SOURCE):
        mutant = gen.apply(SOURCE, site)
        assert mutant != SOURCE, site
        after = ast.unparse(ast.parse(mutant)).splitlines()
        changed = [
            op for op in difflib.SequenceMatcher(a=base, b=after).get_opcodes() if op[0] != "equal"
        ]
        assert len(changed) == 1 and changed[0][0] == "replace", (site, changed)
        _, i1, i2, j1, j2 = changed[0]
        assert (i2 - i1, j2 - j1) == (1, 1), (site, changed)


def test_the_engine_sites_also_remove_each_call_statement_and_count() -> None:
    """benchmarks/engine_ast_mutants.py's sites: a forgotten release or count (a call statement
    or an augmented assignment replaced by `pass`), on top of every other kind, in every
    engine module it names."""
    gen = _generator()
    source = "def release(node, n):\n    node.unlock()\n    n += 1\n    return n > 0\n"
    plain = gen.sites_of("m.py", source)
    with_statements = gen.sites_of("m.py", source, statements=True)
    removed = [s for s in with_statements if s.kind == "call-removed"]
    assert {s.line for s in removed} == {2, 3} and all(s.new == "pass" for s in removed)
    assert [s for s in with_statements if s.kind != "call-removed"] == plain
    for site in removed:
        assert ast.parse(gen.apply(source, site))  # still a module
    spec = importlib.util.spec_from_file_location(
        "engine_ast_mutants", SCRIPT.with_name("engine_ast_mutants.py")
    )
    assert spec is not None and spec.loader is not None
    engine = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = engine
    spec.loader.exec_module(engine)
    assert all((SCRIPT.parent.parent / f).is_file() for f in engine.SOURCES)
    assert any(s.kind == "call-removed" for s in engine.all_sites())
