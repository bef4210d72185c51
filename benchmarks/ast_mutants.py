"""First-order AST mutants of Python modules: the sites, the splice, and a judge's run.

Shared by benchmarks/checktrace_ast_mutants.py (check-trace's judging code) and
benchmarks/engine_ast_mutants.py (the engine's controller and core, judged by the fuzz).
A site is one mutation of one module, enumerated with Python's `ast` in a deterministic order
(file, line, col, kind): comparison operators swapped (== / !=, < / <=, > / >=, in / not in,
is / is not), `and` / `or`, a `not` removed, an `if` test replaced by True and by False, a
returned bool negated, a `raise` or a finding's `.append(...)` replaced by `pass`, an int
constant +1 and -1, `continue` / `break` swapped; with `statements=True` also every call
statement and augmented assignment replaced by `pass` (a release, an unlock, a count
forgotten). A mutant is the source with one site's text spliced (the rest of the file,
comments included, unchanged).
"""

from __future__ import annotations

import argparse
import ast
import os
import random
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

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


def _mutations(node: ast.AST, statements: bool) -> Iterator[tuple[ast.AST, str, str]]:
    """(node whose text is replaced, kind, replacement text) for each mutation of `node`;
    `statements`: also a call statement or an augmented assignment removed."""
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
    elif statements and (
        (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call))
        or isinstance(node, ast.AugAssign)
    ):
        yield node, "call-removed", "pass"
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


def sites_of(file: str, source: str, statements: bool = False) -> list[Site]:
    """Every mutation site of one module, in (line, col, kind) order (`statements`: the
    call-removed sites too)."""
    tree = ast.parse(source)
    skip = _in_fstring(tree) | _docstrings(tree)
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        for at, kind, new in _mutations(node, statements):
            out.append(Site(file, *_span(at), kind, new))
    return sorted(out, key=lambda s: (s.line, s.col, s.kind))


def apply(source: str, site: Site) -> str:
    """`source` with the site's span replaced by its text (columns are UTF-8 byte offsets)."""
    lines = source.encode().splitlines(keepends=True)
    head = b"".join(lines[: site.line - 1]) + lines[site.line - 1][: site.col]
    tail = lines[site.end_line - 1][site.end_col :] + b"".join(lines[site.end_line :])
    return (head + site.new.encode() + tail).decode()


def copy_repo(dest: Path, extra: dict[str, str] | None = None) -> None:
    """git's files of the repository into `dest` (symlinks as links, so the copy imports its
    own hicache/spec, kernels, invariants), plus `extra` ({relative path: text})."""
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
    for rel, text in (extra or {}).items():
        (dest / rel).write_text(text)


def run_judge(cmd: Sequence[str], cwd: Path, timeout: int) -> tuple[str, str]:
    """('killed' | 'survived' | 'timeout', last line of output) of one judge: `cmd` in `cwd`
    with the copy importable first and Hypothesis' derandomised `ci` profile."""
    env = {**os.environ, "PYTHONPATH": str(cwd), "CI": "true"}
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", ""
    said = (p.stdout + p.stderr).strip().splitlines()
    return ("survived" if p.returncode == 0 else "killed"), (said[-1] if said else "")


def line_of(site: Site) -> str:
    """The site's source line, stripped, `|` escaped for a markdown table."""
    text = (ROOT / site.file).read_text().splitlines()[site.line - 1].strip()
    return text.replace("|", "\\|")


def add_sample_options(p: argparse.ArgumentParser, sample: int) -> None:
    """--sample N (default `sample`), --seed S, --list, --only ID,...: which sites a run judges."""
    p.add_argument("--sample", type=int, default=sample, help=f"mutants judged (default {sample})")
    p.add_argument("--seed", type=int, default=0, help="the sample's seed")
    p.add_argument("--list", action="store_true", help="print every site and the count")
    p.add_argument("--only", default="", help="judge these site indices (comma-separated)")


def chosen(sites: Sequence[Site], args: argparse.Namespace) -> list[int] | None:
    """The indices of `sites` to judge (`--only`, else a `--seed`ed sample of `--sample`);
    None after printing every site (`--list`)."""
    if args.list:
        for i, s in enumerate(sites):
            print(f"{i:5} {s.key} -> {s.new}")
        print(f"{len(sites)} sites")
        return None
    if args.only:
        return sorted(int(i) for i in args.only.split(","))
    return sorted(random.Random(args.seed).sample(range(len(sites)), args.sample))
