"""The fuzz machine over SGLang's RadixCache: seeds x steps, what the engine was made to do,
and throughput through the adapter against the hicache controller adapter and the adapter
template's one-tier cache, in one process.

    PYTHONPATH=$PWD VENV/bin/python benchmarks/engine_sglang.py [--seeds 1 2 3] [--steps 2000]
    PYTHONPATH=$PWD VENV/bin/python benchmarks/engine_sglang.py --traces DIR [--seeds ...]

VENV has sglang installed as hicache/testing/adapters/sglang.py says. Per seed, four runs
of the same seed and step budget: `hicache fuzz --adapter ...sglang:sglang_adapter` (pages
of 4 tokens), the same machine over sglang at its default page size of 1 token
(`token_adapter`; prompts drawn for that page size), the adapter template (the machine's own
cost with a trivial engine: the ceiling any adapter's rate is measured against) and the
hicache controller on the null plane (`hicache fuzz` without --adapter). One JSON line per
seed and run: steps, wall and CPU seconds, steps per CPU second, the ratio to the template
ceiling and to the controller, whether the run agreed with the reference model, and the
sglang adapter's `stats` summed over the run's caches.

`--traces DIR` instead writes, per seed, the spec/trace.md trace of sglang driven through
`sglang_trace.workload` (`--steps` steps, L1 of 3 + seed pages, prefill keeping its
admission's match) to DIR/sglang-SEED.ndjson, for `hicache check-trace`; one JSON line per
seed with its event counts.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hicache.testing import runner
from hicache.testing.adapters import sglang
from hicache.testing.adapters.sglang_import import import_radix_cache
from hicache.testing.adapters.sglang_trace import workload
from hicache.testing.coverage import Coverage

STATS: Counter[str] = Counter()  # summed over every sglang cache the current run opens


def _counting(
    factory: Callable[[Any], sglang.SGLangRadixCache],
) -> Callable[[Any], sglang.SGLangRadixCache]:
    """`factory`, each cache's stats added to STATS when the machine closes it."""

    def make(setup: Any) -> sglang.SGLangRadixCache:
        cache = factory(setup)
        close = cache.close

        def close_and_count() -> None:
            STATS.update(cache.stats)
            close()

        cache.close = close_and_count  # type: ignore[method-assign]
        return cache

    return make


counted = _counting(sglang.sglang_adapter)  # `--adapter __main__:counted`
token_counted = _counting(sglang.token_adapter)


def _fuzz(seed: int, steps: int, adapter: str | None) -> tuple[int, bool]:
    """`hicache fuzz` in this process: (steps run, agreed)."""
    result = runner.fuzz(runner.arguments(seed=seed, steps=steps, plane="null", adapter=adapter))
    if not result.ok:
        print(result.text, file=sys.stderr)
    return result.steps, result.ok


def _token_pages(seed: int, steps: int) -> tuple[int, bool]:
    """The machine over sglang with pages of one token, as `hicache fuzz` runs a machine."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    from hicache.testing.machine import make_machine

    coverage = Coverage()
    machine = make_machine(token_counted, sglang.setups("null"), page_size=1, coverage=coverage)
    machine._hypothesis_internal_use_seed = seed
    config = settings(
        max_examples=max(1, steps // runner.STEPS_PER_RUN),
        stateful_step_count=runner.STEPS_PER_RUN,
        deadline=None,
        database=None,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            run_state_machine_as_test(machine, settings=config)  # type: ignore[no-untyped-call]
    except AssertionError as e:
        print(f"page size 1, seed {seed}: {e}", file=sys.stderr)
        return coverage.steps, False
    return coverage.steps, True


def _timed(run: Callable[[], tuple[int, bool]]) -> dict[str, Any]:
    STATS.clear()
    wall, cpu = time.perf_counter(), time.process_time()
    steps, agreed = run()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "steps": steps,
        "agreed": agreed,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "steps_per_cpu_s": round(steps / cpu, 1) if cpu else None,
        "stats": dict(STATS),
    }


def _traces(out: Path, seeds: list[int], steps: int) -> int:
    out.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        cache = sglang.SGLangRadixCache(capacity=3 + seed, rematch=False, traced=True)
        workload(cache, seed, steps)
        lines = cache.traces[-1].lines()
        path = out / f"sglang-{seed}.ndjson"
        path.write_text("\n".join(lines) + "\n")
        kinds = Counter(json.loads(line)["event"] for line in lines[1:])
        print(
            json.dumps({"seed": seed, "trace": str(path), "events": len(lines) - 1, **kinds}),
            flush=True,
        )
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--steps", type=int, default=2_000)
    p.add_argument("--traces", metavar="DIR", help="write sglang's traces there instead")
    args = p.parse_args(argv)
    if args.traces:
        return _traces(Path(args.traces), args.seeds, args.steps)
    import torch

    torch.set_num_threads(1)  # one core, as the other adapters
    import_radix_cache()  # its import (seconds) is not the adapter's rate
    for seed in args.seeds:
        runs = {
            "sglang": _timed(functools.partial(_fuzz, seed, args.steps, "__main__:counted")),
            "sglang_page1": _timed(functools.partial(_token_pages, seed, args.steps)),
            "template": _timed(
                functools.partial(_fuzz, seed, args.steps, "hicache.testing.template:factory")
            ),
            "controller": _timed(functools.partial(_fuzz, seed, args.steps, None)),
        }
        for name, r in runs.items():
            for ceiling in ("template", "controller"):
                base = runs[ceiling]["steps_per_cpu_s"]
                r[f"ratio_to_{ceiling}"] = round(r["steps_per_cpu_s"] / base, 3) if base else None
            print(json.dumps({"seed": seed, "run": name, **r}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
