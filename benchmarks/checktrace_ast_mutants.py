"""check-trace's mutation score over systematic first-order mutants, not a hand-picked few.

    PYTHONPATH=. python3 benchmarks/checktrace_ast_mutants.py [--sample N] [--seed S]
        [--list] [--out FILE] [--only ID,ID,...]

Enumerates every mutation site (benchmarks/ast_mutants.py says which) of check-trace's judging
code (SOURCES below: the reader, schema, id maps, dispatch, replay, compare, invariants; not the
CLI, the trace generator, the corruption catalogue or the report printer).

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
import glob
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
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


def all_sites(root: Path = ROOT) -> list[Site]:
    """Every site of every SOURCES module, in file order then (line, col, kind)."""
    out: list[Site] = []
    for name in SOURCES:
        rel = f"{PACKAGE}/{name}"
        out += sites_of(rel, (root / rel).read_text())
    return out


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
        imports = run_judge([sys.executable, "-c", f"import {module}, hicache.app.cli"], tmp, 60)
        if imports[0] != "survived":
            return Result(site, False, "-", "-", imports[1], time.monotonic() - start)
        files = sorted(f for g in TEST_GLOBS for f in glob.glob(g, root_dir=tmp))
        pytest = ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "mscore_plugin"]
        tests = run_judge([sys.executable, *pytest, *files], tmp, TESTS_TIMEOUT_S)
        fuzz = run_judge([sys.executable, *FUZZ], tmp, FUZZ_TIMEOUT_S)
        return Result(site, True, tests[0], fuzz[0], tests[1], time.monotonic() - start)
    finally:
        path.write_text(original)


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
        out.append(f"| {where} | {s.kind} | `{line_of(s)}` | `{new}` | {tests} | {fuzz} |")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add_sample_options(p, 60)
    p.add_argument("--out", default="benchmarks/results/2026-12-04-checktrace-mutation-score.md")
    args = p.parse_args(argv)
    sites = all_sites()
    picked = chosen(sites, args)
    if picked is None:
        return 0
    command = "PYTHONPATH=. python3 benchmarks/checktrace_ast_mutants.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    results: list[Result] = []
    start = time.monotonic()
    jsonl = Path(args.out).with_suffix(".jsonl")
    with tempfile.TemporaryDirectory(prefix="mscore-") as tmp:
        copy_repo(Path(tmp), {"mscore_plugin.py": _PLUGIN})
        for i in picked:
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
