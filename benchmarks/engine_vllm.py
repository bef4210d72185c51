"""The fuzz machine over vLLM's KV offloading (its GPU block pool over the CPU offloading
manager, hicache/testing/adapters/vllm.py): seeds x policies, what the engine was made to do,
and the coverage `--report` gives, in one process.

    cd /tmp && PYTHONPATH=REPO VENV/bin/python REPO/benchmarks/engine_vllm.py \\
        [--policies lru arc] [--seeds 1 2 3] [--steps 5000] [--reports DIR]

VENV has vLLM installed as hicache/testing/adapters/vllm.py says (run it outside the
repository root: nothing there shadows vLLM, but the adapters' other engines care). Per seed
and policy, one `hicache fuzz --report --adapter __main__:<policy>` run; one JSON line each:
steps, wall and CPU seconds, steps per CPU second, whether the run agreed with the reference
model, the adapter's `stats` summed over the run's engines, and the fault sites reached.
`--reports DIR` keeps each run's whole report text there (DIR/POLICY-SEED.txt).

`--traces DIR` instead writes, per seed and policy, the spec/trace.md trace of vLLM driven
through `vllm_trace.workload` (`--steps` steps; L1 of 8 pages; `--settle`: stores end at
once, no failures, an L2 of 24 pages never pressed; else an L2 of 3 + seed % 6 pages and
every fault of the workload) to DIR/POLICY-SEED.ndjson, for `hicache check-trace`; one JSON
line each with its event counts.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hicache.testing import runner
from hicache.testing.adapters import vllm
from hicache.testing.adapters.vllm_import import import_vllm
from hicache.testing.adapters.vllm_trace import workload

STATS: Counter[str] = Counter()  # summed over every engine the current run opens


def _counting(policy: str) -> Callable[[Any], vllm.VLLMOffloading]:
    """The policy's factory, each engine's stats added to STATS when the machine closes it."""

    def make(config: Any) -> vllm.VLLMOffloading:
        engine = vllm.vllm_cpu_adapter(config, policy)
        close = engine.close

        def close_and_count() -> None:
            STATS.update(engine.stats)
            close()

        engine.close = close_and_count  # type: ignore[method-assign]
        return engine

    return make


lru, arc = _counting("lru"), _counting("arc")  # `--adapter __main__:lru`


def _sites(report: str) -> dict[str, int]:
    """The fault sites a `--report` text counts (the block after `fault sites:`)."""
    block = report.split("fault sites:", 1)[-1].split("composite edges", 1)[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^\s+([A-Z0-9_]+)\s+(\d+)$", block, re.M)}


def _traces(out: Path, args: argparse.Namespace) -> int:
    out.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        for policy in args.policies:
            l2 = 24 if args.settle else 3 + seed % 6
            engine = vllm.VLLMOffloading(8, l2, 4, policy, traced=True)
            workload(engine, seed, args.steps, settle=args.settle)
            lines = engine.traces[-1].lines()
            path = out / f"{policy}-{seed}.ndjson"
            path.write_text("\n".join(lines) + "\n")
            kinds = Counter(json.loads(line)["event"] for line in lines[1:])
            line = {"seed": seed, "policy": policy, "trace": str(path), "events": len(lines) - 1}
            print(json.dumps({**line, **kinds}), flush=True)
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--policies", nargs="+", default=["lru", "arc"], choices=vllm.POLICIES)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--steps", type=int, default=5_000)
    p.add_argument("--reports", metavar="DIR", help="keep each run's report text there")
    p.add_argument("--traces", metavar="DIR", help="write vLLM's traces there instead")
    p.add_argument("--settle", action="store_true", help="--traces: the settled workload")
    args = p.parse_args(argv)
    import_vllm()  # its import (seconds) is not the adapter's rate
    if args.traces:
        return _traces(Path(args.traces), args)
    for seed in args.seeds:
        for policy in args.policies:
            STATS.clear()
            wall, cpu = time.perf_counter(), time.process_time()
            result = runner.fuzz(
                runner.arguments(
                    seed=seed, steps=args.steps, adapter=f"__main__:{policy}", report=True
                )
            )
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if args.reports:
                Path(args.reports).mkdir(parents=True, exist_ok=True)
                Path(args.reports, f"{policy}-{seed}.txt").write_text(result.text)
            if not result.ok:
                print(result.text, file=sys.stderr)
            line = {
                "seed": seed,
                "policy": policy,
                "steps": result.steps,
                "runs": result.runs,
                "agreed": result.ok,
                "wall_s": round(wall, 2),
                "cpu_s": round(cpu, 2),
                "steps_per_cpu_s": round(result.steps / cpu, 1) if cpu else None,
                "stats": dict(STATS),
                "fault_sites": _sites(result.text),
            }
            print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
