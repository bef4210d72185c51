"""The case categories: per category, a configuration and a script drawn from a seed.

category          what a case does
----------------  --------------------------------------------------------------------------
hit_miss          a miss, a full L1 hit, a disjoint miss, a partial hit that splits a node
sharing           requests sharing a prefix while both live; one resubmitted while live
eviction_l1       L1 fills: prefill makes room (LRU), is refused while live requests hold
                  L1, succeeds once one ends; partial pressure on L1
eviction_l2       L2 fills through backups; pressure on L2; what an L1 miss then hits
eviction_l3       a few L3 slots fill; pressure on L3; an L3-only restore after it
write_policy      the D2H then H2S chain step by step under each write policy; then L1
                  fills and makes room (write-back: the victim is backed up first)
restore_l2        a load-back from L2 (ready only once it is observed); a sharer joins
restore_l3        an L3 restore through L2 (promotion on or off), step by step
fail_d2h/_h2s/    one transfer of that kind fails (an S2H: error, corrupt or unreadable);
_h2d/_s2h         the request falls back to computing
aimed             a fault aimed at the next transfer into a tier (refuse, error, corrupt)
abort             a request ends with its restore in flight (H2D, or S2H)
cancel_restore    a request gives its restore up and stays; or its sharer does
drain             many transfers in flight, then every one ends at once
refused           calls the engine must refuse (nothing changes: the next step shows it)
storage_damage    the L3 file is cut or removed; a restore from it falls back to compute
crash             a crash aimed at a transfer: the engine restarts empty
random            a seeded walk over the operations above (no crash, no damage)
l1_hit_miss, l1_sharing, l1_eviction
                  the scripts of hit_miss, sharing and eviction_l1 on a cache of L1 alone
                  (they never tick: nothing is backed up or restored)
l1_refused        refused calls a one-tier cache must refuse
"""

from __future__ import annotations

import random

from hicache.controller.config import WRITE_POLICIES
from hicache.oracle.vectors.format import CaseConfig
from hicache.oracle.vectors.recorder import (
    ALL,
    LIVE_MAX,
    PAGE_SIZE,
    Builder,
    Recorder,
    Script,
    config,
)


def hit_miss(rng: random.Random) -> tuple[CaseConfig, Script]:
    def script(r: Recorder) -> None:
        a = r.fresh(rng.randint(2, 4))
        r.serve(1, a)  # a miss
        r.serve(2, a)  # the whole prompt but its last token: an L1 hit
        r.serve(3, r.fresh(rng.randint(1, 3)), finish=False)  # shares nothing
        r.serve(4, r.extend(a, rng.randint(1, 2), keep_pages=rng.randint(1, 2)), finish=False)
        r.finish(3)
        r.finish(4)

    return config(rng), script


def sharing(rng: random.Random) -> tuple[CaseConfig, Script]:
    def script(r: Recorder) -> None:
        shared = r.fresh(rng.randint(1, 2), tail=0)
        a, b = r.extend(shared, rng.randint(1, 2), 9), r.extend(shared, rng.randint(0, 2), 9)
        r.serve(1, a, finish=False)
        r.serve(2, b, finish=False)  # hits the shared pages while request 1 holds them
        r.serve(3, a, finish=False)  # the same prompt twice at once
        for rid in rng.sample([1, 2, 3], 3):
            r.finish(rid)
        r.serve(4, b)

    return config(rng), script


def eviction_l1(rng: random.Random) -> tuple[CaseConfig, Script]:
    def script(r: Recorder) -> None:
        prompts = [r.fresh(3) for _ in range(4)]
        for rid, p in enumerate(prompts[:3], 1):
            r.serve(rid, p)  # the third makes room in L1: least recently used first
        r.serve(4, prompts[0], finish=False)
        r.serve(5, prompts[3], finish=False)
        r.submit(6, r.fresh(3))  # two live requests hold 6 of 7-8 pages: refused for room
        if not r.prefill(6):
            r.finish(4)
            r.prefill(6)
        r.finish(5)
        r.evict("L1", rng.randint(1, 3))  # least recently used first, whole nodes
        r.finish(6)

    return config(rng, l1=(7, 8)), script


