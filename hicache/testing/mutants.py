"""The bug zoo: deliberately broken variants of the reference, one per bug class.

Each mutant is a small, named patch of one real function, modelled on a class of
spec/bugclasses.md (or on a failure mode of the invariant checker itself). `activate(name)`
returns a context manager that swaps the broken version in and restores the original on exit:

    with activate("B06"):          # a split that forgets a pending op's node list
        run_the_machine()          # must fail, naming the check that caught it

Nothing else reaches these patches: no configuration field, flag or environment variable
of the cache switches one on; only `hicache fuzz --mutant NAME` and the zoo's tests call
`activate`. The tensor-parallel mutants (B16 and the TP- ones: agreement bugs of the
F15-F18 scenarios in spec/tp.md) run on the TP machines.

    name         class  patched function                          what is broken
    -----------  -----  ----------------------------------------  ----------------------------
    B01          B01    ControlPlane.advance_cached_len           serves before publication
    B02          B02    ControlPlane.fail                         frees the published L2 source
    B03          B03    ControlPlane.cancel                       leaks the target pages
    B04          B04    ControlPlane.issue                        never locks the source
    B05          B05    DeviceHostMover.d2h                       reads a stale index buffer
    B06          B06    ControlPlane._on_split                    op forgets the upper half
    B07          B07    execute._Context.parent_resident          issue guard always passes
    B07-leaf     B07    HiRadixTree._refresh_leaf                 leaf set keyed on L1's children
    B08          B08    HiRadixTree.split                         cuts values by tokens
    B09          B09    GroupTable._rollback                      a failed group reserve keeps
                                                                  the pools it took
    B10          B10    TierPools.free                            an L2 eviction frees the
                                                                  anchor, not the side pools
    B11          B11    HiRadixTree.unlock                        clamps at zero
    B12          B12    RestoreStager._settle_own                 a failed load raises
    B13          B13    storage_io.coalesce                       merges on one side
    B14          B14    StorageMover._move_all                    short I/O taken as complete
    B15          B15    TransferEngine.h2d                        scatters to the wrong pages
    B16          B16    ledger.writes_pool                        the L3 write rule inverted
    B16-ack      B16    L3Writes.writes_any                       ranks other than 0 ack L3
                                                                  backups they should write
    TP-conditional  -   Agreement.completion                      skips C4 with nothing to say
    TP-local-capacity - Transfers._issue_here                     evicts and retries alone
    TP-min-of-maxima -  Agreement.admit                           the L1 hit is the least of
                                                                  the ranks' own hits
    TP-rank-local-bytes GroupSyntheticProducer.pool_bytes         a replicated pool's bytes
                                                                  differ on ranks but 0
    F11-no-clamp -      transfers.clamped_nodes                   a stopped S2H publishes
                                                                  every node it read
    decision-unplanned  CacheController._policy_hits              a restore chosen that no
                                                                  plan makes (a freed window)
    replay-unrevived -  L1Windows.clip                            a replayed window counted,
                                                                  never recomputed nor revived
    L3-no-lock   -      storage._lock                             a live controller's L3 file
                                                                  is taken over by a second
    I1-skip-L2   -      the I1 check                              skips tier L2
    checker-off  -      InvariantChecker.after_transition         never checks
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from hicache.errors import ConfigError

Patch = Callable[[], contextlib.AbstractContextManager[None]]


@dataclass(frozen=True)
class Mutant:
    """One broken variant: its name, the bug class it belongs to ("-" for the checker's own
    failure modes), the function it patches, a one-line description and the patch."""

    name: str
    bug_class: str
    target: str
    description: str
    patch: Patch


@contextlib.contextmanager
def _swapped(owner: Any, attr: str, replacement: Any) -> Iterator[None]:
    """`owner.attr` is `replacement` inside the block, the original again after it."""
    original = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
    setattr(owner, attr, replacement)
    try:
        yield
    finally:
        setattr(owner, attr, original)


# -- the control plane ------------------------------------------------------------------------


def _b01() -> contextlib.AbstractContextManager[None]:
    """advance_cached_len without its check that every node up to `node` is RESIDENT in L1:
    a request's cached_len may then cover a load-back still in flight."""
    from hicache.control import ControlPlane

    def advance_cached_len(self: Any, request_id: int, node: Any) -> int:
        req = self._request(request_id)
        self.tree.lock(node, 0)
        if not req.locked.is_root:
            self.tree.unlock(req.locked, 0)
        req.locked = node
        req.published_len = req.cached_len = self.tree.prefix_tokens(node)
        self._check(f"cached_len {request_id}")
        return int(req.cached_len)

    return _swapped(ControlPlane, "advance_cached_len", advance_cached_len)


