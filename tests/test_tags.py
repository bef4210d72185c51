"""Content tags (hicache/dataplane/tags.py): the null plane's stand-in for bytes, so I4 runs
without torch. What moves a tag, and that the controller on the null plane is checked by them."""

from __future__ import annotations

import numpy as np
import pytest

from hicache.controller.config import CacheConfig
from hicache.controller.controller import CacheController
from hicache.core.pages import Pages
from hicache.core.snapshot import UNSERVABLE
from hicache.core.tiers import Direction, Tier
from hicache.dataplane.handles import NullHandle
from hicache.dataplane.null import NullEngine
from hicache.dataplane.plane import TaggedPlane
from hicache.dataplane.tags import FRESH, ContentTags, content_tags
from hicache.errors import InvariantViolation

PS = 4  # tokens per page
CAPACITY = {Tier.L1: 8, Tier.L2: 8, Tier.L3: 8}


def pages(values: list[int]) -> Pages:
    return np.asarray(values, dtype=np.int64)


def is_fresh(tags: np.ndarray) -> bool:
    return bool(np.all(tags >= FRESH))


# -- content_tags ---------------------------------------------------------------------------------


def test_a_page_tag_hashes_every_token_through_the_page_end() -> None:
    tokens = list(range(3 * PS))
    tags = content_tags(tokens, PS, 0, 3)
    assert tags.dtype == np.uint64 and not np.any(tags >= FRESH)  # content tags: below 2**63
    assert len(set(tags.tolist())) == 3
    assert content_tags(tokens, PS, 1, 3).tolist() == tags[1:].tolist()  # a slice: the same tags
    changed = list(tokens)
    changed[PS] += 1  # a token of page 1: pages 1 and 2 change (the chain), page 0 does not
    other = content_tags(changed, PS, 0, 3)
    assert other[0] == tags[0] and other[1] != tags[1] and other[2] != tags[2]


@pytest.mark.parametrize("first,last", [(-1, 1), (2, 1), (0, 4)])
def test_content_tags_refuses_pages_the_tokens_do_not_cover(first: int, last: int) -> None:
    with pytest.raises(ValueError, match="pages"):
        content_tags(list(range(3 * PS)), PS, first, last)


# -- ContentTags ----------------------------------------------------------------------------------


def test_every_page_starts_fresh_and_a_reservation_makes_it_fresh_again() -> None:
    t = ContentTags(CAPACITY, PS)
    all_tags = np.concatenate([t.tags[tier] for tier in CAPACITY])
    assert is_fresh(all_tags) and len(set(all_tags.tolist())) == all_tags.size  # no two alike
    before = t.tags[Tier.L2].copy()
    t.reserve(Tier.L2, pages([1, 2]))
    after = t.tags[Tier.L2]
    assert is_fresh(after[[1, 2]]) and not set(after[[1, 2]].tolist()) & set(all_tags.tolist())
    assert after[0] == before[0] and after[3] == before[3]


def test_a_compute_writes_the_tokens_tags_and_a_landed_transfer_copies_them() -> None:
    t = ContentTags(CAPACITY, PS)
    tokens = list(range(100, 100 + 3 * PS))
    t.compute(tokens, PS, 3 * PS, pages([5, 6]))  # pages 1 and 2 of the request
    assert t.tags[Tier.L1][[5, 6]].tolist() == content_tags(tokens, PS, 1, 3).tolist()
    t.reserve(Tier.L2, pages([0, 1]))
    t.lander(Direction.D2H, pages([5, 6]), pages([0, 1]))(None)  # landed whole
    assert t.tags[Tier.L2][[0, 1]].tolist() == t.tags[Tier.L1][[5, 6]].tolist()


def test_a_stopped_s2h_lands_only_the_pages_every_pool_landed() -> None:
    """Pools `kv` (the anchor, 1 page per anchor page) and `c` (2 per anchor page): `c`
    landed 3 of 6 pages, so only the first anchor page is whole, although `kv` landed all 3."""
    t = ContentTags(CAPACITY, PS)
    source = t.tags[Tier.L3][[0, 1, 2]].copy()
    t.reserve(Tier.L2, pages([4, 5, 6]))
    fresh = t.tags[Tier.L2][[4, 5, 6]].copy()
    unbound = t.lander(Direction.S2H, pages([0, 1, 2]), pages([4, 5, 6]))
    unbound({"kv": 3, "c": 6})  # no pool bound yet: a report names nothing it can read
    assert t.tags[Tier.L2][[4, 5, 6]].tolist() == fresh.tolist()
    t.ratios = {"kv": 1, "c": 2}
    assert t.whole({"kv": 3, "c": 3}) == 1 and t.whole({"kv": 3}) == 0
    t.lander(Direction.S2H, pages([0, 1, 2]), pages([4, 5, 6]))({"kv": 3, "c": 3})
    assert t.tags[Tier.L2][4] == source[0]
    assert t.tags[Tier.L2][[5, 6]].tolist() == fresh[1:].tolist()


