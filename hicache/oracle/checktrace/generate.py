"""Long valid traces from hicache's own controller, for the checker's tests and benchmark.

`controller_trace(seed, steps)` drives the controller on the null data plane (no bytes, the
fuzz machine's adapter) through a seeded random workload -- shared-prefix prompts, prefills,
finishes and aborts, transfers completing or failing in any order, eviction pressure,
cancelled restores -- and returns the trace it emitted, header first, as NDJSON lines. The
same seed gives the same lines.
"""

from __future__ import annotations

import random

from hicache.errors import HiCacheError
from hicache.testing.adapters.controller import ControllerAdapter, Setup
from hicache.testing.protocol import FaultSchedule

PAGE_SIZE = 4
PREFIXES = 3  # shared prompt prefixes
PREFIX_PAGES = 3
LIVE_MAX = 4  # live requests at most


def _prompt(rng: random.Random) -> tuple[int, ...]:
    p = rng.randrange(PREFIXES)
    salt = rng.randrange(3)
    extra = rng.randrange(4) * PAGE_SIZE + rng.randint(1, PAGE_SIZE)
    return tuple(range(1000 * (p + 1), 1000 * (p + 1) + PREFIX_PAGES * PAGE_SIZE)) + tuple(
        range(50 * salt, 50 * salt + extra)
    )


def _step(a: ControllerAdapter, rng: random.Random, next_rid: int, served: set[int]) -> int:
    """One random action on the adapter; returns the next free request id."""
    live = sorted(a.live())
    roll = rng.random()
    ops = a.pending_ops()
    if roll < 0.25 and len(live) < LIVE_MAX:
        a.submit(next_rid, _prompt(rng))
        return next_rid + 1
    if roll < 0.45 and live:
        rid = rng.choice(live)
        if rid not in served and a.ready(rid):
            if a.prefill(rid):
                served.add(rid)
        else:
            a.tick()
    elif roll < 0.6 and live:
        rid = rng.choice(live)
        a.finish(rid)
        served.discard(rid)
    elif roll < 0.75 and ops:
        a.complete(rng.choice(ops))
        a.tick()
    elif roll < 0.8 and ops:
        a.fail(rng.choice(ops), "error")
        a.tick()
    elif roll < 0.85:
        a.evict(rng.choice(a.tiers), rng.randint(1, 6))
    elif roll < 0.88 and live:
        a.cancel_restore(rng.choice(live))
    else:
        a.tick()
    return next_rid


FAULTS = {
    "D2H_COMPLETE": 0.05,
    "H2D_COMPLETE": 0.05,
    "IO_EIO": 0.05,
    "SHORT_READ": 0.05,
    "CORRUPT_SLOT": 0.05,
    "ALLOC_L2": 0.05,
    "ALLOC_L3": 0.05,
}
"""The fault rates `faults=True` draws (sites of hicache.dataplane.faults.FaultSite): failed
transfers, corrupt and short L3 reads (invalidate_l3), refused reservations."""


def controller_trace(
    seed: int, steps: int, setup: Setup | None = None, faults: bool = False
) -> list[str]:
    """The NDJSON lines (header first) of one controller's run of `steps` random actions;
    `faults`: with the fault sites of FAULTS firing at random."""
    rng = random.Random(seed)
    a = ControllerAdapter(setup or Setup(l1_pages=12, l2_pages=10, l3_slots=14, check_mode="off"))
    a.set_faults(FaultSchedule(seed=seed, rates=FAULTS if faults else {}))
    header = a.ctl.cp.trace_header("hicache controller (null plane)")
    next_rid, served = 1, set[int]()
    for _ in range(steps):
        try:
            next_rid = _step(a, rng, next_rid, served)
        except HiCacheError:
            continue  # a refused action (OutOfPages, RestorePending...): nothing changed
    a.close()  # cancels what is still in flight: the trace ends quiescent
    events = a.trace()
    return [header.to_json(), *(e.to_json() for e in events)]
