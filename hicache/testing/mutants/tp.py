"""Tensor-parallel mutants: B16 (the L3 write rule) and agreement bugs of spec/tp.md's
F15-F18 scenarios; they run on the TP machines.

Registered in `hicache.testing.mutants` (its table names each one); `ZOO` lists this
module's mutants in the order `hicache fuzz --mutant list` prints them.
"""

from __future__ import annotations

import contextlib
from typing import Any

from hicache.testing.mutants.base import Mutant, swapped


def _b16() -> contextlib.AbstractContextManager[None]:
    """The L3 write rule inverted: a replicated pool written by every rank, a sharded one by
    rank 0 only."""
    from hicache.distributed import ledger
    from hicache.pools.spec import SHARDED

    def writes_pool(tp_mode: str, rank: int) -> bool:
        return tp_mode != SHARDED or rank == 0

    return swapped(ledger, "writes_pool", writes_pool)


def _b16_ack() -> contextlib.AbstractContextManager[None]:
    """B16 where the rule is right and the controller's use of it is not: every rank but 0
    acks an L3 backup at once (C6b) as if it wrote none of the group's pools, sharded ones
    included. Caught only because I11 reads what each rank wrote, not the rule."""
    from hicache.distributed.ledger import L3Writes

    original = L3Writes.__dict__["writes_any"]

    def writes_any(self: Any, group: Any) -> bool:
        return bool(original(self, group)) and self.rank == 0

    return swapped(L3Writes, "writes_any", writes_any)


def _tp_conditional() -> contextlib.AbstractContextManager[None]:
    """A conditional collective: a rank skips the per-tick completion reduction when none of
    its ops ended locally (it has nothing to report)."""
    from hicache.distributed.agreement import Agreement

    original = Agreement.__dict__["completion"]

    def completion(self: Any, local: Any) -> Any:
        if not any(x[0] for x in local):
            return [(False, False, *x[2:]) for x in local]
        return original(self, local)

    return swapped(Agreement, "completion", completion)


def _tp_local_capacity() -> contextlib.AbstractContextManager[None]:
    """A rank-local capacity decision: a rank whose reservation was refused evicts more and
    retries alone, before the ranks agree (C2; deferred: it drops its refused op first)."""
    from hicache.controller.transfers import Transfers
    from hicache.distributed.refused import RefusedIssue
    from hicache.errors import OutOfPages

    original = Transfers.__dict__["_issue_here"]

    def _issue_here(
        self: Any, direction: Any, chain: Any, request_id: Any, need: int, parent: Any, *more: Any
    ) -> Any:
        got = original(self, direction, chain, request_id, need, parent, *more)
        refused = isinstance(got[1], RefusedIssue) and isinstance(got[1].refusal, OutOfPages)
        if self.tp and (refused or isinstance(got[2], OutOfPages)):
            if refused:
                self.cp.fail(got[0].op_id)
            self.evictor.evict(
                direction.target, need, keep=[parent, *chain], back_up=self.back_up_now
            )
            got = original(self, direction, chain, request_id, need, parent, *more)
        return got

    return swapped(Transfers, "_issue_here", _issue_here)


def _tp_min_of_maxima() -> contextlib.AbstractContextManager[None]:
    """Hit agreement by the minimum of per-rank maxima: the L1 hit is the least of the ranks'
    own hits (each the largest endpoint its own windows allow), not the largest endpoint
    every rank allows (C1a's intersection of masks). The same collective as C1a."""
    from hicache.distributed.agreement import Agreement, decode_ends, encode_ends

    def admit(self: Any, bounds: Any, own_l1: int, code: int, mask: Any, carried: Any = ()) -> Any:
        width = 5 + len(mask or ())
        rows = self.c.all_gather(
            "admit", [*bounds, own_l1, code, *(mask or ()), *encode_ends(carried)]
        )
        agreed = [min(col) for col in zip(*(r[:3] for r in rows))]
        if mask is not None:
            agreed[0] = min(agreed[0], min(r[3] for r in rows))
        head = rows[0]
        ends = decode_ends([min(col) for col in zip(*(r[width:] for r in rows))])
        rank0 = head[4] if (head[3], head[1], head[2]) == tuple(agreed) else None
        return tuple(agreed), rank0, ends

    return swapped(Agreement, "admit", admit)


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

    return swapped(GroupSyntheticProducer, "pool_bytes", pool_bytes)


def _tp_cancel_ended() -> contextlib.AbstractContextManager[None]:
    """C5 as it was before 4f44ac3: across ranks a cancel (finish, cancel_restore, close)
    settles an op from each rank's own handle, so a rank a tick already saw the op end on
    publishes it (done) or fails it while the ranks still moving it release it."""
    from hicache.controller.transfers import Transfers
    from hicache.dataplane.handles import TransferStatus

    original = Transfers.__dict__["settle"]

    def settle(
        self: Any, op_id: int, failed: Any = None, kept: Any = None, bad: Any = None
    ) -> None:
        status = self.handles[op_id].status
        if failed is None and self.tp and status in (TransferStatus.DONE, TransferStatus.FAILED):
            failed = status is TransferStatus.FAILED  # the handle's own end, this rank's alone
        original(self, op_id, failed, kept, bad)

    return swapped(Transfers, "settle", settle)


_ALL_NODES = 1 << 30
"""More nodes than any op has: C4's least of it and a failing rank's clamp is that clamp, as
the op's own node count was (`_tp_moving_landed`)."""


def _tp_moving_landed() -> contextlib.AbstractContextManager[None]:
    """C4 as it was before 417fbcb: a rank still moving an op reports all its nodes landed,
    so when another rank's read stopped part way every rank keeps that rank's clamp -- the
    rank still moving too, which then cancels its read and publishes nodes it never wrote.
    The same values wherever C4 is made: at a tick, and carried by C1a (R85)."""
    from hicache.distributed.agreement import Agreement

    original = Agreement.__dict__["completion"]
    original_admit = Agreement.__dict__["admit"]

    def moving(local: Any) -> Any:
        return [(e, f, k if e or f else _ALL_NODES, *rest) for e, f, k, *rest in local]

    def completion(self: Any, local: Any) -> Any:
        return original(self, moving(local))

    def admit(self: Any, bounds: Any, own_l1: int, code: int, mask: Any, carried: Any = ()) -> Any:
        return original_admit(self, bounds, own_l1, code, mask, moving(carried))

    return _both(swapped(Agreement, "completion", completion), swapped(Agreement, "admit", admit))


@contextlib.contextmanager
def _both(
    first: contextlib.AbstractContextManager[None], second: contextlib.AbstractContextManager[None]
) -> Any:
    """Two patches at once, undone in reverse order."""
    with first, second:
        yield


ZOO: tuple[Mutant, ...] = (
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
        "a refused reservation evicts and retries on that rank alone, before the ranks agree",
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
        "TP-cancel-ended",
        "-",
        "Transfers.settle",
        "C5 before its fix: a cancel settles an op from "
        "each rank's own handle, so the rank a tick saw it end on publishes it alone",
        _tp_cancel_ended,
    ),
    Mutant(
        "TP-moving-landed",
        "-",
        "Agreement.completion",
        "C4 before its fix: a rank still moving "
        "an op reports all its nodes landed, then publishes a clamp it never wrote",
        _tp_moving_landed,
    ),
)
