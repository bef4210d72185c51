"""I5: completion precedes publication, and publication precedes the request's `cached_len`.

A transfer's target pages stay PRIVATE and out of the tree until its completion is observed;
completion publishes them as the nodes' values (state RESIDENT) and clears the nodes' pending
op in one step. So, in any snapshot:

    pending[T] set        ->  state[T] != RESIDENT, value[T] is None, the op exists, fills T
                              and lists the node (and the op's nodes point back at it)
    op target page        ->  never TREE in the page table
    value[T] present      <-> state[T] == RESIDENT (publication is one step)
    request               ->  the node it holds L1-locked is in the tree, every node from the
                              root to it is RESIDENT in L1, and cached_len <= the tokens of
                              that path (its published prefix, measured in the tree)

The root holds no tokens and is exempt from the value/state rule.
"""

from __future__ import annotations

from collections.abc import Mapping

from hicache.core.pages import TREE
from hicache.core.snapshot import NodeView, OpView, Snapshot
from hicache.invariants.claims import inside
from hicache.invariants.ownership import RESIDENT
from hicache.invariants.violation import CheckName, Violation, shown

PUBLISH_ORDER = CheckName("I5", "publish_order")


def check_publish_order(s: Snapshot) -> list[Violation]:
    """I5: no node is RESIDENT (or holds a value) in a tier while an op is pending into it;
    pending links between nodes and ops agree; no op target page is TREE; a value is present
    exactly when the node is RESIDENT; every request serves only tokens the tree has published
    in L1 on the path it holds locked."""
    ops = {op.op_id: op for op in s.ops}
    out = _pending_nodes(s, ops) + _op_back_links(s) + _unpublished_targets(s)
    out += _value_matches_state(s)
    return out + _requests_published(s)


def _requests_published(s: Snapshot) -> list[Violation]:
    """The request clause, read off the tree: the path from the root to the request's locked
    node must exist and be RESIDENT in L1, and cached_len may not pass its end."""
    astray: list[int] = []  # requests whose locked node is not in the tree
    early: list[tuple[int, int, int]] = []  # (request, cached_len, tokens published on its path)
    unpublished: list[tuple[int, int]] = []  # (request, first path node not RESIDENT in L1)
    for r in s.requests:
        path = s.path_to_root(r.locked_node_id)
        if path is None:
            astray.append(r.request_id)
            continue
        gaps = [n for n in path if s.by_id[n].states.get("L1") != RESIDENT]
        if gaps:
            unpublished.append((r.request_id, gaps[-1]))
        published = sum(s.by_id[n].key_tokens for n in path)
        if r.cached_len > published:
            early.append((r.request_id, r.cached_len, published))
    out: list[Violation] = []
    if astray:
        out.append(
            PUBLISH_ORDER.violation(
                f"request(s) [{shown(astray)}] hold L1 locks on nodes that are not in the tree, so "
                "nothing they serve is known to be published"
            )
        )
    if unpublished:
        reqs, nodes = zip(*unpublished)
        out.append(
            PUBLISH_ORDER.violation(
                f"request(s) [{shown(reqs)}] hold L1 prefixes through node(s) [{shown(nodes)}] "
                "that are not RESIDENT in L1",
                tier="L1",
                nodes=nodes,
            )
        )
    if early:
        rid, cached, published = early[0]
        out.append(
            PUBLISH_ORDER.violation(
                f"request(s) [{shown([e[0] for e in early])}] serve tokens not yet published in L1 "
                f"(request {rid}: cached_len {cached} > {published} tokens published on the path "
                "it holds locked)"
            )
        )
    return out


def _pending_nodes(s: Snapshot, ops: Mapping[int, OpView]) -> list[Violation]:
    out: list[Violation] = []
    for tier in s.tiers:
        early: list[tuple[int, int]] = []  # (node, op): published while the op is in flight
        stray: list[tuple[int, int]] = []  # (node, op): op gone, fills elsewhere, or omits node
        for n in s.nodes:
            op_id = n.pending.get(tier)
            if op_id is None:
                continue
            if n.states.get(tier) == RESIDENT or n.values.get(tier) is not None:
                early.append((n.node_id, op_id))
            op = ops.get(op_id)
            if op is None or op.target != tier or n.node_id not in op.node_ids:
                stray.append((n.node_id, op_id))
        if early:
            nodes, waits = zip(*early)
            out.append(
                PUBLISH_ORDER.violation(
                    f"node(s) [{shown(nodes)}] are published in {tier} while the op filling it is "
                    "still pending",
                    tier=tier,
                    nodes=nodes,
                    ops=waits,
                )
            )
        if stray:
            nodes, waits = zip(*stray)
            out.append(
                PUBLISH_ORDER.violation(
                    f"node(s) [{shown(nodes)}] wait on op(s) [{shown(waits)}] that are not pending "
                    f"into {tier} for them, so no completion will publish them",
                    tier=tier,
                    nodes=nodes,
                    ops=waits,
                )
            )
    return out


def _op_back_links(s: Snapshot) -> list[Violation]:
    by_id: Mapping[int, NodeView] = {n.node_id: n for n in s.nodes}
    out: list[Violation] = []
    for op in s.ops:
        unlinked = [
            i for i in op.node_ids if i in by_id and by_id[i].pending.get(op.target) != op.op_id
        ]
        if unlinked:
            out.append(
                PUBLISH_ORDER.violation(
                    f"op {op.op_id} fills {op.target} for node(s) [{shown(unlinked)}] that do not "
                    "name it as their pending op, so its completion could publish into a node not "
                    "waiting for it",
                    tier=op.target,
                    nodes=unlinked,
                    ops=(op.op_id,),
                )
            )
    return out


def _unpublished_targets(s: Snapshot) -> list[Violation]:
    out: list[Violation] = []
    for op in s.ops:
        view = s.tiers.get(op.target)
        if view is None:
            continue
        p = inside(op.target_pages, min(view.capacity, int(view.owner.size)))
        published = p[view.owner[p] == TREE]
        if published.size:
            out.append(
                PUBLISH_ORDER.violation(
                    f"{published.size} target page(s) of pending op {op.op_id} are already TREE in "
                    f"{op.target}",
                    tier=op.target,
                    pages=published,
                    ops=(op.op_id,),
                    nodes=op.node_ids,
                )
            )
    return out


def _value_matches_state(s: Snapshot) -> list[Violation]:
    out: list[Violation] = []
    for tier in s.tiers:
        # A pending node that looks published was reported by `_pending_nodes` already.
        wrong = [
            n.node_id
            for n in s.nodes
            if ((n.values.get(tier) is not None) != (n.states.get(tier) == RESIDENT))
            and n.node_id != s.root_id
            and n.pending.get(tier) is None
        ]
        if wrong:
            out.append(
                PUBLISH_ORDER.violation(
                    f"node(s) [{shown(wrong)}] hold a value in {tier} without being RESIDENT "
                    "there, or are RESIDENT without a value (publication is one step)",
                    tier=tier,
                    nodes=wrong,
                )
            )
    return out
