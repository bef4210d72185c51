"""Hits across pools (hicache/pools/hits.py): per-pool leading runs and legal endpoints, the
agreed hit against a brute force, the SWA window validator, the two group hit policies, the
prefetch clamp and the trailing-tail release, with the upstream failure scenarios named."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hicache.errors import ConfigError
from hicache.pools.hits import (
    ALL_POOLS,
    ANCHOR_RECOMPUTE_SWA,
    Endpoints,
    agreed_hit,
    intersect_masks,
    largest_endpoint,
    leading_run,
    pool_hits,
    prefetch_clamp,
    required_pools,
    swa_boundaries,
    trailing_endpoints,
    trailing_tail,
)
from hicache.pools.spec import (
    ALLOCATING,
    SIDECAR,
    STATE,
    TRAILING_PAGES,
    PoolGroup,
    PoolSpec,
)

T, F = True, False


def anchor(page_size: int = 1) -> PoolSpec:
    return PoolSpec("kv", page_size=page_size, layers=0)


def sidecar(name: str, source: str = "kv", page_size: int = 1, backupable: bool = True) -> PoolSpec:
    return PoolSpec(
        name, role=SIDECAR, indices_from=source, page_size=page_size, backupable=backupable
    )


def trailing(
    name: str, window: int, page_size: int = 1, role: str = ALLOCATING, source: str = ""
) -> PoolSpec:
    return PoolSpec(
        name,
        role=role,
        indices_from=source,
        hit_policy=TRAILING_PAGES,
        window_pages=window,
        page_size=page_size,
    )


def dsv4_tiny(window: int = 2, kv_page: int = 1, swa_page: int = 1) -> PoolGroup:
    """The structure of the dsv4 group: byte-less anchor, allocating swa, three ALL_PAGES
    sidecars on the anchor, two state pools on swa."""
    return PoolGroup(
        "dsv4-test",
        (
            anchor(kv_page),
            trailing("swa", window, swa_page),
            sidecar("c4", page_size=kv_page),
            sidecar("c4_indexer", page_size=kv_page),
            sidecar("c128", page_size=kv_page),
            trailing("c4_state", window, swa_page, role=STATE, source="swa"),
            trailing("c4_indexer_state", window, swa_page, role=STATE, source="swa"),
        ),
    )


def two_trailing(window_a: int, window_b: int) -> PoolGroup:
    return PoolGroup(
        "two-trailing", (anchor(), trailing("swa", window_a), trailing("swb", window_b))
    )


# -- per pool ---------------------------------------------------------------------------------


def test_leading_run_is_the_index_of_the_first_absent_page() -> None:
    assert leading_run([]) == 0
    assert leading_run([T, T, F, T]) == 2
    assert leading_run([F, T]) == 0
    assert leading_run([T, T, T]) == 3


def test_trailing_endpoints_need_the_window_before_them() -> None:
    assert trailing_endpoints([T, F, T, T, T], 2) == {0, 1, 4, 5}
    assert trailing_endpoints([F, F], 1) == {0}


def test_a_window_is_clipped_at_the_path_start_but_not_after_a_gap() -> None:
    # From page 0, a run shorter than the window serves every endpoint it covers (SGLang's
    # validator counts a gap-free path from the root as infinite) ...
    assert trailing_endpoints([T, T], 4) == {0, 1, 2}
    assert swa_boundaries([(1, T), (1, T)], 4) == (0, 1, 2)
    # ... after a gap the run must reach the window again.
    assert trailing_endpoints([F, T, T, T, T], 4) == {0, 5}
    assert swa_boundaries([(1, F), (3, T), (1, T)], 4) == (0, 5)


def test_swa_boundaries_reset_at_a_gap_f23() -> None:
    """F23: write-back tombstoning drops an internal node's window value; a hit through it
    must not count a window with a gap."""
    path = [(4, T), (2, F), (3, T)]
    assert swa_boundaries(path, 4) == (0, 4)  # 3 pages after the gap < window 4
    assert swa_boundaries([*path, (1, T)], 4) == (0, 4, 10)
    group = PoolGroup("swa-only", (anchor(), trailing("swa", 4)))
    swa = [T] * 4 + [F] * 2 + [T] * 3
    hit = agreed_hit(group, {"kv": [T] * 9, "swa": swa}, 9)
    assert hit.hit == 4  # not 9: the window [5, 9) holds page 5, which is gone


def test_endpoints_convert_to_anchor_pages_when_page_sizes_differ() -> None:
    group = dsv4_tiny(window=3, kv_page=4, swa_page=2)
    swa = [F, T, T, T, T, T]  # own endpoints 0, 4, 5, 6 -> anchor endpoints 0, 2, 3
    hits = {p.pool: p for p in pool_hits(group, {"kv": [T] * 3, "swa": swa}, 3)}
    assert hits["swa"].endpoints.legal == {0, 2, 3} and hits["swa"].leading_run == 0
    assert hits["kv"].endpoints.legal == {0, 1, 2, 3}


# -- the agreed hit ---------------------------------------------------------------------------


def test_f14_the_hit_is_the_largest_common_endpoint_not_the_min_of_maxima() -> None:
    """SGLang #39147: endpoints {1,3} and {1,2}; the agreed hit is 1, min-of-maxima says 2."""
    group = two_trailing(1, 1)
    presence = {"kv": [T, T, T], "swa": [T, F, T], "swb": [T, T, F]}
    hit = agreed_hit(group, presence, 3)
    by_pool = {p.pool: p.endpoints for p in hit.pools}
    assert by_pool["swa"].legal == {0, 1, 3} and by_pool["swb"].legal == {0, 1, 2}
    assert min(e.largest for e in by_pool.values()) == 2  # what the bug published
    assert hit.hit == 1 and hit.hit_tokens == 1
    masks = [by_pool[n].endpoint_mask(hit.bound) for n in ("swa", "swb")]
    assert masks == [(1, 1, 0, 1), (1, 1, 1, 0)]
    assert largest_endpoint(intersect_masks(masks)) == 1


