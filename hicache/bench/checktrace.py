"""How fast `hicache check-trace` judges a trace, in events per second, on one CPU core.

    hicache bench checktrace [--seed 1] [--steps 3000] [--repeats 3] [--out PATH]
    hicache bench checktrace --curve [--lengths 5000,50000,500000,1000000]
                             [--tiers small,100000] [--seed 1] [--cache DIR] [--out PATH]

The trace is the hicache controller's own run on the null data plane (seeded random
workload, `hicache.oracle.checktrace.generate`): every event is valid, so the whole trace is read.
Rows, each the best of `--repeats` rounds (the rows take turns in each round), as process
CPU time:

    json only            `json.loads` of every line: the ceiling (nothing is checked)
    read + schema        the reader: JSON, the compiled schema, seq, tiers
    no checks            the full replay, invariants never run (`--check-every 0`)
    every 100            the whole state's checks every 100 events
    every 10             every 10 events
    every event, full    the whole state after every call (`--full-checks`)
    every event          after every call, on what it touched (the default)

Each row shows events/s and its ratio to the json-only ceiling measured in the same run.
A last line splits the no-checks replay: the share of its time spent inside the reference
control plane's own calls (the floor no checking scheme can go under). `--out` also writes
the numbers as JSON.

`--curve`: events/s against the trace's length, the rate per event (flat: the cost of an
event depends on what it touches, never on how many came before it or on the tiers' size).
For each tier size in `--tiers` (`small`: the generator's 12/10/14 pages; N: N pages in
every tier, no eviction pressure) one controller trace of the longest length is generated,
and for each length in `--lengths` its first that many events (a prefix of a trace is a
trace) are judged once with the default checks, and `json.loads` of the same lines is timed
as the ceiling (the parse floor). Long traces take a while to generate (the controller's
own run); `--cache DIR` keeps them as files for the next run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence

from hicache.app.outputs import OUTPUT_FILE
from hicache.bench import BenchParser, columns, counts
from hicache.core.lifecycle import load_lifecycle
from hicache.oracle.checktrace import check_lines
from hicache.oracle.checktrace.dispatch import Call
from hicache.oracle.checktrace.generate import controller_trace
from hicache.oracle.checktrace.reader import Line, TraceReader
from hicache.oracle.checktrace.replay import Replay
from hicache.testing.adapters.controller import Setup

ROWS = (
    ("every event", 1, False),
    ("every event, full", 1, True),
    ("every 10", 10, False),
    ("every 100", 100, False),
    ("no checks", 0, False),
)


def _cpu_s(run: Callable[[], object]) -> float:
    t0 = time.process_time()
    run()
    return time.process_time() - t0


def measure(lines: list[str], repeats: int) -> dict[str, float]:
    """Events/s per row (see the module docstring) over `lines` (header first): the rows
    take turns, `repeats` rounds, and each row's best round counts -- so a machine whose load
    drifts during the run slows every row alike rather than the last ones."""
    n = len(lines) - 1
    lc = load_lifecycle()
    runs: dict[str, Callable[[], object]] = {
        "json only": lambda: [json.loads(x) for x in lines[1:]],
        "read + schema": lambda: sum(1 for _ in TraceReader(lines, lc)),
    }
    for name, every, full in ROWS:

        def replay(every: int = every, full: bool = full) -> None:
            v = check_lines(lines, check_every=every, full_checks=full)
            # Verify the whole trace was judged valid (a failure would measure a prefix).
            assert v.exit_code == 0 and v.events == n, v.message

        runs[name] = replay
    best = {name: float("inf") for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            best[name] = min(best[name], _cpu_s(run))
    return {name: n / s for name, s in best.items()}


class _TimedReplay(Replay):
    """A replay that adds up the process time spent inside the reference's calls."""

    plane_s = 0.0

    def execute(self, call: Call, head: Line) -> None:
        run = call.run

        def timed() -> object:
            t0 = time.process_time()
            try:
                return run()
            finally:
                _TimedReplay.plane_s += time.process_time() - t0

        call.run = timed
        super().execute(call, head)


def plane_share(lines: list[str]) -> float:
    """The fraction of a no-checks replay's process time spent in the reference's calls."""
    lc = load_lifecycle()
    _TimedReplay.plane_s = 0.0
    t0 = time.process_time()
    _TimedReplay(TraceReader(lines, lc), lc, 0).run()
    return _TimedReplay.plane_s / (time.process_time() - t0)


LENGTHS = (5_000, 50_000, 500_000, 1_000_000)
LARGE_PAGES = 100_000


