"""How fast the model checker explores, against the cost of copying and hashing alone.

    python3 -m hicache.oracle.modelcheck.bench [--config NAME ...]   (default: every configuration)

Per configuration: the search's states, edges, depth, wall and CPU seconds and states per
CPU second; then the *ceiling*: every state the search reached is copied and hashed once
more (`ControlPlane.clone`, canonical.py), timed alone, and scaled by the search's edges per
state (the search copies and hashes once per edge). States per second at the ceiling is what
the search would reach if trying actions, the plane's own work and the invariant checks cost
nothing; `ratio` is measured / ceiling. The invariant checks' share (one `check_all` per state) is
shown too. CPU seconds are this process's (steadier than wall time on a shared machine).

With `--zoo`, a third table runs the control-plane mutants of the bug zoo
(hicache/testing/mutants/) through the search: for each, the configurations in order
until one finds it, with the finding's kind, its path length and the states explored.

With `--branching NAME`, a second table compares the ways a search can branch, per state of
that configuration (CPU µs, mean over every state): the field-by-field copy
(`ControlPlane.clone`), `copy.deepcopy` (the lifecycle tables shared, as a search would), and
replaying the state's shortest path on a fresh plane (the alternative to keeping planes at all).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Sequence

from hicache.core.control import ControlPlane
from hicache.invariants.registry import check_all
from hicache.oracle.modelcheck.actions import apply
from hicache.oracle.modelcheck.config import ModelConfig, load_configs
from hicache.oracle.modelcheck.search import explore, initial_plane, key_function

HEADER = (
    "| config | states | edges | depth | wall s | CPU s | states/CPU s | copy+hash µs/edge "
    "| ceiling states/s | ratio | check_all µs/state |\n"
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
)


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
        key_of(cp.clone())
    per_copy = (time.process_time() - t) / len(planes)
    t = time.process_time()
    for cp in planes:
        check_all(cp.snapshot())
    per_check = (time.process_time() - t) / len(planes)
    per_state_ceiling = per_copy * res.edges / res.states
    rate = res.states / cpu
    ceiling = 1 / per_state_ceiling
    return (
        f"| `{cfg.name}` | {res.states:,} | {res.edges:,} | {res.depth} | {wall:.1f} | {cpu:.1f} | "
        f"{rate:,.0f} | {per_copy * 1e6:.0f} | {ceiling:,.0f} | {rate / ceiling:.2f} | "
        f"{per_check * 1e6:.0f} |"
    )


def branching(cfg: ModelConfig) -> str:
    """The branching table for `cfg` (module docstring)."""
    planes: list[ControlPlane] = []
    res = explore(cfg, on_state=planes.append, keep_keys=True)
    key_of = key_function(cfg, "symmetric")
    paths = [res.path_to(key_of(cp)) for cp in planes]
    times: list[float] = []
    for how in (ControlPlane.clone, lambda cp: copy.deepcopy(cp, {id(cp.lifecycle): cp.lifecycle})):
        t = time.process_time()
        for cp in planes:
            how(cp)
        times.append((time.process_time() - t) / len(planes))
    t = time.process_time()
    for path in paths:
        fresh = initial_plane(cfg)
        for a in path:
            apply(fresh, cfg, a)
    times.append((time.process_time() - t) / len(planes))
    mean_len = sum(len(p) for p in paths) / len(paths)
    return (
        "| branching, per state | µs |\n| --- | ---: |\n"
        f"| field-by-field copy (ControlPlane.clone) | {times[0] * 1e6:.0f} |\n"
        f"| `copy.deepcopy` | {times[1] * 1e6:.0f} |\n"
        f"| replay of the shortest path (mean {mean_len:.1f} calls) | {times[2] * 1e6:.0f} |"
    )


ZOO_MUTANTS = ("B01", "B02", "B03", "B04", "B06", "B07", "B07-leaf", "B08", "B11")
"""The zoo's mutants of the control plane and the tree (the others patch the data plane, the
controller or the checker, which the search does not run)."""
ZOO_CONFIGS = ("tail", "pages", "fork")


def zoo() -> str:
    """The zoo table (module docstring)."""
    from hicache.testing.mutants import MUTANTS, activate  # the zoo: only this table needs it

    configs = load_configs()
    rows = [
        "| mutant | what is broken | found by | finding | path | states | CPU s |",
        "| --- | --- | --- | --- | ---: | ---: | ---: |",
    ]
    for name in ZOO_MUTANTS:
        missed: list[str] = []
        for cname in ZOO_CONFIGS:
            t = time.process_time()
            with activate(name):
                res = explore(configs[cname])
            cpu = time.process_time() - t
            if res.finding is not None:
                f = res.finding
                why = f.message if len(f.message) < 70 else f.message[:67] + "..."
                rows.append(
                    f"| {name} | {MUTANTS[name]} | `{cname}`{_missed(missed)} | {f.kind}: {why} | "
                    f"{len(f.path)} | {res.states:,} | {cpu:.1f} |"
                )
                break
            missed.append(cname)
        else:
            rows.append(
                f"| {name} | {MUTANTS[name]} | none of {', '.join(ZOO_CONFIGS)} | - | - | - | - |"
            )
        print(rows[-1], file=sys.stderr, flush=True)
    return "\n".join(rows)


def _missed(names: list[str]) -> str:
    return f" (not `{'`, `'.join(names)}`)" if names else ""


def main(argv: Sequence[str] | None = None) -> int:
    configs = load_configs()
    p = argparse.ArgumentParser(
        prog="python3 -m hicache.oracle.modelcheck.bench", description=__doc__.splitlines()[0]
    )
    p.add_argument(
        "--config",
        nargs="+",
        choices=sorted(configs),
        default=[n for n, c in configs.items() if c.ranks == 1],
        help="configurations to measure (default: every one-plane one; the TP model's "
        "are measured by `hicache model-check`)",
    )
    p.add_argument(
        "--branching", choices=sorted(configs), help="also compare ways to branch on this config"
    )
    p.add_argument("--zoo", action="store_true", help="only the bug-zoo table")
    args = p.parse_args(argv)
    if args.zoo:
        print(zoo())
        return 0
    print(HEADER)
    for name in args.config:
        print(measure(configs[name]), flush=True)
    if args.branching:
        print()
        print(branching(configs[args.branching]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