def test_ranks_agree_on_the_bound_then_intersect_masks() -> None:
    """The tensor-parallel form of #39147: rank 0 alone would serve 3, rank 1 alone 2, so the
    minimum of the ranks' hits is 2; but no endpoint above 1 is legal on both ranks."""
    group = PoolGroup("swa-only", (anchor(), trailing("swa", 1)))
    ranks = [agreed_hit(group, {"kv": [T, T, T], "swa": swa}, 3) for swa in ([T, F, T], [T, T, F])]
    assert [r.hit for r in ranks] == [3, 2]
    bound = min(r.bound for r in ranks)  # the first, fixed-size reduction (MIN)
    common = intersect_masks([r.mask(bound) for r in ranks])  # the second: equal lengths
    assert common == (1, 1, 0, 0) and largest_endpoint(common) == 1


def test_f14_disjoint_endpoints_agree_on_zero() -> None:
    group = two_trailing(2, 1)
    hit = agreed_hit(group, {"kv": [T, T, T], "swa": [F, T, T], "swb": [F, T, F]}, 3)
    assert [p.endpoints.legal for p in hit.pools[1:]] == [{0, 3}, {0, 2}]
    assert hit.hit == 0


def test_f14_an_all_pages_pool_truncates_to_an_endpoint_the_trailing_pool_cannot_serve() -> None:
    group = dsv4_tiny(window=2)
    full = [T] * 6
    presence = {
        "kv": full,
        "c4": [T, T, T, F, F, F],
        "c4_indexer": full,
        "c128": full,
        "swa": [T, F, T, T, T, T],
    }  # swa endpoints 0, 1, 4, 5, 6
    hit = agreed_hit(group, presence, 6)
    assert hit.bound == 3
    assert hit.hit == 1  # 3 and 2 need swa pages 1..2; the largest legal endpoint <= 3 is 1


def test_a_pool_not_reported_holds_nothing() -> None:
    group = dsv4_tiny()
    presence = {"kv": [T] * 4, "c4": [T] * 4, "c4_indexer": [T] * 4, "swa": [T] * 4}
    hit = agreed_hit(group, presence, 4)
    c128 = next(p for p in hit.pools if p.pool == "c128")
    assert not c128.reported and c128.leading_run == 0 and hit.hit == 0


def test_state_and_non_backupable_pools_are_not_matched() -> None:
    group = PoolGroup("ring", (*dsv4_tiny().pools, sidecar("pair_ring", backupable=False)))
    hit = agreed_hit(
        group, {"kv": [T, T], "c4": [T, T], "c4_indexer": [T, T], "c128": [T, T], "swa": [T, T]}, 2
    )
    assert hit.hit == 2
    assert [p.pool for p in hit.pools] == ["kv", "swa", "c4", "c4_indexer", "c128"]


# -- the two group hit policies ---------------------------------------------------------------


