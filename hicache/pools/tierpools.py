"""One tier's pool group behind the page-table interface: the control plane's view of a group.

The tree's value in a tier is the *anchor's* pages. Every other allocating pool that holds
part of a node's value (a backupable side pool: dsv4's `swa`) follows the anchor: each anchor
page holds `ratio = anchor.page_size // pool.page_size` pages of it, reserved, published,
released and freed with the anchor page, in one group move. Derived pools (sidecars, state)
take their source's indices. So the executor and the control plane keep calling `reserve`,
`publish`, `release` and `free` on anchor pages, as on a `hicache.core.pages.PageTable`, and every
pool of the group moves with them.

    anchor page a     kv (anchor)     swa (ratio 2)              c4, c128      c4_state
    -------------     -----------     -----------------------    ----------    ---------
    owner_kv(a)       a               held_by["swa"][a] = (s,t)  a (kv's)      (s,t) (swa's)

A request-scoped allocating pool (`backupable = False`: dsv41's pair ring) is no part of a
node's value, so this table does not hold it.

Contract for callers (spec/invariants.md, I9 `group_atomic`, states what always holds):

- `free_count` is how many anchor pages a group reservation could take now: the minimum over
  the allocating pools of `free // ratio`. A capacity decision made from it (the plane's
  make-room eviction) is one for every pool.
- `reserve(n)` is one `GroupTable.reserve_group` (sorted pool order, reverse rollback): all
  or nothing, `OutOfPages` naming the pool (`<tier>.<pool>`), per-pool faults through the
  table's `fault` hook (`PoolFaults`).
- `publish`, `release` and `free` check every pool before they change one: a refused move
  raises `IllegalTransition` with no pool changed.
- `pool_pages(anchor_pages)` gives, for every pool of the group, the pages it holds for
  those anchor pages, in anchor order: the data plane's interface.
- `tombstone(p)` frees the *window* of TREE anchor pages `p`: the pages of every trailing
  side pool (hit policy `TRAILING_PAGES`: dsv4's `swa`, and with it the state pools on its
  indices) go TREE -> FREE and `held_by` records `TOMBSTONE`; the anchor page and its
  sidecars stay. A tombstoned row is skipped by `free` (nothing left to free) and reported
  as `TOMBSTONE` by `pool_pages` (the data plane refuses to move it). `window_present(p)`
  says which anchor pages still hold their window. A freed window comes back with a new
  reservation (the node evicted and restored) or from a request that recomputed the same
  tokens: `revive(p, donor)` moves the donor's window under `p` before the donor is
  released (its rows read `TOMBSTONE` for that moment: release skips them too). Both bump
  the anchor pages' `generation`: (page, generation) names a group page's content, which a
  freed or revived window changes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import numpy as np
import numpy.typing as npt

from hicache.core.pages import FREE, PRIVATE, TREE, Pages, PageTable, pages
from hicache.core.snapshot import NO_PAGES, TOMBSTONE, PoolView
from hicache.errors import ConfigError, IllegalTransition, OutOfPages
from hicache.pools.spec import ALLOCATING, TRAILING_PAGES, PoolGroup
from hicache.pools.table import GroupPages, GroupTable, Reclaim, ReserveFault
from hicache.pools.tiertable import SINGLE_POOL_NAME, TierTable

MOVED_OUT_OF = {"publish": PRIVATE, "release": PRIVATE, "free": TREE}
"""The state each group move takes anchor pages out of (PageTable's transitions)."""


def window_pools(group: PoolGroup) -> tuple[str, ...]:
    """The trailing side pools of `group.backed_up()` (allocating, `TRAILING_PAGES`): what a
    freed window frees. Empty for a group without one."""
    g = group.backed_up()
    return tuple(
        p.name for p in g.allocating if p.role == ALLOCATING and p.hit_policy == TRAILING_PAGES
    )


def tier_capacities(
    group: PoolGroup,
    tier: str,
    anchor_pages: int,
    given: Mapping[str, Mapping[str, int]] | None = None,
) -> dict[str, int]:
    """Capacity in its own pages of every allocating pool of `group.backed_up()` in `tier`:
    `given[tier][pool]`, else `anchor_pages * ratio` (the anchor: `anchor_pages`, always).
    Other pools named in `given` are passed on, for `GroupTable` to refuse by name."""
    g = group.backed_up()
    mine = dict((given or {}).get(tier, {}))
    if g.anchor.name in mine and mine[g.anchor.name] != anchor_pages:
        raise ConfigError(
            f"pool_capacities.{tier}.{g.anchor.name}",
            f"the anchor's capacity is the tier's ({anchor_pages}); leave it out",
        )
    sizes = {
        p.name: anchor_pages
        if p.name == g.anchor.name
        else mine.get(p.name, anchor_pages * g.ratio(p.name))
        for p in g.allocating
    }
    return {**mine, **sizes}  # a pool named but not allocating: GroupTable names it


class TierPools(TierTable):
    """A `TierTable` of anchor pages whose every move takes the group's other pools along.

    `owner`, `generation` and `capacity` are the anchor pool's (the same arrays);
    `held_by[pool][a]` are the `ratio` pages of side pool `pool` that anchor page `a` holds
    (`NO_PAGES` while `a` is FREE)."""

    def __init__(
        self,
        tier: str,
        group: PoolGroup,
        capacity_pages: Mapping[str, int],
        faults: ReserveFault | None = None,
    ) -> None:
        g = group.backed_up()
        anchor = g.anchor.name
        if anchor not in capacity_pages:
            raise ConfigError(f"{tier}.{anchor}.capacity_pages", "the anchor needs a capacity")
        super().__init__(tier, capacity_pages[anchor], anchor)
        self.group = g
        self.group_name = g.name
        self.anchor = anchor
        self.group_table = GroupTable(tier, g, capacity_pages, faults)
        anchor_table = self.group_table.tables[anchor]
        self.owner, self.generation = anchor_table.owner, anchor_table.generation
        self.ratios = {p.name: g.ratio(p.name) for p in g.allocating if p.role == ALLOCATING}
        self.held_by: dict[str, npt.NDArray[np.int64]] = {
            name: np.full((self.capacity, r), NO_PAGES, dtype=np.int64)
            for name, r in self.ratios.items()
        }
        self.window = window_pools(g)
        """The trailing side pools: what `tombstone` frees (empty: nothing to tombstone)."""

    def clone(self) -> TierPools:
        """An independent copy: every pool's table cloned, the anchor's arrays shared with
        the copy's own owner / generation as in the original, the held-by maps copied."""
        gt: GroupTable = object.__new__(GroupTable)
        gt.__dict__.update(self.group_table.__dict__)
        gt.tables = {name: table.clone() for name, table in self.group_table.tables.items()}
        new: TierPools = object.__new__(TierPools)
        new.__dict__.update(self.__dict__)
        new.group_table = gt
        new.owner, new.generation = gt.tables[self.anchor].owner, gt.tables[self.anchor].generation
        new.held_by = {name: held.copy() for name, held in self.held_by.items()}
        return new

    # -- the group interface (a TierTable answers it for a group of one) --------------------------

    @property
    def pools(self) -> tuple[str, ...]:
        """The names of the group's pools, in group order (anchor first)."""
        return tuple(p.name for p in self.group.pools)

    def pool_tables(self) -> Mapping[str, PageTable]:
        """The page table of every allocating pool of the group (sorted pool order)."""
        return self.group_table.tables

    def set_reserve_fault(self, fault: ReserveFault | None) -> None:
        """The group table's `fault` hook: asked before each reservation attempt of each
        allocating pool (`GroupTable.reserve_group`)."""
        self.group_table.fault = fault

    @contextmanager
    def faults_off(self) -> Iterator[None]:
        """`TierTable.faults_off` for the group table's hook."""
        fault, self.group_table.fault = self.group_table.fault, None
        try:
            yield
        finally:
            self.group_table.fault = fault

    def side_key(self) -> tuple[object, ...]:
        """The side pools, whole: each one's owners and generations, and the side pages each
        anchor page holds (`held_by`: a freed window is a TOMBSTONE there)."""
        side = self.group_table.tables
        return tuple(
            [
                (name, side[name].owner.tobytes(), side[name].generation.tobytes(), held.tobytes())
                for name, held in self.held_by.items()
            ]
        )

    # -- counts ------------------------------------------------------------------------------------

    @property
    def free_count(self) -> int:
        """Anchor pages a group reservation could take now (the minimum over the pools)."""
        free = self.group_table.tables[self.anchor].free_count
        for name, r in self.ratios.items():
            free = min(free, self.group_table.tables[name].free_count // r)
        return free

    def free_pages_by_pool(self) -> dict[str, int]:
        """FREE pages per allocating pool (in its own pages); derived pools are skipped."""
        return self.group_table.free_pages_by_pool()

    # -- ownership transitions of anchor pages -----------------------------------------------------

    def reserve(self, n: int, reclaim: Reclaim | None = None) -> Pages:
        """FREE -> PRIVATE for `n` anchor pages and their side pages, all or nothing (one
        `reserve_group`; `reclaim(pool, pages_short)` at most once per pool)."""
        if n < 0:
            raise ValueError(f"cannot reserve {n} pages")
        want = {self.anchor: n, **{name: n * r for name, r in self.ratios.items()}}
        gp = self.group_table.reserve_group(want, reclaim)
        chosen = gp.by_pool[self.anchor]
        for name, r in self.ratios.items():
            self.held_by[name][chosen] = gp.by_pool[name].reshape(-1, r)
        return chosen

    def reserve_exact(self, chosen: Pages) -> None:
        """FREE -> PRIVATE for exactly these anchor pages; the side pools' pages are chosen
        as `reserve` chooses them (replay, tests). OutOfPages / IllegalTransition: nothing
        changed."""
        chosen = pages(chosen)
        for name, r in self.ratios.items():
            table = self.group_table.tables[name]
            # Verify every side pool can serve before the anchor changes.
            if table.free_count < chosen.size * r:
                raise OutOfPages(table.tier, chosen.size * r, table.free_count)
        self.group_table.tables[self.anchor].reserve_exact(chosen)
        for name, r in self.ratios.items():
            side = self.group_table.tables[name].reserve(chosen.size * r)
            self.held_by[name][chosen] = side.reshape(-1, r)

    def publish(self, p: Pages) -> None:
        """PRIVATE -> TREE for anchor pages `p` and every side page they hold."""
        self.group_table.publish_group(self._group_pages(p, "publish"))

    def release(self, p: Pages) -> None:
        """PRIVATE -> FREE for anchor pages `p` and every side page they hold."""
        self.group_table.release_group(self._group_pages(p, "release"))
        self._forget(p)

    def free(self, p: Pages) -> None:
        """TREE -> FREE for anchor pages `p` and every side page they hold (eviction)."""
        self.group_table.free_group(self._group_pages(p, "free"))
        self._forget(p)

    # -- windows (trailing side pools) -------------------------------------------------------------

    def window_present(self, p: Pages) -> npt.NDArray[np.bool_]:
        """Per anchor page of `p`: whether it holds its window (every trailing side pool's
        pages). True for every page of a group without trailing pools."""
        p = pages(p)
        present = np.ones(p.size, dtype=bool)
        for name in self.window:
            present &= self.held_by[name][p, 0] != TOMBSTONE
        return present

    def window_pages_free(self) -> int:
        """Anchor pages whose window the trailing pools could give now: the minimum over them
        of `free // ratio` (the anchor's capacity when there is none)."""
        free = self.capacity
        for name in self.window:
            free = min(free, self.group_table.tables[name].free_count // self.ratios[name])
        return free

    def tombstone(self, p: Pages) -> None:
        """TREE -> FREE for the trailing side pools' pages of TREE anchor pages `p`, which keep
        their anchor and sidecar pages. IllegalTransition, nothing changed: a page not TREE,
        out of range or named twice, one already tombstoned, or a group with no window."""
        p = pages(p)
        if not self.window:
            raise IllegalTransition(
                "tombstone", self.tier, "-", f"group {self.group.name!r} has no trailing side pool"
            )
        self.group_table.tables[self.anchor].check_move(p, TREE, "tombstone")
        gone = p[~self.window_present(p)]
        if gone.size:
            raise IllegalTransition(
                "tombstone",
                self.tier,
                "TREE",
                f"anchor page {int(gone[0])}'s window is already freed",
            )
        for name in self.window:
            self.group_table.tables[name].free(self.held_by[name][p].reshape(-1))
            self.held_by[name][p] = TOMBSTONE
        self.generation[p] += np.uint64(1)  # the group page's content changed (I4's cache key)

    def revive(self, p: Pages, donor: Pages) -> None:
        """Give TREE anchor pages `p`, whose windows are freed, the windows of PRIVATE anchor
        pages `donor` (a request's copy of the same tokens, about to be discarded): the
        donor's trailing pool pages go PRIVATE -> TREE under `p`, and the donor keeps no
        window (its release then frees only its anchor and sidecar pages). IllegalTransition,
        nothing changed: lengths differ, `p` not TREE with windows freed, or `donor` not
        PRIVATE with its windows."""
        p, donor = pages(p), pages(donor)
        anchor = self.group_table.tables[self.anchor]
        if p.size != donor.size:
            raise IllegalTransition(
                "revive", self.tier, "-", f"{p.size} pages, {donor.size} donors"
            )
        anchor.check_move(p, TREE, "revive")
        anchor.check_move(donor, PRIVATE, "revive")
        if self.window_present(p).any() or not self.window_present(donor).all():
            raise IllegalTransition(
                "revive",
                self.tier,
                "TREE",
                "needs pages whose windows are freed and donors that hold theirs",
            )
        for name in self.window:
            self.group_table.tables[name].publish(self.held_by[name][donor].reshape(-1))
            self.held_by[name][p] = self.held_by[name][donor]
            self.held_by[name][donor] = TOMBSTONE
        self.generation[p] += np.uint64(1)  # whole again, with the donor's window pages

    # -- the data plane's interface and the snapshot -----------------------------------------------

    def pool_pages(self, anchor_pages: Pages) -> dict[str, Pages]:
        """For every pool of the group (table order), the pages it holds for `anchor_pages`,
        in anchor order: the anchor's are `anchor_pages`, a side pool's `ratio` per anchor
        page, a derived pool's its source's; `TOMBSTONE` for a freed window's pages (every
        pool on a trailing pool's indices). IllegalTransition if an anchor page is FREE."""
        p = pages(anchor_pages)
        # Verify each anchor page is in range and named once before it indexes `held_by`.
        if p.size and (p.min() < 0 or p.max() >= self.capacity or np.unique(p).size != p.size):
            raise IllegalTransition(
                "pool_pages",
                self.tier,
                "-",
                f"anchor pages must be distinct, in 0..{self.capacity - 1}; got {p.tolist()}",
            )
        free = p[self.owner[p] == FREE]
        if free.size:
            raise IllegalTransition(
                "pool_pages",
                self.tier,
                "FREE",
                f"anchor page {int(free[0])} holds no pages (it is FREE)",
            )
        own: dict[str, Pages] = {self.anchor: p}
        for name, held in self.held_by.items():
            own[name] = held[p].reshape(-1)
        return {spec.name: own[spec.source] for spec in self.group.pools}

    def pool_views(self) -> tuple[PoolView, ...]:
        """Each side pool's owner codes and `held_by` map, copied (the snapshot's records)."""
        tables = self.group_table.tables
        return tuple(
            PoolView(
                name,
                tables[name].tier,
                tables[name].capacity,
                tables[name].owner.copy(),
                held.copy(),
                name in self.window,
            )
            for name, held in self.held_by.items()
        )

    # -- internals ---------------------------------------------------------------------------------

    def _group_pages(self, p: Pages, event: str) -> GroupPages:
        """The group reservation anchor pages `p` stand for. An anchor page out of range,
        named twice or not in the state `event` moves out of is refused by the anchor's own
        table (IllegalTransition, nothing changed)."""
        p = pages(p)
        self.group_table.tables[self.anchor].check_move(p, MOVED_OUT_OF[event], event)
        by_pool: dict[str, Pages] = {self.anchor: p}
        for name, held in self.held_by.items():
            rows = held[p]
            # Verify a PRIVATE or TREE anchor page holds its side pages (reserve set them);
            # a freed window (only ever of a TREE page) has nothing left to move.
            assert not (rows == NO_PAGES).any(), f"{self.tier}: anchor pages hold no {name} pages"
            by_pool[name] = rows[rows[:, 0] != TOMBSTONE].reshape(-1)
        return GroupPages(self.tier, by_pool)

    def _forget(self, p: Pages) -> None:
        for held in self.held_by.values():
            held[pages(p)] = NO_PAGES


def tier_tables(
    tiers: Sequence[str],
    capacities: Sequence[int],
    page_size: int,
    group: PoolGroup | None = None,
    pool_capacities: Mapping[str, Mapping[str, int]] | None = None,
) -> tuple[TierTable, ...]:
    """One table per tier: a `TierTable` without a group or for a group of one pool
    (its pool: the anchor's name; `SINGLE_POOL_NAME` without a group), else a `TierPools`
    (side pools' capacities from `pool_capacities`, default anchor capacity * ratio).
    ConfigError if the anchor's page size is not the plane's."""
    if group is None or len(group.backed_up().pools) == 1:
        if pool_capacities:
            raise ConfigError("pool_capacities", "given without a pool group of several pools")
        pool = SINGLE_POOL_NAME if group is None else group.anchor.name
        return tuple(TierTable(t, c, pool) for t, c in zip(tiers, capacities))
    if group.anchor.page_size != page_size:
        raise ConfigError(
            f"presets.{group.name}.{group.anchor.name}.page_size",
            f"{group.anchor.page_size} tokens, the plane's page size is {page_size}",
        )
    unknown = sorted(set(pool_capacities or {}) - set(tiers))
    if unknown:
        raise ConfigError("pool_capacities", f"tiers {unknown} are not {list(tiers)}")
    return tuple(
        TierPools(t, group, tier_capacities(group, t, c, pool_capacities))
        for t, c in zip(tiers, capacities)
    )