def test_an_unservable_l3_slot_reads_as_unservable_in_l3_only() -> None:
    t = ContentTags(CAPACITY, PS)
    out = t.digests(Tier.L3, pages([1, 2, 3]), {2})
    assert out[1] == UNSERVABLE and out[0] != UNSERVABLE and out[2] != UNSERVABLE
    assert UNSERVABLE not in t.digests(Tier.L2, pages([1, 2, 3]), {2}).tolist()


# -- the null plane and the controller ------------------------------------------------------------


def null_controller() -> tuple[CacheController, NullEngine]:
    cfg = CacheConfig(l1_pages=16, l2_pages=32, l3_slots=64, policy="always", check_mode="every")
    engine = NullEngine(cfg.kv, cfg.l1_pages, cfg.l2_pages, cfg.l3_slots)
    return CacheController(cfg, engine=engine), engine


def settle(c: CacheController, engine: NullEngine) -> None:
    for _ in range(50):
        c.tick()
        if not c.handles:
            return
        for handle in engine.pending():
            assert isinstance(handle, NullHandle)
            handle.finish(True)
    raise AssertionError("transfers still pending")


def test_the_null_plane_is_a_tagged_plane_whose_failed_transfer_lands_nothing() -> None:
    c, engine = null_controller()
    assert isinstance(engine, TaggedPlane) and c.tagged is engine
    h = engine.d2h(pages([1]), pages([2]))
    assert isinstance(h, NullHandle)
    h.finish(False)
    assert is_fresh(engine.digests("L2", pages([2])))
    c.close()


def serve(c: CacheController, engine: NullEngine, rid: int, tokens: tuple[int, ...]) -> None:
    c.admit(rid, tokens)
    settle(c, engine)
    c.prefill(rid)
    c.finish(rid)


def test_a_null_plane_page_published_before_its_copy_landed_fails_i4() -> None:
    """Before content tags, I4 was vacuous on the null plane and this passed unseen: a D2H
    completed on the control plane without the copy having landed."""
    c, engine = null_controller()
    ps = c.config.kv.page_size
    serve(c, engine, 1, tuple(range(100, 100 + 3 * ps)) + (1,))
    settle(c, engine)  # the write-through backup lands: L1 and L2 agree
    assert c.cp.checker.violations_found == 0
    serve(c, engine, 2, tuple(range(500, 500 + 3 * ps)) + (1,))
    c.tick()  # issues the second request's backup, which the driver leaves in flight
    d2h = [op for op in c.cp.ops.values() if op.direction is Direction.D2H]
    assert d2h, "the second request's write-through backup is in flight"
    with pytest.raises(InvariantViolation, match="I4 tier_bytes_equal"):
        c.cp.complete(d2h[0].op_id)  # published, but its content never arrived


def test_a_recompute_matches_the_copy_backed_up_before_it() -> None:
    """Same tokens, same tags: when a load-back fails and the controller computes the pages
    again, the new L1 pages agree with the L2 copy of the first computation (I4 holds there;
    a tag fresh per compute would fail it)."""
    c, engine = null_controller()
    ps = c.config.kv.page_size
    tokens = tuple(range(100, 100 + 3 * ps)) + (1,)
    serve(c, engine, 1, tokens)
    settle(c, engine)
    node = c.cp.tree.match(tokens[: 3 * ps], split=False, touch=False).path[-1]
    l2 = engine.digests("L2", c.cp.prefix_pages(node, Tier.L2))
    assert l2.tolist() == content_tags(tokens, ps, 0, 3).tolist()
    assert c.evict("L1", 3) == 3 and not c.cp.holds(node, Tier.L1)
    c.admit(2, tokens)
    for handle in engine.pending():  # the load-back fails: the pages are computed again
        assert isinstance(handle, NullHandle)
        handle.finish(False)
    settle(c, engine)
    c.prefill(2)
    assert c.cp.holds(node, Tier.L1) and c.cp.holds(node, Tier.L2)
    l1 = engine.digests("L1", c.cp.prefix_pages(node, Tier.L1))
    assert l1.tolist() == l2.tolist() and c.cp.checker.violations_found == 0
    c.finish(2)
    c.close()
