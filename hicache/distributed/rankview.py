"""A rank's view, built: what the cross-rank invariants compare (spec/invariants.md, I7-I11).

    RankView (hicache/core/snapshot.py, core vocabulary the checker reads)
      rank, size
      nodes        NodeRecord per tree node: topology (parent, key length and hash), per tier
                   residency, lock count, the direction of the op filling it, pages held,
                   LRU tick (what eviction orders by: equal ticks, equal victims)
      requests     (request id, cached_len, hits at admission per tier, locked node)
      restores     (request id, the restore's record, its pins): the plan, ops and flags
                   a prefill's serve reads without a collective where no window is freed
      ops          (op id, direction, node ids, token range): the pending-op table
      next_op      the id the next transfer takes: ids stay equal on every rank, also
                   when no op is pending (C2: a rank that issued nothing skips the id)
      free         (tier, pool, free pages): counts, never page numbers
      log          the collective log: count, digest, last entries (I10)
      l3_writes    (H2S op id, pool, pages this rank wrote) (I11)
      replicated   ((tier, node id, pool), page digests) of replicated pools (I8; bytes only)
      quiescent    no op in flight and no backup wanted: I11 is checked only then
      modes        (pool, tp_mode) of the group: what I11's rule reads

Plain, picklable data: simulated ranks hand it over in memory, processes all-gather it (C7).
Physical page numbers are left out on purpose (they may differ by rank; counts may not), and
so are a trailing pool's windows in L1 (a rank's sliding-window memory is its own: a window
freed on one rank only is legal, and the hits agree on it through C1a).
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from hicache.core.lifecycle import RESIDENT
from hicache.core.pages import Pages
from hicache.core.snapshot import NodeRecord, RankView
from hicache.core.tiers import TIERS, Tier
from hicache.pools.spec import REPLICATED, PoolGroup
from hicache.pools.tierpools import window_pools

if TYPE_CHECKING:
    from hicache.core.control import ControlPlane
    from hicache.distributed.collectives import CollectiveLog
    from hicache.distributed.ledger import L3Writes

PoolDigests = Callable[[str, Pages], Mapping[str, npt.NDArray[np.uint64]]]
"""(tier, pages) -> per pool, the pages' digests: a group byte plane's `pool_digests`."""


class HasRankView(Protocol):
    """What `rank_view` reads: a rank's cache (`CacheController.rank_view` builds it)."""

    def rank_view(self) -> RankView: ...


def key_hash(tokens: tuple[int, ...]) -> str:
    return hashlib.sha256(repr(tokens).encode()).hexdigest()[:16]


def rank_view(ctl: HasRankView) -> RankView:
    """`ctl`'s view (its control plane, restores, collective log and L3 writes)."""
    return ctl.rank_view()


def build_view(
    cp: ControlPlane,
    *,
    rank: int,
    size: int,
    hits: Mapping[int, tuple[int, ...]],
    restores: Mapping[int, tuple[object, ...]],
    log: CollectiveLog,
    l3_writes: L3Writes,
    quiescent: bool,
    group: PoolGroup,
    pool_digests: PoolDigests | None,
) -> RankView:
    """A rank's view from its parts: its control plane `cp`, the hits at admission of the
    live requests that restore (`hits`, by request id) and their restores' records
    (`restores`, `Materialization.record`), its collective `log`, its
    `l3_writes`, whether it is `quiescent` (no op in flight, no backup wanted), its pool
    `group` and its byte plane's `pool_digests` (None: no bytes to compare, or the plane is
    closed)."""
    nodes = []
    for n in cp.tree.nodes():
        filling = tuple(
            None if op is None else cp.ops[op].direction.value if op in cp.ops else "?"
            for op in n.pending
        )
        nodes.append(
            NodeRecord(
                n.node_id,
                None if n.parent is None else n.parent.node_id,
                len(n.key),
                key_hash(tuple(n.key)),
                (n.state[0], n.state[1], n.state[2]),
                (n.lock[0], n.lock[1], n.lock[2]),
                (filling[0], filling[1], filling[2]),
                tuple(0 if v is None else int(v.size) for v in n.value),  # type: ignore[arg-type]
                (n.last_access[0], n.last_access[1], n.last_access[2]),
            )
        )
    requests = tuple(
        sorted(
            (
                rid,
                r.cached_len,
                hits.get(rid, ()),
                r.locked.node_id,
            )
            for rid, r in cp.requests.items()
        )
    )
    restore_records = tuple(
        sorted(
            (
                rid,
                record,
                tuple((n.node_id, int(t)) for n, t in cp.requests[rid].pins)
                if rid in cp.requests
                else (),
            )
            for rid, record in restores.items()
        )
    )
    ops = tuple(
        sorted(
            (op.op_id, op.direction.value, tuple(n.node_id for n in op.nodes), *op.token_range)
            for op in cp.ops.values()
        )
    )
    free: list[tuple[str, str, int]] = []
    for t, table in zip(TIERS, cp.tables):
        named = len(table.pools) > 1  # a group of one's free list is the tier's: unnamed
        for name, sub in table.pool_tables().items():
            if not (str(t) == "L1" and name in table.window):  # a rank's windows are its own
                free.append((str(t), name if named else "", sub.free_count))
    writes = tuple(
        (op_id, pool, n) for op_id, by_pool in l3_writes.ops.items() for pool, n in by_pool.items()
    )
    return RankView(
        rank,
        size,
        tuple(sorted(nodes, key=lambda r: r.node_id)),
        requests,
        ops,
        tuple(free),
        log.count,
        log.digest,
        tuple(e.text() for e in log.tail),
        writes,
        _replicated(cp, group, pool_digests),
        quiescent,
        tuple((p.name, p.tp_mode) for p in group.backed_up().pools),
        cp.next_op_id,
        restore_records,
    )


