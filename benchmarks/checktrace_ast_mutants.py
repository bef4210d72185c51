"""check-trace's mutation score over systematic first-order mutants, not a hand-picked few.

    PYTHONPATH=. python3 benchmarks/checktrace_ast_mutants.py [--sample N] [--seed S]
        [--list] [--out FILE] [--only ID,ID,...]

Enumerates every mutation site of check-trace's judging code (SOURCES below: the reader,
schema, id maps, dispatch, replay, compare, invariants; not the CLI, the trace generator, the
corruption catalogue or the report printer) with Python's `ast`, in a deterministic order
(file, line, col, kind): comparison operators swapped (== / !=, < / <=, > / >=, in / not in,
is / is not), `and` / `or`, a `not` removed, an `if` test replaced by True and by False, a
returned bool negated, a `raise` or a finding's `.append(...)` replaced by `pass`, an int
constant +1 and -1, `continue` / `break` swapped. A mutant is the source with one site's text
spliced (the rest of the file, comments included, unchanged).

`--list` prints every site and the count. Otherwise a seeded sample of N sites is judged, one
at a time, in a copy of the repository (git's files) in a temporary folder: the mutated
module is written there, then
  (a) check-trace's own tests: `CI=true python3 -m pytest -q -x -p no:cacheprovider
      tests/test_checktrace*.py tests/test_trace*.py`, with the fuzz's self-check judged
      clean (as benchmarks/checktrace_mutation_score.py does) so (a) is the tests' own score;
  (b) the fuzz alone: `python3 -m hicache fuzz --seed 0 --steps 1500 --no-shrink` (its
      self-check on);
each in a subprocess with a timeout (a hang is killed-by-timeout, counted apart). A mutant
whose module no longer imports is killed trivially and left out of the denominator.
Writes a markdown table (one row per mutant) and the scores to --out after every mutant.
"""

from __future__ import annotations

import argparse
import ast
import glob
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "hicache/oracle/checktrace"
SOURCES = (
    "compare.py",
    "dispatch.py",
    "fastschema.py",
    "forks.py",
    "invariants.py",
    "maps.py",
    "names.py",
    "reader.py",
    "replay.py",
    "schema.py",
    "touched.py",
    "traceview.py",
    "verdict.py",
)
"""check-trace's judging modules under PACKAGE (command.py: CLI; generate.py: trace maker;
illegal.py: the self-check's corruption catalogue; report.py: printing)."""

TEST_GLOBS = ("tests/test_checktrace*.py", "tests/test_trace*.py")
FUZZ = ("-m", "hicache", "fuzz", "--seed", "0", "--steps", "1500", "--no-shrink")
TESTS_TIMEOUT_S = 150
FUZZ_TIMEOUT_S = 60

_SWAP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_FINDINGS = ("problem", "violation", "found", "error", "bad", "wrong", "why")
"""A receiver whose name holds one of these collects findings: removing its append is a
dropped report."""


@dataclass(frozen=True)
class Site:
    """One mutation: in `file` (repo-relative), the text from (line, col) to (end_line,
    end_col) (1-based lines, 0-based UTF-8 columns, as `ast`) becomes `new`."""

    file: str
    line: int
    col: int
    end_line: int
    end_col: int
    kind: str
    new: str

    @property
    def key(self) -> str:
        return f"{self.file}:{self.line}:{self.col}:{self.kind}"


def _span(node: ast.AST) -> tuple[int, int, int, int]:
    end_line, end_col = node.end_lineno, node.end_col_offset  # type: ignore[attr-defined]
    assert end_line is not None and end_col is not None
    return node.lineno, node.col_offset, end_line, end_col  # type: ignore[attr-defined]


def _expr(node: ast.expr) -> str:
    return f"({ast.unparse(node)})"


def _is_bool(node: ast.expr | None) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, bool)
    return isinstance(node, ast.Compare | ast.BoolOp) or (
        isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)
    )


def _is_finding(node: ast.stmt) -> bool:
    if isinstance(node, ast.Raise):
        return True
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        return False
    func = node.value.func
    if not (isinstance(func, ast.Attribute) and func.attr in ("append", "extend", "add")):
        return False
    receiver = ast.unparse(func.value).lower()
    return any(w in receiver for w in _FINDINGS)


