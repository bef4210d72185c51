"""The bug classes B01-B15 of spec/bugclasses.md, one real function broken per mutant: the
control plane, the tree, the data plane and the controller.

Registered in `hicache.testing.mutants` (its table names each one); `ZOO` lists this
module's mutants in the order `hicache fuzz --mutant list` prints them.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from hicache.testing.mutants.base import Mutant, swapped


def _b01() -> contextlib.AbstractContextManager[None]:
    """advance_cached_len without its check that every node up to `node` is RESIDENT in L1:
    a request's cached_len may then cover a load-back still in flight."""
    from hicache.core.control import ControlPlane

    def advance_cached_len(self: Any, request_id: int, node: Any) -> int:
        req = self._request(request_id)
        self.tree.lock(node, 0)
        if not req.locked.is_root:
            self.tree.unlock(req.locked, 0)
        req.locked = node
        req.published_len = req.cached_len = self.tree.prefix_tokens(node)
        self._check(f"cached_len {request_id}")
        return int(req.cached_len)

    return swapped(ControlPlane, "advance_cached_len", advance_cached_len)


def _b02() -> contextlib.AbstractContextManager[None]:
    """A failed load-back "undoes the restore": it also returns the L2 pages it read (which
    the tree still holds, e.g. promoted by an S2H) to the free list."""
    from hicache.core.control import ControlPlane
    from hicache.core.pages import FREE
    from hicache.core.tiers import TIERS, Direction

    original = ControlPlane.__dict__["fail"]

    def fail(self: Any, op_id: int) -> Any:
        op = original(self, op_id)
        if op.direction is Direction.H2D:
            self.tables[TIERS.index(op.direction.source)].owner[op.source_pages] = FREE
            self._check(f"h2d_fail cleanup op {op_id}")
        return op

    return swapped(ControlPlane, "fail", fail)


def _b03() -> contextlib.AbstractContextManager[None]:
    """A cancel (abort, drain) ends the op but never releases its target pages: they stay
    PRIVATE with no op or request holding them."""
    from hicache.core.control import ControlPlane
    from hicache.core.pages import PRIVATE
    from hicache.core.tiers import TIERS

    original = ControlPlane.__dict__["cancel"]

    def cancel(self: Any, op_id: int) -> Any:
        op = original(self, op_id)
        self.tables[TIERS.index(op.direction.target)].owner[op.target_pages] = PRIVATE
        self._check(f"cancel op {op_id}")
        return op

    return swapped(ControlPlane, "cancel", cancel)


def _b04() -> contextlib.AbstractContextManager[None]:
    """An issue that never locks its source: eviction may take the pages the transfer reads."""
    from hicache.core.control import ControlPlane
    from hicache.core.tiers import TIERS

    original = ControlPlane.__dict__["issue"]

    def issue(self: Any, *args: Any, **kwargs: Any) -> Any:
        op = original(self, *args, **kwargs)
        self.tree.unlock(op.nodes[-1], TIERS.index(op.direction.source))
        self._check(f"issue op {op.op_id} (source left unlocked)")
        return op

    return swapped(ControlPlane, "issue", issue)


def _b05() -> contextlib.AbstractContextManager[None]:
    """A D2H reads its page indices before the stream producing them finished: the index
    buffer still holds the previous transfer's first index, so one page is copied from the
    wrong L1 page (on the CPU plane, the race is reproduced by reusing that stale index)."""
    from hicache.core.pages import pages
    from hicache.dataplane.dma import DeviceHostMover

    original = DeviceHostMover.__dict__["d2h"]
    previous: list[int] = []

    def d2h(self: Any, l1_pages: Any, l2_pages: Any, *, after: Any = None) -> Any:
        src = pages(l1_pages).copy()
        stale = previous[-1] if previous else None
        if src.size:
            previous.append(int(src[0]))
        if stale is not None and stale not in src.tolist():
            src[0] = stale
        return original(self, src, l2_pages, after=after)

    return swapped(DeviceHostMover, "d2h", d2h)


def _b06() -> contextlib.AbstractContextManager[None]:
    """A split while an op is pending does not add the new upper node to the op's node list:
    the op's one page list no longer matches its nodes, and the upper node waits on an op that
    will never publish or release it."""
    from hicache.core.control import ControlPlane

    def on_split(self: Any, upper: Any, lower: Any) -> None:
        if self.tracer.enabled:
            self.tracer.emit(
                "split", node=lower.node_id, detail={"upper": upper.node_id, "at": len(upper.key)}
            )

    return swapped(ControlPlane, "_on_split", on_split)


