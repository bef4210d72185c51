"""L3 bytes written by pool mode across ranks, exact (counted, not sampled): `hicache demo`'s
workload on simulated ranks, one request at a time, once per preset, each rank's `L3Writes.bytes_by_mode`.

    PYTHONPATH=. python3 benchmarks/tp_l3_writes.py [--ranks 2] [--requests 120]
        [--presets mha dsv4-tiny] [--seed 0]

`mha` (one sharded pool) runs on the CPU plane, each rank with its own L3 file; `dsv4-tiny`
(every pool replicated) on the null plane, where a rank's L3 moves no bytes (the reference's
byte planes keep one L3 file per rank, which cannot hold a copy every rank reads: spec/tp.md,
"L3 writes"), but the ledger counts what each rank wrote all the same. The rule says: a
sharded pool's bytes are written by every rank (equal counts), a replicated pool's by rank 0
only (the others 0). Prints one JSON line: per preset and rank the bytes by mode and the H2S
ops completed, and `rule_holds` per preset.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from hicache import demo
from hicache.controller.controller import CacheController
from hicache.dataplane.null import NullEngine
from hicache.distributed.cluster import SimulatedCluster
from hicache.workload import RequestSpec


def serve(ctl: CacheController, workload: Sequence[RequestSpec]) -> None:
    """Every request in turn (this rank's part of the SPMD script): admit, tick until its
    restore settles, prefill, finish; then drain, so every backup has ended."""
    for r in workload:
        ctl.admit(r.request_id, r.tokens)
        while not ctl.ready(r.request_id):
            ctl.wait(r.request_id)
            ctl.tick()
        ctl.prefill(r.request_id)
        ctl.finish(r.request_id)
        ctl.tick()
    ctl.drain()


def run_preset(preset: str, ranks: int, requests: int, seed: int) -> dict[str, Any]:
    """Serve the demo workload of `preset` on `ranks` simulated ranks; what each wrote."""
    args = demo.parser().parse_args(["--device", "cpu", "--preset", preset, "--requests",
                                     str(requests), "--seed", str(seed), "--check-mode", "off",
                                     "--quiet"])
    setup = demo.demo_setup(args)
    cfg = setup.config
    engine = None
    if cfg.group is not None:  # replicated pools: the null plane
        engine = lambda r: NullEngine(cfg.kv, cfg.l1_pages, cfg.l2_pages, cfg.l3_slots)  # noqa: E731
    cluster = SimulatedCluster(cfg, ranks, engine=engine)
    try:
        cluster.run(lambda c: serve(c, setup.workload))
    finally:
        cluster.close()
    modes = [dict(c.l3_writes.bytes_by_mode) for c in cluster.ranks]
    per_rank = [{"rank": c.l3_writes.rank, "bytes_by_mode": m, "h2s_ops_recorded": len(c.l3_writes.ops)}
                for c, m in zip(cluster.ranks, modes)]
    holds = (all(m["sharded"] == modes[0]["sharded"] for m in modes)
             and all(m["replicated"] == 0 for m in modes[1:]))
    return {"preset": preset, "per_rank": per_rank, "rule_holds": holds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--requests", type=int, default=120)
    p.add_argument("--presets", nargs="+", default=["mha", "dsv4-tiny"])
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    print(json.dumps({"bench": "tp_l3_writes", "ranks": a.ranks, "requests": a.requests,
                      "presets": [run_preset(x, a.ranks, a.requests, a.seed) for x in a.presets]}))


if __name__ == "__main__":
    main()
