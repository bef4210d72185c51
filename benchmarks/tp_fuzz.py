"""A timed TP fuzz: `hicache fuzz --tp RANKS` for `--seconds`, the mha and dsv4-tiny groups
taking turns, one seed each, `--steps` rule steps per seed, per-rank faults as the TP machine
draws them (hicache/testing/machines.py `tp_machine`), the cross-rank invariants after every
step.

    PYTHONPATH=. python3 benchmarks/tp_fuzz.py [--seconds 600] [--first-seed 100] [--steps 2000]
                                               [--plane null|cpu|cuda] [--ranks 2]

On the cuda plane each rank has its own GPU when there is one per rank (two H200s), else
they share one. Prints a line per seed (pools, seed, steps run, seconds, ok or FAILED) and,
for a failure, `hicache fuzz`'s report: the shrunk steps, the error (a CollectiveTimeout is the
watchdog's report of a stuck rank, naming the point and the ranks that did not arrive) and
its one-line replay command. Ends with a TOTAL line; exit 1 on any failure.
"""

from __future__ import annotations

import argparse
import sys
import time

from hicache.testing import runner

POOLS = ("mha", "dsv4-tiny")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--seconds", type=float, default=600.0)
    p.add_argument("--first-seed", type=int, default=100)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--plane", choices=("null", "cpu", "cuda"), default="null")
    p.add_argument("--ranks", type=int, default=2)
    a = p.parse_args()
    started, seed, runs, steps_run, failures = time.time(), a.first_seed, 0, 0, 0
    while time.time() - started < a.seconds:
        for pools in POOLS:
            result = runner.fuzz(
                runner.arguments(seed=seed, steps=a.steps, plane=a.plane, pools=pools, tp=a.ranks)
            )
            runs, steps_run, failures = (
                runs + 1,
                steps_run + result.steps,
                failures + (not result.ok),
            )
            print(
                f"{pools} seed {seed}: {result.steps} steps, {result.seconds:.0f} s, "
                f"{'ok' if result.ok else 'FAILED'}",
                flush=True,
            )
            if not result.ok:
                print(result.text, flush=True)
        seed += 1
    print(
        f"TOTAL plane={a.plane} ranks={a.ranks} runs={runs} steps={steps_run} "
        f"failures={failures} wall={time.time() - started:.0f}s",
        flush=True,
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