def _b02() -> contextlib.AbstractContextManager[None]:
    """A failed load-back "undoes the restore": it also returns the L2 pages it read (which
    the tree still holds, e.g. promoted by an S2H) to the free list."""
    from hicache.control import ControlPlane
    from hicache.pages import FREE
    from hicache.tiers import TIERS, Direction

    original = ControlPlane.__dict__["fail"]

    def fail(self: Any, op_id: int) -> Any:
        op = original(self, op_id)
        if op.direction is Direction.H2D:
            self.tables[TIERS.index(op.direction.source)].owner[op.source_pages] = FREE
            self._check(f"h2d_fail cleanup op {op_id}")
        return op

    return _swapped(ControlPlane, "fail", fail)


def _b03() -> contextlib.AbstractContextManager[None]:
    """A cancel (abort, drain) ends the op but never releases its target pages: they stay
    PRIVATE with no op or request holding them."""
    from hicache.control import ControlPlane
    from hicache.pages import PRIVATE
    from hicache.tiers import TIERS

    original = ControlPlane.__dict__["cancel"]

    def cancel(self: Any, op_id: int) -> Any:
        op = original(self, op_id)
        self.tables[TIERS.index(op.direction.target)].owner[op.target_pages] = PRIVATE
        self._check(f"cancel op {op_id}")
        return op

    return _swapped(ControlPlane, "cancel", cancel)


def _b04() -> contextlib.AbstractContextManager[None]:
    """An issue that never locks its source: eviction may take the pages the transfer reads."""
    from hicache.control import ControlPlane
    from hicache.tiers import TIERS

    original = ControlPlane.__dict__["issue"]

    def issue(self: Any, *args: Any, **kwargs: Any) -> Any:
        op = original(self, *args, **kwargs)
        self.tree.unlock(op.nodes[-1], TIERS.index(op.direction.source))
        self._check(f"issue op {op.op_id} (source left unlocked)")
        return op

    return _swapped(ControlPlane, "issue", issue)


def _b06() -> contextlib.AbstractContextManager[None]:
    """A split while an op is pending does not add the new upper node to the op's node list:
    the op's one page list no longer matches its nodes, and the upper node waits on an op that
    will never publish or release it."""
    from hicache.control import ControlPlane

    def on_split(self: Any, upper: Any, lower: Any) -> None:
        if self.tracer.enabled:
            self.tracer.emit(
                "split", node=lower.node_id, detail={"upper": upper.node_id, "at": len(upper.key)}
            )

    return _swapped(ControlPlane, "_on_split", on_split)


def _b07() -> contextlib.AbstractContextManager[None]:
    """The issue guard `parent(<target>) == RESIDENT` always passes: a chain may be backed
    up (or loaded back) below a parent that lacks the target tier."""
    from hicache import execute

    def parent_resident(self: Any, tier: Any) -> bool:
        return True

    return _swapped(execute._Context, "parent_resident", parent_resident)


def _b07_leaf() -> contextlib.AbstractContextManager[None]:
    """The per-tier leaf sets are keyed on the node's L1 children in every tier: an L2 node
    whose children hold L2 (but not L1) is taken for a leaf, and eviction reaches a
    non-leaf."""
    from hicache.lifecycle import RESIDENT
    from hicache.tree import HiRadixTree

    def refresh_leaf(self: Any, node: Any, tier: int) -> None:
        if not node.is_root and node.state[tier] == RESIDENT and node.present_children[0] == 0:
            self._leaves[tier][node.node_id] = node
        else:
            self._leaves[tier].pop(node.node_id, None)

    return _swapped(HiRadixTree, "_refresh_leaf", refresh_leaf)


def _b08() -> contextlib.AbstractContextManager[None]:
    """A split cuts every tier's value at `at_tokens` pages instead of `at_tokens /
    page_size`: the halves point at too many and too few pages."""
    from hicache.tree import HiRadixTree

    original = HiRadixTree.__dict__["split"]

    def split(self: Any, node: Any, at_tokens: int) -> Any:
        whole = list(node.value)
        upper = original(self, node, at_tokens)
        upper.value = [None if v is None else v[:at_tokens].copy() for v in whole]
        node.value = [None if v is None else v[at_tokens:].copy() for v in whole]
        return upper

    return _swapped(HiRadixTree, "split", split)


