"""Valid trace examples: ControlPlane scripts traced through an NdjsonSink, header first.

Each script drives one fresh reference control plane (PAGE_SIZE tokens per page, CAPACITIES
pages per tier) through a scenario an engine porting the design meets; `record` returns its
trace's lines. A script's docstring is its manifest description.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence

from hicache.core.control import ControlPlane
from hicache.core.tiers import Direction
from hicache.core.trace import NdjsonSink, TraceHeader, Tracer
from hicache.core.tree import TreeNode

PAGE_SIZE = 2
CAPACITIES = {"L1": 8, "L2": 8, "L3": 8}
"""Every example runs one control plane of these sizes (tokens per page; pages per tier)."""
PROMPT = (1, 2, 3, 4, 5)
"""Request 1's prompt in every script: two whole pages (node 1) and a tail page."""

Script = Callable[[ControlPlane], None]


def record(script: Script) -> tuple[str, ...]:
    """Run `script` on a fresh plane of CAPACITIES traced into an NdjsonSink: the lines."""
    header = TraceHeader(PAGE_SIZE, CAPACITIES, engine="hicache control plane")
    stream = io.StringIO()
    cp = ControlPlane(
        PAGE_SIZE, tuple(CAPACITIES.values()), tracer=Tracer(NdjsonSink(stream, header))
    )
    # Verify the header written first is the plane's own (spec/trace.md, "Header").
    assert cp.trace_header() == header, f"{cp.trace_header()} != {header}"
    script(cp)
    return tuple(stream.getvalue().splitlines())


