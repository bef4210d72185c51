"""The fuzz machine over SGLang's hierarchical cache (UnifiedRadixCache with HiCache on, L1 and
L2: hicache/testing/adapters/sglang_hicache.py): per seed, `hicache fuzz --adapter --report`
run in this process, the rules the machine ran, and what the engine was made to do, summed
over the run's caches (the adapter's `stats`: backups and loads issued, ticks a job stayed
pending, host hits, load-backs refused or shared, prefills refused or that evicted for room,
L2 evictions).

    PYTHONPATH=$PWD VENV/bin/python benchmarks/engine_sglang_hicache.py [--seeds 1 2 3] \\
        [--steps 2000]

VENV has sglang installed as the adapter's docstring says. One JSON line per seed: steps,
wall and CPU seconds, steps per CPU second, whether the run agreed with the reference model,
and the stats.

    ... benchmarks/engine_sglang_hicache.py --traces DIR [--settle] [--stale] --seeds ...

writes instead, per seed, the spec/trace.md trace of `sglang_hicache_trace.workload`
(`--steps` steps, write-through, L1 of 5 + seed % 4 pages, L2 1, 1.5 or 2 times that by
seed % 3, every host hit loaded back; `--settle`: transfers land before each submit and
prefill; `--stale`: the planted SGLangHiCacheStaleLock) and judges it with `hicache
check-trace`: one JSON line per seed with the event counts, the exit code and its first line.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from hicache.app.cli import main as cli
from hicache.testing import runner
from hicache.testing.adapters import sglang_hicache
from hicache.testing.adapters.sglang_hicache_trace import workload
from hicache.testing.factory import EngineConfig

STATS: Counter[str] = Counter()  # summed over every cache the current run opens


def counted(config: EngineConfig) -> sglang_hicache.SGLangHiCache:
    """`hicache_adapter`, each cache's stats added to STATS when the machine closes it
    (`--adapter __main__:counted`)."""
    cache = sglang_hicache.hicache_adapter(config)
    close = cache.close

    def close_and_count() -> None:
        STATS.update(cache.stats)
        cache.stats.clear()
        close()

    cache.close = close_and_count  # type: ignore[method-assign]
    return cache


def run(seed: int, steps: int) -> dict[str, Any]:
    STATS.clear()
    wall, cpu = time.perf_counter(), time.process_time()
    args = runner.arguments(
        seed=seed, steps=steps, plane="null", adapter="__main__:counted", report=True
    )
    result = runner.fuzz(args)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if not result.ok:
        print(result.text, file=sys.stderr)
    return {
        "seed": seed,
        "steps": result.steps,
        "agreed": result.ok,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "steps_per_cpu_s": round(result.steps / cpu, 1) if cpu else None,
        "stats": dict(sorted(STATS.items())),
        "rules": _rules(result.text),
    }


def _rules(text: str) -> dict[str, int]:
    """The machine's rules and how often each ran (`--report`'s "rules run:" line)."""
    line = next((t for t in text.splitlines() if t.startswith("rules run: ")), "")
    words = line.removeprefix("rules run: ").replace(",", "").split()
    return {name: int(n) for name, n in zip(words[::2], words[1::2], strict=False)}


def traced(out: Path, seed: int, steps: int, settle: bool, stale: bool) -> dict[str, Any]:
    """One seed's trace, written to `out` and judged by check-trace (module docstring)."""
    kind = sglang_hicache.SGLangHiCacheStaleLock if stale else sglang_hicache.SGLangHiCache
    ratio = (1.0, 1.5, 2.0)[seed % 3]
    cache = kind(5 + seed % 4, ratio, 4, load_back_threshold=0, traced=True)
    found = ""
    try:
        workload(cache, seed, steps, settle)
    except AssertionError as e:  # sglang's own accounting (the planted bug may break it)
        found = str(e).splitlines()[0]
    lines = cache.traces[-1].lines()
    path = out / f"seed-{seed}.ndjson"
    path.write_text("\n".join(lines) + "\n")
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        code = cli(["check-trace", str(path)])
    kinds = Counter(json.loads(line)["event"] for line in lines[1:])
    verdict = said.getvalue().splitlines()[:2]
    return {"seed": seed, "events": len(lines) - 1, "exit": code, "verdict": verdict,
            "accounting": found, "kinds": dict(sorted(kinds.items()))}  # fmt: skip


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--steps", type=int, default=2_000)
    p.add_argument("--traces", metavar="DIR", type=Path, help="write and judge traces there")
    p.add_argument("--settle", action="store_true", help="transfers land before each request")
    p.add_argument("--stale", action="store_true", help="the planted stale lock")
    a = p.parse_args(argv)
    if a.traces:
        a.traces.mkdir(parents=True, exist_ok=True)
        for seed in a.seeds:
            print(json.dumps(traced(a.traces, seed, a.steps, a.settle, a.stale)), flush=True)
        return 0
    agreed = True
    for seed in a.seeds:
        line = run(seed, a.steps)
        agreed &= line["agreed"]
        print(json.dumps(line), flush=True)
    return 0 if agreed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