def _b11() -> contextlib.AbstractContextManager[None]:
    """An unlock clamps each count at zero instead of refusing a lock released twice (or
    never taken): the double release is hidden and other holders' locks are lost."""
    from hicache.tree import HiRadixTree

    def unlock(self: Any, node: Any, tier: int) -> None:
        self._writable("unlock")
        self._check_tier(tier)
        for n in self.path_to_root(node):
            n.lock[tier] = max(0, n.lock[tier] - 1)

    return _swapped(HiRadixTree, "unlock", unlock)


def _b09() -> contextlib.AbstractContextManager[None]:
    """A group reservation that fails at one pool never rolls back: the pools reserved before
    it (in sorted name order) keep their pages PRIVATE, held by nobody."""
    from hicache.pools.table import GroupTable

    def rollback(self: Any, taken: Any) -> None:
        return None

    return _swapped(GroupTable, "_rollback", rollback)


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

    return _swapped(TierPools, "free", free)


# -- the controller and the data plane -------------------------------------------------------


def _b05() -> contextlib.AbstractContextManager[None]:
    """A D2H reads its page indices before the stream producing them finished: the index
    buffer still holds the previous transfer's first index, so one page is copied from the
    wrong L1 page (on the CPU plane, the race is reproduced by reusing that stale index)."""
    from hicache.dataplane.dma import DeviceHostMover
    from hicache.pages import pages

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

    return _swapped(DeviceHostMover, "d2h", d2h)


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

    return _swapped(RestoreStager, "_settle_own", settle_own)


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

    return _swapped(storage_io, "coalesce", coalesce)


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

    return _swapped(storage_io.StorageMover, "_move_all", move_all)


def _b15() -> contextlib.AbstractContextManager[None]:
    """A load-back scatters page i of the source into the L1 page meant for page i+1 (a
    mapping off by one): a prefix is served another position's KV."""
    from hicache.dataplane.engine import TransferEngine
    from hicache.pages import pages

    original = TransferEngine.__dict__["h2d"]

    def h2d(self: Any, l2_pages: Any, l1_pages: Any, *, after: Any = None) -> Any:
        dst = pages(l1_pages)
        return original(self, l2_pages, np.roll(dst, 1) if dst.size > 1 else dst, after=after)

    return _swapped(TransferEngine, "h2d", h2d)


def _decision_unplanned() -> contextlib.AbstractContextManager[None]:
    """The restore policy decides on the L2 and L3 hits whole, past where every restore plan
    stops (a node L1 holds with its window freed, a promotion in flight): a restore chosen
    whose plan restores nothing, no fallback counted (issue 30, section 5: the outside
    fuzzer's find, an L2 choice over a freed window)."""
    from hicache.controller.controller import CacheController

    def _policy_hits(self: Any, m: Any) -> tuple[int, int, int]:
        return m.lengths[0], m.lengths[1], max(m.lengths[1], self.l3.servable_len(m))

    return _swapped(CacheController, "_policy_hits", _policy_hits)


def _replay_unrevived() -> contextlib.AbstractContextManager[None]:
    """Under anchor_recompute_swa the L1 hit is the anchor's whole run even when the window
    before its end has a freed page: the replay is counted but never made, so the window is
    never revived and every later hit replays it again (issue 30, section 5)."""
    from hicache.pools.hits import ALL_POOLS
    from hicache.pools.windows import L1Windows

    original = L1Windows.__dict__["clip"]

    def clip(self: Any, run: Any) -> int:
        if self.policy == ALL_POOLS:
            return int(original(self, run))
        return sum(len(node.key) for node in run) // int(self.page_size)

    return _swapped(L1Windows, "clip", clip)


def _l3_no_lock() -> contextlib.AbstractContextManager[None]:
    """An explicit L3 path is opened without its lock: a second controller on the path a
    live one uses takes the file over (issue 30, section 5: the outside fuzzer's find)."""
    from hicache.dataplane import storage

    return _swapped(storage, "_lock", lambda path, fd: None)


# -- the checker's own failure modes ---------------------------------------------------------


