"""Controller throughput on the null data plane: admissions, ticks and control-plane
transitions per second, with every invariant checked after each transition; and, with
`--fuzz`, the fuzz machine's steps and transitions per second with and without its checks.

    PYTHONPATH=. python3 benchmarks/null_plane.py [--requests N] [--seed S] [--check every]
        [--tiers L1 L2 L3]
    PYTHONPATH=. python3 benchmarks/null_plane.py --fuzz [--seeds 1 2 3 4 5] [--steps 3000]

The workload: prompts drawn from a few shared prefixes with divergent suffixes (nodes split,
restores from L2 and L3, backups under pressure in small tiers); after each admission the
pending transfers are finished in a seeded random order, one in ten failed, with a tick after
each. Every request is prefilled and finished (one in five aborted before). One process, one
thread: the number is per core. Transitions are the control plane's own count
(`InvariantChecker.transitions`); with `--check every` each was followed by a full check.
Prints one JSON line; `cpu_transitions_per_s` counts this process's CPU time instead of
wall time (steadier on a shared host).

`--fuzz` runs `hicache fuzz --seed S --steps N` (null plane) per seed twice: as is (every
invariant and the tree's audit after each step), then with the adapter's check returning
nothing -- the floor the checks are measured against (`checks_ratio`, on / off). Rates are
given per second of wall time and of this process's CPU time (steadier on a shared host);
transitions are trace events, what `hicache fuzz` prints. Both runs draw the same steps, so
their trace digests must agree (`same_trace`). One JSON line per seed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import time
from collections.abc import Iterator

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


def run(
    requests: int, seed: int, check_mode: str, tiers: tuple[int, int, int] = (24, 32, 48)
) -> dict[str, object]:
    """Drive `requests` admissions; tiers: (l1_pages, l2_pages, l3_slots)."""
    cfg = CacheConfig(
        l1_pages=tiers[0],
        l2_pages=tiers[1],
        l3_slots=tiers[2],
        policy="always",
        check_mode=check_mode,
    )
    c = CacheController(cfg, engine=NullEngine(cfg.kv, cfg.l1_pages, cfg.l2_pages, cfg.l3_slots))
    rng = random.Random(seed)
    prompts = workload(rng, requests, cfg.kv.page_size)
    ticks = admissions = refused = 0
    started, cpu = time.perf_counter(), time.process_time()
    for rid, tokens in enumerate(prompts):
        c.admit(rid, tokens)
        admissions += 1
        extra = rng.randint(
            1, 3
        )  # ticks beyond readiness: backups are issued and observed on ticks
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
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    transitions = c.cp.checker.transitions
    c.close()
    return {
        "plane": "null",
        "check_mode": check_mode,
        "tiers": list(tiers),
        "seed": seed,
        "seconds": round(seconds, 3),
        "admissions_per_s": round(admissions / seconds),
        "ticks_per_s": round(ticks / seconds),
        "prefills_refused": refused,
        "transitions": transitions,
        "transitions_per_s": round(transitions / seconds),
        "cpu_seconds": round(cpu, 3),
        "cpu_transitions_per_s": round(transitions / cpu),
        "checks_run": c.cp.checker.checks_run,
        "torch_imported": "torch" in sys.modules,
    }


@contextlib.contextmanager
def checks_off() -> Iterator[None]:
    """The fuzz machine's after-step check (every invariant, the tree's audit) finds nothing."""
    from hicache.testing.adapters.controller import ControllerAdapter

    real = ControllerAdapter.check
    ControllerAdapter.check = lambda self: []  # type: ignore[method-assign]
    try:
        yield
    finally:
        ControllerAdapter.check = real  # type: ignore[method-assign]


def fuzz_once(seed: int, steps: int) -> tuple[dict[str, int], str]:
    """One `hicache fuzz --seed seed --steps steps` run on the null plane: its counts and
    rates, and its trace digest."""
    from hicache.testing import runner

    wall, cpu = time.perf_counter(), time.process_time()
    result = runner.fuzz(runner.arguments(seed=seed, steps=steps, plane="null"))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if not result.ok:
        raise SystemExit(f"null_plane --fuzz: seed {seed} did not finish cleanly:\n{result.text}")
    done, events = result.steps, result.events
    return {
        "steps": done,
        "transitions": events,
        "steps_per_s": round(done / wall),
        "transitions_per_s": round(events / wall),
        "cpu_steps_per_s": round(done / cpu),
        "cpu_transitions_per_s": round(events / cpu),
    }, result.digest


def fuzz(seed: int, steps: int) -> dict[str, object]:
    """The fuzz machine on one seed with its checks, then without (the floor)."""
    on, digest = fuzz_once(seed, steps)
    with checks_off():
        off, digest_off = fuzz_once(seed, steps)
    rates = ("steps_per_s", "transitions_per_s", "cpu_steps_per_s", "cpu_transitions_per_s")
    return {
        "plane": "null",
        "mode": "fuzz",
        "seed": seed,
        "steps": on["steps"],
        "transitions": on["transitions"],
        "same_trace": digest == digest_off,
        **{k: on[k] for k in rates},
        **{f"{k}_checks_off": off[k] for k in rates},
        "checks_ratio": round(on["cpu_steps_per_s"] / off["cpu_steps_per_s"], 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", default="every", help="check mode: off, every, periodic N")
    ap.add_argument("--tiers", type=int, nargs=3, default=[24, 32, 48], metavar=("L1", "L2", "L3"))
    ap.add_argument("--fuzz", action="store_true", help="time the fuzz machine instead")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--steps", type=int, default=3000, help="fuzz steps per seed")
    args = ap.parse_args()
    if args.fuzz:
        fuzz_once(0, 100)  # warm up: imports and the lifecycle tables, outside the timing
        for seed in args.seeds:
            print(json.dumps(fuzz(seed, args.steps)), flush=True)
        return
    print(json.dumps(run(args.requests, args.seed, args.check, tuple(args.tiers))))


if __name__ == "__main__":
    main()
