"""`hicache hypofuzz`: hicache's fuzz machines (or an engine's adapter) fuzzed by HypoFuzz on
every core, for a time or until stopped, with what the workers did counted.

    hicache hypofuzz [-n WORKERS] [--seconds S] [--stats DIR] [-k EXPR] [--replicas R]
                     [--adapter module:factory [--plane null|cpu]] [--mutant NAME]
                     [--dashboard] [-- PYTEST_ARGS...]

HypoFuzz (`pip install hypofuzz`, or the `fuzz` extra: never a dependency of hicache, its
licence is its own; README, "Fuzzing on many cores") runs `hypothesis fuzz`: WORKERS processes
(default: every core) fuzzing, coverage-guided, the targets pytest collects -- by default the
machines of hicache/testing/hypofuzz_targets.py (`-k FuzzNull` picks one; PYTEST_ARGS after
`--` replace the file: an engine's own file of `CacheMachine` TestCases), sharing the example
database of the current directory (.hypothesis/). Without HypoFuzz the command says what to
install (exit 2).

Each target is copied once per worker (`--replicas`, default the worker count): HypoFuzz gives
worker i only the targets from the i-th on, so without copies a worker beyond the number of
targets selected would fuzz nothing (hicache/testing/hypofuzz_targets.py). Copies of one
machine share its corpus.

`--seconds S` stops every worker after S seconds (without it: until Ctrl-C or SIGTERM, which
stop the workers the same way). `--stats DIR`
(default: a temporary directory) is where each worker writes its counts
(hicache/testing/fuzzstats.py); at the end one line sums them -- workers, rule steps, runs,
steps/s (each worker's own steps over its own fuzzing seconds, added up) -- and one line per
target that failed: the seconds from the start to its first failing run and each kind of
failure. HypoFuzz keeps each failure, shrunk, in the database (its dashboard,
`hypothesis fuzz --dashboard-only`, shows them). `--adapter module:factory` adds the target
TestFuzzAdapter: that engine through the factory protocol, as `hicache fuzz --adapter`
(configurations for `--plane`). `--mutant NAME` switches the bug zoo's mutant NAME on in every
worker (`hicache fuzz --mutant list` names them): what HypoFuzz finds, and how soon.
`--dashboard` also serves HypoFuzz's dashboard (localhost:9999).

Exit status: 0 no target failed, 1 some target failed, 2 a usage error (HypoFuzz missing
too, or a HypoFuzz that would crash at its first find under the installed Hypothesis:
`shrink_incompatibility`), 130 interrupted with no failure found.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from hicache.app.outputs import OUTPUT_DIR
from hicache.app.usage import EXIT_USAGE, UsageParser
from hicache.testing.fuzzstats import STATS_ENV, Summary, summarise

TARGETS = "hicache.testing.hypofuzz_targets"
STOP_GRACE_S = 10.0
"""Seconds the workers have to end after SIGTERM before they are killed."""


def parser() -> argparse.ArgumentParser:
    p = UsageParser(
        prog="hicache hypofuzz",
        description="fuzz hicache's machines (or an adapter) with HypoFuzz on many cores",
    )
    p.add_argument("-n", "--workers", type=int, default=None, help="worker processes (all cores)")
    p.add_argument("--seconds", type=float, default=None, help="stop after S seconds")
    p.add_argument(
        "--stats", type=OUTPUT_DIR, default=None, help="the directory workers count into"
    )
    p.add_argument("-k", dest="select", default=None, help="pytest -k: which targets")
    p.add_argument("--adapter", metavar="MODULE:FACTORY", help="another engine's adapter factory")
    p.add_argument("--plane", default="null", help="the plane of --adapter's configurations")
    p.add_argument("--mutant", default=None, help="a bug-zoo mutant on in every worker")
    p.add_argument(
        "--replicas", type=int, default=None, help="copies of each target (default: the workers)"
    )
    p.add_argument("--dashboard", action="store_true", help="serve HypoFuzz's dashboard too")
    p.add_argument("pytest_args", nargs="*", help="after --: pytest's, replacing the targets")
    return p


def targets_file() -> str:
    """The path of hicache/testing/hypofuzz_targets.py (pytest collects a file by path)."""
    spec = importlib.util.find_spec(TARGETS)
    assert spec is not None and spec.origin is not None, TARGETS
    return spec.origin


def fuzz_command(args: argparse.Namespace) -> list[str]:
    """The `hypothesis fuzz` command line `args` ask for (run in a new interpreter)."""
    words = [sys.executable, "-c", "import sys; from hypothesis.extra.cli import main; main()"]
    words += ["fuzz", "--dashboard" if args.dashboard else "--no-dashboard"]
    if args.workers is not None:
        words += ["-n", str(args.workers)]
    words += ["--", *(args.pytest_args or [targets_file()])]
    if args.select:
        words += ["-k", args.select]
    return words


def environment(args: argparse.Namespace, stats: Path) -> dict[str, str]:
    """This process's environment plus what the targets read (hypofuzz_targets.py)."""
    from hicache.testing import hypofuzz_targets as t

    env = dict(os.environ)
    env[STATS_ENV] = str(stats.resolve())
    cwd = os.getcwd()  # an --adapter module beside you is importable, as for `hicache fuzz`
    env["PYTHONPATH"] = os.pathsep.join(p for p in (cwd, env.get("PYTHONPATH")) if p)
    for name, value in ((t.ADAPTER_ENV, args.adapter), (t.MUTANT_ENV, args.mutant)):
        if value:
            env[name] = value
    if args.adapter:
        env[t.PLANE_ENV] = args.plane
    env[t.REPLICAS_ENV] = str(replicas(args))
    return env


