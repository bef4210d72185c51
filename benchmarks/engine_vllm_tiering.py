"""The fuzz machine over vLLM's tiering manager with its file tier: seeds x steps, what the
engine was made to do, and steps per second, in one process.

    cd /tmp && PYTHONPATH=REPO VENV/bin/python REPO/benchmarks/engine_vllm_tiering.py \\
        [--seeds 1 2 3] [--steps 2000] [--report DIR]

VENV has vLLM installed as hicache/testing/adapters/vllm.py says (run from another directory
than the repository's root, as every engine adapter is). Per seed: `hicache fuzz --adapter
...vllm_tiering:vllm_tiering_adapter`, each opened engine's `stats` summed over the run
(file jobs done and failed, promotions, damaged files, ...). One JSON line per seed: steps,
wall and CPU seconds, steps per CPU second, whether the run agreed with the reference model,
the stats. `--report DIR` also writes each seed's `hicache fuzz --report` text (rules, fault
sites reached) to DIR/vllm-tiering-SEED.txt, and `--summarize DIR` reads such a directory
(and DIR/out.jsonl, this script's output) back: seeds, steps, failures, steps per wall second,
the stats and the rules and fault sites reached, summed. `--traces DIR [--settle]` writes
each seed's spec/trace.md trace instead (`trace_run`), for `hicache check-trace`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from hicache.testing import runner
from hicache.testing.adapters import vllm_tiering
from hicache.testing.factory import EngineConfig

STATS: Counter[str] = Counter()  # summed over every engine the current run opens


def counted(config: EngineConfig) -> vllm_tiering.VLLMTiering:
    """`vllm_tiering_adapter`, each engine's stats added to STATS when the machine closes it
    (`--adapter __main__:counted`)."""
    cache = vllm_tiering.vllm_tiering_adapter(config)
    close = cache.close

    def close_and_count() -> None:
        STATS.update(cache.stats)
        close()

    cache.close = close_and_count  # type: ignore[method-assign]
    return cache


def seed_run(seed: int, steps: int, report: Path | None) -> dict[str, Any]:
    STATS.clear()
    args = runner.arguments(
        seed=seed, steps=steps, plane="null", adapter="__main__:counted", report=bool(report)
    )
    wall, cpu = time.perf_counter(), time.process_time()
    result = runner.fuzz(args)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if not result.ok:
        print(result.text, file=sys.stderr)
    if report is not None:
        report.mkdir(parents=True, exist_ok=True)
        (report / f"vllm-tiering-{seed}.txt").write_text(result.text)
    return {
        "seed": seed,
        "steps": result.steps,
        "agreed": result.ok,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "steps_per_cpu_s": round(result.steps / cpu, 1) if cpu else None,
        "stats": dict(sorted(STATS.items())),
    }


def trace_run(seed: int, steps: int, folder: Path, settle: bool) -> dict[str, Any]:
    """Seed `seed`'s trace of `vllm_trace.workload` (L1 8 pages; settled: L2 24 pages, every
    file job ended at once, L1 and L2 emptied now and then; else an L2 of 3 + seed % 6 and
    the workload's faults) to FOLDER/{settled,raw}-SEED.ndjson, for `hicache check-trace`.
    One engine, fresh directory: a trace has no restart event."""
    from hicache.testing.adapters.vllm_trace import workload

    cache = vllm_tiering.VLLMTiering(8, 24 if settle else 3 + seed % 6, 4, persistent=False)
    cache.traced = True
    cache.restart()
    workload(cache, seed, steps, settle=settle, flush_l2=settle)
    lines = cache.traces[-1].lines()
    path = folder / f"{'settled' if settle else 'raw'}-{seed}.ndjson"
    path.write_text("\n".join(lines) + "\n")
    events = Counter(json.loads(line)["event"] for line in lines[1:])
    return {"seed": seed, "trace": str(path), "events": dict(sorted(events.items()))}


def _counts(text: str, heading: str) -> Counter[str]:
    """The `name  count` lines under `heading` in a `--report` text (a `rules run:` line
    lists them inline instead)."""
    out: Counter[str] = Counter()
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("rules run:") and heading == "rules run":
            for part in line.split(":", 1)[1].split(","):
                name, _, n = part.strip().rpartition(" ")
                out[name] += int(n)
        elif line.startswith(heading):
            for row in lines[i + 1 :]:
                if not row.startswith("  "):
                    break
                name, n = row.split()
                out[name] += int(n)
    return out


def summarize(folder: Path) -> dict[str, Any]:
    """What a campaign's JSON lines and reports in `folder` add up to."""
    runs = [json.loads(line) for line in (folder / "out.jsonl").read_text().splitlines()]
    stats: Counter[str] = Counter()
    rules: Counter[str] = Counter()
    sites: Counter[str] = Counter()
    for run in runs:
        stats.update(run["stats"])
        text = (folder / f"vllm-tiering-{run['seed']}.txt").read_text()
        rules.update(_counts(text, "rules run"))
        sites.update(_counts(text, "fault sites"))
    steps, wall = sum(r["steps"] for r in runs), sum(r["wall_s"] for r in runs)
    return {
        "seeds": len(runs),
        "steps": steps,
        "failed": [r["seed"] for r in runs if not r["agreed"]],
        "steps_per_wall_s": round(steps / wall, 1) if wall else None,
        "steps_per_cpu_s": round(steps / sum(r["cpu_s"] for r in runs), 1),
        "rules": dict(sorted(rules.items())),
        "fault_sites": dict(sorted(sites.items())),
        "stats": dict(sorted(stats.items())),
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--steps", type=int, default=2_000)
    p.add_argument("--report", metavar="DIR", type=Path)
    p.add_argument("--summarize", metavar="DIR", type=Path, help="sum a campaign's output")
    p.add_argument("--traces", metavar="DIR", type=Path, help="write workload traces there")
    p.add_argument("--settle", action="store_true", help="--traces: the settled workload")
    args = p.parse_args(argv)
    if args.traces:
        args.traces.mkdir(parents=True, exist_ok=True)
        for seed in args.seeds:
            print(json.dumps(trace_run(seed, args.steps, args.traces, args.settle)), flush=True)
        return 0
    if args.summarize:
        print(json.dumps(summarize(args.summarize), indent=1))
        return 0
    failed = 0
    for seed in args.seeds:
        line = seed_run(seed, args.steps, args.report)
        failed += not line["agreed"]
        print(json.dumps(line), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