def eviction_l2(rng: random.Random) -> tuple[CaseConfig, Script]:
    def script(r: Recorder) -> None:
        prompts = [r.fresh(2) for _ in range(4)]
        for rid, p in enumerate(prompts, 1):
            r.serve(rid, p)
            r.drain()  # backups land: L2 fills, then makes room for the next
        r.evict("L2", rng.randint(1, 3))
        r.evict("L1")
        r.serve(5, prompts[rng.randrange(4)])
        r.drain()

    return config(rng, l2=(3, 5)), script


def eviction_l3(rng: random.Random) -> tuple[CaseConfig, Script]:
    def script(r: Recorder) -> None:
        prompts = [r.fresh(rng.randint(1, 2)) for _ in range(4)]
        for rid, p in enumerate(prompts, 1):
            r.serve(rid, p)
            r.drain()
        r.evict("L3", rng.randint(1, 2))
        r.evict("L1")
        r.evict("L2")
        r.serve(5, prompts[rng.randrange(4)])
        r.drain()

    return config(rng, l3=(2, 4)), script


def write_policy(rng: random.Random) -> tuple[CaseConfig, Script]:
    policy = rng.choice(WRITE_POLICIES)

    def script(r: Recorder) -> None:
        a = r.fresh(rng.randint(2, 3))
        for rid in (1, 2, 3):  # selective write-through backs up once the prefix is hit
            r.serve(rid, a)
            r.tick()  # wanted backups start: a D2H
            for _ in range(2):
                if r.pending():
                    r.complete(0)
                r.tick()  # the D2H observed: the H2S starts; then it is observed
        # Two more prompts fill L1: prefill makes room, `a` first (least recently used);
        # under write-back its eviction backs it up first (eviction.md).
        r.serve(4, r.fresh(3))
        r.serve(5, r.fresh(3))
        r.drain()
        r.serve(6, a)
        r.drain()
        # Pressure from outside goes through the same hook: under write-back every L1
        # victim is backed up before it goes, so L2 then holds what L1 gave up.
        r.serve(7, r.fresh(2))
        r.evict("L1", ALL)
        r.drain()

    return config(rng, l1=(7, 8), write_policy=policy), script


def restore_l2(rng: random.Random) -> tuple[CaseConfig, Script]:
    def script(r: Recorder) -> None:
        a = r.fresh(rng.randint(2, 4))
        r.backed_up(a, 1, deep=False)
        r.submit(2, a)  # a load-back: L1 pending
        r.ready(2)
        r.tick()
        if rng.random() < 0.5:
            r.submit(3, a)  # shares the load-back
        r.step_through(2)
        r.prefill(2)
        if 3 in r.live():
            r.step_through(3)
            r.prefill(3)
            r.finish(3)
        r.finish(2)

    return config(rng), script


def restore_l3(rng: random.Random) -> tuple[CaseConfig, Script]:
    def script(r: Recorder) -> None:
        a = r.fresh(rng.randint(2, 3))
        r.backed_up(a, 1, deep=True)
        r.submit(2, a)  # an S2H into L2, then an H2D into L1
        r.step_through(2)
        r.prefill(2)
        r.finish(2)
        r.drain()

    return config(rng, promotion=rng.random() < 0.7), script


def _failure(direction: str) -> Builder:
    """One transfer of `direction` fails; the request (if any) computes instead."""

    def build(rng: random.Random) -> tuple[CaseConfig, Script]:
        kind = rng.choice(("error", "corrupt", "unreadable")) if direction == "S2H" else "error"

        def script(r: Recorder) -> None:
            a = r.fresh(rng.randint(2, 3))
            if direction in ("D2H", "H2S"):
                r.serve(1, a)
                r.tick()  # the D2H starts
                if direction == "H2S":
                    r.complete(0)
                    r.tick()  # the D2H observed, the H2S starts
                r.fail(0, kind)
                r.tick()
                r.drain()
                r.evict("L1")
                r.serve(2, a)
            else:
                r.backed_up(a, 1, deep=direction == "S2H")
                r.submit(2, a)
                r.fail(0, kind)
                r.tick()
                r.step_through(2)
                r.prefill(2)
                r.finish(2)
                r.drain()

        return config(rng), script

    return build


