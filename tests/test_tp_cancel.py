"""Ends of an op across ranks that the TP model check (tests/test_modelcheck_tp.py) found
wrong, on a 2-rank cluster of null planes:

- C5 `abort` (spec/tp.md): a cancel is the same call on every rank, so every rank releases
  the op alike -- also a rank whose handle already ended, and whose end a tick polled before
  the ranks agreed on it (C4 waits for every rank). Such a rank published the op while the
  others released it, and the ranks' trees differed (I7).
- C4 `completion`: a read that failed on one rank keeps the fewest whole nodes any rank
  landed; a rank still moving it landed none it can vouch for."""

from __future__ import annotations

from hicache.controller.config import CacheConfig
from hicache.core.tiers import Direction
from hicache.dataplane.handles import NullHandle
from hicache.dataplane.null import NullEngine
from hicache.distributed.cluster import SimulatedCluster
from hicache.errors import TransferError

PROMPT = list(range(1, 10))  # two whole pages of the tiny geometry's 4 tokens, and one more


def serve(cluster: SimulatedCluster, request_id: int, tokens: list[int]) -> None:
    """Admit, prefill and finish one request on every rank."""
    cluster.run(lambda c: c.admit(request_id, tokens))
    cluster.run(lambda c: c.prefill(request_id))
    cluster.run(lambda c: c.finish(request_id))


def backed_up(cluster: SimulatedCluster, ticks: int) -> None:
    """The write-through backups in flight done on every rank, over `ticks` ticks."""
    for _ in range(ticks):
        for c in cluster.ranks:
            for h in c.handles.values():
                assert isinstance(h, NullHandle)
                h.finish(True)
        cluster.run(lambda c: c.tick())


def test_finishing_a_request_whose_restore_ended_on_one_rank_only_releases_it_on_every_rank() -> (
    None
):
    cfg = CacheConfig(l1_pages=4, l2_pages=8, l3_slots=8)
    cluster = SimulatedCluster(cfg, 2, engine=lambda r: NullEngine(cfg.kv, 4, 8, 8))
    try:
        serve(cluster, 1, PROMPT)
        backed_up(cluster, 2)  # D2H, then H2S
        cluster.run(lambda c: c.evict("L1", 4))
        cluster.run(lambda c: c.admit(2, PROMPT))  # a load-back from L2 (H2D)
        restore = [p.op_id for p in cluster.ranks[0].pending() if p.request_id == 2]
        assert restore, "the second admission restores from L2"
        for op_id in restore:  # rank 0's load-back lands; rank 1's is still moving
            handle = cluster.ranks[0].handles[op_id]
            assert isinstance(handle, NullHandle)
            handle.finish(True)
        cluster.run(lambda c: c.tick())  # rank 0 polls DONE; C4 waits for rank 1
        assert all(op_id in c.handles for c in cluster.ranks for op_id in restore)
        cluster.run(lambda c: c.finish(2))  # C5: the request ends on every rank
        assert cluster.check() == []
        states = [[n.state for n in c.cp.tree.nodes()] for c in cluster.ranks]
        assert states[0] == states[1]
    finally:
        cluster.close()


def test_a_read_failed_on_one_rank_keeps_no_node_a_rank_still_moving_it_never_landed() -> None:
    """C4 keeps the fewest whole nodes any rank landed. A rank still moving the read landed
    none it can vouch for: it cancels, so it must not publish the nodes another rank landed
    (it reported all of them as kept, and published a node its cancelled read may never
    have written). Found by the TP model check (C4 rule `landed`)."""
    cfg = CacheConfig(l1_pages=16, l2_pages=16, l3_slots=32)
    cluster = SimulatedCluster(cfg, 2, engine=lambda r: NullEngine(cfg.kv, 16, 16, 32))
    long = list(range(1, 33))  # 8 pages; the first 4 a node of their own
    try:
        for rid, tokens in ((1, long[:16]), (2, long)):
            serve(cluster, rid, tokens)
            backed_up(cluster, 3)
        cluster.run(lambda c: c.evict("L1", 16))
        cluster.run(lambda c: c.evict("L2", 16))
        cluster.run(lambda c: c.admit(3, long + [7] * 4))  # the L3 part: one S2H, two nodes
        cluster.run(lambda c: c.tick())  # no C4: the admission's C1a carried it (tp.md)
        (read,) = [p for p in cluster.ranks[0].pending() if p.direction is Direction.S2H]
        assert len(cluster.ranks[0].cp.ops[read.op_id].nodes) == 2
        handle = cluster.ranks[0].handles[read.op_id]
        assert isinstance(handle, NullHandle)
        handle.landed = {"kv": 4}  # rank 0's read landed its first node, then stopped
        handle.fail(TransferError("stopped part way"))
        cluster.run(lambda c: c.tick())  # C4: failed on rank 0; rank 1 still moving it
        for c in cluster.ranks:
            assert read.op_id not in c.cp.ops
            assert [n.state[1] for n in c.cp.tree.nodes()] == ["ABSENT", "ABSENT"], c.agree.rank
        assert cluster.check() == []
    finally:
        cluster.close()
