"""Restores among several requests (spec/restore.md): a restored page stays pinned until
`cached_len` covers it, a request shares the load-back another request is filling instead of
recomputing it, and a request that ends with ops in flight cancels them (not a failure)
while a request sharing them loads the pages itself. Bad L3 slots: only the bad slot's node
is invalidated."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

from hicache.controller.config import CacheConfig
from hicache.controller.controller import CacheController
from hicache.controller.materialize import Materialization
from hicache.core.tiers import Direction
from hicache.core.trace import ListSink, Tracer
from hicache.dataplane.faults import FaultInjector, FaultSite
from hicache.errors import OutOfPages
from tests.test_controller import assert_clean, push_out_of, serve

A = tuple(range(100, 124))  # 6 pages of the tiny geometry
B = tuple(range(200, 224))


def make(
    faults: FaultInjector | None = None, tracer: Tracer | None = None, **kw: object
) -> CacheController:
    cfg = CacheConfig(
        **{  # type: ignore[arg-type]
            "policy": "always",
            "backend": "torch",
            "device": "cpu",
            "l1_pages": 16,
            "l2_pages": 32,
            "l3_slots": 64,
            **kw,
        }
    )
    return CacheController(cfg, faults=faults, tracer=tracer)


def in_l2_only(c: CacheController, tokens: tuple[int, ...] = A) -> None:
    serve(c, 100 + len(c.cp.tree), tokens)
    push_out_of(c, "1")


def h2d_ops(c: CacheController) -> list[int]:
    return [op_id for op_id, op in c.cp.ops.items() if op.direction is Direction.H2D]


def sharing(delay_polls: int) -> tuple[CacheController, Materialization]:
    """Request 2 loads A back from L2 (observed `delay_polls` polls late); request 3, admitted
    meanwhile for the same prompt, shares that load-back. Returns request 3's restore."""
    faults = FaultInjector(delay_polls=delay_polls)
    c = make(faults)
    in_l2_only(c)
    faults.once(FaultSite.DELAY)
    c.admit(2, A)
    mat3 = c.admit(3, A)
    assert mat3.awaited and not mat3.ops and not c.ready(3)
    assert len(h2d_ops(c)) == 1
    return c, mat3


def test_a_restored_node_survives_another_requests_prefill_before_its_own() -> None:
    """Tick order: request 2's restore lands, then request 3 (admitted later) prefills first
    and needs more L1 pages than are free. Without the L1 pin taken at `h2d_complete`,
    request 3's make-room evicted request 2's restored leaf and request 2 recomputed it (a
    wasted restore). With it, request 3 waits for L1 (OutOfPages, nothing changed)."""
    c = make(l1_pages=10)
    in_l2_only(c)
    c.admit(2, A)
    while not c.ready(2):
        c.tick()  # 5 pages restored into L1; 5 left free
    c.admit(3, B)
    with pytest.raises(OutOfPages):
        c.prefill(3)  # 6 pages: only by evicting request 2's restore
    assert c.prefill(2) == 4  # only the last page: the 20 restored tokens are served
    assert c.metrics.hit_tokens["L2"] == 20 and c.metrics.restored_unused_pages == 0
    c.finish(2)
    assert c.prefill(3) == 24  # request 2's pages are cached, unlocked: evictable now
    c.finish(3)
    assert_clean(c)
    c.close()


def test_a_request_shares_the_load_back_another_request_is_filling() -> None:
    """Request 3 wants the pages request 2's H2D is filling: it waits for that op and uses
    it (one transfer for both). Before, it planned nothing there and recomputed them, and its
    insert kept the recomputed pages private (the node was still H2D_PENDING)."""
    c, _ = sharing(delay_polls=3)
    while not (c.ready(2) and c.ready(3)):
        c.tick()
    assert c.prefill(3) == 4 and c.prefill(2) == 4
    assert c.metrics.directions["H2D"].count == 1
    assert c.metrics.shared_load_back_pages == 5 and c.metrics.hit_tokens["L2"] == 40
    assert c.metrics.verified_pages == 10  # both requests' restored pages checked
    c.finish(2)
    c.finish(3)
    assert_clean(c)
    c.close()


def test_a_request_that_ends_cancels_its_load_back_and_the_sharer_loads_it_itself() -> None:
    """Request 2 ends while its H2D is in flight and request 3 shares it: the op is
    cancelled (counted as cancelled, not failed, and no fallback), and request 3 issues its
    own load-back of the same nodes on the next tick."""
    c, mat3 = sharing(delay_polls=1000)
    c.finish(2)
    assert c.metrics.directions["H2D"].cancelled == 1 and c.metrics.directions["H2D"].failed == 0
    assert c.metrics.fallbacks["transfer_failed"] == 0
    c.tick()
    assert not mat3.awaited and len(mat3.ops) == 1  # its own H2D of the same nodes
    while not c.ready(3):
        c.tick()
    assert c.prefill(3) == 4 and c.metrics.hit_tokens["L2"] == 20
    assert c.metrics.shared_load_back_pages == 0
    prometheus = c.metrics.to_prometheus()
    assert 'hicache_transfers_cancelled_total{direction="H2D"} 1' in prometheus
    assert 'hicache_transfers_failed_total{direction="H2D"} 0' in prometheus
    c.finish(3)
    assert_clean(c)
    c.close()


