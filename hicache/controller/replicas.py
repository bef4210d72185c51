"""A replicated pool's one L3 copy across tensor-parallel ranks (spec/tp.md, C6a and C6b).

    share()          C6a, once, when the cache is built: every rank but 0 reads each
                     replicated pool from rank 0's L3 file from then on (a replica)
    ack(op_ids)      C6b, when C4 ended H2S ops on every rank, before they are published:
                     every rank's slots must be rank 0's, and every rank but 0 records rank
                     0's checksums of what it wrote, so a read of the one copy is verified
    written(acked)   the pools a completed H2S wrote on this rank (I11 reads it)

A replicated pool holds the same bytes on every rank, so rank 0 alone writes it to L3, under
a key without a rank (pool, slot), and every rank reads that copy. On a plane with bytes
(`TransferEngine`) rank 0 hands its files to the others at C6a (process id and
descriptor: `/proc/<pid>/fd/<fd>` reaches a file whose name was removed, from any process of
the host); a plane without bytes takes part with zeros, so both planes make the same
collectives. The slot a node's replicated page sits in is the same on every rank because
every rank makes the same reservations in the same order (C2: commit on all or release on
all) from a deterministic allocator; C6b checks it at every backup rather than trust it.

With one rank, or a group without replicated pools, `pools` is empty and nothing here runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from hicache.controller.planes import tier_pool_pages
from hicache.core.control import ControlPlane
from hicache.core.pages import Pages, pages
from hicache.core.tiers import Tier
from hicache.distributed.agreement import Agreement
from hicache.errors import InvariantViolation
from hicache.invariants import RANK_CHECKS, Violation
from hicache.pools.spec import REPLICATED, PoolGroup

if TYPE_CHECKING:  # torch-heavy: only a plane with bytes brings it
    from hicache.dataplane.engine import TransferEngine

__all__ = ["ReplicatedL3"]


class ReplicatedL3:
    """This rank's side of C6a and C6b (module docstring). `byte_plane`: the controller's
    plane with bytes, or None."""

    def __init__(
        self,
        cp: ControlPlane,
        agree: Agreement,
        group: PoolGroup,
        byte_plane: TransferEngine | None,
    ) -> None:
        self.cp, self.agree, self.group = cp, agree, group
        self._pool_pages = tier_pool_pages(group, cp.tables)  # anchor slots -> each pool's
        kept = group.backed_up().pools
        self.pools: tuple[str, ...] = (
            tuple(p.name for p in kept if p.tp_mode == REPLICATED) if agree.tp else ()
        )
        self.plane = byte_plane if self.pools else None

    def share(self) -> None:
        """C6a: every rank but 0 reads the replicated pools from rank 0's L3 files.
        ConfigError when some ranks' planes hold bytes and others' do not; StorageError when
        rank 0's file cannot be reached (the ranks run on different hosts)."""
        files = self.plane.share_l3(self.pools) if self.plane else [0] * (2 * len(self.pools))
        head = self.agree.l3_share(files)
        if self.plane is not None and self.agree.rank:
            self.plane.attach_l3(self.pools, head)

    def ack(self, op_ids: Sequence[int]) -> None:
        """C6b over H2S ops `op_ids` (issue order) that C4 ended on every rank, before any
        is published. InvariantViolation on every rank, the control plane poisoned, when a
        rank holds a replicated page in another slot than rank 0."""
        if not op_ids:
            return  # C4's agreed answer: the same on every rank
        parts: list[tuple[str, Pages]] = []
        for op_id in op_ids:
            by_source = self._pool_pages(str(Tier.L3), self.cp.ops[op_id].target_pages)
            parts += [(pool, pages(by_source[self.group.pool(pool).source])) for pool in self.pools]
        slots = [int(s) for _, ids in parts for s in ids]
        mine: list[int | None] = []
        for pool, ids in parts:
            got = self.plane.l3_checksums(pool, ids) if self.plane is not None else None
            if got is not None:
                mine += got
            else:
                mine += [None] * ids.size
        head, differ = self.agree.l3_ack(slots, mine)
        if differ:
            self._diverged(op_ids, [slots[i] for i in differ])
        if self.plane is None or not self.agree.rank:
            return
        at = 0
        for pool, ids in parts:
            crcs = head[at : at + ids.size]
            at += ids.size
            if self.plane.is_replica(pool):
                # Verify rank 0 wrote every slot it acked: its plane holds these bytes too.
                assert all(c is not None for c in crcs), (pool, ids.tolist(), crcs)
                self.plane.record_l3(pool, ids, [int(c or 0) for c in crcs])

    def written(self, acked: bool) -> tuple[str, ...]:
        """The backed-up pools a completed H2S wrote on this rank's data plane: none when
        this rank acked it without writing (C6b), a group plane's own files (not its
        replicas), else every pool (a plane moves every pool of the group)."""
        if acked:
            return ()
        kept = self.group.backed_up().pools
        return tuple(
            p.name for p in kept if self.plane is None or not self.plane.is_replica(p.name)
        )

    def _diverged(self, op_ids: Sequence[int], where: Sequence[int]) -> None:
        i7 = RANK_CHECKS[0]  # rank_agreement
        violation = InvariantViolation(
            (
                Violation(
                    i7.id,
                    i7.name,
                    "L3",
                    tuple(sorted(set(where))[:8]),
                    (),
                    tuple(op_ids),
                    f"rank {self.agree.rank} holds replicated pages of these H2S ops in other L3 "
                    f"slots than some rank: every rank reads rank 0's slots, so they must be equal",
                ),
            ),
            "C6b l3_ack",
        )
        self.cp.poison(violation)
        raise violation
