"""`hicache bench vectors`: conformance vectors per second through hicache's controller adapter.

    hicache bench vectors [--count N] [--seed S] [--repeat R]

Generates N cases per category into a temporary directory (timed), then runs them: once
reading, sha-checking and parsing every case without driving anything (the ceiling: what a
runner costs before it drives an engine; best of R), and once through the controller adapter
(`run_dir` with hicache/oracle/vectors/adapters.py's `controller`: every step driven, `check()` with
every invariant after each step, every observation compared; best of R). Prints cases/s and
steps/s of each, and the run's rate as a fraction of the ceiling; then the run again with
the adapter's `check()` skipped (what the invariant checks cost). Exit 1 if a case fails.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from hicache.bench import BenchParser
from hicache.oracle.vectors.adapters import controller
from hicache.oracle.vectors.categories import CATEGORIES
from hicache.oracle.vectors.format import CaseConfig, parse_case, read_manifest, sha256_hex
from hicache.oracle.vectors.generate import generate
from hicache.oracle.vectors.run import Verdict, run_dir
from hicache.testing.adapters.controller import ControllerAdapter


def load_only(directory: Path) -> int:
    """Read, sha-check and parse every listed case; returns the number of steps read."""
    steps = 0
    for entry in read_manifest(directory):
        data = (directory / entry.file).read_bytes()
        # Verify the bytes are the ones listed, as `run` does before it uses them.
        assert sha256_hex(data) == entry.sha256, f"{entry.file}: sha256 differs"
        steps += len(parse_case(data, entry.file).steps)
    return steps


class Unchecked(ControllerAdapter):
    """The controller adapter with `check()` answering [] at once: how much of a run is the
    invariant checking after every step (informative, beside the full run)."""

    def check(self) -> list[str]:
        return []


def unchecked(config: CaseConfig) -> Unchecked:
    return Unchecked(controller(config).setup)


def best_of(repeat: int, work: Callable[[], object]) -> float:
    """The shortest of `repeat` wall-clock timings of `work()` (seconds)."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def main(argv: Sequence[str] | None = None) -> int:
    parser = BenchParser("vectors", __doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--count", type=int, default=10, help="cases per category (default 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--repeat", type=int, default=3, help="timings per measurement, best kept (default 3)"
    )
    args = parser.parse_args(argv)
    if args.count < 1 or args.repeat < 1:
        parser.error("--count and --repeat: at least 1")
    with tempfile.TemporaryDirectory(prefix="hicache-vectors-") as tmp:
        directory = Path(tmp) / "v"
        started = time.perf_counter()
        cases = len(generate(directory, args.count, args.seed, list(CATEGORIES)))
        generated_s = time.perf_counter() - started
        steps = load_only(directory)
        ceiling_s = best_of(args.repeat, lambda: load_only(directory))
        verdicts: list[list[Verdict]] = []
        run_s = best_of(args.repeat, lambda: verdicts.append(run_dir(directory, controller)))
        bare_s = best_of(args.repeat, lambda: verdicts.append(run_dir(directory, unchecked)))
    failed = [v for run in verdicts for v in run if v.status == "FAIL"]
    print(
        f"{cases} cases, {steps} steps ({args.count} per category, seed {args.seed}); "
        f"best of {args.repeat}"
    )
    print(
        f"generate (controller, recording):  {cases / generated_s:8.0f} cases/s  "
        f"{steps / generated_s:9.0f} steps/s"
    )
    print(
        f"ceiling: read + sha256 + parse:    {cases / ceiling_s:8.0f} cases/s  "
        f"{steps / ceiling_s:9.0f} steps/s"
    )
    print(
        f"run through the controller:        {cases / run_s:8.0f} cases/s  {steps / run_s:9.0f} "
        f"steps/s  ({ceiling_s / run_s:.3f} of the ceiling)"
    )
    print(
        f"  the same, check() skipped:        {cases / bare_s:8.0f} cases/s  {steps / bare_s:9.0f} "
        f"steps/s  ({ceiling_s / bare_s:.3f} of the ceiling)"
    )
    if failed:
        print(f"{len(failed)} case runs FAILED")
        return 1
    return 0
