"""A replicated pool's one L3 copy across ranks, on planes with bytes (spec/tp.md, C6a, C6b,
"L3 writes"): rank 0 writes it, every other rank reads rank 0's file with rank 0's checksums;
the slots must agree; the replicated bytes are compared (I8) and a difference is caught."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (the byte plane): pip install -e '.[data]'")

from hicache.controller.config import CacheConfig
from hicache.controller.controller import CacheController
from hicache.core.pages import Pages, PageTable, pages
from hicache.core.tiers import Tier
from hicache.dataplane.engine import TransferEngine
from hicache.dataplane.l3format import HEADER_BYTES
from hicache.dataplane.null import NullEngine
from hicache.dataplane.storage import L3File, share_path
from hicache.distributed.cluster import SimulatedCluster
from hicache.errors import ConfigError, CorruptSlot, InvariantViolation, StorageError

PROMPT = list(range(1, 33))  # 8 anchor pages of the tiny geometry's 4 tokens
PRESETS = ["dsv4-tiny", "mla-tiny"]  # every pool replicated


def config(preset: str, device: str = "cpu") -> CacheConfig:
    # `always`: these tests are of the one copy's restore mechanics, not the policy's choice
    return CacheConfig(
        device=device,
        pools=preset,
        l1_pages=16,
        l2_pages=16,
        l3_slots=32,
        io_threads=0,
        policy="always",
    )


def plane(c: CacheController) -> TransferEngine:
    engine = c.replicas.plane
    assert engine is not None
    return engine


def served(cluster: SimulatedCluster, request_id: int, tokens: list[int]) -> None:
    """Serve `tokens` on every rank and let every backup (to L2, then L3) finish."""
    cluster.run(lambda c: c.admit(request_id, tokens))
    cluster.run(lambda c: c.prefill(request_id))
    cluster.run(lambda c: c.finish(request_id))
    cluster.run(lambda c: c.drain())


def only_in_l3(cluster: SimulatedCluster, request_id: int, tokens: list[int]) -> None:
    """Serve `tokens` on every rank, back them up to L3, and drop the L1 and L2 copies."""
    served(cluster, request_id, tokens)
    cluster.run(lambda c: c.evict("L1", 16))
    cluster.run(lambda c: c.evict("L2", 16))


def restore(cluster: SimulatedCluster, request_id: int, tokens: list[int]) -> list[int]:
    """Admit `tokens` on every rank, tick until every rank's restore settled, prefill; the
    tokens each rank computed."""
    cluster.run(lambda c: c.admit(request_id, tokens))
    for _ in range(50):
        if all(cluster.run(lambda c: c.ready(request_id))):
            break
        cluster.run(lambda c: c.tick())
    computed = cluster.run(lambda c: c.prefill(request_id))
    cluster.run(lambda c: c.finish(request_id))
    return computed


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("size", [2, 3])
def test_rank_0_writes_the_one_copy_and_every_rank_restores_from_it(
    preset: str, size: int, device: str
) -> None:
    """On CUDA the ranks share the one GPU (threads): their pools, pinned L2 and L3 I/O are
    each rank's own, and the replicas read rank 0's files as on the CPU."""
    cluster = SimulatedCluster(config(preset, device), size)
    try:
        only_in_l3(cluster, 1, PROMPT)
        assert [[n.states for n in v.nodes] for v in cluster.views()] == [
            [("ABSENT", "ABSENT", "RESIDENT")]
        ] * size
        writes = [v.l3_writes for v in cluster.views()]
        assert writes[0] and all(pages > 0 for _, _, pages in writes[0])
        for w in writes[1:]:  # the same ops and pools recorded, none written (I11)
            assert [(op, pool) for op, pool, _ in w] == [(op, pool) for op, pool, _ in writes[0]]
            assert all(pages == 0 for _, _, pages in w)
        for c in cluster.ranks[1:]:
            storage = plane(c).group_storage
            assert storage.replicas == set(storage.files)  # every byte pool is rank 0's file
            assert all(m.counters.h2s_bytes == 0 for m in storage.movers.values())
        assert restore(cluster, 2, PROMPT + [9] * 4) == [4] * size  # 32 tokens from L3
        for c in cluster.ranks:  # each rank read the one copy and its bytes verified
            movers = plane(c).group_storage.movers.values()
            assert sum(m.counters.s2h_bytes for m in movers) > 0
            assert all(m.counters.corrupt_reads == 0 for m in movers)
            assert sum(getattr(c.verifier, "bytes_checked", {}).values()) > 0
        assert cluster.check() == []
        assert cluster.views()[1].replicated  # I8 compared real page digests
    finally:
        cluster.close()


def test_a_byte_flipped_in_the_one_copy_is_found_by_the_rank_reading_it_and_dropped_on_all() -> (
    None
):
    cluster = SimulatedCluster(config("dsv4-tiny"), 2)
    try:
        only_in_l3(cluster, 1, PROMPT)
        (node,) = cluster.ranks[1].cp.tree.nodes()
        plane(cluster.ranks[1]).corrupt_slot(int(node.value[2][0]))  # type: ignore[index]
        assert restore(cluster, 2, PROMPT + [9] * 4) == [36, 36]  # nothing served
        corrupt = [
            sum(m.counters.corrupt_reads for m in plane(c).group_storage.movers.values())
            for c in cluster.ranks
        ]
        assert min(corrupt) >= 1  # both ranks read the same flipped copy
        assert list(cluster.ranks[0].cp.tree.nodes()) != []  # re-inserted
        assert cluster.check() == []
    finally:
        cluster.close()


def test_replicated_bytes_that_differ_between_ranks_are_an_i8_violation_on_every_rank() -> None:
    """I8 reads real bytes now: a changed byte in rank 1's L2 copy of a replicated pool is
    found by the simulated check and by the ranks' own check (C8), raised on every rank."""
    cluster = SimulatedCluster(config("dsv4-tiny"), 2)
    try:
        served(cluster, 1, PROMPT)
        assert cluster.check() == []
        (node,) = cluster.ranks[1].cp.tree.nodes()
        l2 = plane(cluster.ranks[1]).group_l2
        pool = l2.geometry.pools[0].name
        view = l2.bytes_view(pool)
        page = int(node.value[1][0])  # type: ignore[index]
        view[page, 0] ^= 0xFF
        assert [v.invariant for v in cluster.check()] == ["I8"]
        raised = cluster.group.run(lambda r: _raised(cluster.ranks[r].check_ranks))
        assert all(isinstance(e, InvariantViolation) and "I8" in str(e) for e in raised)
    finally:
        cluster.close()


