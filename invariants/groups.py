"""I6 per pool of a pool group, and the rollback of a failed group reservation, as pure
predicates over a `GroupView`: a copy of a group table's page tables (one per allocating
pool) and of the caller's records of what it holds.

    record     its pages                                          owner code it implies
    ---------  -------------------------------------------------  ---------------------
    reserved   reservations the caller holds (reserve_group)      PRIVATE
    published  reservations the caller published (node values)   TREE
    free list  pages whose owner code is FREE                     FREE

    check                       statement
    --------------------------  ---------------------------------------------------------------
    check_group_conservation    I6 in every allocating pool: each page 0..capacity-1 counted
                                once (free, reserved or published), and the table agrees
    check_reserve_rolled_back   a failed reserve_group left no page PRIVATE that was not
                                PRIVATE before it (the caller took `before` just before it)

The records are `Mapping[str, Pages]` per reservation (a `GroupPages.by_pool`). In a
violation, `ops` are indices into the reserved records and `nodes` into the published ones.

These checks are not in the plane registry (`registry.CHECKS`): they read the records of a
caller holding a `GroupTable` directly (the group-table state machine in tests/). A control
plane's pool group (hicache/pools/tierpools.py) is checked by I9 `group_atomic` (atomic.py),
which is registered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hicache.core.pages import PRIVATE, Pages, PageTable, pages
from hicache.invariants.claims import TierClaims, _joined
from hicache.invariants.ownership import PAGE_CONSERVATION, _conserved
from hicache.invariants.violation import CheckName, Violation, shown

RESERVE_ROLLED_BACK = CheckName("I6", "reserve_group_rolled_back")


@dataclass(frozen=True)
class PoolRows:
    """One allocating pool: its table's owner codes (a copy) and the records' pages."""

    tier: str  # "<tier>.<pool>", as the pool's page table names itself
    capacity: int  # pages
    owner: npt.NDArray[np.uint8]
    reserved: tuple[Pages, ...]  # one array per reserved record
    published: tuple[Pages, ...]  # one array per published record


@dataclass(frozen=True)
class GroupView:
    """A group table's allocating pools, in sorted name order."""

    pools: Mapping[str, PoolRows]


def group_view(
    tables: Mapping[str, PageTable],
    reserved: Sequence[Mapping[str, Pages]] = (),
    published: Sequence[Mapping[str, Pages]] = (),
) -> GroupView:
    """A `GroupView` of `tables` (a `GroupTable.tables`) and the caller's records."""
    return GroupView(
        {
            name: PoolRows(
                t.tier,
                t.capacity,
                t.owner.copy(),
                tuple(pages(r.get(name, ())) for r in reserved),
                tuple(pages(r.get(name, ())) for r in published),
            )
            for name, t in tables.items()
        }
    )


def check_group_conservation(view: GroupView) -> list[Violation]:
    """I6 `page_conservation` in every allocating pool: free + reserved + published ==
    capacity, every page counted once, and the table's PRIVATE and TREE counts equal the
    records'. A page PRIVATE in the table that no record holds is a leak."""
    out: list[Violation] = []
    for rows in view.pools.values():
        out += _conserved(_claims(rows))
    return out


def check_reserve_rolled_back(before: GroupView, after: GroupView) -> list[Violation]:
    """After a failed `reserve_group`: every page PRIVATE in any pool was PRIVATE before the
    call (the pools it reserved were released again). `before` and `after` name the same
    pools."""
    out: list[Violation] = []
    if list(before.pools) != list(after.pools):
        return [
            RESERVE_ROLLED_BACK.violation(
                f"the views name different pools: {list(before.pools)} then {list(after.pools)}"
            )
        ]
    for name, rows in after.pools.items():
        was, now = before.pools[name].owner == PRIVATE, rows.owner == PRIVATE
        if was.size != now.size:
            out.append(
                RESERVE_ROLLED_BACK.violation(
                    f"{rows.tier} has {now.size} pages, {was.size} before", tier=rows.tier
                )
            )
            continue
        left = np.flatnonzero(now & ~was)
        if left.size:
            out.append(
                RESERVE_ROLLED_BACK.violation(
                    f"a failed reserve_group left {left.size} page(s) of {rows.tier} PRIVATE "
                    f"([{shown(left)}]): its reservation of pool {name!r} was not rolled back",
                    tier=rows.tier,
                    pages=left,
                )
            )
    return out


def _claims(rows: PoolRows) -> TierClaims:
    """The pool's records in the form I6 reads (reserved records as ops, published as nodes)."""
    tree, tree_ids = _joined(list(enumerate(rows.published)))
    private, private_ids = _joined(list(enumerate(rows.reserved)))
    return TierClaims(
        rows.tier, rows.capacity, rows.owner, tree, tree_ids, private, private_ids, pages(), pages()
    )


__all__ = [
    "PAGE_CONSERVATION",
    "RESERVE_ROLLED_BACK",
    "GroupView",
    "PoolRows",
    "check_group_conservation",
    "check_reserve_rolled_back",
    "group_view",
]
