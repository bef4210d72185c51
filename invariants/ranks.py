"""The cross-rank invariants of a tensor-parallel cache (spec/invariants.md, I7, I8, I10, I11).

Pure functions of every rank's `RankView` (hicache/core/snapshot.py; built by
hicache/distributed/rankview.py), in rank order.
Each compares rank r with rank 0 and reports the first field that differs, so a report says
which rank left the others and where:

    id   name                     what must hold across ranks
    ---  -----------------------  ---------------------------------------------------------
    I7   rank_agreement           equal trees (topology, residency, locks, pending ops by
                                  direction), requests (cached_len, hits, locked node),
                                  restores (plan, ops, flags, pins), op tables, the next op
                                  id and free counts; page numbers may differ
    I8   replicated_bytes_equal   a replicated pool's pages hold the same digests on every
                                  rank where they are resident (sharded pools are exempt)
    I10  collective_sequence      every rank made the same collectives, in the same order
    I11  l3_write_multiplicity    once quiescent: every completed L3 backup wrote each
                                  replicated pool on rank 0 only, each sharded pool on every
                                  rank (B16)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hicache.core.snapshot import RankView
from hicache.invariants.violation import CheckName, Violation

SHARDED = "sharded"  # the tp_mode whose pages every rank writes (spec/pools.toml, spec/tp.toml)

RANK_AGREEMENT = CheckName("I7", "rank_agreement")
REPLICATED_BYTES_EQUAL = CheckName("I8", "replicated_bytes_equal")
COLLECTIVE_SEQUENCE = CheckName("I10", "collective_sequence")
L3_WRITE_MULTIPLICITY = CheckName("I11", "l3_write_multiplicity")


def check_rank_agreement(views: Sequence[RankView]) -> list[Violation]:
    """I7: every rank's tree, requests, restores, op table and free counts equal rank 0's."""
    out: list[Violation] = []
    for v in views[1:]:
        ref = views[0]
        for field, mine, theirs in (
            ("requests", v.requests, ref.requests),
            ("restores", v.restores, ref.restores),
            ("ops", v.ops, ref.ops),
            ("free counts", v.free, ref.free),
            ("next op ids", (v.next_op,), (ref.next_op,)),
        ):
            if mine != theirs:
                out.append(
                    RANK_AGREEMENT.violation(
                        f"rank {v.rank}'s {field} differ from rank 0's: "
                        f"{_first_difference(mine, theirs)}"
                    )
                )
        if v.nodes != ref.nodes:
            mine_by = {n.node_id: n for n in v.nodes}
            theirs_by = {n.node_id: n for n in ref.nodes}
            ids = sorted(set(mine_by) ^ set(theirs_by)) or sorted(
                i for i in mine_by if mine_by[i] != theirs_by[i]
            )
            first = ids[0]
            out.append(
                RANK_AGREEMENT.violation(
                    f"rank {v.rank}'s tree differs from rank 0's at node {first}: rank {v.rank} "
                    f"{_node_text(mine_by.get(first))}, rank 0 {_node_text(theirs_by.get(first))}",
                    nodes=ids,
                )
            )
    return out


def check_replicated_bytes_equal(views: Sequence[RankView]) -> list[Violation]:
    """I8: a replicated pool's page digests agree wherever every rank holds the page."""
    out: list[Violation] = []
    ref = dict(views[0].replicated) if views else {}
    for v in views[1:]:
        for (tier, node, pool), digests in v.replicated:
            theirs = ref.get((tier, node, pool))
            if theirs is not None and theirs != digests:
                page = (
                    next(i for i, (a, b) in enumerate(zip(digests, theirs)) if a != b)
                    if len(digests) == len(theirs)
                    else 0
                )
                out.append(
                    REPLICATED_BYTES_EQUAL.violation(
                        f"rank {v.rank}'s {tier} copy of node {node}'s replicated pool {pool!r} "
                        f"differs from rank 0's (page {page} of the node)",
                        tier=tier,
                        nodes=(node,),
                    )
                )
    return out