def test_a_window_freed_on_one_rank_is_no_i8_difference() -> None:
    """Each rank frees its own L1 windows. Rank 1 freeing one made its L1 digests of every
    replicated pool UNSERVABLE for that page, so I8 reported six pools differing, and C8's
    hash differed on a correct cache (found by FuzzTpCpuDsv4). I8 compares, in L1, the
    pools no window frees (the others in L2), and those pools' digests stay real."""
    cluster = SimulatedCluster(config("dsv4-tiny"), 2)
    try:
        served(cluster, 1, PROMPT)
        cp = cluster.ranks[1].cp
        found = cp.windows.candidates(cp.tree.nodes())
        assert found
        cp.tombstone(found[0])
        assert cluster.check() == []
        cluster.run(lambda c: c.check_ranks())  # C7-C9: equal hashes, nothing raised
        views = cluster.views()
        assert views[0].replicated == views[1].replicated
        assert {pool for (tier, _, pool), _ in views[1].replicated if tier == "L1"} == {
            "c4",
            "c4_indexer",
            "c128",
        }  # on the anchor's indices: no window frees them
    finally:
        cluster.close()


def test_a_replicated_page_in_another_slot_on_one_rank_is_an_invariant_violation_at_c6b() -> None:
    """Rank 1's L3 allocator takes the highest free slots, rank 0's the lowest: the same
    counts, other slots. C6b raises on every rank before the backup is published."""
    cluster = SimulatedCluster(config("dsv4-tiny"), 2)
    try:
        for table in cluster.ranks[1].cp.tables[2].group_table.tables.values():  # type: ignore[attr-defined]
            table.reserve = _highest_first(table)
        cluster.run(lambda c: c.admit(1, PROMPT))
        cluster.run(lambda c: c.prefill(1))
        raised = cluster.group.run(lambda r: _raised(cluster.ranks[r].drain))
        assert all(isinstance(e, InvariantViolation) and "C6b l3_ack" in str(e) for e in raised)
        assert all(c.cp.poisoned is not None for c in cluster.ranks)
    finally:
        cluster.close()


