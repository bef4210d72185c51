"""Which rank writes a pool's pages to L3, and what each rank wrote (spec/tp.md, "L3 writes").

    writes_pool(tp_mode, rank)   the rule: a replicated pool's pages by rank 0 only, under a
                                 rank-free key; a sharded pool's by every rank, under a rank key
    L3Writes                     one rank's record of its completed L3 backups (H2S): per op,
                                 the pages its data plane wrote of each pool; bytes by tp_mode
    AckedWrite                   the handle of an H2S a rank acks without writing (C6b)

The controller asks `writes_pool` before an H2S: a rank that writes none of the group's pools
issues nothing to its data plane and acks at once (C6b); the op is published only when every
writing rank's write succeeded (C4). I11 `l3_write_multiplicity` reads every rank's record:
each completed H2S wrote each replicated pool on exactly one rank (0) and each sharded pool
on every rank (B16 breaks one or the other).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass, field

from hicache.dataplane.handles import NullHandle
from hicache.pools.spec import SHARDED, PoolGroup

OPS_MAX = 4096  # completed H2S ops a record keeps (the oldest go first; counters keep all)


def writes_pool(tp_mode: str, rank: int) -> bool:
    """Whether `rank` writes a pool of `tp_mode` to L3 (spec/tp.toml, [[l3_write]]; R74)."""
    return tp_mode == SHARDED or rank == 0


class AckedWrite(NullHandle):
    """The handle of an H2S this rank does not write (C6b): no bytes, finished at once; its
    completion is recorded as written by no pool."""


@dataclass
class L3Writes:
    """One rank's L3 writes. `ops[op_id][pool]`: pages of `pool` this rank wrote for that
    completed H2S (0: it wrote none, as the rule says for its mode); `bytes_by_mode`: bytes
    written per tp_mode since the start (exact: counted, not sampled)."""

    rank: int
    ops: OrderedDict[int, dict[str, int]] = field(default_factory=OrderedDict)
    bytes_by_mode: dict[str, int] = field(default_factory=lambda: {"replicated": 0, "sharded": 0})

    def writes_any(self, group: PoolGroup) -> bool:
        """Whether this rank writes any pool of `group` (else an H2S is acked at once)."""
        return any(writes_pool(p.tp_mode, self.rank) for p in group.backed_up().pools)

    def record(
        self,
        op_id: int,
        group: PoolGroup,
        anchor_pages: int,
        bytes_per_pool: dict[str, int],
        written: Collection[str],
    ) -> None:
        """A completed H2S of `anchor_pages` anchor pages: what this rank wrote of each pool
        (`bytes_per_pool[pool]`: bytes of one of the pool's own pages). `written`: the pools
        this rank's data plane wrote for the op (none when it acked at once, C6b; a replica of
        rank 0's file is never written). What was written, not what the rule says: I11
        compares the two."""
        kept = group.backed_up()
        wrote: dict[str, int] = {}
        for p in kept.pools:
            n = anchor_pages * kept.ratio(p.name) if p.name in written else 0
            wrote[p.name] = n
            self.bytes_by_mode[p.tp_mode] += n * bytes_per_pool.get(p.name, 0)
        self.ops[op_id] = wrote
        while len(self.ops) > OPS_MAX:
            self.ops.popitem(last=False)


__all__ = ["OPS_MAX", "AckedWrite", "L3Writes", "writes_pool"]
