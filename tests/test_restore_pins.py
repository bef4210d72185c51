"""A restore pins what it planned at every stage (spec/lifecycle.md, "Locks a restore holds"):
nested make-room, other requests' backups and plain eviction can neither evict nor remove a
planned node, and the controller never acts on a node the tree has removed."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

from hicache.controller.config import CacheConfig
from hicache.controller.controller import CacheController
from hicache.core.lifecycle import RESIDENT
from hicache.core.tiers import Direction
from hicache.dataplane.faults import FaultInjector, FaultSite
from hicache.errors import IllegalTransition, OutOfPages, RequestTooLarge, RestorePending
from tests.test_controller import assert_clean, serve

PS = 4
A = tuple(range(100, 124))  # 6 pages each
B = tuple(range(200, 224))
C = tuple(range(300, 324))


def make(faults: FaultInjector | None = None, **kw: object) -> CacheController:
    cfg = CacheConfig(**{"policy": "always", "backend": "torch", "device": "cpu", **kw})  # type: ignore[arg-type]
    return CacheController(cfg, faults=faults)


def in_l2_only(c: CacheController, tokens: tuple[int, ...] = A) -> None:
    """Serve `tokens` once, let its backups land, then push it out of L1."""
    serve(c, 1, tokens)
    c.drain()
    c.cp.evict("L1", 1000)


def test_write_back_restore_is_not_evicted_by_its_own_nested_make_room() -> None:
    """Under write_back the L1 make-room of a restore backs a victim up, and that backup's L2
    make-room used to evict (and remove) the restore's own unlocked L2 chain: the issue then
    died on a removed node (`AssertionError: the root is never transferred`)."""
    c = make(l1_pages=12, l2_pages=8, l3_slots=1, write_policy="write_back")
    serve(c, 1, A)
    serve(c, 2, B)
    serve(c, 3, C)  # L1 full: A is backed up to L2 (write_back) and evicted from L1
    c.drain()
    assert c.cp.tree.match(A, split=False, touch=False).lengths[:2] == (0, 24)
    recomputed = serve(c, 4, A)  # H2D needs 5 L1 pages: B is the victim, its backup needs L2
    assert recomputed == 4  # only the last page: 20 tokens came back from L2
    assert c.metrics.hit_tokens["L2"] == 20 and c.metrics.fallbacks["no_room"] == 0
    # The victim's write-back found no room in L2: its tokens are lost once, as SGLang's
    # write-back failure (`host_pressure`; they used to be counted twice, by two reasons).
    assert c.metrics.dropped_tokens["host_pressure"] == len(B), c.metrics.dropped_tokens
    assert c.metrics.dropped_tokens["write_through_unbacked_eviction"] == 0, (
        c.metrics.dropped_tokens
    )
    assert_clean(c)
    c.close()


def test_promoted_pages_stay_pinned_until_they_are_loaded_back() -> None:
    """Between an L3 restore's S2H completion and its H2D the promoted nodes used to hold no
    lock: eviction in L2 and L3 removed them and the next tick acted on a removed node."""
    faults = FaultInjector(delay_polls=1000)
    c = make(faults, l1_pages=16, l2_pages=32, l3_slots=64)
    in_l2_only(c)
    c.cp.tree.match(A[:12])  # split A: [0, 12) keeps L2, [12, 24) is pushed out of L2
    lower = c.cp.tree.match(A, split=False, touch=False).path[-1]
    c.cp.evict_node(lower, "L2")
    faults.once(FaultSite.DELAY)  # the L2 part's H2D (issued first) is observed late
    mat = c.admit(2, A)
    assert len(mat.ops) == 2 and mat.l3_part
    s2h = next(op for op in mat.ops if c.cp.ops[op].direction is Direction.S2H)
    c.handles[s2h].wait()
    c.tick()
    assert mat.s2h_done and not mat.done
    # Pressure from elsewhere: every evictable page of L2 and L3 goes.
    c.cp.evict("L2", 1000)
    c.cp.evict("L3", 1000)
    for node in mat.l3_part:
        assert c.cp.tree.contains(node) and node.state[1] == RESIDENT, node
    c.handles[next(iter(mat.ops))]._delay_polls = 0  # type: ignore[attr-defined]
    while not c.ready(2):
        c.tick()
    assert c.prefill(2) == 4  # 20 tokens restored: 12 from L2, 8 promoted from L3
    assert c.metrics.hit_tokens["L2"] == 12 and c.metrics.hit_tokens["L3"] == 8
    c.finish(2)
    assert all(n.lock == [0, 0, 0] for n in c.cp.tree.nodes())  # every pin released
    assert_clean(c)
    c.close()


def test_restored_pages_are_pinned_in_l1_until_prefill() -> None:
    """A restore that landed is not evicted before `prefill` uses it (it would be wasted)."""
    c = make(l1_pages=16, l2_pages=32, l3_slots=64)
    in_l2_only(c)
    c.admit(2, A)
    while not c.ready(2):
        c.tick()
    c.cp.evict("L1", 1000)
    assert c.prefill(2) == 4
    assert c.metrics.hit_tokens["L2"] == 20
    c.finish(2)
    assert_clean(c)
    c.close()


def test_control_plane_refuses_a_removed_node() -> None:
    c = make(l1_pages=16, l2_pages=32, l3_slots=64)
    serve(c, 1, A)
    c.drain()
    node = c.cp.tree.match(A, split=False, touch=False).path[-1]
    for tier in ("L1", "L2", "L3"):
        c.cp.evict_node(node, tier)
    assert not c.cp.tree.contains(node)
    with pytest.raises(IllegalTransition, match="removed from the tree"):
        c.cp.issue(Direction.H2D, [node])
    c.cp.begin_request(7, B)
    with pytest.raises(IllegalTransition, match="removed from the tree"):
        c.cp.pin(7, node, "L1")
    assert c.cp.requests[7].pins == []
    c.cp.end_request(7)
    c.close()


def test_prefill_checks_then_changes() -> None:
    """`prefill` raising OutOfPages changes nothing about the request: the retry counts the
    restore once. Before: cached_len, restores and hit_tokens had moved, and counted twice."""
    c = make(l1_pages=12, l2_pages=32, l3_slots=64)
    in_l2_only(c)
    c.admit(2, A)  # restores 5 pages from L2
    while not c.ready(2):
        c.tick()
    c.admit(3, B)  # holds 6 of the 7 pages left: request 2's last page does not fit
    c.prefill(3)
    hog = c.cp.tables[0].reserve(c.cp.tables[0].free_count)  # every other page is taken
    before = (c.cp.requests[2].cached_len, c.metrics.restores, dict(c.metrics.hit_tokens))
    with pytest.raises(OutOfPages):
        c.prefill(2)
    assert (c.cp.requests[2].cached_len, c.metrics.restores, dict(c.metrics.hit_tokens)) == before
    c.cp.tables[0].release(hog)
    assert c.prefill(2) == 4
    assert c.metrics.restores == 1 and c.metrics.hit_tokens["L2"] == 20
    c.finish(2)
    c.finish(3)
    assert_clean(c)
    c.close()


def test_prefill_before_the_restore_settled_is_a_typed_error() -> None:
    faults = FaultInjector(delay_polls=1000)
    c = make(faults, l1_pages=16, l2_pages=32, l3_slots=64)
    in_l2_only(c)
    faults.once(FaultSite.DELAY)
    c.admit(2, A)
    with pytest.raises(RestorePending):
        c.prefill(2)
    c.finish(2)
    assert_clean(c)
    c.close()


def test_admit_refuses_a_prompt_l1_can_never_hold() -> None:
    c = make(l1_pages=4, l2_pages=8, l3_slots=8)
    with pytest.raises(RequestTooLarge, match="at least 6 pages"):
        c.admit(1, A)
    assert not c.cp.requests and not c.restores  # nothing changed
    c.close()


def test_a_closed_controller_frees_its_pools_without_the_garbage_collector() -> None:
    """A closed, dropped controller's pools go at once: before, reference cycles (controller
    and backup chain; control plane, tree and the engine's digest method) kept GPU and pinned
    memory until a collection -- which could then run inside a CUDA graph capture."""
    import gc
    import weakref

    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        c = make(l1_pages=16, l2_pages=32, l3_slots=64)
        serve(c, 1, A)
        l1, l2 = weakref.ref(c.transfer_engine.l1.tensor), weakref.ref(c.transfer_engine.l2.tensor)
        c.close()
        del c
        assert l1() is None and l2() is None
    finally:
        if enabled:
            gc.enable()


def test_close_quiesces_the_data_plane_of_a_poisoned_plane() -> None:
    """After an InvariantViolation the control plane refuses every transition; close() must
    still cancel and wait for the transfers in flight and close the data plane, leaving the
    plane's records for diagnosis (it used to die in finish() with PlanePoisoned)."""
    from hicache.errors import InvariantViolation

    faults = FaultInjector(delay_polls=1000)
    c = make(faults, l1_pages=16, l2_pages=32, l3_slots=64)
    c.admit(1, A)
    while not c.ready(1):
        c.tick()
    c.prefill(1)  # write_through: the D2H backup is queued
    faults.once(FaultSite.DELAY, 10)
    c.tick()  # ... issued, and held in flight
    assert c.handles, "a backup is in flight"
    handles = list(c.handles.values())
    c.cp.tree.lock(c.cp.requests[1].locked, 1)  # a lock no holder records (S7)
    with pytest.raises(InvariantViolation):
        c.admit(2, B)
    c.close()
    assert all(h.status.final for h in handles) and not c.handles
    assert 1 in c.cp.requests  # records kept for diagnosis
    c.close()  # idempotent


