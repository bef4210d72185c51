"""L3 bytes written by pool mode across ranks, exact (counted, not sampled): `hicache demo`'s
workload on simulated ranks, one request at a time, once per preset, each rank's
`L3Writes.bytes_by_mode`.

    PYTHONPATH=. python3 benchmarks/tp_l3_writes.py [--ranks 2] [--requests 120]
        [--presets mha dsv4-tiny] [--seed 0]

Both run on the CPU plane: `mha` (one sharded pool) with an L3 file per rank; `dsv4-tiny`
(every pool replicated) with rank 0's L3 files the one copy every rank reads (spec/tp.md,
C6a and C6b). The rule says: a sharded pool's bytes are written by every rank (equal
counts), a replicated pool's by rank 0 only (the others 0). Two counts per rank, each
exact: the ledger's (`L3Writes.bytes_by_mode`, what I11 reads) and the data plane's own
(`StorageCounters.h2s_bytes` of every L3 file the rank wrote). Prints one JSON line: per
preset and rank both counts and the H2S ops completed, and `rule_holds` per preset (the
rule, and the two counts equal).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from hicache.app import demo, demo_serve
from hicache.app.workload import RequestSpec
from hicache.controller.controller import CacheController
from hicache.distributed.cluster import SimulatedCluster


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


def h2s_bytes(ctl: CacheController) -> int:
    """Bytes this rank's data plane wrote to L3, from its movers' own counters."""
    plane = ctl.byte_plane
    movers = [plane.storage] if plane.one_pool else list(plane.group_storage.movers.values())
    return sum(m.counters.h2s_bytes for m in movers)


def run_preset(preset: str, ranks: int, requests: int, seed: int) -> dict[str, Any]:
    """Serve the demo workload of `preset` on `ranks` simulated ranks; what each wrote."""
    args = demo.parser().parse_args(
        [
            "--device",
            "cpu",
            "--preset",
            preset,
            "--requests",
            str(requests),
            "--seed",
            str(seed),
            "--check-mode",
            "off",
            "--quiet",
        ]
    )
    setup = demo_serve.demo_setup(args)
    cluster = SimulatedCluster(setup.config, ranks)
    try:
        cluster.run(lambda c: serve(c, setup.workload))
        plane = [h2s_bytes(c) for c in cluster.ranks]
    finally:
        cluster.close()
    modes = [dict(c.l3_writes.bytes_by_mode) for c in cluster.ranks]
    per_rank = [
        {
            "rank": c.l3_writes.rank,
            "bytes_by_mode": m,
            "data_plane_h2s_bytes": b,
            "h2s_ops_recorded": len(c.l3_writes.ops),
        }
        for c, m, b in zip(cluster.ranks, modes, plane)
    ]
    holds = (
        all(m["sharded"] == modes[0]["sharded"] for m in modes)
        and all(m["replicated"] == 0 for m in modes[1:])
        and all(sum(m.values()) == b for m, b in zip(modes, plane))
    )
    return {"preset": preset, "per_rank": per_rank, "rule_holds": holds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--requests", type=int, default=120)
    p.add_argument("--presets", nargs="+", default=["mha", "dsv4-tiny"])
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    print(
        json.dumps(
            {
                "bench": "tp_l3_writes",
                "ranks": a.ranks,
                "requests": a.requests,
                "presets": [run_preset(x, a.ranks, a.requests, a.seed) for x in a.presets],
            }
        )
    )


if __name__ == "__main__":
    main()