def curve_trace(seed: int, events: int, pages: int | None, cache: str | None = None) -> list[str]:
    """The header and the first `events` events of a controller trace (`pages`: that many
    pages in every tier; None: the generator's small tiers), from `cache` when it has it.
    A prefix of a trace is a trace (it may stop anywhere): the curve's shorter lengths are
    prefixes of its longest."""
    name = f"controller-s{seed}-p{pages or 'small'}-n{events}.ndjson"
    path = None if cache is None else os.path.join(cache, name)
    if path is not None and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    setup = None if pages is None else Setup(pages, pages, pages, check_mode="off")
    steps = max(events * 5 // 6, 1)  # a step emits about 1.2-1.5 events
    while True:
        lines = controller_trace(seed, steps, setup)
        if len(lines) > events:
            break
        steps *= 2
    lines = lines[: events + 1]
    if path is not None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return lines


def _tiers(text: str) -> tuple[int | None, ...]:
    """`--tiers`: comma-separated `small` (the generator's tiers) or pages per tier."""
    out: list[int | None] = []
    for word in text.split(","):
        if word.strip() == "small":
            out.append(None)
        else:
            out.extend(counts(word.strip()))
    return tuple(out)


def curve_point(lines: list[str]) -> dict[str, float]:
    """Events/s of `json.loads` (the ceiling) and of check-trace's default checks."""
    n = len(lines) - 1
    parse_s = _cpu_s(lambda: [json.loads(x) for x in lines[1:]])
    verdict = None

    def judge() -> None:
        nonlocal verdict
        verdict = check_lines(lines)

    check_s = _cpu_s(judge)
    assert verdict is not None and verdict.exit_code == 0 and verdict.events == n, verdict
    return {"events": n, "json_only": n / parse_s, "check_trace": n / check_s}


def curve(args: argparse.Namespace) -> int:
    """`--curve`: events/s per length and tier size (the module docstring)."""
    print(
        f"check-trace events/s against trace length: controller traces, seed {args.seed}; "
        f"one run each, CPU time; Python {platform.python_version()}"
    )
    rows, points = [], []
    for pages in args.tiers:
        longest = curve_trace(args.seed, max(args.lengths), pages, args.cache)
        for n in args.lengths:
            p = curve_point(longest[: n + 1])
            tiers = "small (12/10/14)" if pages is None else f"{pages:,} pages"
            points.append({"tiers": tiers, **p})
            rows.append(
                [
                    tiers,
                    f"{n:,}",
                    f"{p['json_only']:,.0f}",
                    f"{p['check_trace']:,.0f}",
                    f"{p['check_trace'] / p['json_only']:.3f}",
                ]
            )
            print(f"  {tiers}, {n:,} events: {p['check_trace']:,.0f} events/s", flush=True)
    for line in columns(
        ["tiers", "events", "json-only ev/s", "check-trace ev/s", "x json-only"], rows, left=1
    ):
        print(line)
    print("legend: json-only = json.loads of each line, the ceiling; ev/s = events per CPU second")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"seed": args.seed, "points": points}, f, indent=2)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = BenchParser("checktrace", __doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--seed", type=int, default=1, help="workload seed (default 1)")
    p.add_argument(
        "--steps", type=int, default=3_000, help="random controller actions (default 3000)"
    )
    p.add_argument(
        "--repeats", type=int, default=3, help="runs per row; the best counts (default 3)"
    )
    p.add_argument("--out", type=OUTPUT_FILE, metavar="PATH", help="also write the numbers as JSON")
    p.add_argument(
        "--curve", action="store_true", help="events/s against trace length (see the docstring)"
    )
    p.add_argument(
        "--lengths",
        type=counts,
        default=LENGTHS,
        help="--curve: trace lengths in events (default 5000,50000,500000,1000000)",
    )
    p.add_argument(
        "--tiers",
        type=_tiers,
        default=(None, LARGE_PAGES),
        help=f"--curve: tier sizes, small or pages per tier (default small,{LARGE_PAGES})",
    )
    p.add_argument("--cache", metavar="DIR", help="--curve: keep the generated traces here")
    args = p.parse_args(argv)
    if args.curve:
        return curve(args)
    if args.steps < 1 or args.repeats < 1:
        p.error("--steps and --repeats must be >= 1")
    lines = controller_trace(args.seed, args.steps)
    rates = measure(lines, args.repeats)
    ceiling = rates["json only"]
    print(
        f"trace: seed {args.seed}, {args.steps} controller actions, {len(lines) - 1} events; "
        f"best of {args.repeats}, CPU time; Python {platform.python_version()}"
    )
    rows = [[name, f"{rate:,.0f}", f"{rate / ceiling:.3f}"] for name, rate in rates.items()]
    for line in columns(["row", "events/s", "x json-only"], rows, left=1):
        print(line)
    share = plane_share(lines)
    print(f"no checks: {share:.0%} of the replay's time is the reference control plane's own calls")
    print(
        "legend: json-only = json.loads of each line, the ceiling; "
        "x json-only = events/s / the ceiling's"
    )
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "seed": args.seed,
                    "steps": args.steps,
                    "events": len(lines) - 1,
                    "events_per_s": rates,
                    "plane_share_no_checks": share,
                },
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