def replicas(args: argparse.Namespace) -> int:
    """Copies of each target: `--replicas`, else one per worker (HypoFuzz leaves a worker
    beyond the number of targets idle: hypofuzz_targets.py's docstring)."""
    if args.replicas is not None:
        return int(args.replicas)
    return int(args.workers or os.cpu_count() or 1)


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (a `kill`, a CI job's timeout) ends the wait as Ctrl-C does, so the workers
    are stopped and the counts reported: Python's default SIGTERM ends the process at once,
    leaving the fuzz's workers -- their own session -- running on every core."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set a handler (and only it receives signals)
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the fuzz's process group (its workers too), SIGKILL after STOP_GRACE_S
    (a worker's counts are on disk already: fuzzstats writes them as it goes)."""
    for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, None)):
        if process.poll() is not None:
            return
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue


def report(summary: Summary, started: float, seconds: float) -> str:
    """What the command prints at the end (module docstring)."""
    start_up = (
        "" if summary.first_step is None else f" ({summary.first_step - started:.0f} s start-up)"
    )
    lines = [
        f"hypofuzz: {summary.workers} workers, {seconds:.0f} s{start_up}, {summary.steps} "
        f"steps, {summary.runs} runs, {summary.steps_per_s:.1f} steps/s, "
        f"{len(summary.first_failure)} target(s) failed"
    ]
    for name, first in sorted(summary.first_failure.items()):
        kinds = "; ".join(sorted(summary.failures.get(name, {})))
        lines.append(f"  {name}: first failing run after {first - started:.1f} s: {kinds}")
    return "\n".join(lines)


def shrink_incompatibility() -> str | None:
    """Why this HypoFuzz would crash at its first find under this Hypothesis, or None.

    HypoFuzz 25.11.1 copies `shrink_target.slice_comments` after shrinking a failure; the
    field left Hypothesis' `ConjectureResult` in 6.157.1, so with both a worker dies at the
    moment it has something to report (seen: every bug-zoo mutant HypoFuzz found)."""
    import dataclasses

    from hypothesis import __version__ as hypothesis_version
    from hypothesis.internal.conjecture.data import ConjectureResult

    spec = importlib.util.find_spec("hypofuzz.hypofuzz")
    if spec is None or spec.origin is None or not os.path.exists(spec.origin):
        return None
    with open(spec.origin, encoding="utf-8") as f:
        reads = "shrink_target.slice_comments" in f.read()
    fields = {f.name for f in dataclasses.fields(ConjectureResult)}
    if not reads or "slice_comments" in fields:
        return None
    return (
        f"this hypofuzz reads ConjectureResult.slice_comments, which hypothesis "
        f"{hypothesis_version} no longer has (removed in 6.157.1): its workers crash at their "
        "first find; pip install 'hypothesis<6.157.1' (the fuzz extra pins it)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    # Missing, ModuleNotFoundError: the CLI names the extra to install (exit 2).
    importlib.import_module("hypofuzz")
    crash = shrink_incompatibility()
    if crash is not None:
        parser().error(crash)

    if args.workers is not None and args.workers < 1:
        parser().error(f"argument -n/--workers: {args.workers}: at least one worker")
    if args.replicas is not None and args.replicas < 1:
        parser().error(f"argument --replicas: {args.replicas}: at least one copy")
    if args.mutant:
        from hicache.testing import mutants

        mutants.get(args.mutant)  # an unknown name: ConfigError listing the names, exit 2
    with tempfile.TemporaryDirectory(prefix="hicache-hypofuzz-") as scratch:
        stats = Path(args.stats or scratch)
        started = time.time()
        process = subprocess.Popen(
            fuzz_command(args), env=environment(args, stats), start_new_session=True
        )
        interrupted = ended = False
        try:
            with _sigterm_interrupts():
                process.wait(timeout=args.seconds)
            ended = True
        except subprocess.TimeoutExpired:
            pass
        except KeyboardInterrupt:
            interrupted = True
        finally:
            _stop(process)
        seconds = time.time() - started
        summary = summarise(stats)
        print(report(summary, started, seconds), flush=True)
    if summary.first_failure:
        return 1
    if ended and summary.steps == 0:  # collection failed, or nothing matched -k
        print(
            f"hicache hypofuzz: error: hypothesis fuzz ended (status {process.returncode}) "
            "before any step: see its output above",
            file=sys.stderr,
        )
        return EXIT_USAGE
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