def test_all_pools_needs_the_window_and_anchor_recompute_swa_replays_it() -> None:
    group = dsv4_tiny(window=3, kv_page=4, swa_page=2)
    full = [T] * 4
    presence = {"kv": full, "c4": full, "c4_indexer": full, "c128": full, "swa": [F] * 8}
    strict = agreed_hit(group, presence, 4, ALL_POOLS)
    assert strict.hit == 0 and strict.recompute_tokens == 0
    assert set(strict.required) == {"kv", "swa", "c4", "c4_indexer", "c128"}
    lenient = agreed_hit(group, presence, 4, ANCHOR_RECOMPUTE_SWA)
    assert set(lenient.required) == {"kv", "c4", "c4_indexer", "c128"}
    assert lenient.hit == 4 and lenient.hit_tokens == 16
    assert lenient.recompute_tokens == 6  # the swa window: 3 pages of 2 tokens
    short = agreed_hit(group, {**presence, "c4": [T, F, F, F]}, 4, ANCHOR_RECOMPUTE_SWA)
    assert short.hit == 1 and short.recompute_tokens == 4  # the window clipped at the start


def test_anchor_recompute_swa_still_needs_every_anchor_derived_pool() -> None:
    group = dsv4_tiny()
    presence = {"kv": [T] * 3, "c4": [T] * 3, "c4_indexer": [T] * 3, "c128": [T, T, F]}
    assert agreed_hit(group, presence, 3, ANCHOR_RECOMPUTE_SWA).hit == 2


def test_anchor_recompute_swa_refuses_an_all_pages_pool_off_the_anchor() -> None:
    group = PoolGroup("odd", (anchor(), PoolSpec("full2", role=ALLOCATING, page_size=1)))
    assert required_pools(group, ALL_POOLS) == ("kv", "full2")
    with pytest.raises(ConfigError, match="full2"):
        agreed_hit(group, {"kv": [T], "full2": [T]}, 1, ANCHOR_RECOMPUTE_SWA)


def test_an_unknown_hit_policy_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        agreed_hit(dsv4_tiny(), {}, 0, "min_of_maxima")
    assert caught.value.field == "hit_policy"


# -- prefetch clamp and trailing tail ---------------------------------------------------------


def test_f11_prefetch_publishes_at_most_every_all_pages_sidecar() -> None:
    """F11 (#30334): the prefetch stopped after the KV pages, before c4 landed."""
    clamp = prefetch_clamp(
        dsv4_tiny(), {"kv": 5, "c4": 3, "c4_indexer": 5, "c128": 4, "swa": 6}, reserved=6
    )
    assert clamp.published == 3
    assert clamp.release == range(3, 6)
    assert dict(clamp.by_pool) == {"kv": 5, "c4": 3, "c4_indexer": 5, "c128": 4}


def test_f12_a_sidecar_not_reported_counts_zero_and_every_slot_is_released() -> None:
    """F12 (#37145): c128 missing from the per-pool results. Ignoring it would publish 5;
    counting it 0 publishes nothing and hands every reserved slot back, so none is orphaned."""
    clamp = prefetch_clamp(dsv4_tiny(), {"kv": 5, "c4": 5, "c4_indexer": 5}, reserved=5)
    assert clamp.published == 0 and dict(clamp.by_pool)["c128"] == 0
    assert list(clamp.release) == [0, 1, 2, 3, 4]


def test_a_non_backupable_sidecar_does_not_clamp_a_prefetch() -> None:
    group = PoolGroup("ring", (*dsv4_tiny().pools, sidecar("pair_ring", backupable=False)))
    clamp = prefetch_clamp(group, {"kv": 2, "c4": 2, "c4_indexer": 2, "c128": 2}, reserved=2)
    assert clamp.published == 2 and clamp.release == range(2, 2)


def test_f13_the_window_beyond_a_shortened_hit_is_released() -> None:
    """F13 (#31679): the swa window was held for endpoint 10; c4 shortened the hit to 8."""
    group = dsv4_tiny(window=4)
    tail = trailing_tail(group, "swa", range(6, 10), 8)
    assert tail.needed == range(4, 8) and tail.keep == range(6, 8)
    assert tail.release == (8, 9) and tail.missing == (4, 5)
    whole = trailing_tail(group, "swa", range(6, 10), 10)
    assert whole.release == () and whole.missing == () and whole.keep == range(6, 10)
    none = trailing_tail(group, "swa", range(6, 10), 0)
    assert none.needed == range(0, 0) and none.release == (6, 7, 8, 9)
    early = trailing_tail(group, "swa", range(2, 6), 8)  # held for an earlier endpoint
    assert early.keep == range(4, 6) and early.release == (2, 3) and early.missing == (6, 7)