@contextlib.contextmanager
def _i1_skip_l2() -> Iterator[None]:
    """I1 `ownership_disjoint` checks every tier but L2."""
    from hicache.invariants.registry import CHECKS

    check = next(c for c in CHECKS if c.id == "I1")
    original = check.func

    def skipping(s: Any) -> Any:
        return original(
            dataclasses.replace(s, tiers={k: v for k, v in s.tiers.items() if k != "L2"})
        )

    object.__setattr__(check, "func", skipping)
    try:
        yield
    finally:
        object.__setattr__(check, "func", original)


def _checker_off() -> contextlib.AbstractContextManager[None]:
    """The checker counts transitions but never checks a snapshot, whatever its mode."""
    from hicache.invariants.checker import InvariantChecker

    def after_transition(self: Any, snapshot_fn: Any, context: str) -> None:
        self.transitions += 1

    return _swapped(InvariantChecker, "after_transition", after_transition)


# -- tensor parallelism -------------------------------------------------------------------------


def _b16() -> contextlib.AbstractContextManager[None]:
    """The L3 write rule inverted: a replicated pool written by every rank, a sharded one by
    rank 0 only."""
    from hicache.distributed import ledger
    from hicache.pools.spec import SHARDED

    def writes_pool(tp_mode: str, rank: int) -> bool:
        return tp_mode != SHARDED or rank == 0

    return _swapped(ledger, "writes_pool", writes_pool)


def _b16_ack() -> contextlib.AbstractContextManager[None]:
    """B16 where the rule is right and the controller's use of it is not: every rank but 0
    acks an L3 backup at once (C6b) as if it wrote none of the group's pools, sharded ones
    included. Caught only because I11 reads what each rank wrote, not the rule."""
    from hicache.distributed.ledger import L3Writes

    original = L3Writes.__dict__["writes_any"]

    def writes_any(self: Any, group: Any) -> bool:
        return bool(original(self, group)) and self.rank == 0

    return _swapped(L3Writes, "writes_any", writes_any)


def _tp_conditional() -> contextlib.AbstractContextManager[None]:
    """A conditional collective: a rank skips the per-tick completion reduction when none of
    its ops ended locally (it has nothing to report)."""
    from hicache.distributed.agreement import Agreement

    original = Agreement.__dict__["completion"]

    def completion(self: Any, local: Any) -> Any:
        if not any(x[0] for x in local):
            return [(False, False, x[2], x[3], x[4]) for x in local]
        return original(self, local)

    return _swapped(Agreement, "completion", completion)


def _tp_local_capacity() -> contextlib.AbstractContextManager[None]:
    """A rank-local capacity decision: a rank whose reservation was refused evicts more and
    retries alone, before the ranks agree (C2)."""
    from hicache.controller.transfers import Transfers
    from hicache.errors import OutOfPages

    original = Transfers.__dict__["_issue_here"]

    def _issue_here(
        self: Any, direction: Any, chain: Any, request_id: Any, need: int, parent: Any
    ) -> Any:
        got = original(self, direction, chain, request_id, need, parent)
        if self.tp and isinstance(got[2], OutOfPages):
            self.evictor.evict(direction.target, need, keep=[parent, *chain])
            got = original(self, direction, chain, request_id, need, parent)
        return got

    return _swapped(Transfers, "_issue_here", _issue_here)


def _tp_min_of_maxima() -> contextlib.AbstractContextManager[None]:
    """Hit agreement by the minimum of per-rank maxima: the L1 hit is the least of the ranks'
    own hits (each the largest endpoint its own windows allow), not the largest endpoint
    every rank allows (C1a's intersection of masks). The same collective as C1a."""
    from hicache.distributed.agreement import Agreement

    def admit(self: Any, bounds: Any, own_l1: int, code: int, mask: Any) -> Any:
        rows = self.c.all_gather("admit", [*bounds, own_l1, code, *(mask or ())])
        agreed = [min(col) for col in zip(*(r[:3] for r in rows))]
        if mask is not None:
            agreed[0] = min(agreed[0], min(r[3] for r in rows))
        head = rows[0]
        return tuple(agreed), head[4] if (head[3], head[1], head[2]) == tuple(agreed) else None

    return _swapped(Agreement, "admit", admit)


