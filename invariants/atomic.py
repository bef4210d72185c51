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
    a freed window (TOMBSTONE row) only for a     a window freed in a host tier, of a page not
      trailing pool, in L1, of a TREE page, of     in the tree, of part of a node, or of one
      every trailing pool and a node's whole      trailing pool alone
      L1 value
    a live request's L1 prefix holds its window   a hit served over a window with a gap in it
      for `hit_window` pages before its end         (SGLang #29204, F23), or a tombstone of a
                                                  page some request reads

Together the first three are I6 per side pool: every side page is FREE and held by no anchor
page, or held by exactly one with the same owner code, so each pool's PRIVATE and TREE counts
are the anchor's times its ratio (less the freed windows'). Derived pools (sidecars, state)
take their source's indices, so their pages are present exactly where the source's are;
nothing more to record.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from hicache.core.pages import FREE, TREE
from hicache.core.snapshot import NO_PAGES, TOMBSTONE, PoolView, Snapshot, TierView
from hicache.invariants.violation import CheckName, Violation, shown

GROUP_ATOMIC = CheckName("I9", "group_atomic")
WINDOW_TIER = "L1"  # the only tier that frees windows: the host tiers hold whole groups


def check_group_atomic(s: Snapshot) -> list[Violation]:
    """I9 over every tier's side pools (none: no violation)."""
    out: list[Violation] = []
    for tier in s.tiers.values():
        for pool in tier.pools:
            out += _pool_follows_anchor(tier, pool)
        freed = _freed_rows(tier)
        if freed is not None:
            out += _windows_whole(s, tier, freed)
    return out


def _pool_follows_anchor(tier: TierView, pool: PoolView) -> list[Violation]:
    out: list[Violation] = []
    held = pool.held_by
    where = pool.tier
    if held.shape[0] != tier.capacity or held.ndim != 2:
        return [
            GROUP_ATOMIC.violation(
                f"{where}: the map has {held.shape[0]} rows, the anchor {tier.capacity} pages",
                tier=where,
            )
        ]
    taken = held >= 0
    may_free = pool.window and tier.tier == WINDOW_TIER
    bad_range = held[
        (held >= pool.capacity)
        | ((held < 0) & (held != NO_PAGES) & ((held != TOMBSTONE) | (not may_free)))
    ]
    if bad_range.size:
        return [
            GROUP_ATOMIC.violation(
                f"{where}: side pages [{shown(bad_range)}] are outside 0..{pool.capacity - 1}",
                tier=where,
                pages=bad_range,
            )
        ]
    tomb = held == TOMBSTONE
    freed = tomb.all(axis=1)
    # Verify a freed window frees the whole row, and only of a page the tree holds.
    partial = np.flatnonzero((tomb.any(axis=1) & ~freed) | (freed & (tier.owner != TREE)))
    if partial.size:
        out.append(
            GROUP_ATOMIC.violation(
                f"{partial.size} anchor page(s) of {tier.tier} [{shown(partial)}] have their "
                f"{pool.pool} window freed in part, or while not TREE",
                tier=tier.tier,
                pages=partial,
            )
        )
    anchor_free = tier.owner == FREE
    whole = taken.all(axis=1)
    # Verify a FREE anchor page holds no side page, and a held one all `ratio` of them.
    wrong = np.flatnonzero(
        (anchor_free & (taken | tomb).any(axis=1)) | (~anchor_free & ~whole & ~freed)
    )
    if wrong.size:
        out.append(
            GROUP_ATOMIC.violation(
                f"{wrong.size} anchor page(s) of {tier.tier} [{shown(wrong)}] hold {pool.pool} "
                "pages while FREE, or none (or some) while held: the group moved one pool alone",
                tier=tier.tier,
                pages=wrong,
            )
        )
    rows = np.flatnonzero(~anchor_free & whole)
    side = held[rows]
    # Verify each side page has its anchor page's owner code.
    differs = pool.owner[side] != tier.owner[rows][:, None]
    if differs.any():
        odd = side[differs]
        out.append(
            GROUP_ATOMIC.violation(
                f"{odd.size} page(s) of {where} [{shown(odd)}] differ in owner from their anchor "
                f"page: one pool was published or released alone",
                tier=where,
                pages=odd,
            )
        )
    counts = np.bincount(held[taken], minlength=pool.capacity)
    # Verify every non-FREE side page is held by exactly one anchor page.
    leaked = np.flatnonzero((pool.owner != FREE) & (counts == 0))
    if leaked.size:
        out.append(
            GROUP_ATOMIC.violation(
                f"{leaked.size} page(s) of {where} [{shown(leaked)}] are not FREE but no anchor "
                "page holds them (leaked: an eviction freed the anchor only)",
                tier=where,
                pages=leaked,
            )
        )
    shared = np.flatnonzero(counts > 1)
    if shared.size:
        out.append(
            GROUP_ATOMIC.violation(
                f"{shared.size} page(s) of {where} [{shown(shared)}] are held by two anchor pages",
                tier=where,
                pages=shared,
            )
        )
    return out


