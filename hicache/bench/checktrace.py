"""How fast `hicache check-trace` judges a trace, in events per second, on one CPU core.

    hicache bench checktrace [--seed 1] [--steps 3000] [--repeats 3] [--out PATH]

The trace is the hicache controller's own run on the null data plane (seeded random
workload, `hicache.checktrace.generate`): every event is valid, so the whole trace is read.
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
"""

from __future__ import annotations

import json
import platform
import sys
import time
from collections.abc import Callable, Sequence

from hicache.bench import BenchParser, columns
from hicache.checktrace import check_lines
from hicache.checktrace.dispatch import Call
from hicache.checktrace.generate import controller_trace
from hicache.checktrace.reader import Line, TraceReader
from hicache.checktrace.replay import Replay
from hicache.lifecycle import load_lifecycle
from hicache.outputs import OUTPUT_FILE

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
    args = p.parse_args(argv)
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