def aimed(rng: random.Random) -> tuple[CaseConfig, Script]:
    tier = rng.choice(("L1", "L2", "L3"))
    action = rng.choice(("refuse", "error") + (("corrupt",) if tier == "L2" else ()))

    def script(r: Recorder) -> None:
        a = r.fresh(rng.randint(2, 3))
        if tier == "L3":
            r.aim(action, tier)  # the H2S of the backup
            r.serve(1, a)
            r.drain()
            r.evict("L1")
            r.evict("L2")
            r.serve(2, a)
        else:
            r.backed_up(a, 1, deep=tier == "L2")
            r.aim(action, tier)
            r.serve(2, a)
        r.drain()

    return config(rng), script


def abort(rng: random.Random) -> tuple[CaseConfig, Script]:
    deep = rng.random() < 0.5

    def script(r: Recorder) -> None:
        a = r.fresh(rng.randint(2, 3))
        r.backed_up(a, 1, deep=deep)
        r.submit(2, a)
        if rng.random() < 0.5:
            r.tick()
        r.finish(2)  # ends with its restore in flight
        r.tick()
        r.drain()
        r.serve(3, a)

    return config(rng), script


def cancel_restore(rng: random.Random) -> tuple[CaseConfig, Script]:
    sharer, deep = rng.random() < 0.5, rng.random() < 0.5

    def script(r: Recorder) -> None:
        a = r.fresh(rng.randint(2, 3))
        r.backed_up(a, 1, deep=deep)
        r.submit(2, a)
        if sharer:
            r.submit(3, a)
        rid = 3 if sharer else 2
        r.cancel(rid)
        r.ready(rid)
        r.prefill(rid)
        if sharer:
            r.step_through(2)
            r.prefill(2)
        r.drain()

    return config(rng), script


def drain(rng: random.Random) -> tuple[CaseConfig, Script]:
    def script(r: Recorder) -> None:
        prompts = [r.fresh(rng.randint(1, 2)) for _ in range(3)]
        for rid, p in enumerate(prompts, 1):
            r.serve(rid, p)
            r.tick()
        r.drain()
        r.evict("L1")
        r.evict("L2")
        for rid, p in enumerate(prompts, 4):
            r.submit(rid, p)
        r.drain()
        for rid in (4, 5, 6):
            r.prefill(rid)

    return config(rng, l1=(10, 12)), script


def _refuse_requests(r: Recorder, rng: random.Random) -> tuple[int, ...]:
    """Request 1 is served and stays; then calls every cache must refuse: request 1 admitted
    again, request 99 (never admitted) prefilled and finished, an empty prompt, a prompt
    larger than L1 (at most 12 pages here). Returns request 1's prompt."""
    a = r.fresh(2)
    r.serve(1, a, finish=False)
    r.submit(1, r.fresh(1))  # the id is live
    r.do({"op": "prefill", "request": 99})  # not live
    r.do({"op": "finish", "request": 99})
    r.submit(2, [])  # no token to compute
    r.submit(3, r.fresh(rng.randint(13, 16)))  # more pages than L1 holds
    return a


def refused(rng: random.Random) -> tuple[CaseConfig, Script]:
    def script(r: Recorder) -> None:
        a = _refuse_requests(r, rng)
        r.do({"op": "cancel_restore", "request": 99})
        r.do({"op": "ready", "request": 99})
        r.aim("melt", "L1")
        r.do({"op": "damage_storage", "how": "burn"})
        r.finish(1)
        r.drain()
        r.evict("L1")
        r.submit(4, a)
        r.prefill(4)  # its load-back has not settled yet
        r.step_through(4)
        r.prefill(4)
        r.prefill(4)  # served already

    return config(rng, l1=(8, 12)), script


def storage_damage(rng: random.Random) -> tuple[CaseConfig, Script]:
    how = rng.choice(("truncate", "remove"))

    def script(r: Recorder) -> None:
        a = r.fresh(rng.randint(2, 3))
        r.backed_up(a, 1, deep=True)
        r.do({"op": "damage_storage", "how": how})
        r.serve(2, a)
        r.drain()

    return config(rng), script


