"""The stateful fuzz's kill rate on systematic planted bugs in the engine, not a hand-picked zoo.

    PYTHONPATH=. python3 benchmarks/engine_ast_mutants.py [--sample N] [--seed S] [--jobs J]
        [--list] [--out FILE] [--only ID,ID,...]

Enumerates every mutation site (benchmarks/ast_mutants.py says which, with the call-removed
sites: a release, an unlock, a count forgotten) of the engine's own code: the controller
(hicache/controller) and the core's engine half (the tree, its pages, the control plane and
its execution, queries). Not the modules the judges share with the engine (the lifecycle
table loaded from spec/, the snapshot the invariants read, the trace writer and walk), nor
the data planes (the null plane is the fuzz's fake device).

A seeded sample is judged one mutant at a time in a copy of the repository (git's files) in a
temporary folder (`--jobs` copies side by side): the mutated module is written there, then the
fuzz, each configuration in turn until one fails (a kill):
  null   `hicache fuzz --plane null --seed 0 --steps 3000 --no-shrink`
  cpu    the same on the CPU plane (real bytes), 1,500 steps
  tp     the null plane with 2 ranks, 1,500 steps
  pools  the null plane with the dsv4-tiny pool group, 1,500 steps
each in a subprocess with a timeout (a hang is killed-by-timeout, counted apart). A mutant whose
module no longer imports is killed trivially and left out of the denominator. Writes a markdown
table (one row per mutant: which configuration killed it) and the score to --out after every
mutant, and the raw records beside it (.jsonl).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or loaded by path
from ast_mutants import (
    ROOT,
    Site,
    add_sample_options,
    apply,
    chosen,
    copy_repo,
    line_of,
    run_judge,
    sites_of,
)

SOURCES = (
    *(
        f"hicache/controller/{p.name}"
        for p in sorted((ROOT / "hicache/controller").glob("*.py"))
        if p.name != "__init__.py"
    ),
    "hicache/core/control.py",
    "hicache/core/execute.py",
    "hicache/core/pages.py",
    "hicache/core/queries.py",
    "hicache/core/records.py",
    "hicache/core/tree.py",
    "hicache/core/treenode.py",
)
"""The engine's modules: every controller module, and the core's tree, pages, control plane,
execution, queries and records."""

CONFIGS: tuple[tuple[str, tuple[str, ...], int], ...] = (
    ("null", ("--plane", "null"), 3000),
    ("cpu", ("--plane", "cpu"), 1500),
    ("tp", ("--plane", "null", "--tp", "2"), 1500),
    ("pools", ("--plane", "null", "--pools", "dsv4-tiny"), 1500),
)
"""(name, `hicache fuzz` arguments, steps) of each fuzz configuration, cheapest first."""
JUDGE_TIMEOUT_S = 120


def judges(seed: int = 0, scale: int = 1) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(name, `python3` arguments) of each configuration: fuzz seed `seed`, `scale` times the
    steps (a survivor judged again deeper: a rare path, or one the fuzz cannot see)."""
    fuzz = ("-m", "hicache", "fuzz", "--seed", str(seed), "--no-shrink")
    return tuple(
        (name, (*fuzz, *args, "--steps", str(steps * scale))) for name, args, steps in CONFIGS
    )


JUDGES = judges()


def all_sites(root: Path = ROOT) -> list[Site]:
    """Every site of every SOURCES module, in file order then (line, col, kind)."""
    out: list[Site] = []
    for rel in SOURCES:
        out += sites_of(rel, (root / rel).read_text(), statements=True)
    return out


@dataclass
class Result:
    site: Site
    imports: bool
    killed_by: str
    """the first configuration that failed ('null', ...; 'null:timeout' for a hang), or ''"""
    said: str
    """the killing run's last output line (its replay line or the error)"""
    seconds: float