def test_ranks_whose_planes_differ_in_holding_bytes_are_refused() -> None:
    cfg = config("dsv4-tiny")
    with pytest.raises(ConfigError, match="tp.engine"):
        SimulatedCluster(cfg, 2, engine=lambda r: NullEngine(cfg.kv, 16, 16, 32) if r else None)  # type: ignore[arg-type,return-value]


def test_the_views_of_closed_byte_planes_hold_no_bytes_and_still_compare() -> None:
    """A view taken after close (as `hicache demo --tp` takes it) read the closed plane's
    pages and raised ConfigError; a closed cache has no bytes on any rank."""
    cluster = SimulatedCluster(config("dsv4-tiny"), 2)
    cluster.run(lambda c: c.admit(1, PROMPT))
    cluster.run(lambda c: c.prefill(1))
    cluster.close()
    assert [v.replicated for v in cluster.views()] == [(), ()]


def _highest_first(table: PageTable) -> Callable[[int], Pages]:
    def reserve(n: int) -> Pages:
        chosen = table.free_pages()[-n:] if n else pages()
        table.reserve_exact(chosen)
        return chosen

    return reserve


def _raised(fn: object) -> BaseException | None:
    try:
        fn()  # type: ignore[operator]
    except BaseException as e:  # the test compares what each rank raised
        return e
    return None


# -- L3File.open_replica ----------------------------------------------------------------------


def test_a_replica_reads_the_writers_file_and_trusts_only_recorded_checksums() -> None:
    page = bytes(range(64))
    with L3File(None, 4, 64) as writer:
        os.pwrite(writer.fd, page, writer.offset(2))
        with L3File.open_replica(share_path(*writer.share_handle()), 4, 64) as replica:
            assert replica.replica and not writer.replica
            assert not replica.written(np.arange(4)).any()  # nothing trusted from the file
            read = memoryview(os.pread(replica.fd, 64, replica.offset(2)))
            assert bytes(read) == page and replica.offset(2) == HEADER_BYTES + 128
            with pytest.raises(CorruptSlot):
                replica.verify(2, read)  # no checksum recorded: never served
            checksum = writer.page_checksum(memoryview(page))
            replica.record(np.array([2]), np.array([checksum], dtype=np.uint32))
            replica.verify(2, read)


def test_a_replica_of_another_geometry_or_no_file_is_a_storage_error(tmp_path: Path) -> None:
    with L3File(None, 4, 64) as writer:
        with pytest.raises(StorageError, match="geometries differ"):
            L3File.open_replica(share_path(*writer.share_handle()), 8, 64)
    with pytest.raises(StorageError, match="one host"):
        L3File.open_replica(str(tmp_path / "missing"), 4, 64)


def test_a_replica_is_never_written_by_its_mover() -> None:
    cluster = SimulatedCluster(config("mla-tiny"), 2)
    try:
        served(cluster, 1, PROMPT)
        rank1 = plane(cluster.ranks[1])
        assert not any(rank1.writes(p) for p in cluster.ranks[1].replicas.pools)
        l2 = rank1.pool_pages(Tier.L2, np.array([0]))
        handle = rank1.group_storage.h2s({s: (ids, np.array([5])) for s, ids in l2.items()})
        assert handle.parts == {}  # rank 0 writes it: nothing issued here
    finally:
        cluster.close()


def test_ranks_on_two_hosts_are_refused_at_c6a_on_every_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replicated pool's one copy is rank 0's file, reached through /proc/<pid>/fd/<fd>:
    on another host that path names nothing, or another process's file. C6a gathers each
    rank's host id, and every rank refuses a group whose ranks with bytes run on two
    hosts (it was accepted whenever the path happened to open)."""
    import threading

    from hicache.distributed import agreement

    real = agreement.host_id
    monkeypatch.setattr(
        agreement,
        "host_id",
        lambda: real() + (threading.current_thread().name == "rank1"),  # rank 1: host B
    )
    with pytest.raises(StorageError, match=r"rank\(s\) \[1\] run on another host than rank 0"):
        SimulatedCluster(config("dsv4-tiny"), 2)
