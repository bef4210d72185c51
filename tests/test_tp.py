"""Tensor parallelism in one process (spec/tp.md): simulated ranks that meet at every
collective (ThreadGroup), the agreement points (Agreement), the ranks of one cache
(SimulatedCluster) with per-rank faults, the named scenarios F15-F18, and the fuzz machine
over 2 and 3 ranks. Cross-rank invariants' violation tests are in test_rank_invariants.py."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="needs torch (the controller): pip install -e '.[data]'")

from hicache.controller.config import CacheConfig
from hicache.controller.controller import CacheController
from hicache.core.tiers import Direction
from hicache.dataplane.faults import FaultInjector, FaultSite
from hicache.dataplane.null import NullEngine
from hicache.distributed.agreement import NO_SLOT, Agreement
from hicache.distributed.cluster import SimulatedCluster
from hicache.distributed.collectives import (
    Alone,
    CollectiveMismatch,
    CollectiveTimeout,
    RankFailed,
)
from hicache.distributed.rankview import rank_view
from hicache.distributed.simulated import ThreadGroup
from hicache.errors import ConfigError, InvariantViolation, PlanePoisoned
from hicache.testing.adapters.controller import Setup
from hicache.testing.adapters.tp import TPSetup
from hicache.testing.machines import tp_machine
from tests.test_testing_machine import _budget

PROMPT = list(range(1, 33))  # 8 pages of the tiny geometry's 4 tokens


def cpu_cluster(
    tmp_path: Path, size: int = 2, faults: list[FaultInjector] | None = None, **fields: object
) -> SimulatedCluster:
    """`size` CPU ranks (mha, sharded: real bytes), each with its own L3 file."""
    cfgs = [
        CacheConfig(
            device="cpu",
            l1_pages=16,
            l2_pages=16,
            l3_slots=32,
            io_threads=0,
            l3_path=str(tmp_path / f"rank{r}.slots"),
            **fields,  # type: ignore[arg-type]
        )
        for r in range(size)
    ]
    return SimulatedCluster(cfgs, size, faults=(lambda r: faults[r]) if faults else None)


def serve(cluster: SimulatedCluster, request_id: int, tokens: list[int]) -> list[tuple[int, ...]]:
    """Admit, prefill and finish one request on every rank; the per-rank hits at admission."""
    mats = cluster.run(lambda c: c.admit(request_id, tokens))
    cluster.run(lambda c: c.prefill(request_id))
    cluster.run(lambda c: c.finish(request_id))
    return [tuple(m.match.lengths) for m in mats]


# -- ThreadGroup: a step never hangs -------------------------------------------------------------


def test_ranks_meet_and_every_rank_takes_the_same_result() -> None:
    group = ThreadGroup(3, timeout_s=5)
    got = group.run(lambda r: group.member(r).all_reduce_min("reserve", [10 - r]))
    assert got == [(8,), (8,), (8,)]
    gathered = group.run(lambda r: group.member(r).all_gather("admit_choice", [r * 7]))
    assert gathered == [((0,), (7,), (14,))] * 3
    assert len({(m.log.count, m.log.digest) for m in group.members}) == 1


def test_f16_a_rank_that_skips_a_collective_is_named_at_once_not_hung() -> None:
    """F16, a conditional collective: rank 1 has nothing to report and leaves the step."""
    group = ThreadGroup(2, timeout_s=30)

    def step(rank: int) -> None:
        if rank == 0:  # only rank 0 has something to agree on
            group.member(rank).all_reduce_min("completion", [1])

    with pytest.raises(CollectiveTimeout) as e:
        group.run(step)
    assert e.value.missing == (1,) and e.value.point == "completion" and "skipped" in str(e.value)
    with pytest.raises(ConfigError, match="build a new group"):
        group.run(lambda r: None)  # the ranks' collective numbers differ now


def test_f17_a_payload_whose_length_is_local_is_a_mismatch_naming_both_calls() -> None:
    """F17: a mask sized by local state (here rank 1's plan is a page longer)."""
    group = ThreadGroup(2, timeout_s=30)
    with pytest.raises(CollectiveMismatch) as e:
        group.run(lambda r: group.member(r).all_reduce_min("serve", [1] * (4 + 2 * r)))
    assert "rank 0: serve all_reduce_min int64[4]" in str(e.value)
    assert "rank 1: serve all_reduce_min int64[6]" in str(e.value)


def test_the_watchdog_turns_a_stuck_rank_into_a_timeout_naming_it() -> None:
    release = threading.Event()
    group = ThreadGroup(2, timeout_s=0.3)

    def step(rank: int) -> None:
        if rank == 1:
            release.wait(5)  # stuck inside its step, never reaching the collective
            return
        group.member(rank).all_reduce_min("reserve", [1])

    t = threading.Timer(1.5, release.set)
    t.start()
    try:
        with pytest.raises(CollectiveTimeout) as e:
            group.run(step)
    finally:
        release.set()
        t.cancel()
    assert e.value.missing == (1,) and "timed out" in str(e.value)


def test_a_rank_that_raises_is_the_root_cause_the_others_are_broken_out() -> None:
    group = ThreadGroup(2, timeout_s=30)
    seen: list[RankFailed] = []

    def step(rank: int) -> None:
        if rank == 1:
            raise ValueError("rank 1's own bug")
        try:
            group.member(rank).all_reduce_min("reserve", [1])
        except RankFailed as e:
            seen.append(e)
            raise

    with pytest.raises(ValueError, match="rank 1's own bug"):
        group.run(step)
    assert len(seen) == 1 and seen[0].rank == 1


def test_a_point_the_table_lacks_or_the_wrong_op_is_refused() -> None:
    with pytest.raises(ConfigError, match="'nowhere' is not a point"):
        Alone().all_reduce_min("nowhere", [1])
    with pytest.raises(ConfigError, match="point of op all_gather"):
        Alone().all_reduce_min("admit_choice", [1])
    with pytest.raises(ConfigError, match="point of op none"):
        Alone().all_reduce_min("room", [1])  # C3 rides on C1c: no collective of its own
    with pytest.raises(ConfigError, match="int64"):
        Alone().all_reduce_min("reserve", [1 << 64])


# -- Agreement: the rules that decide ----------------------------------------------------------


def agree(size: int, fn: object) -> list[object]:
    group = ThreadGroup(size, timeout_s=10)
    return group.run(lambda r: fn(r, Agreement(group.member(r))))  # type: ignore[operator]


def test_f17_hits_are_the_intersection_of_legal_endpoints_not_the_min_of_maxima() -> None:
    """Rank 0 may end a hit at page 2 or 4, rank 1 at 3 or 4 once rank 1 freed a window...
    here at 1 or 3: the minimum of maxima (3) is illegal on rank 0; the intersection says 1.
    The masks span the prompt's page ends (here 0..5), whatever each rank's run."""

    def admit(bounds: list[list[int]], legal: list[set[int]]) -> list[object]:
        return agree(
            2,
            lambda r, a: a.admit(
                bounds[r],
                max(legal[r] & set(range(bounds[r][0] + 1))),
                0,
                [int(e in legal[r]) for e in range(6)],
            )[0],
        )

    assert admit([[4, 4, 4]] * 2, [{0, 2, 4}, {0, 1, 3}]) == [(0, 4, 4)] * 2  # only 0 is common
    assert admit([[4, 3, 0]] * 2, [{0, 1, 2, 4}, {0, 1, 3, 4}]) == [(4, 3, 0)] * 2
    # Rank 1's L1 holds one page less: endpoints past the agreed run (4) are not served.
    assert admit([[4, 3, 0], [3, 3, 0]], [{0, 1, 2, 4}, {0, 1, 3, 4}]) == [(1, 3, 0)] * 2


def test_c1_takes_rank_0s_choice_from_c1a_unless_rank_0s_own_hits_were_cut() -> None:
    """C1a carries every rank's choice on its own hits; rank 0's stands when its own hits are
    the agreed ones (one collective), else None tells every rank alike to ask again (C1b)."""
    group = ThreadGroup(2, timeout_s=10)
    same = group.run(lambda r: Agreement(group.member(r)).admit([4, 2, 0], 4, 1 + r, None))
    assert same == [((4, 2, 0), 1, [])] * 2 and group.members[0].log.count == 1
    cut = group.run(lambda r: Agreement(group.member(r)).admit([4 - r, 2, 0], 4 - r, 1 + r, None))
    assert cut == [((3, 2, 0), None, [])] * 2  # rank 0 chose on 4 pages of L1; the ranks agreed 3
    # Windows: a rank's own L1 hit is the largest endpoint its own mask allows.
    masks = [[1, 0, 0, 1, 0], [1, 0, 0, 1, 1]]  # rank 0 freed the window before page 4
    mine = group.run(lambda r: Agreement(group.member(r)).admit([4, 2, 0], 3 + r, 1 + r, masks[r]))
    assert mine == [((3, 2, 0), 1, [])] * 2  # only rank 1 was cut: rank 0's choice stands
    masks.reverse()  # now rank 1 freed it: rank 0's own hit (4) is cut to 3
    theirs = group.run(
        lambda r: Agreement(group.member(r)).admit([4, 2, 0], 4 - r, 1 + r, masks[r])
    )
    assert theirs == [((3, 2, 0), None, [])] * 2


def test_c1c_serves_the_largest_common_endpoint_and_carries_c3_s_room() -> None:
    """Serving through page 3 is legal on both ranks (page 4 on rank 0 only); the room entry
    at 3 decides: refused on every rank when one rank cannot make the room after it."""
    servable = [[1, 0, 0, 1, 1], [1, 0, 1, 1, 0]]
    both = agree(2, lambda r, a: a.serve(servable[r], [1, 1, 1, 1, 0]))
    assert both == [(3, True)] * 2
    one = agree(2, lambda r, a: a.serve(servable[r], [1, 1, 1, r, 1]))
    assert one == [(3, False)] * 2  # rank 0 could make room only after page 4, never served
    assert agree(3, lambda r, a: a.serve([1, 0, 0], [int(r != 2), 1, 1])) == [(0, False)] * 3


def test_c2_commits_only_when_every_rank_reserved_the_same_pages() -> None:
    assert agree(2, lambda r, a: a.reserve(True, 4)) == [True] * 2
    assert agree(2, lambda r, a: a.reserve(r == 0, 4)) == [False] * 2  # F15
    assert agree(2, lambda r, a: a.reserve(True, 4 + r)) == [False] * 2


def test_c4_fails_an_op_refused_on_one_rank_and_agrees_a_lost_l3_file() -> None:
    """The deferred reserve: a rank that refused the op's issue reports it ended and failed
    (no node kept); every rank fails it, and a lost L3 file at that issue is every rank's."""
    moving = (False, False, 0, 0, NO_SLOT, False)
    refused = (True, True, 0, 0, NO_SLOT, False)
    lost = (True, True, 0, 0, NO_SLOT, True)
    got = agree(2, lambda r, a: a.completion([refused if r else moving]))
    assert got == [[(False, True, 0, 0, NO_SLOT, False)]] * 2  # failed: rank 0 cancels first
    got = agree(3, lambda r, a: a.completion([lost if r == 2 else refused]))
    assert got == [[(True, True, 0, 0, NO_SLOT, True)]] * 3


def test_c0_refuses_ranks_configured_apart_naming_the_field(tmp_path: Path) -> None:
    cfgs = [
        CacheConfig(
            device="cpu",
            l1_pages=16 + r,
            l2_pages=16,
            l3_slots=32,
            l3_path=str(tmp_path / f"r{r}.slots"),
        )
        for r in range(2)
    ]
    with pytest.raises(ConfigError, match=r"tp\.fingerprint\.l1_pages") as e:
        SimulatedCluster(cfgs, 2)
    assert "rank(s) [1]" in str(e.value)


# -- The ranks of one cache -------------------------------------------------------------------


def test_the_ranks_check_each_other_every_n_admissions_and_a_divergence_raises_on_every_rank(
    tmp_path: Path,
) -> None:
    """C7-C9 over the collectives: with rank_check_every = 2 the ranks compare hashes of
    their views before admissions 3 and 5; then rank 1 alone ends a request (a script that
    is not SPMD), and the next check gathers the views and raises I7 on both ranks."""
    cluster = cpu_cluster(tmp_path, 2, rank_check_every=2)
    try:
        for rid in range(1, 6):
            serve(cluster, rid, PROMPT[: 8 + 4 * rid])
        assert [c.rank_checks for c in cluster.ranks] == [2, 2]
        points = [e.point for e in cluster.ranks[0].agree.c.log.tail]
        assert points.count("check_state") == 2 and "check_log" in points
        cluster.run(lambda c: c.admit(6, PROMPT))
        cluster.group.run(lambda r: cluster.ranks[r].finish(6) if r == 1 else None)
        raised = cluster.group.run(lambda r: _raised(cluster.ranks[r].check_ranks))
        assert all(isinstance(e, InvariantViolation) for e in raised)
        assert {str(e) for e in raised} == {str(raised[0])}  # the same report on every rank
        assert "I7 rank_agreement" in str(raised[0]) and "rank 1's requests differ" in str(
            raised[0]
        )
        with pytest.raises(PlanePoisoned):  # the ranks are no longer one cache
            cluster.ranks[0].cp.compute(6, 4)
    finally:
        cluster.close()


def test_hashes_that_differ_where_no_check_looks_are_reported_never_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """C7's hash differs (here: made rank-dependent) while the gathered views agree: the
    check reports it as I7 on every rank instead of passing."""
    cluster = cpu_cluster(tmp_path, 2)
    try:
        serve(cluster, 1, PROMPT)
        monkeypatch.setattr("hicache.distributed.agreement.state_hash", lambda view: view.rank)
        found = cluster.group.run(
            lambda r: cluster.ranks[r].agree.check(rank_view(cluster.ranks[r]))
        )
        assert found[0] == found[1] and [v.invariant for v in found[0]] == ["I7"]
        assert "rank(s) [1]'s view hashes differ" in found[0][0].message
    finally:
        cluster.close()


def _raised(fn: Callable[[], object]) -> BaseException | None:
    try:
        fn()
    except BaseException as e:  # the test compares what each rank raised
        return e
    return None


@pytest.mark.parametrize("size", [2, 3])
def test_ranks_serve_alike_and_sharded_pages_reach_l3_from_every_rank(
    tmp_path: Path, size: int
) -> None:
    cluster = cpu_cluster(tmp_path, size)
    try:
        assert serve(cluster, 1, PROMPT) == [(0, 0, 0)] * size
        cluster.run(lambda c: c.drain())
        assert cluster.check() == []
        views = cluster.views()
        assert all(v.quiescent for v in views)
        writes = [sorted(w for w in v.l3_writes) for v in views]
        assert writes[0] and all(w == writes[0] for w in writes)  # sharded: every rank, same pages
        assert all(pages == 8 for _, pool, pages in writes[0] if pool == "kv")
        assert serve(cluster, 2, PROMPT + [99] * 4) == [(32, 32, 32)] * size
        assert cluster.check() == []
    finally:
        cluster.close()


def test_f15_an_allocation_failing_on_one_rank_aborts_the_reservation_on_every_rank(
    tmp_path: Path,
) -> None:
    """Rank 1's L2 refuses the write-through's pages; rank 0's succeeded. Rank 1 still takes
    the op (the deferred reserve), and the next C4 fails it on both, releasing on both:
    neither has an L2 copy, and the next hit is the same everywhere."""
    faults = [FaultInjector(), FaultInjector().once(FaultSite.ALLOC_L2)]
    cluster = cpu_cluster(tmp_path, 2, faults)
    try:
        serve(cluster, 1, PROMPT)
        cluster.run(lambda c: c.drain())
        assert faults[1].fired.get(FaultSite.ALLOC_L2) == 1 and not faults[0].fired
        assert cluster.check() == []
        states = [[n.states for n in v.nodes] for v in cluster.views()]
        assert states[0] == states[1] == [("RESIDENT", "ABSENT", "ABSENT")]
        assert serve(cluster, 2, PROMPT + [99] * 4) == [(32, 0, 0)] * 2
    finally:
        cluster.close()


def test_f18_replicated_pools_reach_l3_from_rank_0_only() -> None:
    """dsv4-tiny (every pool replicated), null plane: each L3 backup's pages are written by
    rank 0 alone and recorded by every rank (I11)."""
    cfg = CacheConfig(device="cpu", pools="dsv4-tiny", l1_pages=16, l2_pages=16, l3_slots=32)
    cluster = SimulatedCluster(cfg, 2, engine=lambda r: NullEngine(cfg.kv, 16, 16, 32))
    try:
        serve(cluster, 1, PROMPT)
        cluster.run(lambda c: c.drain())
        assert cluster.check() == []
        r0, r1 = (v.l3_writes for v in cluster.views())
        assert r0 and all(pages == 8 for _, _, pages in r0)
        assert [(op, pool) for op, pool, _ in r0] == [(op, pool) for op, pool, _ in r1]
        assert all(pages == 0 for _, _, pages in r1)
    finally:
        cluster.close()


def test_a_hit_cut_by_another_rank_touches_only_the_agreed_nodes() -> None:
    """Found by the TP fuzz (dsv4-tiny, L1 of 7 pages): rank 0 freed the window of A's node,
    so its own L1 hit is 0 and rank 1's is A's node; the ranks agree on 0. The match once
    refreshed the LRU ticks of each rank's own hit before the agreement: rank 1's A became
    the most recent, and making room for the prefill evicted A on rank 0 and B on rank 1.
    Now only the agreed hits are touched (I7 compares the ticks), and both evict A."""
    cfg = CacheConfig(
        device="cpu",
        pools="dsv4-tiny",
        l1_pages=7,
        l2_pages=3,
        l3_slots=2,
        policy="always",
        promotion=False,
    )
    cluster = SimulatedCluster(cfg, 2, engine=lambda r: NullEngine(cfg.kv, 7, 3, 2))
    a, b = [1000 + i for i in range(8)], [2000 + i for i in range(8)]
    try:
        serve(cluster, 1, a + [0])
        serve(cluster, 2, b + [0])
        node = next(
            n for n in cluster.ranks[0].cp.tree.nodes() if not n.is_root and n.key[0] == 1000
        )
        cluster.ranks[0].cp.tombstone(node)  # rank 0 alone frees A's window
        assert serve(cluster, 3, a + [0, 1, 2, 3, 4]) == [(0, 0, 0)] * 2
        assert cluster.check() == []
        keys = [sorted(n.key[0] for n in c.cp.tree.nodes() if not n.is_root) for c in cluster.ranks]
        assert keys[0] == keys[1] and 2000 in keys[0]  # A (least recently used) was evicted
    finally:
        cluster.close()


def test_op_ids_stay_equal_when_making_room_issued_backups_before_an_aborted_reservation() -> None:
    """Write-back: rank 0's H2D reservation is refused after making room issued (and agreed)
    the D2H backup of the node it evicts; rank 1 issued its H2D. The aborted H2D's id is
    skipped on rank 0, so the ranks' next ids (and every later op id) stay equal. (The skip
    once compared the next id with the one before making room: rank 0 skipped nothing.)"""
    cfg = CacheConfig(
        device="cpu", l1_pages=10, l2_pages=16, l3_slots=32, write_policy="write_back"
    )
    faults = [FaultInjector(), FaultInjector()]
    cluster = SimulatedCluster(
        cfg, 2, engine=lambda r: NullEngine(cfg.kv, 10, 16, 32), faults=lambda r: faults[r]
    )
    a, b = list(range(1, 21)), list(range(101, 129))  # 5 and 7 pages: a's restore evicts b
    try:
        serve(cluster, 1, a)
        cluster.run(lambda c: c.evict("L1", 10))
        cluster.run(lambda c: c.drain())
        serve(cluster, 2, b)
        faults[0].aim("alloc", direction=Direction.H2D)
        mats = cluster.run(lambda c: c.admit(3, a + [7] * 4))
        assert [m.match.lengths for m in mats] == [(0, 20, 20)] * 2
        for _ in range(3):
            cluster.run(lambda c: c.tick())
        assert faults[0].fired and len({c.cp.next_op_id for c in cluster.ranks}) == 1
        assert cluster.check() == []
    finally:
        cluster.close()


def test_a_slot_corrupt_on_one_rank_drops_the_node_everywhere_and_prefill_serves_past_it() -> None:
    """Rank 1's L3 slot of a planned node is corrupt: its S2H fails, the node is dropped on
    every rank (C4 carries the bad slot), and the prefill's C1d mask skips the planned node
    that left the tree (it once read the dropped node: TreeError; found by the TP fuzz)."""
    cfg = CacheConfig(device="cpu", l1_pages=16, l2_pages=16, l3_slots=32)
    engines = [NullEngine(cfg.kv, 16, 16, 32) for _ in range(2)]
    cluster = SimulatedCluster(cfg, 2, engine=lambda r: engines[r])
    try:
        serve(cluster, 1, PROMPT)
        cluster.run(lambda c: c.drain())
        cluster.run(lambda c: c.evict("L1", 16))
        cluster.run(lambda c: c.evict("L2", 16))
        (node,) = cluster.ranks[1].cp.tree.nodes()
        engines[1].corrupt_slot(int(node.value[2][0]))  # type: ignore[index]
        mats = cluster.run(lambda c: c.admit(2, PROMPT + [7] * 4))
        assert [m.match.lengths[2] for m in mats] == [32, 32]
        for _ in range(4):
            cluster.run(lambda c: c.tick())
        assert [list(c.cp.tree.nodes()) for c in cluster.ranks] == [[], []]
        assert cluster.run(lambda c: c.prefill(2)) == [36, 36]
        assert cluster.check() == []
    finally:
        cluster.close()


def test_bad_slots_on_two_ranks_drop_every_copy_from_the_first_bad_page_on() -> None:
    """One read of two nodes, A then its child B, meets a different bad slot on each rank:
    rank 0 B's, rank 1 A's. B's slots are lower than A's (X's freed slots, reused), so the
    least slot named B alone, and A's bad copy stayed in L3 on both ranks, to fail every
    later read on rank 1. C4 agrees on the first bad page of the read: A, and B with it."""
    cfg = CacheConfig(device="cpu", l1_pages=16, l2_pages=16, l3_slots=32)
    engines = [NullEngine(cfg.kv, 16, 16, 32) for _ in range(2)]
    cluster = SimulatedCluster(cfg, 2, engine=lambda r: engines[r])
    a, b = list(range(1, 17)), list(range(17, 25))
    try:
        serve(cluster, 1, list(range(100, 108)))  # X: L3 slots 0-1
        cluster.run(lambda c: c.drain())
        serve(cluster, 2, a)  # A: slots 2-5
        cluster.run(lambda c: c.drain())
        for tier in ("L1", "L2", "L3"):  # X leaves every tier: its slots 0-1 are free
            cluster.run(functools.partial(CacheController.evict, tier=tier, n_pages=2))
        serve(cluster, 3, a + b)  # B: slots 0-1, below A's
        cluster.run(lambda c: c.drain())
        cluster.run(lambda c: c.evict("L1", 16))
        cluster.run(lambda c: c.evict("L2", 16))
        node_a, node_b = cluster.ranks[0].cp.tree.nodes()
        slot_a, slot_b = int(node_a.value[2][0]), int(node_b.value[2][0])  # type: ignore[index]
        assert slot_b < slot_a
        engines[0].corrupt_slot(slot_b)
        engines[1].corrupt_slot(slot_a)
        mats = cluster.run(lambda c: c.admit(4, a + b + [7] * 4))
        assert [m.match.lengths[2] for m in mats] == [24, 24]
        for _ in range(4):
            cluster.run(lambda c: c.tick())
        assert [list(c.cp.tree.nodes()) for c in cluster.ranks] == [[], []]
        assert cluster.run(lambda c: c.prefill(4)) == [28, 28]
        assert cluster.check() == []
    finally:
        cluster.close()


# -- The fuzz machine over 2 and 3 ranks ------------------------------------------------------

TpMha = tp_machine(name="TpMha")
TpMha.TestCase.settings = _budget(30, 50)
TestTpMha = TpMha.TestCase

TpDsv4 = tp_machine("dsv4-tiny", name="TpDsv4")
TpDsv4.TestCase.settings = _budget(20, 50)
TestTpDsv4 = TpDsv4.TestCase

# On the CPU plane: each rank's bytes, rank 0's L3 copy of the replicated pools read by both,
# I8 comparing the replicated pools' bytes after every step.
TpCpuDsv4 = tp_machine("dsv4-tiny", sizes=(2,), name="TpCpuDsv4", plane="cpu")
TpCpuDsv4.TestCase.settings = _budget(15, 40)
TestTpCpuDsv4 = TpCpuDsv4.TestCase


def test_a_crash_on_one_rank_restarts_every_rank_even_one_mid_transfer() -> None:
    """A crash aimed at rank 0's S2H ends the step there; rank 1 had gone on to issue the
    restore's H2D, its C2 broken off. The job restarts: every rank's controller is the dead
    job's (quiesce and release, publish nothing), so the restart cannot end a request whose
    op is still pending on one rank (it once raised IllegalTransition; found by the TP fuzz)."""
    from hicache.dataplane.faults import SimulatedCrash
    from hicache.testing.adapters.controller import Setup
    from hicache.testing.adapters.tp import TPAdapter, TPSetup

    cache = TPAdapter(TPSetup(Setup(l1_pages=10, l2_pages=8, l3_slots=12, promotion=False), 2))
    prompt = tuple(range(1, 21))
    cache.submit(1, prompt)
    cache.prefill(1)
    cache.finish(1)
    cache.drain()
    cache.evict("L1", 10)
    cache.evict("L2", 8)
    cache.drain()
    cache.ranks[0].faults.aim("crash", direction=Direction.S2H)
    assert cache.submit(2, prompt + (7,) * 4).hits["L3"] == 20
    with pytest.raises(SimulatedCrash):
        for _ in range(6):
            for op in cache.pending_ops():
                cache.complete(op)
            cache.tick()
    assert [list(a.ctl.cp.ops) for a in cache.ranks][1], "rank 1 went on to issue the H2D"
    cache.restart()
    assert cache.check() == [] and cache.live() == set()
    cache.close()


def test_the_demo_tallies_one_decision_per_admission_on_a_rank_whose_hits_were_cut() -> None:
    """The demo's decision reasons count the decision each admission served by, once: on a
    rank whose own hits were cut by C1a the policy decides twice (its own hits, then the
    agreed ones), and the tally once counted both."""
    from hicache.app.demo_report import DecisionTally

    cfg = CacheConfig(
        device="cpu",
        pools="dsv4-tiny",
        l1_pages=7,
        l2_pages=3,
        l3_slots=2,
        policy="always",
        promotion=False,
    )
    cluster = SimulatedCluster(cfg, 2, engine=lambda r: NullEngine(cfg.kv, 7, 3, 2))
    a = [1000 + i for i in range(8)]
    try:
        serve(cluster, 1, a + [0])
        node = next(
            n for n in cluster.ranks[0].cp.tree.nodes() if not n.is_root and n.key[0] == 1000
        )
        cluster.ranks[0].cp.tombstone(node)  # rank 0 alone frees A's window: rank 1 is cut
        tallies = [DecisionTally() for _ in cluster.ranks]
        for c, t in zip(cluster.ranks, tallies):
            c.decisions = t
        assert serve(cluster, 2, a + [0, 1, 2, 3]) == [(0, 0, 0)] * 2
        assert tallies[0].by_reason == tallies[1].by_reason
        assert [sum(t.by_reason.values()) for t in tallies] == [1, 1]
    finally:
        cluster.close()


def test_i11_records_what_the_data_plane_wrote_not_what_the_rule_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A controller that acks an L3 backup on a rank that should write it (here rank 1 of a
    sharded group: `writes_any` wrong, the rule `writes_pool` right) wrote nothing there, and
    I11 says so. (The record once derived each rank's pages from the rule, so it passed.)"""
    from hicache.distributed.ledger import L3Writes

    cfg = CacheConfig(device="cpu", l1_pages=16, l2_pages=16, l3_slots=32)
    cluster = SimulatedCluster(cfg, 2, engine=lambda r: NullEngine(cfg.kv, 16, 16, 32))
    real = L3Writes.writes_any
    monkeypatch.setattr(
        L3Writes, "writes_any", lambda self, group: real(self, group) and self.rank != 1
    )
    try:
        serve(cluster, 1, PROMPT)
        cluster.run(lambda c: c.drain())
        r0, r1 = (v.l3_writes for v in cluster.views())
        assert r0 and all(pages == 8 for _, _, pages in r0)
        assert r1 and all(pages == 0 for _, _, pages in r1)
        found = cluster.check()
        assert [(v.invariant, v.name) for v in found] == [("I11", "l3_write_multiplicity")]
        assert "written by rank(s) [0]" in found[0].message and "every rank" in found[0].message
    finally:
        cluster.close()


def test_c1a_carries_c4_whose_ends_are_the_ones_completion_agrees() -> None:
    """C4 carried by C1a: the gather's rows end with each rank's C4 values, and the ends
    every rank takes from them are those `completion` would agree (one collective, not two)."""
    bad = NO_SLOT
    local = [
        [(True, False, 2, 0, bad, False), (True, True, 0, 1, 3, False)],
        [(False, False, 0, 0, bad, False), (True, False, 1, 0, 1, True)],
    ]
    carried = agree(2, lambda r, a: a.admit([4, 2, 0], 4, 1, None, local[r])[2])
    alone = agree(2, lambda r, a: a.completion(local[r]))
    assert carried == alone == [[(False, False, 0, 0, bad, False), (True, True, 0, 1, 1, True)]] * 2
    masked = agree(2, lambda r, a: a.admit([4, 2, 0], 4, 1, [1, 0, 1, 0, 1], local[r])[2])
    assert masked == alone  # after a mask too


def test_resubmit_shares_then_fails_an_op_still_moving_across_ranks() -> None:
    """`resubmit(twice)` admits the sharer before it fails the first's op; across ranks the
    sharer's admission carries C4 (C1a) and may end that op, so the op to fail is read after
    it. Read before, it named an op no rank still moved (ZeroDivisionError in the adapter's
    `fail`: found by the default profile)."""
    state: Any = TpMha()
    base = Setup(
        l1_pages=7,
        l2_pages=3,
        l3_slots=2,
        write_policy="write_through",
        policy="always",
        promotion=False,
        plane="null",
        check_mode="off",
    )
    state.start(setup=TPSetup(base=base, size=2), corruptions=())
    state.refused_on_one_rank(base=0, held=1, tier=1)
    state.resubmit(abort_first=False, aim="error", deep=True, pick=0, settle=0, twice=True)
    state.agrees_with_reference()
    state.teardown()