def _replicated(
    cp: ControlPlane, group: PoolGroup, per_pool: PoolDigests | None
) -> tuple[tuple[tuple[str, int, str], tuple[int, ...]], ...]:
    """Per (tier, node, replicated pool) the node's page digests there (bytes only; none
    once the plane is closed: a closed cache holds no bytes, on any rank). In L1, the pools
    a freed window frees are left out: each rank frees its own windows (spec/tp.md), so
    those pages may be held on one rank and not another; L2 compares them."""
    kept = group.backed_up()
    windowed = set(window_pools(kept))
    pools = [p.name for p in kept.pools if p.tp_mode == REPLICATED]
    in_l1 = [n for n in pools if kept.pool(n).source not in windowed]
    if not pools or per_pool is None:
        return ()
    out = []
    for n in cp.tree.nodes():
        for t, v in enumerate(n.value):
            if v is None or not v.size or n.state[t] != RESIDENT or TIERS[t] is Tier.L3:
                continue  # L3: a replicated pool's slots are rank 0's, read by every rank
            for pool, digests in per_pool(TIERS[t].value, v).items():
                if pool in (in_l1 if TIERS[t] is Tier.L1 else pools):
                    out.append(((TIERS[t].value, n.node_id, pool), tuple(int(d) for d in digests)))
    return tuple(sorted(out))


def state_hash(view: RankView) -> int:
    """A 63-bit hash of what I7 compares (tree, requests, restores, ops, free counts, next
    op id)."""
    return _hash63((view.nodes, view.requests, view.restores, view.ops, view.free, view.next_op))


def bytes_hash(view: RankView) -> int:
    """A 63-bit hash of what I8 compares (the replicated pools' page digests)."""
    return _hash63(view.replicated)


def _hash63(value: object) -> int:
    return int.from_bytes(hashlib.sha256(repr(value).encode()).digest()[:8], "big") >> 1


def encode_view(view: RankView) -> tuple[list[int], int]:
    """`view` as int64 words (a collective's payload) and its length in bytes."""
    blob = pickle.dumps(view, protocol=pickle.HIGHEST_PROTOCOL)
    padded = blob + b"\0" * (-len(blob) % 8)
    return np.frombuffer(padded, dtype=np.int64).tolist(), len(blob)


def decode_view(words: tuple[int, ...], nbytes: int) -> RankView:
    """The view `encode_view` made (`words` may carry padding past `nbytes`). The ranks of one
    job run one program: a view is read only from a peer rank's own collective."""
    view = pickle.loads(np.array(words, dtype=np.int64).tobytes()[:nbytes])
    # Verify a peer sent a view, not something else.
    assert isinstance(view, RankView), type(view)
    return view


__all__ = [
    "HasRankView",
    "NodeRecord",
    "PoolDigests",
    "RankView",
    "build_view",
    "bytes_hash",
    "decode_view",
    "encode_view",
    "key_hash",
    "rank_view",
    "state_hash",
]