def test_prefill_does_not_evict_the_restored_prefix_it_is_about_to_serve() -> None:
    """A restore's failed H2D drops its pins; another request then loads the same nodes into
    L1 and ends, so they are RESIDENT in L1 but nobody's. `prefill` took them as its served
    prefix, then its make-room for the rest evicted them and `advance_cached_len` raised
    IllegalTransition (found by `hicache fuzz --plane cpu --seed 3 --steps 20000`)."""
    faults = FaultInjector()
    c = make(faults, l1_pages=12, l2_pages=16, l3_slots=16)
    in_l2_only(c)
    faults.once(FaultSite.H2D_COMPLETE)  # request 2's load-back of A fails
    c.admit(2, A + tuple(range(900, 908)))  # A, then two pages nobody has
    while not c.ready(2):
        c.tick()
    assert not c.cp.holds(c.cp.tree.match(A, split=False, touch=False).path[-1], "L1")
    serve(c, 3, A)  # loads A back into L1 and ends: A is RESIDENT in L1, unlocked
    c.admit(4, B)  # B fills the rest of L1 and stays locked (served, not finished)
    while not c.ready(4):
        c.tick()
    c.prefill(4)
    assert c.cp.free_pages("L1") == 0
    with pytest.raises(OutOfPages):  # A is what it serves: the only candidate is kept
        c.prefill(2)
    assert c.cp.cached_len(2) == 0 and c.cp.free_pages("L1") == 0
    c.finish(4)  # room now
    assert c.prefill(2) == 8 and c.cp.cached_len(2) == len(A) + 8
    c.finish(2)
    assert_clean(c)
    c.close()
