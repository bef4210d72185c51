"""The drain: from any reachable state, end everything and arrive at the quiescent state.

    quiescent   no pending op, no live request, no PRIVATE page in any tier, no lock on any
                node in any tier (what is left is published tree pages, free to evict)

The drain is what a shutdown (or an engine emptying its queue) does: `cancel` every pending
op (once its handle is quiet: spec/restore.md), oldest first, then `end_request` every live
request (releasing its private pages, pins and prefix lock), lowest id first. A state from
which this does not reach the quiescent state is *stuck*: a deadlock (a call the drain needs
is refused) or a leak (a lock or private page nobody can release any more).
"""

from __future__ import annotations

from collections.abc import Callable

from hicache.core.control import ControlPlane
from hicache.core.pages import PRIVATE
from hicache.invariants.registry import check_all
from hicache.oracle.modelcheck.actions import Action


def drain_actions(cp: ControlPlane) -> list[Action]:
    """The drain's calls from `cp`'s state, in order: cancel each op, then end each request."""
    return [Action("cancel", arg=op_id) for op_id in sorted(cp.ops)] + [
        Action("end_request", r) for r in sorted(cp.requests)
    ]


def drain(cp: ControlPlane, run: Callable[[Action], None]) -> str | None:
    """Drain `cp` in place, each call made through `run` (which applies it to `cp`). Returns
    why the state is stuck, or None when the drain reached the quiescent state with every
    invariant holding."""
    for a in drain_actions(cp):
        try:
            run(a)
        except Exception as e:  # any refusal or crash here means the state is stuck
            return f"drain step `{a}` raised {type(e).__name__}: {e}"
    left = not_quiescent(cp)
    if left:
        return "after the drain: " + "; ".join(left)
    broken = check_all(cp.snapshot())
    if broken:
        return "after the drain: " + "; ".join(str(v) for v in broken)
    return None


def not_quiescent(cp: ControlPlane) -> list[str]:
    """What keeps `cp` from being quiescent (module docstring); [] when it is."""
    out: list[str] = []
    if cp.ops:
        out.append(f"ops {sorted(cp.ops)} pending")
    if cp.requests:
        out.append(f"requests {sorted(cp.requests)} live")
    for table in cp.tables:
        held = table.count(PRIVATE)
        if held:
            out.append(f"{held} {table.tier} page(s) PRIVATE")
    locked = [(n.node_id, tuple(n.lock)) for n in cp.tree.nodes() if any(n.lock)]
    if locked:
        out.append(f"locks left (node, per tier): {locked}")
    return out
