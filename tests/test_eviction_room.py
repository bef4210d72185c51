"""A prefill refused for lack of L1 room evicts nothing (spec/README.md: a rejected operation
leaves no trace): the controller first asks the control plane how many L1 pages eviction could
free (`PlaneQueries.evictable_l1`), and that count is exactly what the one eviction loop frees,
in every state of the model checker's configurations."""

from __future__ import annotations

import pytest

from hicache.core.control import ControlPlane
from hicache.oracle.modelcheck.config import get_config
from hicache.oracle.modelcheck.search import explore


@pytest.mark.parametrize("config", ["tail", "pair"])
def test_evictable_l1_is_what_the_eviction_loop_frees(config: str) -> None:
    seen = [0, 0]  # states, states with something evictable

    def agree(cp: ControlPlane) -> None:
        said = cp.evictable_l1()
        scratch = cp.clone()
        freed = scratch.evict("L1", 10**6)
        assert said == freed, f"evictable_l1 says {said}, the loop frees {freed}"
        if cp.tree.root.children:
            node = next(iter(cp.tree.root.children.values()))
            # Verify a kept node (and so its ancestors) is never counted.
            kept = cp.clone()
            kept_node = kept.tree._nodes[node.node_id]
            assert kept.evictable_l1([kept_node]) == kept.evict("L1", 10**6, keep=[kept_node])
        seen[0] += 1
        seen[1] += said > 0

    result = explore(get_config(config), on_state=agree)
    assert result.finding is None and seen[0] == result.states and seen[1] > 0, seen


def test_a_prefill_refused_for_room_evicts_nothing() -> None:
    """L1 of 5 pages of 4 tokens: request 1's first page stays cached, request 2 fills the
    rest and stays live, request 3 needs two pages: one could be evicted, two cannot, so the
    prefill is refused -- and request 1's cached page is still there. (The controller used to
    evict it first and then refuse, as SGLang's RadixCache, checked by the vectors, does not.)"""
    pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")
    from hicache.controller.config import CacheConfig
    from hicache.controller.controller import CacheController
    from hicache.errors import OutOfPages

    c = CacheController(
        CacheConfig(
            geometry="tiny",
            device="cpu",
            l1_pages=5,
            l2_pages=8,
            l3_slots=8,
            policy="never",
            write_policy="write_through_selective",
        )
    )
    try:
        c.admit(1, tuple(range(100, 105)))
        c.prefill(1)
        c.finish(1)  # its first page stays cached, unlocked; its tail page is freed
        c.admit(2, tuple(range(200, 213)))
        c.prefill(2)  # four pages: L1 is full, request 2 stays live
        c.admit(3, tuple(range(300, 305)))
        cached = c.cp.tree.match(tuple(range(100, 104)), split=False, touch=False).lengths[0]
        assert cached == 4 and c.cp.evictable_l1() == 1
        with pytest.raises(OutOfPages):
            c.prefill(3)
        assert c.cp.tree.match(tuple(range(100, 104)), split=False, touch=False).lengths[0] == 4
        assert c.metrics.evicted_pages["L1"] == 0
    finally:
        c.close()
