"""Controller throughput on the null data plane: admissions, ticks and control-plane
transitions per second, with every invariant checked after each transition.

    PYTHONPATH=. python3 benchmarks/null_plane.py [--requests N] [--seed S] [--check every]
        [--tiers L1 L2 L3]

The workload: prompts drawn from a few shared prefixes with divergent suffixes (nodes split,
restores from L2 and L3, backups under pressure in small tiers); after each admission the
pending transfers are finished in a seeded random order, one in ten failed, with a tick after
each. Every request is prefilled and finished (one in five aborted before). One process, one
thread: the number is per core. Transitions are the control plane's own count
(`InvariantChecker.transitions`); with `--check every` each was followed by a full check.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

from hicache.controller.config import CacheConfig
from hicache.controller.controller import CacheController
from hicache.dataplane.handles import NullHandle
from hicache.dataplane.null import NullEngine
from hicache.errors import OutOfPages


def workload(rng: random.Random, n: int, page_size: int) -> list[tuple[int, ...]]:
    """`n` prompts: one of 4 prefixes (2..6 pages) plus a suffix of 1..4 pages from 3 choices."""
    prefixes = [tuple(range(1000 * p, 1000 * p + page_size * rng.randint(2, 6))) for p in range(4)]
    out = []
    for _ in range(n):
        suffix = tuple(range(7, 7 + page_size * rng.randint(1, 4))) * 1
        salt = rng.randrange(3)
        out.append(rng.choice(prefixes) + tuple(t + 100 * salt for t in suffix) + (salt,))
    return out


def run(requests: int, seed: int, check_mode: str, tiers: tuple[int, int, int] = (24, 32, 48)) -> dict[str, object]:
    """Drive `requests` admissions; tiers: (l1_pages, l2_pages, l3_slots)."""
    cfg = CacheConfig(l1_pages=tiers[0], l2_pages=tiers[1], l3_slots=tiers[2], policy="always",
                      check_mode=check_mode)
    c = CacheController(cfg, engine=NullEngine(cfg.kv, cfg.l1_pages, cfg.l2_pages, cfg.l3_slots))
    rng = random.Random(seed)
    prompts = workload(rng, requests, cfg.kv.page_size)
    ticks = admissions = refused = 0
    started = time.perf_counter()
    for rid, tokens in enumerate(prompts):
        c.admit(rid, tokens)
        admissions += 1
        extra = rng.randint(1, 3)  # ticks beyond readiness: backups are issued and observed on ticks
        while not c.ready(rid) or extra > 0:
            extra -= 1
            pending = c.pending()
            if pending:
                op = rng.choice(pending)
                handle = c.handles[op.op_id]
                assert isinstance(handle, NullHandle), "the null plane issues NullHandles"
                handle.finish(rng.random() >= 0.1)
            c.tick()
            ticks += 1
        if rng.random() < 0.2:
            c.finish(rid)  # aborted after its restore, before prefill
            continue
        try:
            c.prefill(rid)
        except OutOfPages:
            refused += 1  # L1 held by pins and backups in flight: the request gives up
        c.finish(rid)
    seconds = time.perf_counter() - started
    transitions = c.cp.checker.transitions
    c.close()
    return {
        "plane": "null", "check_mode": check_mode, "tiers": list(tiers), "seed": seed, "seconds": round(seconds, 3),
        "admissions_per_s": round(admissions / seconds), "ticks_per_s": round(ticks / seconds),
        "prefills_refused": refused,
        "transitions": transitions, "transitions_per_s": round(transitions / seconds),
        "checks_run": c.cp.checker.checks_run, "torch_imported": "torch" in sys.modules,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", default="every", help="check mode: off, every, periodic N")
    ap.add_argument("--tiers", type=int, nargs=3, default=[24, 32, 48], metavar=("L1", "L2", "L3"))
    args = ap.parse_args()
    print(json.dumps(run(args.requests, args.seed, args.check, tuple(args.tiers))))


if __name__ == "__main__":
    main()
