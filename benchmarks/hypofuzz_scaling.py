"""HypoFuzz on hicache's machines: rule steps per second from 1 to N workers, and what it finds.

    python3 benchmarks/hypofuzz_scaling.py RESULTS_DIR [--workers 1 2 4 8 16] [--seconds 60]
        [-k FuzzNull] [--baseline-steps 1000] [--mutants B04 B08 ...] [--mutant-seconds 120]
        [--mutant-workers N]

Needs HypoFuzz importable (the `fuzz` extra, or wheels: below) and no network. Runs from the
repository root with the project importable from the working tree (PYTHONPATH=.), as on the
lent GPU host, where nothing is installed and nothing can be fetched: there the wheels of
`.whl-hypofuzz/` (gitignored; made here by the command at the end of this docstring) travel
with the tree and are installed first:

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \\
        .whl-hypofuzz/*.whl && export PYTHONPATH=/tmp/site:$PWD &&
    python3 benchmarks/hypofuzz_scaling.py /tmp/hf --workers 1 2 4 8 16 --seconds 45 &&
    cp /tmp/hf/hypofuzz-scaling.* "$OUT"/

(the lent host returns at most 8 files from $OUT: the run folders stay in /tmp;
benchmarks/results/2026-12-06-hypofuzz-2core.md says how long each call takes).

For each worker count: `hicache hypofuzz -n N --seconds S -k K` in a fresh directory
RESULTS_DIR/nN (its own example database, nothing carried over), each worker counting its
steps into RESULTS_DIR/nN/stats (hicache/testing/fuzzstats.py: steps/s is each worker's steps
over its own fuzzing seconds, summed; start-up -- pytest collection, imports -- is not
counted). Then, with `--mutants`, each bug-zoo mutant switched on in every worker of one run of
`--mutant-workers` (default: the largest count) for `--mutant-seconds`: found or not, and the
seconds from the start to the first failing run; with `--stop-at-find` a run ends at its
first find, and the tables end with the finds per hour over the mutants (`--workers` with no
count: no scaling runs). The baseline is `hicache fuzz` (one process,
no coverage tracing) on the same machine: `--baseline-steps` steps of seed 1, its steps/s.

Writes RESULTS_DIR/hypofuzz-scaling.json (everything) and RESULTS_DIR/hypofuzz-scaling.md (the
tables); the logs of each run beside them. Exit status 0 (a mutant not found is a result, not
an error), 2 when a run did nothing (HypoFuzz missing, collection failed).

The wheels (Python 3.12, x86-64 manylinux: the GPU host's python3), from a machine with an
index, in the repository root:

    benchmarks/hypofuzz_scaling.py --wheels .whl-hypofuzz
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hicache.testing.fuzzstats import summarise  # noqa: E402

WHEELS = {
    # HypoFuzz and what it needs that the GPU host's image lacks (or has too old), pinned to
    # what ran here; the image has pytest, click, rich, psutil, pyyaml, anyio, attrs, h11,
    # idna, packaging, pathspec, mypy-extensions, sortedcontainers, six, numpy, torch.
    "hypofuzz": "25.11.1",
    "hypothesis": "6.157.0",  # 6.157.1 on: HypoFuzz 25.11.1 crashes at a find (pyproject)
    "coverage": "7.18.0",
    "black": "26.10.1",
    "pytokens": "0.4.1",
    "platformdirs": "4.14.9",
    "libcst": "1.9.0",
    "starlette": "1.10.0",
    "hypercorn": "0.18.0",
    "h2": "4.4.1",
    "hpack": "4.2.0",
    "hyperframe": "6.1.0",
    "wsproto": "1.3.2",
    "priority": "2.0.0",
    "trio": "0.35.0",
    "outcome": "1.3.0.post0",
    "sniffio": "1.3.1",
    "watchdog": "7.1.1",
    "transitions": "0.9.3",  # hicache's own base dependency
}
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_12_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
)


def download_wheels(into: Path, python: str = "3.12") -> None:
    """The WHEELS for CPython `python` on x86-64 Linux into `into` (needs an index)."""
    words = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    words += ["--python-version", python, "--implementation", "cp", "-d", str(into)]
    for p in PLATFORMS:
        words += ["--platform", p]
    subprocess.run([*words, *(f"{n}=={v}" for n, v in WHEELS.items())], check=True)


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def hypofuzz_run(
    out: Path,
    workers: int,
    seconds: float,
    select: str,
    mutant: str | None = None,
    *,
    stop_at_find: bool = False,
) -> dict[str, Any]:
    """One `hicache hypofuzz` run in a fresh directory `out` (emptied first: no database and
    no counts of an earlier run): its counts, summed. `stop_at_find`: end the run (every
    worker) once a worker counted a failing run, so a zoo of mutants costs the time to find
    each, not `seconds` each."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    words = [sys.executable, "-m", "hicache", "hypofuzz", "-n", str(workers)]
    words += ["--seconds", str(seconds), "--stats", str(out / "stats"), "-k", select]
    if mutant:
        words += ["--mutant", mutant]
    load_before = os.getloadavg()[0]
    started = time.time()
    with open(out / "hypofuzz.log", "w") as log:
        proc = subprocess.Popen(
            words,
            cwd=out,
            env=environment(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        stopped = False
        while proc.poll() is None:
            time.sleep(0.5)
            if stop_at_find and summarise(out / "stats").first_failure:
                proc.terminate()  # `hicache hypofuzz` stops its workers and reports
                stopped = True
                break
        status = proc.wait()
    ended = time.time()
    s = summarise(out / "stats")
    first = {name: round(t - started, 1) for name, t in s.first_failure.items()}
    row = {
        "workers": workers,
        "seconds": seconds,
        "select": select,
        "mutant": mutant,
        "status": status,
        "stopped_at_find": stopped,
        "wall_s": round(ended - started, 1),
        # The host's 1-minute load average before and after: other work on a shared machine
        # takes cores from the workers (a run is comparable only with others at a like load).
        "load_before": round(load_before, 1),
        "load_after": round(os.getloadavg()[0], 1),
        "workers_counted": s.workers,
        "start_up_s": None if s.first_step is None else round(s.first_step - started, 1),
        "steps": s.steps,
        "runs": s.runs,
        "steps_per_s": round(s.steps_per_s, 2),
        "failing_runs": s.failing_runs,
        "first_failure_s": first,
        "failures": s.failures,
        "per_worker": s.per_worker,
    }
    print(json.dumps({k: v for k, v in row.items() if k != "per_worker"}), flush=True)
    return row


def baseline(out: Path, steps: int) -> dict[str, Any]:
    """`hicache fuzz` on the controller's null-plane machine, one process: its steps/s."""
    words = [sys.executable, "-m", "hicache", "fuzz", "--seed", "1", "--steps", str(steps)]
    load_before = os.getloadavg()[0]
    done = subprocess.run(
        words, cwd=REPO, env=environment(), capture_output=True, text=True, check=False
    )
    (out / "baseline.log").write_text(done.stdout + done.stderr)
    found = re.search(r"in ([\d.]+) s \(([\d.]+) steps/s", done.stdout)
    row = {
        "command": " ".join(words[2:]),
        "load_before": round(load_before, 1),
        "status": done.returncode,
        "seconds": float(found.group(1)) if found else None,
        "steps_per_s": float(found.group(2)) if found else None,
    }
    print(json.dumps(row), flush=True)
    return row


def plain_finds(mutants: list[str], workers: int, seed: int, steps: int) -> list[dict[str, Any]]:
    """The same mutants under plain `hicache fuzz` (one process per mutant, no coverage
    guidance, `workers` at a time): caught or not within `steps` steps of seed `seed`, and
    each process's wall seconds, start-up included -- what HypoFuzz's finds compare with."""

    def one(mutant: str) -> dict[str, Any]:
        words = [sys.executable, "-m", "hicache", "fuzz", "--mutant", mutant]
        words += ["--seed", str(seed), "--steps", str(steps)]
        started = time.time()
        done = subprocess.run(
            words, cwd=REPO, env=environment(), capture_output=True, text=True, check=False
        )
        at = re.search(r"at step (\d+)", done.stdout)
        row = {
            "mutant": mutant,
            "caught": done.returncode == 0,
            "step": int(at.group(1)) if at else None,
            "wall_s": round(time.time() - started, 1),
            "said": (done.stdout.strip().splitlines() or [done.stderr.strip()[-200:]])[0],
        }
        print(json.dumps(row), flush=True)
        return row

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, mutants))


