"""I9 `group_atomic`: a tier's pool group moves as one (spec/invariants.md).

A control plane with a pool group (hicache/pools/tierpools.py) keeps the tree's values in
anchor pages; every side pool (an allocating pool that follows the anchor, dsv4's `swa`)
holds `ratio` pages per anchor page. The snapshot records, per tier and side pool, the pool's
owner codes and which side pages each anchor page holds (`PoolView.held_by`). A single-pool
plane records no side pool, and the check has nothing to read.

    rule                                         what breaks it
    -------------------------------------------  ----------------------------------------------
    anchor page FREE  <=>  it holds no side page  a group free that frees the anchor and keeps
                                                  a side pool's pages (B10), or the reverse
    owner(side page) == owner(its anchor page)    a publish or release of one pool only
    a non-FREE side page has one anchor page      a side page leaked (held by none) or shared
                                                  by two anchor pages

Together they are I6 per side pool: every side page is FREE and held by no anchor page, or
held by exactly one with the same owner code, so each pool's PRIVATE and TREE counts are the
anchor's times its ratio. Derived pools (sidecars, state) take their source's indices, so
their pages are present exactly where the source's are; nothing more to record.
"""

from __future__ import annotations

import numpy as np

from hicache.invariants.violation import CheckName, Violation, shown
from hicache.pages import FREE
from hicache.snapshot import PoolView, Snapshot, TierView

GROUP_ATOMIC = CheckName("I9", "group_atomic")


def check_group_atomic(s: Snapshot) -> list[Violation]:
    """I9 over every tier's side pools (none: no violation)."""
    out: list[Violation] = []
    for tier in s.tiers.values():
        for pool in tier.pools:
            out += _pool_follows_anchor(tier, pool)
    return out


def _pool_follows_anchor(tier: TierView, pool: PoolView) -> list[Violation]:
    out: list[Violation] = []
    held = pool.held_by
    where = pool.tier
    if held.shape[0] != tier.capacity or held.ndim != 2:
        return [GROUP_ATOMIC.violation(f"{where}: the map has {held.shape[0]} rows, the anchor "
                                       f"{tier.capacity} pages", tier=where)]
    taken = held != -1
    bad_range = held[taken & ((held < 0) | (held >= pool.capacity))]
    if bad_range.size:
        return [GROUP_ATOMIC.violation(f"{where}: side pages [{shown(bad_range)}] are outside "
                                       f"0..{pool.capacity - 1}", tier=where, pages=bad_range)]
    anchor_free = tier.owner == FREE
    whole = taken.all(axis=1)
    # Verify a FREE anchor page holds no side page, and a held one all `ratio` of them.
    wrong = np.flatnonzero((anchor_free & taken.any(axis=1)) | (~anchor_free & ~whole))
    if wrong.size:
        out.append(GROUP_ATOMIC.violation(
            f"{wrong.size} anchor page(s) of {tier.tier} [{shown(wrong)}] hold {pool.pool} pages "
            f"while FREE, or none (or some) while held: the group moved one pool alone",
            tier=tier.tier, pages=wrong))
    rows = np.flatnonzero(~anchor_free & whole)
    side = held[rows]
    # Verify each side page has its anchor page's owner code.
    differs = pool.owner[side] != tier.owner[rows][:, None]
    if differs.any():
        odd = side[differs]
        out.append(GROUP_ATOMIC.violation(
            f"{odd.size} page(s) of {where} [{shown(odd)}] differ in owner from their anchor "
            f"page: one pool was published or released alone", tier=where, pages=odd))
    counts = np.bincount(held[taken], minlength=pool.capacity)
    # Verify every non-FREE side page is held by exactly one anchor page.
    leaked = np.flatnonzero((pool.owner != FREE) & (counts == 0))
    if leaked.size:
        out.append(GROUP_ATOMIC.violation(
            f"{leaked.size} page(s) of {where} [{shown(leaked)}] are not FREE but no anchor page "
            f"holds them (leaked: an eviction freed the anchor only)", tier=where, pages=leaked))
    shared = np.flatnonzero(counts > 1)
    if shared.size:
        out.append(GROUP_ATOMIC.violation(
            f"{shared.size} page(s) of {where} [{shown(shared)}] are held by two anchor pages",
            tier=where, pages=shared))
    return out


__all__ = ["GROUP_ATOMIC", "check_group_atomic"]