def _in_fstring(tree: ast.Module) -> set[int]:
    """ids of the nodes inside f-strings (their positions are not safe to splice)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            inside.update(id(n) for n in ast.walk(node))
    return inside


def _docstrings(tree: ast.Module) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for st in body:
                if isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant):
                    out.update(id(n) for n in ast.walk(st))
    return out


def _mutations(node: ast.AST) -> Iterator[tuple[ast.AST, str, str]]:
    """(node whose text is replaced, kind, replacement text) for each mutation of `node`."""
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            swapped = _SWAP.get(type(op))
            if swapped is not None:
                ops = [*node.ops[:i], swapped(), *node.ops[i + 1 :]]
                new = ast.Compare(left=node.left, ops=ops, comparators=node.comparators)
                yield node, f"cmp{i}:{type(op).__name__}->{swapped.__name__}", _expr(new)
    elif isinstance(node, ast.BoolOp):
        other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        yield node, f"boolop:{type(node.op).__name__}", _expr(ast.BoolOp(other, node.values))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield node, "not-removed", _expr(node.operand)
    elif isinstance(node, ast.If | ast.IfExp | ast.While):
        yield node.test, "if-true", "True"
        yield node.test, "if-false", "False"
    elif isinstance(node, ast.Return) and node.value is not None and _is_bool(node.value):
        yield node.value, "return-negated", f"(not {_expr(node.value)})"
    elif isinstance(node, ast.stmt) and _is_finding(node):
        yield node, "stmt-removed", "pass"
    elif (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int)
        and not isinstance(node.value, bool)
    ):
        yield node, "int+1", f"({node.value + 1})"
        yield node, "int-1", f"({node.value - 1})"
    elif isinstance(node, ast.Continue):
        yield node, "continue->break", "break"
    elif isinstance(node, ast.Break):
        yield node, "break->continue", "continue"


def sites_of(file: str, source: str) -> list[Site]:
    """Every mutation site of one module, in (line, col, kind) order."""
    tree = ast.parse(source)
    skip = _in_fstring(tree) | _docstrings(tree)
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        for at, kind, new in _mutations(node):
            out.append(Site(file, *_span(at), kind, new))
    return sorted(out, key=lambda s: (s.line, s.col, s.kind))


def all_sites(root: Path = ROOT) -> list[Site]:
    """Every site of every SOURCES module, in file order then (line, col, kind)."""
    out: list[Site] = []
    for name in SOURCES:
        rel = f"{PACKAGE}/{name}"
        out += sites_of(rel, (root / rel).read_text())
    return out


def apply(source: str, site: Site) -> str:
    """`source` with the site's span replaced by its text (columns are UTF-8 byte offsets)."""
    lines = source.encode().splitlines(keepends=True)
    head = b"".join(lines[: site.line - 1]) + lines[site.line - 1][: site.col]
    tail = lines[site.end_line - 1][site.end_col :] + b"".join(lines[site.end_line :])
    return (head + site.new.encode() + tail).decode()


def _copy_repo(dest: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, text=True
    ).stdout.split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():  # hicache/spec -> ../spec: the copy's own, not the repo's
            os.symlink(os.readlink(src), dest / rel)
        elif src.is_file():
            shutil.copy2(src, dest / rel)
    (dest / "mscore_plugin.py").write_text(_PLUGIN)


_PLUGIN = '''"""pytest plugin: the fuzz's self-check judges every run clean (the tests' own
score), and Hypothesis does not shrink (a failure is a kill; shrinking only costs time)."""
import pytest
from hypothesis import Phase, settings

from hicache.testing import selfcheck


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    selfcheck.judge_run = lambda *a, **k: None
    phases = [Phase.explicit, Phase.reuse, Phase.generate]
    settings.register_profile("mscore", settings.default, phases=phases)
    settings.load_profile("mscore")
'''


def _run(cmd: Sequence[str], cwd: Path, timeout: int) -> tuple[str, str]:
    """('killed' | 'survived' | 'timeout', last line of output) of one judge."""
    env = {**os.environ, "PYTHONPATH": str(cwd), "CI": "true"}
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", ""
    said = (p.stdout + p.stderr).strip().splitlines()
    return ("survived" if p.returncode == 0 else "killed"), (said[-1] if said else "")


@dataclass
class Result:
    site: Site
    imports: bool
    tests: str
    fuzz: str
    tests_said: str
    seconds: float