def test_a_sharer_whose_shared_load_back_failed_loads_it_itself() -> None:
    faults = FaultInjector(delay_polls=2)
    c = make(faults)
    in_l2_only(c)
    faults.once(FaultSite.DELAY).once(FaultSite.H2D_COMPLETE)
    c.admit(2, A)
    c.admit(3, A)
    while not (c.ready(2) and c.ready(3)):
        c.tick()
    # Request 2's load-back failed (one counted fallback); request 3 loaded the same nodes
    # itself, and request 2, still live, is served from them too.
    assert c.metrics.fallbacks["transfer_failed"] == 1 and c.metrics.directions["H2D"].failed == 1
    assert c.metrics.directions["H2D"].count == 1
    assert c.prefill(3) == 4 and c.prefill(2) == 4
    c.finish(2)
    c.finish(3)
    assert_clean(c)
    c.close()


def test_a_bad_slot_invalidates_its_node_only_and_evicts_healthy_copies_below_it() -> None:
    """The read node's copy is dropped with `invalidate_l3`; the healthy page below it (it
    must leave L3 first: S6) is traced `evict_l3` and counted apart. Before, both were
    traced and counted as invalidations."""
    sink = ListSink()
    faults = FaultInjector().once(FaultSite.CORRUPT_SLOT)  # the first slot written
    c = make(faults, tracer=Tracer(sink))
    serve(c, 1, A)
    push_out_of(c, "12")
    assert serve(c, 2, A) == 24  # the S2H of the 5-page upper node fails its checksum
    invalidated = [e for e in sink.events if e.event == "invalidate_l3"]
    evicted = [e for e in sink.events if e.event == "evict_l3"]
    assert len(invalidated) == 1 and len(invalidated[0].pages) == 5
    assert len(evicted) == 1 and len(evicted[0].pages) == 1
    assert c.metrics.l3_invalidated_pages["corrupt"] == 5
    assert c.metrics.l3_invalidated_pages["below_bad_slot"] == 1
    assert c.metrics.evicted_pages["L3"] == 0  # corruption is not pressure
    assert_clean(c)
    c.close()


def test_a_bad_slot_a_reader_still_holds_is_reported_by_match_but_never_planned() -> None:
    """Between detection and the drop (a reader holds the copy), `match` still reports the L3
    copy; the controller plans no L3 read through it (no S2H), and drops it once let go. The
    quarantine follows the slot through the split the next match makes."""
    c = make()
    serve(c, 1, A)
    push_out_of(c, "12")
    node = c.cp.tree.match(A, split=False, touch=False).path[-1]
    slot = int(c.cp.prefix_pages(node, "L3")[0])
    c.cp.begin_request(50, B)
    c.cp.pin(50, node, "L3")  # a reader holds the node in L3
    c.l3.bad_slot([node], slot, "corrupt")
    assert c.l3.quarantine and c.cp.tree.match(A, split=False, touch=False).lengths[2] == 24
    assert serve(c, 2, A) == 24  # recomputed, not read: the match split the node meanwhile
    assert c.metrics.directions["S2H"].count + c.metrics.directions["S2H"].failed == 0
    c.cp.end_request(50)
    c.tick()
    assert not c.l3.quarantine
    assert c.metrics.l3_invalidated_pages["corrupt"] == 5  # the upper node holds the slot
    assert c.metrics.l3_invalidated_pages["below_bad_slot"] == 1
    assert_clean(c)
    c.close()


def test_cancel_restore_keeps_the_request_and_recomputes() -> None:
    """`cancel_restore`: the request's load-back is cancelled (not failed: no fallback), the
    request stays live and ready, and `prefill` recomputes what did not arrive."""
    faults = FaultInjector(delay_polls=1000)
    c = make(faults)
    in_l2_only(c)
    faults.once(FaultSite.DELAY)
    c.admit(2, A)
    assert not c.ready(2) and len(h2d_ops(c)) == 1
    assert c.cancel_restore(2) == 1
    assert c.ready(2) and not c.handles and 2 in c.cp.requests
    assert c.cancel_restore(2) == 0  # settled already: nothing to cancel
    assert c.prefill(2) == len(A)  # every token recomputed
    assert c.cp.cached_len(2) == len(A)
    assert c.metrics.directions[Direction.H2D].cancelled == 1
    assert sum(c.metrics.fallbacks.values()) == 0
    c.finish(2)
    assert_clean(c)
    c.close()


def test_cancel_restore_of_a_sharer_leaves_the_owners_load_back_running() -> None:
    """Request 3 shares request 2's load-back and gives up waiting: request 2's op goes on,
    request 3 is ready at once and recomputes; both end clean."""
    c, mat3 = sharing(delay_polls=1000)
    assert c.cancel_restore(3) == 0  # nothing of its own in flight
    assert c.ready(3) and not mat3.awaited and len(h2d_ops(c)) == 1 and not c.ready(2)
    c.prefill(3)  # computes A; L1 is filling A for request 2, so nothing is published for 3
    assert c.cp.cached_len(3) == 0
    c.handles[h2d_ops(c)[0]]._delay_polls = 0  # type: ignore[attr-defined]
    while not c.ready(2):
        c.tick()
    c.prefill(2)
    c.finish(3)
    c.finish(2)
    assert_clean(c)
    c.close()
