"""How many collectives the ranks make (issue 35, spec/tp.md): none on an idle tick (C4 is
skipped when no op is in flight, on every rank alike), none at a prefill on a group whose L1
frees no window (C1c is each rank's own answer there), C1c where a trailing pool's windows
may differ by rank, none at an issue unless it moves L1 on such a group (C2 deferred to C4);
and the ranks still agree (the cross-rank check)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest

pytest.importorskip("torch", reason="needs torch (the controller): pip install -e '.[data]'")

from hicache.controller.config import CacheConfig
from hicache.controller.controller import CacheController
from hicache.dataplane.faults import FaultInjector, FaultSite
from hicache.dataplane.handles import NullHandle
from hicache.dataplane.null import NullEngine
from hicache.distributed.cluster import SimulatedCluster

PROMPT = list(range(1, 33))  # 8 pages of the tiny geometry's 4 tokens


def cluster_of(pools: str = "mha", size: int = 2) -> SimulatedCluster:
    cfg = CacheConfig(device="cpu", pools=pools, l1_pages=32, l2_pages=32, l3_slots=64)
    return SimulatedCluster(cfg, size, engine=lambda r: NullEngine(cfg.kv, 32, 32, 64))


def made(cluster: SimulatedCluster, call: Callable[[CacheController], object]) -> list[str]:
    """The points of the collectives `call` made on every rank (the same list on each)."""
    before = [c.agree.c.log.count for c in cluster.ranks]
    cluster.run(call)
    points = []
    for c, start in zip(cluster.ranks, before):
        new = c.agree.c.log.count - start
        assert new <= len(c.agree.c.log.tail), "the log's tail holds every new entry"
        points.append([e.point for e in list(c.agree.c.log.tail)[len(c.agree.c.log.tail) - new :]])
    assert all(p == points[0] for p in points), points
    return points[0]


def drain(cluster: SimulatedCluster) -> None:
    """Wait for every op in flight and apply it, on every rank (a null handle nobody
    finished ends done when waited on)."""
    cluster.run(lambda c: c.drain())
    assert not any(c.handles for c in cluster.ranks)


@pytest.mark.parametrize("size", [1, 2])
def test_an_idle_tick_makes_no_collective(size: int) -> None:
    cluster = cluster_of(size=size)
    try:
        assert made(cluster, lambda c: c.tick()) == []  # nothing ever in flight
        cluster.run(lambda c: c.admit(1, PROMPT))
        cluster.run(lambda c: c.prefill(1))
        cluster.run(lambda c: c.finish(1))
        # Nothing in flight yet: no C4; the write-through backup is issued, with no C2: its
        # reservation reads only agreed state, and C4 agrees its outcome (deferred reserve).
        assert made(cluster, lambda c: c.tick()) == []
        assert made(cluster, lambda c: c.tick())[0] == "completion"  # the backup's C4
        drain(cluster)
        assert made(cluster, lambda c: c.tick()) == []  # every backup ended: idle again
        if size > 1:
            assert cluster.check() == []
    finally:
        cluster.close()


def test_an_admitted_request_on_a_group_without_windows_agrees_once() -> None:
    """C1a at admission and nothing at the prefill: its servable and room masks read only
    state every rank holds equal (one pool: no window L1 frees)."""
    cluster = cluster_of()
    try:
        assert made(cluster, lambda c: c.admit(1, PROMPT)) == ["admit"]
        assert made(cluster, lambda c: c.prefill(1)) == []
        assert made(cluster, lambda c: c.finish(1)) == []
        drain(cluster)
        # A hit served from L1 after a restore: still C1a alone, then C2/C4 of the restore.
        assert made(cluster, lambda c: c.admit(2, PROMPT + [99])) == ["admit"]
        assert made(cluster, lambda c: c.prefill(2)) == []
        assert cluster.ranks[0].cp.cached_len(2) == len(PROMPT)  # served: the hit was used
        assert cluster.check() == []
    finally:
        cluster.close()


def test_a_group_whose_l1_frees_windows_still_agrees_at_the_prefill() -> None:
    """dsv4-tiny's trailing pool: a window freed on one rank makes the ranks' masks differ,
    so C1c is made at every prefill."""
    cluster = cluster_of("dsv4-tiny")
    try:
        cluster.run(lambda c: c.admit(1, PROMPT))
        assert made(cluster, lambda c: c.prefill(1)) == ["serve"]
        assert cluster.check() == []
    finally:
        cluster.close()


def test_an_issue_makes_no_collective_unless_it_moves_l1_where_windows_are_freed() -> None:
    """mha (no window): every issue's outcome is agreed at the next C4, so a served request
    with its write-through and L3 backups costs C1a and one C4 per tick with an op in
    flight. dsv4-tiny: the D2H out of L1 still makes C2, its L3 backup (L2 -> L3) does not."""
    for pools, reserves in (("mha", 0), ("dsv4-tiny", 1)):
        cluster = cluster_of(pools)
        try:
            points = made(cluster, lambda c: c.admit(1, PROMPT))
            points += made(cluster, lambda c: c.prefill(1))
            points += made(cluster, lambda c: c.finish(1))
            for _ in range(6):
                points += made(cluster, lambda c: c.tick())
            drain(cluster)
            assert points.count("reserve") == reserves, (pools, points)
            assert points.count("admit") == 1
            assert "completion" in points
            assert cluster.check() == []
        finally:
            cluster.close()


def test_a_refusal_on_one_rank_is_agreed_at_c4_and_released_on_every_rank() -> None:
    """Rank 1's L2 refuses the write-through's pages: the op is taken on both ranks (equal op
    ids and free counts while it is in flight), and the next C4 fails it on both."""
    cfg = CacheConfig(device="cpu", pools="mha", l1_pages=32, l2_pages=32, l3_slots=64)
    faults = [FaultInjector(), FaultInjector().once(FaultSite.ALLOC_L2)]
    cluster = SimulatedCluster(
        cfg, 2, engine=lambda r: NullEngine(cfg.kv, 32, 32, 64), faults=lambda r: faults[r]
    )
    try:
        cluster.run(lambda c: c.admit(1, PROMPT))
        cluster.run(lambda c: c.prefill(1))
        cluster.run(lambda c: c.finish(1))
        assert made(cluster, lambda c: c.tick()) == []  # the D2H issued: no C2
        assert faults[1].fired.get(FaultSite.ALLOC_L2) == 1 and not faults[0].fired
        ops = [sorted(c.cp.ops) for c in cluster.ranks]
        assert ops[0] == ops[1] and ops[0], ops  # the refused rank took the op too
        assert cluster.check() == []  # I7: op ids, free counts, locks equal in flight
        assert made(cluster, lambda c: c.tick())[0] == "completion"
        drain(cluster)
        states = [[n.states for n in v.nodes] for v in cluster.views()]
        assert states[0] == states[1], states
        assert cluster.check() == []
    finally:
        cluster.close()


def test_one_tick_per_request_makes_at_most_two_collectives_per_admitted_request() -> None:
    """The demo's rhythm (admit, prefill, finish, tick) on mha: C1a per admission and at
    most one C4 per tick, however many backups each tick issues; before the deferred reserve
    every issued backup added a C2 (issue 35: 4.5 per request measured, now 2.2)."""
    cluster = cluster_of()
    n = 3  # L1 holds 32 pages: the prompts' sources stay locked by their backups
    try:
        points: list[str] = []
        for i in range(n):
            prompt = [1000 * (i + 1) + t for t in range(len(PROMPT))]
            points += made(
                cluster, functools.partial(CacheController.admit, request_id=i, tokens=prompt)
            )
            points += made(cluster, functools.partial(CacheController.prefill, request_id=i))
            points += made(cluster, functools.partial(CacheController.finish, request_id=i))
            points += made(cluster, lambda c: c.tick())
        assert "reserve" not in points
        assert points.count("admit") == n
        assert len(points) <= 2 * n, points
        drain(cluster)
        assert cluster.check() == []
    finally:
        cluster.close()


def test_an_admission_carries_c4_and_the_tick_after_it_makes_none() -> None:
    """C4 carried by C1a (issue 35): an admission's gather carries every rank's ends of the
    ops in flight and applies the agreed ones once its plan is pinned, so the tick after it
    makes no C4 of its own; an op ended on one rank only stays in flight on both, and the
    next tick without an admission between makes C4 again."""
    cluster = cluster_of()
    try:
        cluster.run(lambda c: c.admit(1, PROMPT))
        cluster.run(lambda c: c.prefill(1))
        cluster.run(lambda c: c.finish(1))
        assert made(cluster, lambda c: c.tick()) == []  # the write-through D2H is issued
        (d2h,) = {op for c in cluster.ranks for op in c.handles}
        first = cluster.ranks[0].handles[d2h]
        assert isinstance(first, NullHandle)
        first.finish(True)  # ended on rank 0 alone
        assert made(cluster, lambda c: c.admit(2, [1000 + t for t in PROMPT])) == ["admit"]
        assert all(d2h in c.handles for c in cluster.ranks)  # the MIN: still in flight
        assert made(cluster, lambda c: c.tick()) == []  # its ends rode on the admission
        second = cluster.ranks[1].handles[d2h]
        assert isinstance(second, NullHandle)
        second.finish(True)  # now ended on every rank
        assert made(cluster, lambda c: c.admit(3, [2000 + t for t in PROMPT])) == ["admit"]
        for c in cluster.ranks:  # published at the admission, with no C4
            assert d2h not in c.handles and d2h not in c.cp.ops
            assert "RESIDENT" in [n.state[1] for n in c.cp.tree.nodes()]
        assert cluster.check() == []
        assert made(cluster, lambda c: c.tick()) == []
        cluster.run(lambda c: c.prefill(2))
        cluster.run(lambda c: c.finish(2))
        cluster.run(lambda c: c.tick())  # issues request 2's write-through
        assert made(cluster, lambda c: c.tick())[0] == "completion"  # no admission between
        drain(cluster)
        assert cluster.check() == []
    finally:
        cluster.close()