def _b07() -> contextlib.AbstractContextManager[None]:
    """The issue guard `parent(<target>) == RESIDENT` always passes: a chain may be backed
    up (or loaded back) below a parent that lacks the target tier."""
    from hicache.core import execute

    def parent_resident(self: Any, tier: Any) -> bool:
        return True

    return swapped(execute._Context, "parent_resident", parent_resident)


def _b07_leaf() -> contextlib.AbstractContextManager[None]:
    """The per-tier leaf sets are keyed on the node's L1 children in every tier: an L2 node
    whose children hold L2 (but not L1) is taken for a leaf, and eviction reaches a
    non-leaf."""
    from hicache.core.lifecycle import RESIDENT
    from hicache.core.tree import HiRadixTree

    def refresh_leaf(self: Any, node: Any, tier: int) -> None:
        if not node.is_root and node.state[tier] == RESIDENT and node.present_children[0] == 0:
            self._leaves[tier][node.node_id] = node
        else:
            self._leaves[tier].pop(node.node_id, None)

    return swapped(HiRadixTree, "_refresh_leaf", refresh_leaf)


def _b08() -> contextlib.AbstractContextManager[None]:
    """A split cuts every tier's value at `at_tokens` pages instead of `at_tokens /
    page_size`: the halves point at too many and too few pages."""
    from hicache.core.tree import HiRadixTree

    original = HiRadixTree.__dict__["split"]

    def split(self: Any, node: Any, at_tokens: int) -> Any:
        whole = list(node.value)
        upper = original(self, node, at_tokens)
        upper.value = [None if v is None else v[:at_tokens].copy() for v in whole]
        node.value = [None if v is None else v[at_tokens:].copy() for v in whole]
        return upper

    return swapped(HiRadixTree, "split", split)


def _b09() -> contextlib.AbstractContextManager[None]:
    """A group reservation that fails at one pool never rolls back: the pools reserved before
    it (in sorted name order) keep their pages PRIVATE, held by nobody."""
    from hicache.pools.table import GroupTable

    def rollback(self: Any, taken: Any) -> None:
        return None

    return swapped(GroupTable, "_rollback", rollback)


def _b10() -> contextlib.AbstractContextManager[None]:
    """A host-leaf eviction frees one pool of the group: an L2 `free` of anchor pages returns
    the anchor's pages and forgets the side pools' (`swa`), which stay TREE, held by no
    anchor page. Other tiers' frees are left whole."""
    from hicache.pools.tierpools import TierPools

    original = TierPools.__dict__["free"]

    def free(self: Any, p: Any) -> None:
        if self.tier != "L2":
            original(self, p)
            return
        self.group_table.tables[self.anchor].free(p)
        self._forget(p)

    return swapped(TierPools, "free", free)


def _b11() -> contextlib.AbstractContextManager[None]:
    """An unlock clamps each count at zero instead of refusing a lock released twice (or
    never taken): the double release is hidden and other holders' locks are lost."""
    from hicache.core.tree import HiRadixTree

    def unlock(self: Any, node: Any, tier: int) -> None:
        self._writable("unlock")
        self._check_tier(tier)
        for n in self.path_to_root(node):
            n.lock[tier] = max(0, n.lock[tier] - 1)

    return swapped(HiRadixTree, "unlock", unlock)


def _b12() -> contextlib.AbstractContextManager[None]:
    """A failed restore stage raises instead of dropping its part to recompute."""
    from hicache.controller.restore import RestoreStager
    from hicache.dataplane.handles import TransferStatus
    from hicache.errors import TransferError

    original = RestoreStager.__dict__["_settle_own"]

    def settle_own(self: Any, mat: Any, op: Any, status: Any) -> None:
        if status is TransferStatus.FAILED:
            raise TransferError(f"restore op {op.op_id} of request {mat.request_id} failed")
        original(self, mat, op, status)

    return swapped(RestoreStager, "_settle_own", settle_own)


def _b13() -> contextlib.AbstractContextManager[None]:
    """Extents merge whenever the destinations are consecutive, whether or not the sources
    are: an L3 write moves the wrong L2 pages into the later slots of a run."""
    from hicache.dataplane import storage_io
    from hicache.dataplane.extents import Extent

    def coalesce(src: Any, dst: Any) -> list[Extent]:
        s_all = np.asarray(src, dtype=np.int64).reshape(-1)
        d_all = np.asarray(dst, dtype=np.int64).reshape(-1)
        if d_all.size == 0:
            return []
        order = np.argsort(d_all, kind="stable")
        s, d = s_all[order], d_all[order]
        joins = np.diff(d) == 1  # the bug: the sources are never compared
        starts = np.flatnonzero(np.concatenate(([True], ~joins)))
        counts = np.diff(np.append(starts, d.size))
        return [Extent(int(s[i]), int(d[i]), int(c)) for i, c in zip(starts, counts)]

    return swapped(storage_io, "coalesce", coalesce)


