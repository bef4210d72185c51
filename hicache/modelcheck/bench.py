"""How fast the model checker explores, against the cost of copying and hashing alone.

    python3 -m hicache.modelcheck.bench [--config NAME ...]   (default: every configuration)

Per configuration: the search's states, edges, depth, wall and CPU seconds and states per
CPU second; then the *ceiling*: every state the search reached is copied and hashed once
more (clone.py, canonical.py), timed alone, and scaled by the search's edges per state (the
search copies and hashes once per edge). States per second at the ceiling is what the search
would reach if trying actions, the plane's own work and the invariant checks cost nothing;
`ratio` is measured / ceiling. The invariant checks' share (one `check_all` per state) is
shown too. CPU seconds are this process's (steadier than wall time on a shared machine).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

from hicache.control import ControlPlane
from hicache.invariants.registry import check_all
from hicache.modelcheck.clone import clone
from hicache.modelcheck.config import ModelConfig, load_configs
from hicache.modelcheck.search import explore, key_function

HEADER = ("| config | states | edges | depth | wall s | CPU s | states/CPU s | copy+hash µs/edge "
          "| ceiling states/s | ratio | check_all µs/state |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")


def measure(cfg: ModelConfig) -> str:
    """One table row for `cfg` (module docstring)."""
    planes: list[ControlPlane] = []
    wall, cpu = time.perf_counter(), time.process_time()
    res = explore(cfg, on_state=planes.append)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    # Verify the search was clean: a finding's counts are not the configuration's.
    assert res.finding is None and res.exhaustive, f"{cfg.name}: {res.finding}"
    key_of = key_function(cfg, "symmetric")
    t = time.process_time()
    for cp in planes:
        key_of(clone(cp))
    per_copy = (time.process_time() - t) / len(planes)
    t = time.process_time()
    for cp in planes:
        check_all(cp.snapshot())
    per_check = (time.process_time() - t) / len(planes)
    per_state_ceiling = per_copy * res.edges / res.states
    rate = res.states / cpu
    ceiling = 1 / per_state_ceiling
    return (f"| `{cfg.name}` | {res.states:,} | {res.edges:,} | {res.depth} | {wall:.1f} | {cpu:.1f} | "
            f"{rate:,.0f} | {per_copy * 1e6:.0f} | {ceiling:,.0f} | {rate / ceiling:.2f} | "
            f"{per_check * 1e6:.0f} |")


def main(argv: Sequence[str] | None = None) -> int:
    configs = load_configs()
    p = argparse.ArgumentParser(prog="python3 -m hicache.modelcheck.bench", description=__doc__.splitlines()[0])
    p.add_argument("--config", nargs="+", choices=sorted(configs), default=list(configs),
                   help="configurations to measure (default: all)")
    args = p.parse_args(argv)
    print(HEADER)
    for name in args.config:
        print(measure(configs[name]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
