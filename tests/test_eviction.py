"""`ControlPlane.evict`, the one eviction loop (spec/eviction.md): per-tier LRU leaves, one
node's value at a time, never a locked, pending, guarded or kept node; the `before` hook runs
once per victim and the victim is chosen again after it."""

from __future__ import annotations

from hicache.core.control import ControlPlane
from hicache.core.tiers import Direction, Tier
from hicache.core.trace import ListSink, Tracer
from hicache.core.tree import TreeNode

PS = 2


def plane() -> tuple[ControlPlane, ListSink]:
    sink = ListSink()
    return ControlPlane(PS, (16, 16, 16), check_mode="every", tracer=Tracer(sink)), sink


def cached(cp: ControlPlane, rid: int, tokens: list[int]) -> TreeNode:
    """Compute and insert `tokens` (page aligned), end the request; the deepest node."""
    m = cp.begin_request(rid, tokens)
    if len(tokens) > m.lengths[0]:
        cp.compute(rid, len(tokens) - m.lengths[0])
        cp.insert(rid)
    node = cp.prefix_node(rid)
    cp.end_request(rid)
    return node


def test_lru_leaf_first_whole_node_at_a_time() -> None:
    cp, sink = plane()
    a = cached(cp, 1, [1, 2, 3, 4])  # 2 pages, older
    b = cached(cp, 2, [5, 6])  # 1 page, newer
    assert cp.candidates(Tier.L1) == [a, b]
    assert cp.evict(Tier.L1, 1) == 2  # the LRU node goes whole, though 1 page was asked
    assert [e.node for e in sink.events if e.event == "evict_l1"] == [a.node_id]
    assert cp.candidates(Tier.L1) == [b]


def test_keep_protects_a_node_and_a_lock_protects_its_path() -> None:
    cp, _ = plane()
    a = cached(cp, 1, [1, 2])
    b = cached(cp, 2, [1, 2, 3, 4])  # child of a: a is no L1 leaf
    assert cp.candidates(Tier.L1) == [b]
    assert cp.candidates(Tier.L1, keep=[b]) == []
    assert cp.evict(Tier.L1, 10, keep=[b]) == 0
    cp.begin_request(3, [1, 2, 3, 4, 9, 9])  # locks b's path in L1
    assert cp.evict(Tier.L1, 10) == 0 and cp.holds(a, Tier.L1) and cp.holds(b, Tier.L1)
    cp.end_request(3)
    assert cp.evict(Tier.L1, 10) == 2  # b, then a (a leaf once b is gone)


def test_a_guarded_node_is_no_candidate() -> None:
    """`evict_l2` is refused while the node's L1 load-back reads it (guard): the loop skips
    it instead of raising half-way."""
    cp, _ = plane()
    a = cached(cp, 1, [1, 2])
    cp.complete(cp.issue(Direction.D2H, [a]).op_id)
    cp.evict_node(a, "L1")
    cp.issue(Direction.H2D, [a])  # locks a in L2 for the read
    assert cp.candidates(Tier.L2) == []
    assert cp.evict(Tier.L2, 10) == 0


def test_before_runs_once_per_victim_and_the_victim_is_chosen_again() -> None:
    cp, _ = plane()
    a = cached(cp, 1, [1, 2])
    b = cached(cp, 2, [5, 6])
    seen: list[int] = []

    def before(victim: TreeNode) -> None:
        seen.append(victim.node_id)
        if victim is a:
            cp.tree.touch(a, 0)  # `before` changed the cache: a is no longer the LRU node

    assert cp.evict(Tier.L1, 2, before=before) == 2
    assert seen == [a.node_id, b.node_id]  # a offered, then b first, then a again (no call)
    assert not cp.holds(a, Tier.L1) and not cp.holds(b, Tier.L1)