def _served(cp: ControlPlane, rid: int, tokens: Sequence[int]) -> None:
    """Request `rid` computes what it misses through its tail page and inserts it (it stays
    live: its prefix lock holds what it inserted)."""
    m = cp.begin_request(rid, tokens)
    cp.compute(rid, -(-len(tokens) // PAGE_SIZE) * PAGE_SIZE - m.lengths[0])
    cp.insert(rid)


def _node(cp: ControlPlane, key_start: int) -> TreeNode:
    """The node whose key starts at token `key_start` of its path (the scripts' nodes differ
    in that)."""
    return next(n for n in cp.tree.nodes() if cp.tree.prefix_tokens(n) - len(n.key) == key_start)


def _back_up(cp: ControlPlane, direction: Direction, node: TreeNode) -> None:
    cp.complete(cp.issue(direction, [node]).op_id)


def write_through_l3(cp: ControlPlane) -> None:
    """Two nodes backed up to L2 and L3, parent first; request 2 extends request 1's prefix."""
    _served(cp, 1, PROMPT)
    _back_up(cp, Direction.D2H, _node(cp, 0))
    cp.end_request(1)
    _served(cp, 2, (1, 2, 3, 4, 6, 7, 8, 9, 10))
    _back_up(cp, Direction.H2S, _node(cp, 0))
    _back_up(cp, Direction.D2H, _node(cp, 4))
    _back_up(cp, Direction.H2S, _node(cp, 4))
    cp.end_request(2)


def _only_in(cp: ControlPlane, tier: str) -> TreeNode:
    """Request 1 computes PROMPT; node 1 is backed up down to `tier` (L2 or L3), then every
    tier above it is evicted."""
    _served(cp, 1, PROMPT)
    node = _node(cp, 0)
    _back_up(cp, Direction.D2H, node)
    if tier == "L3":
        _back_up(cp, Direction.H2S, node)
    cp.end_request(1)
    cp.evict("L1", 8)
    if tier == "L3":
        cp.evict("L2", 8)
    return node


def _promoted(cp: ControlPlane) -> TreeNode:
    """Node 1 held in L3 only; request 2 pins it there, promotes it (S2H) and pins it in L2,
    as a restore does before its load-back (spec/restore.md, "Locks a restore holds")."""
    node = _only_in(cp, "L3")
    cp.begin_request(2, PROMPT)
    cp.pin(2, node, "L3")
    cp.complete(cp.issue(Direction.S2H, [node], 2).op_id)
    cp.pin(2, node, "L2")
    return node


def l3_restore_promotion(cp: ControlPlane) -> None:
    """Request 2 restores node 1 from L3: S2H publishes it in L2 (promotion), H2D in L1, each
    stage pinned (spec/restore.md, "Locks a restore holds"); then `cached_len` covers it."""
    node = _promoted(cp)
    cp.complete(cp.issue(Direction.H2D, [node], 2).op_id)
    cp.pin(2, node, "L1")
    cp.advance_cached_len(2, node)
    cp.unpin(2)
    cp.compute(2, PAGE_SIZE)  # the tail page
    cp.insert(2)
    cp.end_request(2)


def failed_h2d_after_promotion(cp: ControlPlane) -> None:
    """The promotion completes, the load-back fails: the promoted L2 copy stays published
    (B02), and request 2 recomputes the prefix (compute, insert)."""
    node = _promoted(cp)
    cp.fail(cp.issue(Direction.H2D, [node], 2).op_id)
    cp.unpin(2)
    cp.compute(2, 3 * PAGE_SIZE)
    cp.insert(2)
    cp.end_request(2)


def abort_mid_h2d(cp: ControlPlane) -> None:
    """Request 2's load-back from L2 is cancelled in flight (`h2d_cancel`) and the request
    ends: its pin released, nothing left behind (spec/restore.md)."""
    node = _only_in(cp, "L2")
    cp.begin_request(2, PROMPT)
    cp.pin(2, node, "L2")
    cp.cancel(cp.issue(Direction.H2D, [node], 2).op_id)
    cp.end_request(2)


def failed_s2h_fallback(cp: ControlPlane) -> None:
    """The promotion's read fails its checksum (`s2h_fail`): the pin is released, the slot
    dropped (`invalidate_l3`, the node removed) and request 2 recomputes (compute, insert)."""
    node = _only_in(cp, "L3")
    cp.begin_request(2, PROMPT)
    cp.pin(2, node, "L3")
    cp.fail(cp.issue(Direction.S2H, [node], 2).op_id)
    cp.unpin(2)
    cp.evict_node(node, "L3", "invalidate_l3")
    cp.compute(2, 3 * PAGE_SIZE)
    cp.insert(2)
    cp.end_request(2)


def split_during_pending_op(cp: ControlPlane) -> None:
    """Node 1's backup to L2 is in flight when request 2's match splits it (`split`): the op
    then covers both halves and ends with one event per node, upper first, each with its
    part of the op's one page list (spec/trace.md, rule 4)."""
    _served(cp, 1, PROMPT)
    op = cp.issue(Direction.D2H, [_node(cp, 0)])
    cp.end_request(1)
    _served(cp, 2, (1, 2, 9, 9, 9))
    cp.complete(op.op_id)
    cp.end_request(2)


def shared_load_back(cp: ControlPlane) -> None:
    """Requests 2 and 3 want node 1, held in L2 only: request 2 issues the load-back, request
    3 finds it pending, pins node 1 in L2 and waits; on completion both take their L1 pins and
    both serve 4 tokens from the one transfer (spec/restore.md, "Sharing a load-back")."""
    node = _only_in(cp, "L2")
    cp.begin_request(2, PROMPT)
    cp.pin(2, node, "L2")
    op = cp.issue(Direction.H2D, [node], 2)
    cp.begin_request(3, PROMPT)
    cp.pin(3, node, "L2")
    cp.complete(op.op_id)
    for rid in (2, 3):
        cp.pin(rid, node, "L1")
    for rid in (2, 3):
        cp.advance_cached_len(rid, node)
        cp.unpin(rid)
        cp.compute(rid, PAGE_SIZE)
        cp.insert(rid)
        cp.end_request(rid)


def write_back_on_eviction(cp: ControlPlane) -> None:
    """Write-back: L1 pressure picks node 1, which has no L2 copy, so it is backed up first
    (`d2h_issue`, `d2h_complete`) and only then evicted (`evict_l1`); request 2 then loads it
    back from L2."""
    _served(cp, 1, PROMPT)
    cp.end_request(1)
    cp.evict("L1", 2, before=lambda victim: _back_up(cp, Direction.D2H, victim))
    node = _node(cp, 0)
    cp.begin_request(2, PROMPT)
    cp.pin(2, node, "L2")
    cp.complete(cp.issue(Direction.H2D, [node], 2).op_id)
    cp.pin(2, node, "L1")
    cp.advance_cached_len(2, node)
    cp.unpin(2)
    cp.end_request(2)


VALID: dict[str, Script] = {
    "write_through_l3": write_through_l3,
    "l3_restore_promotion": l3_restore_promotion,
    "failed_h2d_after_promotion": failed_h2d_after_promotion,
    "abort_mid_h2d": abort_mid_h2d,
    "failed_s2h_fallback": failed_s2h_fallback,
    "split_during_pending_op": split_during_pending_op,
    "shared_load_back": shared_load_back,
    "write_back_on_eviction": write_back_on_eviction,
}
"""Valid examples: name -> script (its docstring is the manifest's description)."""
