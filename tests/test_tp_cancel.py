"""C5 `abort` across ranks (spec/tp.md): a cancel is the same call on every rank, so every
rank releases the op alike -- also a rank whose handle already ended, and whose end a tick
polled before the ranks agreed on it (C4 waits for every rank). Found by the TP model
check (tests/test_modelcheck_tp.py): such a rank published the op while the others
released it, and the ranks' trees differed (I7)."""

from __future__ import annotations

from hicache.controller.config import CacheConfig
from hicache.dataplane.handles import NullHandle
from hicache.dataplane.null import NullEngine
from hicache.distributed.cluster import SimulatedCluster

PROMPT = list(range(1, 10))  # two whole pages of the tiny geometry's 4 tokens, and one more


def test_finishing_a_request_whose_restore_ended_on_one_rank_only_releases_it_on_every_rank() -> (
    None
):
    cfg = CacheConfig(l1_pages=4, l2_pages=8, l3_slots=8)
    cluster = SimulatedCluster(cfg, 2, engine=lambda r: NullEngine(cfg.kv, 4, 8, 8))
    try:
        cluster.run(lambda c: c.admit(1, PROMPT))
        cluster.run(lambda c: c.prefill(1))
        cluster.run(lambda c: c.finish(1))
        for _ in range(2):  # the write-through backups, D2H then H2S, done on every rank
            for c in cluster.ranks:
                for h in c.handles.values():
                    assert isinstance(h, NullHandle)
                    h.finish(True)
            cluster.run(lambda c: c.tick())
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