def crash(rng: random.Random) -> tuple[CaseConfig, Script]:
    tier = rng.choice(("L1", "L2", "L3"))

    def script(r: Recorder) -> None:
        a = r.fresh(rng.randint(2, 3))
        if tier == "L1":
            r.backed_up(a, 1, deep=False)
        r.aim("crash", tier)
        r.serve(2, a)
        r.drain()  # a backup's crash is observed here
        r.serve(3, a)  # after a crash: a miss everywhere

    return config(rng), script


def random_walk(rng: random.Random) -> tuple[CaseConfig, Script]:
    policy = rng.choice(WRITE_POLICIES)

    tiers = ("L1", "L2", "L3")

    def script(r: Recorder) -> None:
        shared = [r.fresh(2, tail=0) for _ in range(2)]
        rid, served = 0, set[int]()
        for _ in range(rng.randint(20, 35)):
            live = r.live()
            served &= set(live)
            unserved = [x for x in live if x not in served]
            roll = rng.random()
            if roll < 0.25 and len(live) < LIVE_MAX:
                rid += 1
                r.submit(rid, r.extend(rng.choice(shared), rng.randint(0, 2), rng.randint(0, 2)))
            elif roll < 0.4 and unserved:
                x = rng.choice(unserved)
                if r.ready(x) and r.prefill(x):
                    served.add(x)
            elif roll < 0.5 and live:
                r.finish(rng.choice(live))
            elif roll < 0.65 and r.pending():
                r.complete(rng.randrange(r.pending()))
                r.tick()
            elif roll < 0.7 and r.pending():
                r.fail(rng.randrange(r.pending()), rng.choice(("error", "corrupt", "unreadable")))
            elif roll < 0.8:
                r.evict(rng.choice(tiers), rng.choice((1, 2, ALL)))
            elif roll < 0.85 and unserved:
                r.cancel(rng.choice(unserved))
            elif roll < 0.9:
                r.drain()
            else:
                r.tick()
        r.drain()

    return config(rng, write_policy=policy), script


def _l1_only(builder: Builder) -> Builder:
    """The same script on a one-tier cache of the same L1 size: for scripts that never tick,
    drain or complete (nothing is backed up, nothing restored), so any prefix cache can run
    them (the runner observes L1 alone)."""

    def build(rng: random.Random) -> tuple[CaseConfig, Script]:
        cfg, script = builder(rng)
        return CaseConfig(
            cfg.page_size,
            {"L1": cfg.capacities["L1"]},
            cfg.write_policy,
            cfg.restore_policy,
            cfg.promotion,
        ), script

    return build


def l1_refused(rng: random.Random) -> tuple[CaseConfig, Script]:
    def script(r: Recorder) -> None:
        a = _refuse_requests(r, rng)
        r.prefill(1)  # served already
        r.finish(1)
        r.serve(4, a)

    return CaseConfig(PAGE_SIZE, {"L1": rng.randint(8, 12)}), script


CATEGORIES: dict[str, Builder] = {
    "hit_miss": hit_miss,
    "sharing": sharing,
    "eviction_l1": eviction_l1,
    "eviction_l2": eviction_l2,
    "eviction_l3": eviction_l3,
    "write_policy": write_policy,
    "restore_l2": restore_l2,
    "restore_l3": restore_l3,
    "fail_d2h": _failure("D2H"),
    "fail_h2s": _failure("H2S"),
    "fail_h2d": _failure("H2D"),
    "fail_s2h": _failure("S2H"),
    "aimed": aimed,
    "abort": abort,
    "cancel_restore": cancel_restore,
    "drain": drain,
    "refused": refused,
    "storage_damage": storage_damage,
    "crash": crash,
    "random": random_walk,
    "l1_hit_miss": _l1_only(hit_miss),
    "l1_sharing": _l1_only(sharing),
    "l1_eviction": _l1_only(eviction_l1),
    "l1_refused": l1_refused,
}
"""Category name -> its builder (a seeded RNG -> the case's configuration and script)."""
