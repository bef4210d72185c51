"""A timed TP fuzz: the stateful fuzz of simulated ranks for `SECONDS`, fuzz-tp (mha, 2 or 3
ranks) and fuzz-tp-dsv4 (dsv4-tiny, windows freed per rank) taking turns, one Hypothesis seed
each, `--steps` rule steps per seed, per-rank faults as the machines draw them.

    PYTHONPATH=. python3 benchmarks/tp_fuzz.py [--seconds 600] [--first-seed 100] [--steps 2000]

Prints a line per seed (machine, seed, steps run, seconds, ok or the failure: a
CollectiveTimeout is the watchdog's report of a stuck rank) and a TOTAL line; exit 1 on any
failure. Replay one: `hicache fuzz --mutant ...` does not apply; run the machine at the seed
(`hicache.testing.zoo.run_seed(load_machine(NAME), SEED, STEPS)`).
"""

from __future__ import annotations

import argparse
import sys
import time

from hicache.testing import zoo

MACHINES = ("fuzz-tp", "fuzz-tp-dsv4")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--seconds", type=float, default=600.0)
    p.add_argument("--first-seed", type=int, default=100)
    p.add_argument("--steps", type=int, default=2000)
    a = p.parse_args()
    started, seed, runs, steps_run, failures = time.time(), a.first_seed, 0, 0, 0
    while time.time() - started < a.seconds:
        for name in MACHINES:
            t = time.time()
            steps, error = zoo.run_seed(zoo.load_machine(name), seed, a.steps)
            runs, steps_run, failures = runs + 1, steps_run + steps, failures + (error is not None)
            what = "ok" if error is None else f"{type(error).__name__}: {str(error)[:400]}"
            print(f"{name} {seed} {steps} {time.time() - t:.0f}s {what}", flush=True)
        seed += 1
    print(f"TOTAL runs={runs} steps={steps_run} failures={failures} "
          f"wall={time.time() - started:.0f}s", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