def _tp_rank_local_bytes() -> contextlib.AbstractContextManager[None]:
    """A replicated pool computed rank-locally: on a rank that reads rank 0's L3 copy of it,
    its pages hold bytes of their own (every byte flipped), as if each rank derived the pool
    from its shard. Each rank is consistent with itself (I4 holds, its verifier expects its
    own bytes); only the ranks' digests differ."""
    from hicache.producers.group import GroupSyntheticProducer

    original = GroupSyntheticProducer.pool_bytes

    def pool_bytes(self: Any, pool: Any, tokens: Any, start: int, end: int) -> Any:
        out = original(self, pool, tokens, start, end)
        return out.bitwise_not() if self.engine.is_replica(pool.name) else out

    return _swapped(GroupSyntheticProducer, "pool_bytes", pool_bytes)


def _f11_no_clamp() -> contextlib.AbstractContextManager[None]:
    """An S2H that stopped part way publishes every node it was reading, not only the whole
    nodes within `prefetch_clamp` of what landed (SGLang #30334: a prefix published past a
    sidecar's coverage). The landed report is still drawn and applied."""
    import hicache.controller.transfers as transfers

    return _swapped(transfers, "clamped_nodes", lambda group, nodes, landed: len(nodes))


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
    Mutant(
        "B16",
        "B16",
        "ledger.writes_pool",
        "the L3 write rule inverted: replicated pools "
        "written by every rank, sharded ones by rank 0 only",
        _b16,
    ),
    Mutant(
        "B16-ack",
        "B16",
        "L3Writes.writes_any",
        "ranks other than 0 ack an L3 backup "
        "without writing it, a sharded pool's included (the rule itself right)",
        _b16_ack,
    ),
    Mutant(
        "TP-conditional",
        "-",
        "Agreement.completion",
        "a rank skips the per-tick completion reduction when none of its ops ended locally",
        _tp_conditional,
    ),
    Mutant(
        "TP-local-capacity",
        "-",
        "Transfers._issue_here",
        "a refused reservation evicts and retries on that rank alone, before C2",
        _tp_local_capacity,
    ),
    Mutant(
        "TP-min-of-maxima",
        "-",
        "Agreement.admit",
        "the agreed L1 hit is the least of the "
        "ranks' own hits, not the largest endpoint in every rank's mask",
        _tp_min_of_maxima,
    ),
    Mutant(
        "TP-rank-local-bytes",
        "-",
        "GroupSyntheticProducer.pool_bytes",
        "a replicated "
        "pool's bytes computed rank-locally: ranks other than 0 hold bytes of their own",
        _tp_rank_local_bytes,
    ),
    Mutant(
        "F11-no-clamp",
        "-",
        "transfers.clamped_nodes",
        "an S2H stopped part way "
        "publishes every node it read, not the clamp of what landed in every pool",
        _f11_no_clamp,
    ),
    Mutant(
        "decision-unplanned",
        "-",
        "CacheController._policy_hits",
        "the policy decides on hits past where every plan stops: a restore chosen, none planned",
        _decision_unplanned,
    ),
    Mutant(
        "replay-unrevived",
        "-",
        "L1Windows.clip",
        "anchor_recompute_swa serves the anchor's whole run over a freed window: never revived",
        _replay_unrevived,
    ),
    Mutant(
        "L3-no-lock",
        "-",
        "storage._lock",
        "an explicit L3 path is opened unlocked: a second controller takes a live one's file over",
        _l3_no_lock,
    ),
    Mutant(
        "I1-skip-L2",
        "-",
        "invariants.registry CHECKS[I1]",
        "the I1 ownership_disjoint check skips tier L2",
        _i1_skip_l2,
    ),
    Mutant(
        "checker-off",
        "-",
        "InvariantChecker.after_transition",
        "the invariant checker never runs a check, whatever the check mode",
        _checker_off,
    ),
)

MUTANTS: dict[str, str] = {m.name: m.description for m in ZOO}
"""Every mutant's name -> its one-line description (what is broken)."""

_BY_NAME: dict[str, Mutant] = {m.name: m for m in ZOO}


def get(name: str) -> Mutant:
    """The mutant called `name` (an "M-" prefix is accepted: "M-B06" is "B06"). ConfigError,
    listing the names, for an unknown one."""
    key = name[2:] if name.startswith("M-") else name
    mutant = _BY_NAME.get(key)
    if mutant is None:
        raise ConfigError("mutant", f"no mutant named {name!r}; known: {', '.join(MUTANTS)}")
    return mutant


def activate(name: str) -> contextlib.AbstractContextManager[None]:
    """A context manager that switches mutant `name` on inside its block (and off after it,
    also when the block raises). Activations do not nest: one mutant at a time."""
    return get(name).patch()