def check_collective_sequence(views: Sequence[RankView]) -> list[Violation]:
    """I10: every rank's collective log (count and running digest) equals rank 0's."""
    out: list[Violation] = []
    for v in views[1:]:
        ref = views[0]
        if (v.log_count, v.log_digest) != (ref.log_count, ref.log_digest):
            out.append(
                COLLECTIVE_SEQUENCE.violation(
                    f"rank {v.rank} made {v.log_count} collectives, rank 0 {ref.log_count}, and "
                    f"their sequences differ; last on rank {v.rank}: {list(v.log_tail[-3:])}, on "
                    f"rank 0: {list(ref.log_tail[-3:])}"
                )
            )
    return out


def check_l3_write_multiplicity(views: Sequence[RankView]) -> list[Violation]:
    """I11, once every rank is quiescent: per completed H2S and pool, the ranks that wrote
    pages are {0} for a replicated pool and every rank for a sharded one (the pools' modes:
    rank 0's view's `modes`), and every rank recorded the op."""
    if not views or not all(v.quiescent for v in views):
        return []
    mode = dict(views[0].modes)
    writers: dict[tuple[int, str], set[int]] = {}
    seen: dict[tuple[int, str], set[int]] = {}
    for v in views:
        for op_id, pool, pages in v.l3_writes:
            seen.setdefault((op_id, pool), set()).add(v.rank)
            if pages:
                writers.setdefault((op_id, pool), set()).add(v.rank)
    out: list[Violation] = []
    everyone = set(range(len(views)))
    for (op_id, pool), ranks in sorted(seen.items()):
        wrote = writers.get((op_id, pool), set())
        want = everyone if mode.get(pool) == SHARDED else {0}
        if ranks != everyone or wrote != want:
            out.append(
                L3_WRITE_MULTIPLICITY.violation(
                    f"L3 backup op {op_id}: pool {pool!r} ({mode.get(pool)}) was written by "
                    f"rank(s) {sorted(wrote)}, recorded by {sorted(ranks)}; the rule: "
                    f"{'every rank' if want == everyone else 'rank 0 only'}",
                    ops=(op_id,),
                )
            )
    return out


@dataclass(frozen=True)
class RankCheck:
    id: str
    name: str
    summary: str
    func: Callable[[Sequence[RankView]], list[Violation]]

    def __call__(self, views: Sequence[RankView]) -> list[Violation]:
        return self.func(views)


RANK_CHECKS: tuple[RankCheck, ...] = (
    RankCheck(
        RANK_AGREEMENT.id,
        RANK_AGREEMENT.name,
        "every rank's tree, requests, ops and free counts equal rank 0's",
        check_rank_agreement,
    ),
    RankCheck(
        REPLICATED_BYTES_EQUAL.id,
        REPLICATED_BYTES_EQUAL.name,
        "a replicated pool's pages hold the same bytes on every rank",
        check_replicated_bytes_equal,
    ),
    RankCheck(
        COLLECTIVE_SEQUENCE.id,
        COLLECTIVE_SEQUENCE.name,
        "every rank made the same collectives in the same order",
        check_collective_sequence,
    ),
    RankCheck(
        L3_WRITE_MULTIPLICITY.id,
        L3_WRITE_MULTIPLICITY.name,
        "replicated pools reach L3 from rank 0 once, sharded ones from every rank",
        check_l3_write_multiplicity,
    ),
)


def check_ranks(views: Sequence[RankView]) -> list[Violation]:
    """Every cross-rank invariant over `views` (rank order)."""
    out: list[Violation] = []
    for c in RANK_CHECKS:
        out += c(views)
    return out


def _first_difference(mine: Sequence[object], theirs: Sequence[object]) -> str:
    for a, b in zip(mine, theirs):
        if a != b:
            return f"{a!r} vs {b!r}"
    return f"{len(mine)} vs {len(theirs)} entries"


def _node_text(n: object) -> str:
    return "has no such node" if n is None else repr(n)


__all__ = [
    "COLLECTIVE_SEQUENCE",
    "L3_WRITE_MULTIPLICITY",
    "RANK_AGREEMENT",
    "RANK_CHECKS",
    "REPLICATED_BYTES_EQUAL",
    "RankCheck",
    "check_collective_sequence",
    "check_l3_write_multiplicity",
    "check_rank_agreement",
    "check_ranks",
    "check_replicated_bytes_equal",
]
