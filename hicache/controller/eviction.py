"""Eviction under pressure, and the write-back it triggers.

Contract: `evict(tier, n_pages)` frees at least `n_pages` pages of `tier` while candidates are
left (pressure from outside the controller); `make_room(tier, n_pages, keep)` tries to leave at
least `n_pages` FREE pages in `tier` by running the control plane's one eviction loop
(`ControlPlane.evict`, spec/eviction.md: LRU leaves of that tier, one node's value at a time, never
a locked, pending or kept node). It never raises for lack of room: the caller's reservation raises
`OutOfPages` if the room was not made. Pages freed are counted in `evicted_pages[tier]` (pressure
only: copies dropped because an L3 slot is bad are counted apart, see l3health.py).

An L1 victim without an L2 copy loses its tokens from the cache, counted once with SGLang's
reasons: under `write_back` it is backed up first (`back_up`, given by each caller: a D2H of
the chain it needs, waited for -- `Transfers.back_up_now`), and when that cannot be done its
tokens count as `host_pressure`; under the write-through policies (whose backup was not in
time) as `write_through_unbacked_eviction`.
A victim whose backup is in flight (L2 `D2H_PENDING`) is never offered: the D2H locks its
source and `evict_l1` is guarded by `L2 != D2H_PENDING` (spec/eviction.md).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from functools import partial

from hicache.choices import WritePolicy
from hicache.controller.metrics import Metrics
from hicache.core.control import ControlPlane
from hicache.core.tiers import Tier
from hicache.core.tree import TreeNode

BackUp = Callable[[TreeNode], bool]  # back the node up to L2 now; whether it holds L2 after


class Evictor:
    def __init__(
        self,
        cp: ControlPlane,
        metrics: Metrics,
        write_policy: WritePolicy,
        windows: bool = True,
    ) -> None:
        """`windows` False (tensor-parallel ranks, whose windows may differ): a write-back
        victim is always offered to `back_up`, whose issue a freed window refuses on its
        rank, so every rank makes the same calls (spec/tp.md C2). The write-back itself is
        the caller's (`back_up`, per call): the evictor holds no transfer machinery, so no
        reference cycle runs through it to the data plane."""
        self.cp = cp
        self.metrics = metrics
        self.write_policy = write_policy
        self.windows = windows

    def make_room(
        self, tier: Tier, n_pages: int, keep: Collection[TreeNode] = (), *, back_up: BackUp
    ) -> int:
        """Evict until `n_pages` pages of `tier` are free or no candidate is left; the pages
        freed. `keep`: nodes that must keep their copy in `tier` (a transfer's chain parent).
        `back_up`: backs a write-back L1 victim up to L2 now (`evict`).
        An L1 that frees windows evicts for its anchor pages only, then frees the windows of
        the least recently used nodes until `n_pages` windows are free (`free_windows`)."""
        windows = self.cp.windows
        if tier is not Tier.L1 or not windows.tombstones:
            return self.evict(tier, n_pages - self.cp.free_pages(tier), keep, back_up=back_up)
        freed = self.evict(tier, n_pages - windows.anchor_free(), keep, back_up=back_up)
        self.free_windows(n_pages, keep)
        return freed

    def can_make_room_l1(self, n_pages: int, keep: Collection[TreeNode] = ()) -> bool:
        """Whether `make_room(L1, n_pages, keep)` would leave `n_pages` free (a caller that
        refuses for lack of room asks first, so a refused operation evicts nothing, R25): the
        anchor's free pages plus what eviction frees, and -- an L1 that frees windows -- the
        free windows plus every node's window `free_windows` could free (an evictable node's
        with it)."""
        windows = self.cp.windows
        if not windows.tombstones:
            return self.cp.free_pages(Tier.L1) + self.cp.evictable_l1(keep) >= n_pages
        freeable = sum(n.num_pages for n in windows.candidates(self.cp.tree.nodes(), keep))  # R68
        return (
            windows.anchor_free() + self.cp.evictable_l1(keep) >= n_pages
            and windows.window_free() + freeable >= n_pages
        )

    def free_windows(self, n_pages: int, keep: Collection[TreeNode] = ()) -> int:
        """Free L1 windows (`tombstone`), least recently used node first, until `n_pages`
        anchor pages' windows are free or no candidate is left; the anchor pages whose window
        was freed (counted in `window_freed_pages`)."""
        windows = self.cp.windows
        freed = 0
        while windows.window_free() < n_pages:
            found = windows.candidates(self.cp.tree.nodes(), keep)
            if not found:
                break
            freed += int(self.cp.tombstone(found[0]).size)
        self.metrics.window_freed_pages += freed
        return freed

    def evict(
        self, tier: Tier, n_pages: int, keep: Collection[TreeNode] = (), *, back_up: BackUp
    ) -> int:
        """Free at least `n_pages` pages of `tier` (more when a node's value goes whole; fewer
        only when no candidate is left) through the one loop, an L1 victim without an L2 copy first
        backed up under write-back (by `back_up`, whether it then holds L2); the pages freed
        (0 when `n_pages` <= 0). R22: the controller never picks victims of its own."""
        if n_pages <= 0:
            return 0
        before = partial(self._before_l1_eviction, back_up) if tier is Tier.L1 else None
        freed = self.cp.evict(tier, n_pages, keep, before=before)
        self.metrics.evicted(tier, freed)
        return freed

    def _before_l1_eviction(self, back_up: BackUp, victim: TreeNode) -> None:
        """An L1 victim that L2 does not hold: back it up (write-back) or count its loss, by
        exactly its own tokens (the ancestors a write-back would have copied stay in L1): R27."""
        if self.cp.holds(victim, Tier.L2):
            return
        freed = self.cp.windows.freed(victim)
        if self.write_policy is not WritePolicy.WRITE_BACK:
            self.metrics.drop("write_through_unbacked_eviction", len(victim.key))
        elif self.windows and freed:
            self.metrics.drop("window_freed", len(victim.key))  # no whole group to back up
        elif not back_up(victim):
            self.metrics.drop("window_freed" if freed else "host_pressure", len(victim.key))