def _b14() -> contextlib.AbstractContextManager[None]:
    """A short `pwrite`/`preadv` is taken as complete: the rest of the piece never moves."""
    from hicache.dataplane import storage_io
    from hicache.dataplane.storage import describe_os_error

    def move_all(self: Any, direction: Any, view: memoryview, first_slot: int, plan: Any) -> None:
        offset, total = self.l3.offset(first_slot), len(view)
        try:
            part = view if plan is None else storage_io._apply_faults(plan, view, 0, total)
            moved = self._syscall(direction, part, offset)
        except OSError as e:
            raise self._io_error(direction, first_slot, total, describe_os_error(e)) from e
        if moved == 0:
            raise self._io_error(direction, first_slot, total, "no progress at byte 0")

    return swapped(storage_io.StorageMover, "_move_all", move_all)


def _b15() -> contextlib.AbstractContextManager[None]:
    """A load-back scatters page i of the source into the L1 page meant for page i+1 (a
    mapping off by one): a prefix is served another position's KV."""
    from hicache.core.pages import pages
    from hicache.dataplane.engine import TransferEngine

    original = TransferEngine.__dict__["h2d"]

    def h2d(self: Any, l2_pages: Any, l1_pages: Any, *, after: Any = None) -> Any:
        dst = pages(l1_pages)
        return original(self, l2_pages, np.roll(dst, 1) if dst.size > 1 else dst, after=after)

    return swapped(TransferEngine, "h2d", h2d)


ZOO: tuple[Mutant, ...] = (
    Mutant(
        "B01",
        "B01",
        "ControlPlane.advance_cached_len",
        "cached_len advances over a node whose load-back is still pending (no publication check)",
        _b01,
    ),
    Mutant(
        "B02",
        "B02",
        "ControlPlane.fail",
        "a failed load-back also frees the published L2 pages it read",
        _b02,
    ),
    Mutant(
        "B03",
        "B03",
        "ControlPlane.cancel",
        "a cancelled op never releases its target pages (leak on abort)",
        _b03,
    ),
    Mutant(
        "B04",
        "B04",
        "ControlPlane.issue",
        "an issue leaves its source unlocked, so eviction may take pages in flight",
        _b04,
    ),
    Mutant(
        "B05",
        "B05",
        "DeviceHostMover.d2h",
        "a D2H reads a stale page index (no wait on the stream that wrote the indices)",
        _b05,
    ),
    Mutant(
        "B06",
        "B06",
        "ControlPlane._on_split",
        "a split of a pending node leaves the new upper node out of the op's node list",
        _b06,
    ),
    Mutant(
        "B07",
        "B07",
        "execute._Context.parent_resident",
        "the issue guard parent(target) == RESIDENT always passes (backup gap)",
        _b07,
    ),
    Mutant(
        "B07-leaf",
        "B07",
        "HiRadixTree._refresh_leaf",
        "leaf sets keyed on L1's children in every tier: eviction reaches a non-leaf",
        _b07_leaf,
    ),
    Mutant(
        "B08",
        "B08",
        "HiRadixTree.split",
        "a split cuts values at at_tokens pages instead of at_tokens / page_size",
        _b08,
    ),
    Mutant(
        "B09",
        "B09",
        "GroupTable._rollback",
        "a group reservation that fails at one pool "
        "keeps the pages of the pools reserved before it",
        _b09,
    ),
    Mutant(
        "B10",
        "B10",
        "TierPools.free",
        "a host-leaf (L2) eviction frees the anchor's pages and leaves the side pools' pages held",
        _b10,
    ),
    Mutant(
        "B11",
        "B11",
        "HiRadixTree.unlock",
        "an unlock below zero is clamped at zero instead of refused",
        _b11,
    ),
    Mutant(
        "B12",
        "B12",
        "RestoreStager._settle_own",
        "a failed restore stage raises instead of falling back to recompute",
        _b12,
    ),
    Mutant(
        "B13",
        "B13",
        "storage_io.coalesce",
        "L3 extents merge when only the destinations are consecutive",
        _b13,
    ),
    Mutant(
        "B14",
        "B14",
        "StorageMover._move_all",
        "a short pwrite/preadv is accepted as complete",
        _b14,
    ),
    Mutant(
        "B15",
        "B15",
        "TransferEngine.h2d",
        "a load-back scatters each page into the L1 page of the next one",
        _b15,
    ),
)