def _freed_rows(tier: TierView) -> npt.NDArray[np.bool_] | None:
    """Per anchor page of `tier`, whether its window is freed (the first trailing pool's
    rows); None when the tier has no trailing pool whose map fits (reported above)."""
    windows = [p for p in tier.pools if p.window and p.held_by.shape[0] == tier.capacity]
    if not windows:
        return None
    return np.asarray((windows[0].held_by == TOMBSTONE).all(axis=1))


def _windows_whole(s: Snapshot, tier: TierView, freed: npt.NDArray[np.bool_]) -> list[Violation]:
    """A window is freed for every trailing pool, for a node's whole value; and no live
    request's L1 prefix has a freed window within `hit_window` pages of its end."""
    out: list[Violation] = []
    for pool in tier.pools:
        if pool.window and pool.held_by.shape[0] == tier.capacity:
            # Verify every trailing pool's window is freed with the others (one tombstone).
            apart = np.flatnonzero((pool.held_by == TOMBSTONE).all(axis=1) != freed)
            if apart.size:
                out.append(
                    GROUP_ATOMIC.violation(
                        f"anchor page(s) of {tier.tier} [{shown(apart)}] have the {pool.pool} "
                        f"window freed apart from the other trailing pools'",
                        tier=tier.tier,
                        pages=apart,
                    )
                )
    if not freed.any():
        return out
    for node in s.nodes:
        value = node.values.get(tier.tier)
        if value is None or not value.size or value.min() < 0 or value.max() >= tier.capacity:
            continue  # ranges are I3's and S4's to report
        gone = freed[value]
        # Verify a window is freed per node: the hit rules read node ends (spec/pools.md).
        if gone.any() and not gone.all():
            out.append(
                GROUP_ATOMIC.violation(
                    f"node {node.node_id}'s window is freed for {int(gone.sum())} of its "
                    f"{value.size} {tier.tier} pages: a window is freed for a whole node",
                    tier=tier.tier,
                    pages=value[gone],
                    nodes=(node.node_id,),
                )
            )
    if tier.hit_window:
        out += _prefixes_hold_their_window(s, tier, freed)
    return out


def _prefixes_hold_their_window(
    s: Snapshot, tier: TierView, freed: npt.NDArray[np.bool_]
) -> list[Violation]:
    out: list[Violation] = []
    for req in s.requests:
        path = s.path_to_root(req.locked_node_id)
        values = [s.by_id[n].values.get(tier.tier) for n in reversed(path or ())]
        if not path or any(v is None for v in values):
            continue  # the request holds no L1 prefix (or S1/S7 report its path)
        prefix = np.concatenate([v for v in values if v is not None])
        window = prefix[max(0, prefix.size - tier.hit_window) :]
        if window.size and (window.min() < 0 or window.max() >= tier.capacity):
            continue
        # Verify the window before the prefix's end is whole (SGLang's SWA validator).
        gap = window[freed[window]]
        if gap.size:
            out.append(
                GROUP_ATOMIC.violation(
                    f"request {req.request_id}'s {tier.tier} prefix ({prefix.size} pages) has a "
                    f"freed window within its last {tier.hit_window} pages [{shown(gap)}]",
                    tier=tier.tier,
                    pages=gap,
                    nodes=(req.locked_node_id,),
                )
            )
    return out


__all__ = ["GROUP_ATOMIC", "check_group_atomic"]