def judge(site: Site, tmp: Path, scale: int = 1, seed: int = 0) -> Result:
    """The fuzz configurations in turn on one mutant, its file restored afterwards."""
    path = tmp / site.file
    original = path.read_text()
    start = time.monotonic()
    try:
        path.write_text(apply(original, site))
        module = site.file.removesuffix(".py").replace("/", ".")
        imports = run_judge([sys.executable, "-c", f"import {module}, hicache.app.cli"], tmp, 60)
        if imports[0] != "survived":
            return Result(site, False, "", imports[1], time.monotonic() - start)
        for name, args in judges(seed, scale):
            verdict, said = run_judge([sys.executable, *args], tmp, JUDGE_TIMEOUT_S * scale)
            if verdict != "survived":
                by = name if verdict == "killed" else f"{name}:timeout"
                return Result(site, True, by, said, time.monotonic() - start)
        return Result(site, True, "", "", time.monotonic() - start)
    finally:
        path.write_text(original)


def render(
    results: list[Result], command: str, total_sites: int, seconds: float, scale: int, seed: int
) -> str:
    live = [r for r in results if r.imports]
    killed = [r for r in live if r.killed_by]
    by = {name: sum(r.killed_by.split(":")[0] == name for r in live) for name, _ in JUDGES}
    pct = f" ({100 * len(killed) / len(live):.0f}%)" if live else ""
    out = [
        "# The fuzz on systematic engine mutants",
        "",
        f"    {command}",
        "",
        f"{total_sites} mutation sites in {len(SOURCES)} engine modules; {len(results)} sampled "
        f"mutants judged in {seconds:.0f} s. {len(results) - len(live)} did not import (left out "
        "of the denominator). Judges, cheapest first, until one fails: "
        + "; ".join(f"{name} `{' '.join(args[1:])}`" for name, args in judges(seed, scale))
        + ". A timeout counts as killed.",
        "",
        f"- killed: {len(killed)}/{len(live)}{pct}; "
        + ", ".join(f"first by {name}: {n}" for name, n in by.items())
        + f"; by timeout: {sum(r.killed_by.endswith(':timeout') for r in live)}",
        f"- survivors: {len(live) - len(killed)}",
        "",
        "| site | kind | line (original) | becomes | killed by |",
        "|---|---|---|---|---|",
    ]
    for r in sorted(results, key=lambda r: (r.site.file, r.site.line, r.site.col)):
        s = r.site
        new = s.new.replace("|", "\\|")
        where = f"{s.file.removeprefix('hicache/')}:{s.line}:{s.col}"
        verdict = (r.killed_by or "**survived**") if r.imports else "no import"
        out.append(f"| {where} | {s.kind} | `{line_of(s)}` | `{new}` | {verdict} |")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add_sample_options(p, 80)
    p.add_argument("--jobs", type=int, default=1, help="mutants judged at once (copies)")
    p.add_argument("--scale", type=int, default=1, help="each configuration's steps times this")
    p.add_argument("--fuzz-seed", type=int, default=0, help="the fuzz runs' seed")
    p.add_argument("--out", default="/tmp/engine-mutation-score.md")
    args = p.parse_args(argv)
    sites = all_sites()
    picked = chosen(sites, args)
    if picked is None:
        return 0
    command = "PYTHONPATH=. python3 benchmarks/engine_ast_mutants.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    results: list[Result] = []
    start = time.monotonic()
    jsonl = Path(args.out).with_suffix(".jsonl")
    with tempfile.TemporaryDirectory(prefix="emscore-") as tmp:
        copies = [Path(tmp) / str(j) for j in range(args.jobs)]
        for c in copies:
            copy_repo(c)

        def one(job: int) -> None:
            for i in picked[job :: args.jobs]:
                r = judge(sites[i], copies[job], args.scale, args.fuzz_seed)
                results.append(r)
                print(
                    f"#{i} {r.site.key} killed_by={r.killed_by or '-'} {r.seconds:.1f}s", flush=True
                )
                with jsonl.open("a") as f:
                    f.write(json.dumps({"index": i, **asdict(r)}) + "\n")
                took = time.monotonic() - start
                text = render(list(results), command, len(sites), took, args.scale, args.fuzz_seed)
                Path(args.out).write_text(text)

        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(one, range(args.jobs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
