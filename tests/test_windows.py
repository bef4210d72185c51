"""Freed windows (SWA tombstones): `TierPools.tombstone` frees a TREE anchor page's trailing
side pools (dsv4's `swa`, and the state pools on its indices) and keeps the anchor page and
its sidecars (spec/pools.md, "Freed windows").
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hicache.errors import IllegalTransition
from hicache.pages import FREE, TREE, Pages
from hicache.pools.presets import group
from hicache.pools.spec import ALL_PAGES, PoolGroup
from hicache.pools.tierpools import TOMBSTONE, TierPools

DSV4 = group("dsv4-tiny")
DSV41 = group("dsv41-tiny")


def published(tp: TierPools, n: int) -> Pages:
    p = tp.reserve(n)
    tp.publish(p)
    return p


@pytest.mark.parametrize("g", [DSV4, DSV41], ids=lambda g: g.name)
def test_tombstone_frees_the_window_and_keeps_the_anchor_and_sidecars(g: PoolGroup) -> None:
    tp = TierPools("L1", g, {"kv": 4, "swa": 4 * g.ratio("swa")})
    p = published(tp, 3)
    swa = tp.held_by["swa"][p[:2]].reshape(-1).copy()
    tp.tombstone(p[:2])
    assert tp.window_present(p).tolist() == [False, False, True]
    assert (tp.owner[p] == TREE).all()
    assert (tp.group_table.tables["swa"].owner[swa] == FREE).all()
    mapped = tp.pool_pages(p)
    r = g.ratio("swa")
    for spec in tp.group.pools:  # the backed-up pools (no request-scoped pair ring)
        if spec.source == "kv":  # the anchor and its sidecars stay on the anchor's indices
            assert mapped[spec.name].tolist() == p.tolist()
        else:  # swa and the state pools on its indices: the first two windows are gone
            assert (mapped[spec.name][:2 * r] == TOMBSTONE).all()
            assert (mapped[spec.name][2 * r:] >= 0).all()
    assert tp.window_pages_free() == 3  # 4 anchor pages' windows, one held
    tp.free(p)  # the freed windows are skipped, the rest freed
    assert tp.free_count == 4 and (tp.group_table.tables["swa"].owner == FREE).all()


def test_tombstone_refuses_with_nothing_changed() -> None:
    tp = TierPools("L1", DSV4, {"kv": 4, "swa": 4})
    p = published(tp, 2)
    private = tp.reserve(1)
    tp.tombstone(p[:1])
    before = tp.group_table.tables["swa"].owner.copy()
    for bad in ([int(p[0])], [int(private[0])], [int(p[1]), int(p[1])], [9]):
        with pytest.raises(IllegalTransition):
            tp.tombstone(np.asarray(bad, dtype=np.int64))
    assert (tp.group_table.tables["swa"].owner == before).all()
    assert tp.window_present(p).tolist() == [False, True]


def test_a_group_without_a_window_has_nothing_to_tombstone() -> None:
    flat = PoolGroup("flat", tuple(dataclasses.replace(p, hit_policy=ALL_PAGES, window_pages=0)
                                   for p in DSV4.pools))
    tp = TierPools("L1", flat, {"kv": 4, "swa": 4})
    p = published(tp, 1)
    assert tp.window_present(p).tolist() == [True]
    with pytest.raises(IllegalTransition):
        tp.tombstone(p)