def host() -> dict[str, Any]:
    import hypothesis

    try:
        from importlib.metadata import version

        hypofuzz = version("hypofuzz")
    except Exception:
        hypofuzz = "not installed"
    cpu = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if "model name" in line),
        platform.processor(),
    )
    return {
        "python": platform.python_version(),
        "hypothesis": hypothesis.__version__,
        "hypofuzz": hypofuzz,
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "cpu": cpu,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def _kinds(failures: dict[str, dict[str, int]], width: int = 90) -> str:
    """The most frequent kind of failure (cut to `width`) and how many other kinds there were."""
    counted = sorted(((n, k) for t in failures.values() for k, n in t.items()), reverse=True)
    if not counted:
        return "-"
    first = counted[0][1][:width].replace("|", "/")
    return first + (f" (+{len(counted) - 1} more kinds)" if len(counted) > 1 else "")


def markdown(result: dict[str, Any]) -> str:
    h = result["host"]
    lines = [
        f"# HypoFuzz scaling ({h['date']})",
        "",
        f"{h['cpu']}, {h['usable_cores']} usable cores; Python {h['python']}, Hypothesis "
        f"{h['hypothesis']}, HypoFuzz {h['hypofuzz']}. Targets `-k {result['select']}`"
        + (
            f", {result['seconds']:.0f} s a scaling run (start-up not counted in steps/s)."
            if result["scaling"]
            else "."
        ),
    ]
    rows = result["scaling"]
    if rows:
        lines += [
            "",
            "| workers | counted | load before/after | start-up (s) | steps | runs | steps/s "
            "| steps/s per worker | speed-up | failing targets |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
    one = next((r["steps_per_s"] for r in rows if r["workers"] == 1), None)
    for r in rows:
        speedup = f"{r['steps_per_s'] / one:.2f}" if one else "-"
        per = r["steps_per_s"] / max(1, r["workers"])
        failed = ", ".join(sorted(r["first_failure_s"])) or "none"
        lines.append(
            f"| {r['workers']} | {r['workers_counted']} | {r['load_before']}/{r['load_after']} | "
            f"{r['start_up_s']} | {r['steps']} | {r['runs']} | "
            f"{r['steps_per_s']:.1f} | {per:.1f} | {speedup} | {failed} |"
        )
    b = result.get("baseline")
    if b:
        lines += ["", f"Baseline, one process without HypoFuzz: `{b['command']}`: "]
        lines[-1] += f"{b['steps_per_s']} steps/s (load before: {b['load_before']})."
    if result.get("mutants"):
        lines += [
            "",
            "Found after: seconds from the launch to the first failing run; of them, fuzzing: "
            "after the first step (start-up, pytest collection and imports, excluded).",
            "",
            "| mutant | workers | start-up (s) | found after (s) | of them, fuzzing (s) "
            "| failure |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        fuzzing, finds = [], 0
        for r in result["mutants"]:
            first = min(r["first_failure_s"].values()) if r["first_failure_s"] else None
            found = f"{first:.0f}" if first is not None else f"not in {r['seconds']:.0f}"
            finds += first is not None
            fuzzed = "-"  # found before a worker counted its first step: no fuzzing time
            if first is not None and r["start_up_s"] is not None:
                fuzzing.append(first - r["start_up_s"])
                fuzzed = f"{fuzzing[-1]:.1f}"
            lines.append(
                f"| {r['mutant']} | {r['workers']} | {r['start_up_s']} | {found} | {fuzzed} | "
                f"{_kinds(r['failures'])} |"
            )
        lines += [
            "",
            f"Found {finds} of {len(result['mutants'])} mutants within "
            f"{result['mutants'][0]['seconds']:.0f} s each"
            + (f"; the slowest after {max(fuzzing):.1f} s of fuzzing." if fuzzing else "."),
        ]
        runs = result["mutants"]
        wall = sum(r["wall_s"] for r in runs)  # launch to find (or to the limit), start-up in
        started = [r for r in runs if r["start_up_s"] is not None]
        fuzz_s = sum(r["wall_s"] - r["start_up_s"] for r in started)
        lines.append(
            f"Finds per hour over these mutants: {finds} in {wall:.0f} s of runs "
            f"= {3600 * finds / wall:.0f} per hour with start-up, "
            f"{3600 * finds / max(fuzz_s, 1e-9):.0f} per hour of fuzzing "
            f"({runs[0]['workers']} workers: "
            f"{3600 * finds / (wall * runs[0]['workers']):.0f} per worker-hour with "
            "start-up; "
            + (
                "each run stopped at its first find)."
                if result.get("stop_at_find")
                else "runs of full length)."
            )
        )
    plain = result.get("plain")
    if plain:
        caught = [r for r in plain if r["caught"]]
        wall = sum(r["wall_s"] for r in plain)
        lines += [
            "",
            "Plain `hicache fuzz --mutant M --seed S --steps N` (no HypoFuzz), one process per "
            "mutant, as many at a time as the HypoFuzz runs had workers:",
            "",
            "| mutant | caught | at step | wall s (start-up in) |",
            "| --- | --- | --- | --- |",
            *(
                f"| {r['mutant']} | {('no', 'yes')[r['caught']]} | {r['step']} | {r['wall_s']} |"
                for r in plain
            ),
            "",
            f"Plain fuzz: {len(caught)} of {len(plain)} caught in {wall:.0f} process-seconds "
            f"= {3600 * len(caught) / max(wall, 1e-9):.0f} finds per process-hour.",
        ]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path, nargs="?")
    p.add_argument(
        "--workers", type=int, nargs="*", default=[1, 2, 4, 8, 16], help="none: no scaling runs"
    )
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("-k", dest="select", default="FuzzNull")
    p.add_argument("--baseline-steps", type=int, default=1000)
    p.add_argument("--mutants", nargs="*", default=[])
    p.add_argument("--mutant-seconds", type=float, default=120.0)
    p.add_argument("--mutant-workers", type=int, default=None)
    p.add_argument("--mutant-select", default=None, help="-k for mutant runs (default: -k)")
    p.add_argument(
        "--plain",
        action="store_true",
        help="also run each mutant under plain `hicache fuzz`, one process per worker",
    )
    p.add_argument("--plain-seed", type=int, default=0)
    p.add_argument("--plain-steps", type=int, default=2000)
    p.add_argument(
        "--stop-at-find",
        action="store_true",
        help="end a mutant's run at its first failing run (finds per hour over a zoo)",
    )
    p.add_argument("--wheels", type=Path, help="only download the offline wheels into DIR")
    args = p.parse_args()
    if args.wheels:
        download_wheels(args.wheels)
        return 0
    if args.results is None:
        p.error("RESULTS_DIR is required")
    out: Path = args.results.resolve()
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"host": host(), "select": args.select, "seconds": args.seconds}
    result["stop_at_find"] = args.stop_at_find
    print(json.dumps(result["host"]), flush=True)
    if args.baseline_steps:
        result["baseline"] = baseline(out, args.baseline_steps)
    result["scaling"] = [
        hypofuzz_run(out / f"n{n}", n, args.seconds, args.select) for n in args.workers
    ]
    n_mut = args.mutant_workers or max(args.workers or [os.cpu_count() or 1])
    select = args.mutant_select or args.select
    result["mutants"] = [
        hypofuzz_run(
            out / f"m-{m}", n_mut, args.mutant_seconds, select, m, stop_at_find=args.stop_at_find
        )
        for m in args.mutants
    ]
    if args.plain and args.mutants:
        result["plain"] = plain_finds(args.mutants, n_mut, args.plain_seed, args.plain_steps)
    (out / "hypofuzz-scaling.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "hypofuzz-scaling.md").write_text(markdown(result))
    print(markdown(result))
    return 2 if any(r["steps"] == 0 for r in result["scaling"]) else 0


if __name__ == "__main__":
    sys.exit(main())
