"""A collective that never returns under TP (spec/tp.md, "A collective that never returns"):
a rank hangs, the others' collective ends in CollectiveTimeout, and each surviving rank's
cache is then dead on its own -- its group broken for good (GroupBroken for every later
call, no collective made), close() publishing nothing -- and a restart starts empty."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("torch", reason="needs torch (the controller): pip install -e '.[data]'")

from hicache.controller.config import CacheConfig
from hicache.core.tiers import Direction, Tier
from hicache.dataplane.handles import NullHandle
from hicache.dataplane.null import NullEngine
from hicache.distributed.cluster import SimulatedCluster
from hicache.distributed.collectives import CollectiveTimeout, GroupBroken

PROMPT = list(range(1, 17))  # 4 pages of the tiny geometry's 4 tokens
CFG = CacheConfig(device="cpu", l1_pages=16, l2_pages=16, l3_slots=32)


def cluster_of_two(timeout_s: float) -> SimulatedCluster:
    return SimulatedCluster(
        CFG, 2, engine=lambda r: NullEngine(CFG.kv, 16, 16, 32), timeout_s=timeout_s
    )


def test_a_rank_that_hangs_in_c4_leaves_the_others_dead_on_their_own() -> None:
    cluster = cluster_of_two(timeout_s=0.3)
    cluster.run(lambda c: c.admit(1, PROMPT))
    cluster.run(lambda c: c.prefill(1))
    cluster.run(lambda c: c.finish(1))
    cluster.run(lambda c: c.tick())  # the write-through backup (D2H) is issued on both
    survivor = cluster.ranks[0]
    (op_id,) = [p.op_id for p in survivor.pending() if p.direction is Direction.D2H]
    handle = survivor.handles[op_id]
    assert isinstance(handle, NullHandle)
    handle.finish(True)  # done on rank 0; rank 1 never reports
    made = survivor.agree.c.log.count

    def step(rank: int) -> None:
        if rank == 0:
            survivor.tick()  # C4 waits for rank 1
        else:
            time.sleep(1.0)  # rank 1 hangs, past the watchdog, and makes no collective

    with pytest.raises(CollectiveTimeout, match="completion"):
        cluster.group.run(step)
    # The survivor published nothing of the op C4 never agreed on, and is dead: every call
    # is refused before it makes a collective (a late peer's call would pair with it).
    assert op_id in survivor.cp.ops and survivor.cp.poisoned is None
    node = survivor.cp.ops[op_id].nodes[-1]
    assert not survivor.cp.holds(node, Tier.L2)
    for call in (lambda: survivor.admit(2, PROMPT), survivor.tick, survivor.check_ranks):
        with pytest.raises(GroupBroken, match="CollectiveTimeout"):
            call()
    assert survivor.agree.c.log.count == made + 1  # the C4 that timed out, nothing after
    # Closed on its own (no peer, no collective): quiesce and release, publish nothing.
    started = time.perf_counter()
    survivor.close()
    assert time.perf_counter() - started < 1.0 and survivor.leaked == []
    assert op_id in survivor.cp.ops  # records left for diagnosis, as after a crash
    cluster.close()
    # The restart: a new group and new caches, which start empty.
    again = cluster_of_two(timeout_s=5.0)
    try:
        mats = again.run(lambda c: c.admit(2, PROMPT))
        assert [m.match.lengths for m in mats] == [(0, 0, 0)] * 2
    finally:
        again.close()


def test_a_rank_wedged_by_a_cancel_breaks_the_step_and_the_others_close_alone() -> None:
    """Rank 1's restore op never goes quiet: its finish raises QuiesceTimeout (the step's
    root cause); rank 0's finish needed no collective and ended. The cluster then closes
    each rank alone: rank 1 leaks the op and parks its plane, rank 0 leaks nothing."""
    from hicache.dataplane import leaks
    from hicache.errors import QuiesceTimeout

    cfg = CacheConfig(
        device="cpu",
        l1_pages=16,
        l2_pages=16,
        l3_slots=32,
        policy="always",
        quiesce_timeout_s=0.05,
    )
    engines = [NullEngine(cfg.kv, 16, 16, 32) for _ in range(2)]
    cluster = SimulatedCluster(cfg, 2, engine=lambda r: engines[r], timeout_s=5.0)
    cluster.run(lambda c: c.admit(1, PROMPT))
    cluster.run(lambda c: c.prefill(1))
    cluster.run(lambda c: c.finish(1))
    cluster.run(lambda c: c.drain())
    cluster.run(lambda c: c.evict("L1", 16))
    cluster.run(lambda c: c.admit(2, PROMPT + [7]))
    (op_id,) = [p.op_id for p in cluster.ranks[1].pending() if p.request_id == 2]
    handle = cluster.ranks[1].handles[op_id]
    assert isinstance(handle, NullHandle)
    handle.hang()
    parked = leaks.parked()
    with pytest.raises(QuiesceTimeout, match=f"op {op_id}"):
        cluster.run(lambda c: c.finish(2))
    cluster.close()
    assert cluster.ranks[0].leaked == []
    assert [op.op_id for op in cluster.ranks[1].leaked] == [op_id]
    assert leaks.parked() == parked + 1
    handle.unhang()
    assert leaks.reclaim() == parked
