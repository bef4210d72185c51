"""The TP model's counts and times, and the TP zoo run through it.

    python3 -m hicache.oracle.modelcheck.tpbench [--config NAME ...]   (default: every TP config)

First table: per TP configuration (configs.toml, `ranks` > 1), one exhaustive search --
states, edges, depth, refusals, wall and CPU seconds (this process's: steadier than wall
time on a shared machine). Second table: every mutant of the TP zoo
(hicache/testing/mutants/tp.py) on each of those configurations: the finding's kind, its
shortest path's length and the states explored, or "none" when the search ended clean.
benchmarks/results/2026-12-05-modelcheck-tp.md is a run of it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from hicache.oracle.modelcheck.config import ModelConfig, load_configs
from hicache.oracle.modelcheck.tpsearch import TPResult, explore_tp


def _timed(cfg: ModelConfig) -> tuple[TPResult, float]:
    cpu = time.process_time()
    res = explore_tp(cfg)
    return res, time.process_time() - cpu


def counts(configs: Sequence[ModelConfig]) -> str:
    rows = [
        "| config | ranks | pools | states | edges | depth | refusals | wall s | CPU s |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for cfg in configs:
        res, cpu = _timed(cfg)
        # Verify the search was clean: a finding's counts are not the configuration's.
        assert res.finding is None and res.exhaustive, f"{cfg.name}: {res.finding}"
        rows.append(
            f"| `{cfg.name}` | {cfg.ranks} | {cfg.pools} | {res.states:,} | {res.edges:,} | "
            f"{res.depth} | {res.refusals:,} | {res.seconds:.1f} | {cpu:.1f} |"
        )
        print(rows[-1], file=sys.stderr, flush=True)
    return "\n".join(rows)


def zoo(configs: Sequence[ModelConfig]) -> str:
    from hicache.testing.mutants.tp import ZOO  # the zoo: only this table needs it

    rows = [
        "| mutant | " + " | ".join(f"`{c.name}`" for c in configs) + " |",
        "| --- |" + " --- |" * len(configs),
    ]
    for mutant in ZOO:
        cells = []
        for cfg in configs:
            with mutant.patch():
                res, cpu = _timed(cfg)
            f = res.finding
            cells.append(
                f"{f.kind}, {len(f.path)} steps, {res.states:,} states, {cpu:.1f} s"
                if f
                else f"none ({res.states:,} states, {cpu:.1f} s)"
            )
        rows.append(f"| `{mutant.name}` | " + " | ".join(cells) + " |")
        print(rows[-1], file=sys.stderr, flush=True)
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    tp = {n: c for n, c in load_configs().items() if c.ranks > 1}
    p = argparse.ArgumentParser(
        prog="python3 -m hicache.oracle.modelcheck.tpbench", description=__doc__.splitlines()[0]
    )
    p.add_argument("--config", nargs="+", choices=sorted(tp), default=list(tp))
    args = p.parse_args(argv)
    chosen = [tp[n] for n in args.config]
    print(counts(chosen))
    print()
    print(zoo(chosen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
