"""The checks' fast paths: plain-Python all-clears in front of the array-wide reports.

I1, I6 and S5 skip every tier `hicache.invariants.claims.unsettled` does not name, and I3's
node clause skips its arrays when `_nodes_aligned` holds. A fast path may only save time: on
any snapshot, valid or broken, `check_all` must find exactly what it finds with every tier
sent to the full checks. The claims index is gathered once per snapshot, whichever checks
read it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hicache.bench.invariants import synthetic_snapshot
from hicache.core.pages import FREE, PRIVATE, TREE, pages
from hicache.core.snapshot import Snapshot
from hicache.invariants import Violation, alignment, check_all, claims, ownership, structure

Corrupt = Callable[[Snapshot, str, st.DataObject], Snapshot]


def with_tier(s: Snapshot, tier: str, **changes: object) -> Snapshot:
    view = dataclasses.replace(s.tiers[tier], **changes)  # type: ignore[arg-type]
    return dataclasses.replace(s, tiers={**s.tiers, tier: view})


def with_value(s: Snapshot, tier: str, data: st.DataObject, page: int) -> Snapshot:
    """`s` with one page of one node's `tier` value replaced by `page`."""
    holders = [n for n in s.nodes if (v := n.values.get(tier)) is not None and v.size]
    if not holders:
        return s
    n = data.draw(st.sampled_from(holders))
    value = pages(n.values[tier]).copy()
    value[data.draw(st.integers(0, value.size - 1))] = page
    changed = dataclasses.replace(n, values={**n.values, tier: value})
    return dataclasses.replace(s, nodes=tuple(changed if m is n else m for m in s.nodes))


def flip_owner(s: Snapshot, tier: str, data: st.DataObject) -> Snapshot:
    o = s.tiers[tier].owner.copy()
    o[data.draw(st.integers(0, o.size - 1))] = data.draw(st.sampled_from([FREE, PRIVATE, TREE, 3]))
    return with_tier(s, tier, owner=o)


def reuse_a_tree_page(s: Snapshot, tier: str, data: st.DataObject) -> Snapshot:
    """A node value names a page another record holds (or a free one), the table unchanged:
    the counts can still add up (a duplicate leaves one TREE page unclaimed)."""
    owner = s.tiers[tier].owner
    return with_value(s, tier, data, data.draw(st.integers(0, owner.size - 1)))


def page_outside(s: Snapshot, tier: str, data: st.DataObject) -> Snapshot:
    cap = s.tiers[tier].capacity
    return with_value(s, tier, data, data.draw(st.sampled_from([-1, cap, cap + 5])))


def short_table(s: Snapshot, tier: str, data: st.DataObject) -> Snapshot:
    return with_tier(s, tier, owner=s.tiers[tier].owner[:-1].copy())


def drop_an_op(s: Snapshot, tier: str, data: st.DataObject) -> Snapshot:
    """An op vanishes from the table, its target pages still PRIVATE (a leak)."""
    return dataclasses.replace(s, ops=s.ops[1:]) if s.ops else s


CORRUPTIONS: tuple[Corrupt, ...] = (
    flip_owner,
    reuse_a_tree_page,
    page_outside,
    short_table,
    drop_an_op,
)


def full_checks(s: Snapshot) -> list[Violation]:
    """`check_all` with every fast path off: every tier unsettled, no node clause skipped."""
    with pytest.MonkeyPatch.context() as mp:
        for module in (ownership, structure):
            mp.setattr(module, "unsettled", lambda snap: list(snap.tiers))
        mp.setattr(alignment, "_nodes_aligned", lambda snap: False)
        return check_all(s)


@given(st.integers(22, 700), st.integers(0, 2**16), st.sampled_from(CORRUPTIONS), st.data())
def test_fast_paths_find_exactly_what_the_full_checks_find(
    n_pages: int, seed: int, corrupt: Corrupt, data: st.DataObject
) -> None:
    """Valid or broken, small tier (plain Python) or large (numpy): the same violations."""
    # No digests: I4 has no fast path, and the synthetic ones cannot read a corrupted page.
    s = dataclasses.replace(synthetic_snapshot(n_pages, seed=seed, node_pages=4), digests=None)
    tier = data.draw(st.sampled_from(list(s.tiers)))
    broken = corrupt(s, tier, data)
    assert check_all(broken) == full_checks(broken)
    assert check_all(s) == full_checks(s) == []


def test_pigeonhole_duplicate_is_not_settled() -> None:
    """A page twice in the tree plus one TREE page no node holds: TREE count, PRIVATE count and
    FREE count all match the records, yet S5 and I6 must fire."""
    s = synthetic_snapshot(100, node_pages=4)
    n = next(n for n in s.nodes if (v := n.values.get("L2")) is not None and v.size >= 2)
    value = pages(n.values["L2"]).copy()
    value[1] = value[0]
    changed = dataclasses.replace(n, values={**n.values, "L2": value})
    broken = dataclasses.replace(s, nodes=tuple(changed if m is n else m for m in s.nodes))
    assert claims.unsettled(broken) == ["L2"]
    found = {v.invariant for v in check_all(broken)}
    assert {"S5", "I6"} <= found, found


@pytest.mark.parametrize("n_pages", [64, 2_000])  # below and above claims.SMALL_TIER
def test_claims_are_gathered_once_per_snapshot(
    monkeypatch: pytest.MonkeyPatch, n_pages: int
) -> None:
    """I1, I6 and S5 read one claims index per tier and one all-clear per snapshot, even when
    every tier is broken (so each of them reads every tier's claims)."""
    s = synthetic_snapshot(n_pages, node_pages=4)
    for tier in s.tiers:
        o = s.tiers[tier].owner.copy()
        o[np.flatnonzero(o == FREE)[0]] = PRIVATE  # a leaked page in every tier
        s = with_tier(s, tier, owner=o)
    calls: list[str] = []

    def counted(name: str) -> Callable[..., object]:
        real = getattr(claims, name)

        def call(*args: object) -> object:
            calls.append(name)
            return real(*args)

        return call

    for name in ("_gather", "_unsettled"):
        monkeypatch.setattr(claims, name, counted(name))
    assert [v.invariant for v in check_all(s)] == ["I6"] * 3
    assert sorted(calls) == ["_gather"] * 3 + ["_unsettled"]


def test_the_invariants_bench_times_each_run_on_a_fresh_snapshot() -> None:
    """`hicache bench invariants` repeats each check: every run must start with an empty
    memo, or the repeats would time a lookup of what the first run derived."""
    from hicache.bench.invariants import _median_us

    s = synthetic_snapshot(100, node_pages=4)
    seen: list[Snapshot] = []

    def run(fresh: Snapshot) -> None:
        assert fresh.memo == {} and fresh.nodes is s.nodes
        seen.append(fresh)
        fresh.memo["ran"] = True

    _median_us(run, s, 3)
    assert len({id(x) for x in seen}) == 3 and all(x is not s for x in seen)