def judge(site: Site, tmp: Path) -> Result:
    """Both judges on one mutant, its file restored afterwards."""
    path = tmp / site.file
    original = path.read_text()
    start = time.monotonic()
    try:
        path.write_text(apply(original, site))
        module = site.file.removesuffix(".py").replace("/", ".")
        imports = _run([sys.executable, "-c", f"import {module}, hicache.app.cli"], tmp, 60)
        if imports[0] != "survived":
            return Result(site, False, "-", "-", imports[1], time.monotonic() - start)
        files = sorted(f for g in TEST_GLOBS for f in glob.glob(g, root_dir=tmp))
        pytest = ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "mscore_plugin"]
        tests = _run([sys.executable, *pytest, *files], tmp, TESTS_TIMEOUT_S)
        fuzz = _run([sys.executable, *FUZZ], tmp, FUZZ_TIMEOUT_S)
        return Result(site, True, tests[0], fuzz[0], tests[1], time.monotonic() - start)
    finally:
        path.write_text(original)


def _line(site: Site) -> str:
    text = (ROOT / site.file).read_text().splitlines()[site.line - 1].strip()
    return text.replace("|", "\\|")


def _score(rs: list[Result], killed: Callable[[Result], bool]) -> str:
    n = len(rs)
    k = sum(1 for r in rs if killed(r))
    return f"{k}/{n} ({100 * k / n:.0f}%)" if n else "0/0"


def render(results: list[Result], command: str, total_sites: int, seconds: float) -> str:
    live = [r for r in results if r.imports]
    dead = len(results) - len(live)

    def a(r: Result) -> bool:
        return r.tests != "survived"

    def b(r: Result) -> bool:
        return r.fuzz != "survived"

    out = [
        "# check-trace mutation score: systematic AST mutants",
        "",
        f"    {command}",
        "",
        f"{total_sites} mutation sites in {len(SOURCES)} modules of {PACKAGE} "
        f"({', '.join(SOURCES)}); {len(results)} sampled mutants judged in {seconds:.0f} s, "
        f"one at a time. {dead} did not import (killed trivially, left out of the "
        f"denominator). (a) = check-trace's own tests ({', '.join(TEST_GLOBS)}, -x, "
        "self-check judged clean, Hypothesis not shrinking); (b) = `hicache fuzz --seed 0 "
        "--steps 1500 --no-shrink` alone (its self-check on). A timeout counts as killed.",
        "",
        f"- (a) tests: {_score(live, a)}"
        f" (of which by timeout: {sum(r.tests == 'timeout' for r in live)})",
        f"- (b) fuzz: {_score(live, b)}"
        f" (of which by timeout: {sum(r.fuzz == 'timeout' for r in live)})",
        f"- (a or b): {_score(live, lambda r: a(r) or b(r))}",
        f"- survivors of both: {sum(1 for r in live if not a(r) and not b(r))}",
        "",
        "| site | kind | line (original) | becomes | tests | fuzz |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        s = r.site
        new = s.new.replace("|", "\\|")
        where = f"{s.file.removeprefix(PACKAGE + '/')}:{s.line}:{s.col}"
        tests, fuzz = (r.tests, r.fuzz) if r.imports else ("no import", "no import")
        out.append(f"| {where} | {s.kind} | `{_line(s)}` | `{new}` | {tests} | {fuzz} |")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--sample", type=int, default=60, help="mutants judged (default 60)")
    p.add_argument("--seed", type=int, default=0, help="the sample's seed")
    p.add_argument("--list", action="store_true", help="print every site and the count")
    p.add_argument("--only", default="", help="judge these site indices (comma-separated)")
    p.add_argument("--out", default="benchmarks/results/2026-12-04-checktrace-mutation-score.md")
    args = p.parse_args(argv)
    sites = all_sites()
    if args.list:
        for i, s in enumerate(sites):
            print(f"{i:5} {s.key} -> {s.new}")
        print(f"{len(sites)} sites")
        return 0
    if args.only:
        chosen = sorted(int(i) for i in args.only.split(","))
    else:
        chosen = sorted(random.Random(args.seed).sample(range(len(sites)), args.sample))
    command = "PYTHONPATH=. python3 benchmarks/checktrace_ast_mutants.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    results: list[Result] = []
    start = time.monotonic()
    jsonl = Path(args.out).with_suffix(".jsonl")
    with tempfile.TemporaryDirectory(prefix="mscore-") as tmp:
        _copy_repo(Path(tmp))
        for i in chosen:
            r = judge(sites[i], Path(tmp))
            results.append(r)
            print(f"#{i} {r.site.key} tests={r.tests} fuzz={r.fuzz} {r.seconds:.1f}s", flush=True)
            with jsonl.open("a") as f:
                f.write(json.dumps({"index": i, **asdict(r)}) + "\n")
            text = render(results, command, len(sites), time.monotonic() - start)
            Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