def test_f13_in_the_pools_own_pages() -> None:
    group = dsv4_tiny(window=4, kv_page=4, swa_page=2)
    tail = trailing_tail(group, "swa", range(16, 20), 9)  # anchor page 9 ends at swa page 18
    assert tail.needed == range(14, 18) and tail.release == (18, 19)
    assert tail.missing == (14, 15)


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("window", [-1, 0])
def test_a_window_below_one_page_is_refused(window: int) -> None:
    with pytest.raises(ConfigError, match="window"):
        trailing_endpoints([T], window)
    with pytest.raises(ConfigError, match="window"):
        swa_boundaries([(1, T)], window)


@pytest.mark.parametrize(
    ("presence", "field"),
    [
        ({"kv": [T, T], "mystery": [T, T]}, "presence.mystery"),
        ({"kv": [T, T], "c4_state": [T, T]}, "presence.c4_state"),
        ({"kv": [T, T], "c4": [T, T, T]}, "presence.c4"),
        ({"kv": [T]}, "presence.kv"),
    ],
)
def test_bad_presence_is_refused_naming_the_pool(
    presence: dict[str, list[bool]], field: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        agreed_hit(dsv4_tiny(), presence, 2)
    assert caught.value.field == field


def test_bad_masks_paths_and_counts_are_refused() -> None:
    with pytest.raises(ConfigError, match="lengths differ"):
        intersect_masks([(1, 1), (1, 1, 0)])  # F17: masks built with different bounds
    with pytest.raises(ConfigError, match="0 or 1"):
        intersect_masks([(1, 2)])
    with pytest.raises(ConfigError, match="entry 0"):
        largest_endpoint((0, 1))
    with pytest.raises(ConfigError, match="bound"):
        Endpoints(1, frozenset({0})).endpoint_mask(-1)
    with pytest.raises(ConfigError, match="legal"):
        Endpoints(2, frozenset({1, 2}))  # the empty hit is always legal
    with pytest.raises(ConfigError, match="legal"):
        Endpoints(2, frozenset({0, 3}))
    with pytest.raises(ConfigError, match="path"):
        swa_boundaries([(0, T)], 1)
    with pytest.raises(ConfigError, match="pages"):
        agreed_hit(dsv4_tiny(), {}, -1)
    with pytest.raises(ConfigError, match="completed.c4"):
        prefetch_clamp(dsv4_tiny(), {"kv": 2, "c4": 3}, reserved=2)
    with pytest.raises(ConfigError, match="completed.mystery"):
        prefetch_clamp(dsv4_tiny(), {"mystery": 0}, reserved=2)
    with pytest.raises(ConfigError, match="hit_policy"):
        trailing_tail(dsv4_tiny(), "c4", range(0, 2), 1)
    with pytest.raises(ConfigError, match="held"):
        trailing_tail(dsv4_tiny(), "swa", range(0, 4, 2), 1)


# -- properties against brute force -----------------------------------------------------------


@st.composite
def groups_and_presence(draw: st.DrawFn) -> tuple[PoolGroup, dict[str, list[bool]], int]:
    """A group of every matched shape (ALL_PAGES sidecars, trailing pools with smaller pages,
    trailing sidecars, state pools, sometimes an ALL_PAGES allocating pool) and presence for a
    random subset of its matched pools."""
    kv_page = draw(st.sampled_from([1, 2, 4]))
    divisors = [d for d in (1, 2, 4) if kv_page % d == 0]
    pools = [anchor(kv_page)]
    pools += [sidecar(f"c{i}", page_size=kv_page) for i in range(draw(st.integers(0, 2)))]
    for i in range(draw(st.integers(0, 3))):
        page, window = draw(st.sampled_from(divisors)), draw(st.integers(1, 4))
        pools.append(trailing(f"swa{i}", window, page))
        pools.append(trailing(f"swa{i}_state", window, page, role=STATE, source=f"swa{i}"))
        if draw(st.booleans()):
            pools.append(
                trailing(
                    f"swa{i}_side", draw(st.integers(1, 4)), page, role=SIDECAR, source=f"swa{i}"
                )
            )
    if draw(st.booleans()):
        pools.append(PoolSpec("full2", role=ALLOCATING, page_size=draw(st.sampled_from(divisors))))
    group = PoolGroup("drawn", tuple(pools))
    pages = draw(st.integers(0, 8))
    # Every ALL_PAGES pool holds at least the first `floor` anchor pages, so that the bound
    # often leaves room for trailing endpoint sets that are not nested (where min-of-maxima
    # goes wrong); trailing pools are random.
    floor = draw(st.integers(0, pages))
    presence = {}
    for p in group.pools:
        ratio = kv_page // p.page_size
        if p.role != STATE and draw(st.integers(0, 15)) != 0:  # 1 in 16 matched pools unreported
            bits = draw(st.lists(st.booleans(), min_size=pages * ratio, max_size=pages * ratio))
            run = 0 if p.hit_policy == TRAILING_PAGES else floor * ratio
            presence[p.name] = [T] * run + bits[run:]
    return group, presence, pages


def serves(pool: PoolSpec, present: Sequence[bool], ratio: int, e: int) -> bool:
    """Brute force: can `pool` serve a hit ending at anchor endpoint e?"""
    end = e * ratio
    start = max(0, end - pool.window_pages) if pool.hit_policy == TRAILING_PAGES else 0
    return all(present[start:end])


@given(groups_and_presence(), st.sampled_from([ALL_POOLS, ANCHOR_RECOMPUTE_SWA]))
def test_the_agreed_hit_is_the_largest_endpoint_every_required_pool_serves(
    drawn: tuple[PoolGroup, dict[str, list[bool]], int], policy: str
) -> None:
    group, presence, pages = drawn
    if policy == ANCHOR_RECOMPUTE_SWA and any(p.name == "full2" for p in group.pools):
        with pytest.raises(ConfigError, match="full2"):
            agreed_hit(group, presence, pages, policy)
        return
    hit = agreed_hit(group, presence, pages, policy)
    ratio = {p.name: group.anchor.page_size // p.page_size for p in group.pools}
    absent = {p.name: [F] * (pages * ratio[p.name]) for p in group.pools}
    rows = {
        p.name: (p, presence.get(p.name, absent[p.name])) for p in group.pools if p.role != STATE
    }
    for result in hit.pools:  # every pool's endpoint set, by brute force
        pool, present = rows[result.pool]
        assert result.endpoints.legal == {
            e for e in range(pages + 1) if serves(pool, present, ratio[pool.name], e)
        }
    needed = [rows[name] for name in hit.required]
    expected = max(
        e
        for e in range(pages + 1)
        if all(serves(pool, present, ratio[pool.name], e) for pool, present in needed)
    )
    assert hit.hit == expected
    # Min-of-maxima is an upper bound, never below the agreed hit (and the F14 tests show it
    # can be above).
    ends = [p.endpoints.largest for p in hit.pools if p.pool in hit.required]
    assert hit.hit <= min(ends, default=pages)


@given(st.lists(st.tuples(st.integers(1, 3), st.booleans()), max_size=6), st.integers(1, 5))
def test_swa_boundaries_are_the_trailing_endpoints_at_node_ends(
    path: list[tuple[int, bool]], window: int
) -> None:
    pages = [here for length, here in path for _ in range(length)]
    legal = trailing_endpoints(pages, window)
    ends = [sum(length for length, _ in path[: i + 1]) for i in range(len(path))]
    assert swa_boundaries(path, window) == (0, *[e for e in ends if e in legal])


@given(st.integers(0, 8), st.lists(st.sets(st.integers(1, 10)), min_size=1, max_size=4))
def test_intersecting_masks_intersects_the_endpoint_sets(bound: int, sets: list[set[int]]) -> None:
    endpoints = [Endpoints(10, frozenset({0} | s)) for s in sets]
    mask = intersect_masks([e.endpoint_mask(bound) for e in endpoints])
    common = set.intersection(*({0} | s for s in sets))
    assert len(mask) == bound + 1
    assert {e for e, v in enumerate(mask) if v} == {e for e in common if e <= bound}
    assert largest_endpoint(mask) == max(e for e in common if e <= bound)


@given(st.lists(st.integers(1, 3), min_size=2, max_size=3), st.integers(1, 8), st.data())
def test_trailing_pools_agree_on_a_common_endpoint(
    windows: list[int], pages: int, data: st.DataObject
) -> None:
    """Trailing pools alone (a whole anchor): the agreed hit is the largest endpoint all of
    them serve, which min-of-maxima often overshoots when their endpoint sets interleave."""
    group = PoolGroup(
        "trailing", (anchor(), *(trailing(f"sw{i}", w) for i, w in enumerate(windows)))
    )
    presence: dict[str, list[bool]] = {"kv": [T] * pages}
    for i in range(len(windows)):
        presence[f"sw{i}"] = data.draw(st.lists(st.booleans(), min_size=pages, max_size=pages))
    rows = [(group.pool(name), present) for name, present in presence.items()]
    expected = max(
        e for e in range(pages + 1) if all(serves(pool, present, 1, e) for pool, present in rows)
    )
    assert agreed_hit(group, presence, pages).hit == expected
