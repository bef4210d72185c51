"""C4's rules, checked on every tick of the TP model and every admission (whose C1a carries
C4): not only that the ranks agree, but on what (spec/tp.md, C4). Over one tick, from the
state before it to the state after:

    rule        holds when
    ----------  --------------------------------------------------------------------------
    landed      no rank publishes more of an op than every rank landed: a failed op (on
                some rank) keeps at most the whole nodes each rank landed (done: all of
                them; a read stopped part way: its clamp, `clamped_nodes`; failed, a bad
                slot, still moving: none)
    bad slot    the first bad page any rank's read found (the least position in the op's
                source pages) is, after the tick, quarantined or holding no copy on every
                rank (dropped); the copies after it go with it (evicted below it)
    lost        an op whose issue some rank refused because its L3 file was lost (C2
                deferred: the op taken all the same) leaves L3 offline on every rank once
                the tick ends it

    carried     an admission whose C1a carried C4 (R85) applies the agreed ends only after
                its plan pinned the L3 copy it reads: the copy still holds L3 then (a bad
                slot's drop waits for the pin); C4's rules above hold for the ops it ended

A mutant that makes every rank agree on a wrong answer (the most nodes any rank landed, no
bad slot at all) keeps the ranks equal, so only these rules see it.
"""

from __future__ import annotations

from hicache.controller.clamp import clamped_nodes
from hicache.core.lifecycle import RESIDENT
from hicache.core.tiers import TIERS, Tier
from hicache.oracle.modelcheck.tpstate import handle_of
from hicache.oracle.modelcheck.tpsteps import State
from hicache.pools.spec import PoolGroup


def admit_rules(before: State, after: State, pools: PoolGroup) -> str | None:
    """The rules an admission whose C1a carried C4 keeps (module docstring): `carried`,
    then C4's own over the ops it ended."""
    lost = [rs.rank for rs in after if not rs.plan_held]
    if lost:
        return (
            f"C1a carried: on rank(s) {lost} the ends the admission's C1a carried dropped the "
            "L3 copy its plan reads before the plan pinned it (R85: apply them after the pin)"
        )
    return tick_rules(before, after, pools)


def tick_rules(before: State, after: State, pools: PoolGroup) -> str | None:
    """The first C4 rule the tick from `before` to `after` broke (module docstring), or
    None."""
    for op_id, op in before[0].cp.ops.items():
        if op_id in after[0].cp.ops:
            continue  # still in flight: the tick ended nothing of it
        ends = [rs.ends[op_id] for rs in before]
        landed = []
        for rs, end in zip(before, ends):
            nodes = rs.cp.ops[op_id].nodes
            if end.kind in ("done", "acked"):
                landed.append(len(nodes))
            elif end.kind == "part":
                handle = handle_of(end, op.direction, pools)
                assert handle.landed is not None  # Verify: a part end names what landed.
                landed.append(clamped_nodes(pools, nodes, handle.landed))
            else:
                landed.append(0)
        t = TIERS.index(op.direction.target)
        for rs in after:
            live = {n.node_id: n for n in rs.cp.tree.nodes()}
            published = sum(
                1 for n in op.nodes if n.node_id in live and live[n.node_id].state[t] == RESIDENT
            )
            if published > min(landed):
                return (
                    f"C4 landed: rank {rs.rank} published {published} node(s) of op {op_id} "
                    f"({op.direction}), and the ranks landed {landed}: at most "
                    f"{min(landed)} may be kept"
                )
        if any(end.kind == "refused" and end.arg for end in ends):
            online = [rs.rank for rs in after if rs.l3.online]
            if online:
                return (
                    f"C4 lost: op {op_id} ({op.direction}) was refused on a rank whose L3 "
                    f"file was lost, and L3 is still online on rank(s) {online}"
                )
        found = op.source_pages.tolist()
        bad = [found.index(end.arg) for end in ends if end.kind == "bad"]
        if not bad:
            continue
        slot = found[min(bad)]
        for rs in after:
            if slot not in rs.l3.quarantine and rs.cp.holder(Tier.L3, slot):
                return (
                    f"C4 bad slot: the first bad page of op {op_id} some rank's read found is "
                    f"L3 slot {slot}, and rank {rs.rank} still holds a copy there unquarantined"
                )
    return None


__all__ = ["admit_rules", "tick_rules"]
