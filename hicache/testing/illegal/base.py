"""What an illegal call is, how one is judged, and the spec's rules the builders read.

`refusal(cp, call)` runs one call and returns None when the plane refused it with the
error named and changed nothing (`ControlPlane.state_key` before == after), else what went
wrong. The helpers decide from the spec's rules (spec/lifecycle.md) whether a node may be
issued, never by asking the plane's own planner: a broken guard must not vouch for itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, TypeVar

from hicache.core.control import ControlPlane
from hicache.core.lifecycle import ABSENT, RESIDENT
from hicache.core.tiers import TIERS, Direction
from hicache.core.tree import TreeNode
from hicache.errors import HiCacheError

NOT_LIVE = 1_000_000
"""Request ids from here on are never live: the machine numbers its requests from 1."""

T = TypeVar("T")


class IllegalCall(NamedTuple):
    """One call the spec refuses in the plane's current state: its catalogue `kind`, what
    it does (ids named), the call, and the typed error its refusal must raise."""

    kind: str
    what: str
    run: Callable[[], object]
    error: type[HiCacheError]


Builder = Callable[[ControlPlane, int], "IllegalCall | None"]
"""A catalogue entry: (plane, pick) -> the call its kind makes in the plane's state now, or
None when the state offers none; `pick` chooses among the candidates (modulo their number)."""


def refusal(
    cp: ControlPlane, call: IllegalCall, before: tuple[object, ...] | None = None
) -> str | None:
    """Run `call` on `cp`: None when it raised `call.error` and changed nothing, else what
    went wrong (accepted; another error; refused after a change), naming the call. `before`:
    `cp.state_key()` now, when the caller has it (a refused call leaves it valid for the
    next)."""
    before = cp.state_key() if before is None else before
    try:
        call.run()
    except call.error:
        if cp.state_key() != before:
            return f"{call.kind}: {call.what} was refused, but changed the plane's state first"
        return None
    except Exception as e:  # any other error is the finding: named, with what it changed
        changed = ", and changed the plane's state" if cp.state_key() != before else ""
        typed = "" if isinstance(e, HiCacheError) else " (untyped: no HiCacheError)"
        return (
            f"{call.kind}: {call.what} raised {type(e).__name__}{typed}{changed}, not "
            f"{call.error.__name__}: {e}"
        )
    return f"{call.kind}: {call.what} was accepted; the spec refuses it ({call.error.__name__})"


def choose(items: Sequence[T], pick: int) -> T | None:
    """The `pick`-th of `items` (modulo their number); None when there are none."""
    return items[pick % len(items)] if items else None


def ends(d: Direction) -> tuple[int, int]:
    """The tier indexes a transfer reads (source) and fills (target)."""
    return TIERS.index(d.source), TIERS.index(d.target)


def issuable(
    cp: ControlPlane, n: TreeNode, d: Direction, *, after_parent: bool = False, window: bool = True
) -> bool:
    """Whether `<d>_issue` may take `n` (its row, spec/lifecycle.md): the source RESIDENT,
    the target ABSENT, the parent the root or RESIDENT in the target (`after_parent`: the
    parent is an earlier node of the same chain), and for a D2H the L1 window whole
    (`window` False: not asked)."""
    s, t = ends(d)
    if n.state[s] != RESIDENT or n.state[t] != ABSENT:
        return False
    if window and d is Direction.D2H and cp.windows.freed(n):
        return False
    p = n.parent
    return after_parent or p is None or p.is_root or p.state[t] == RESIDENT


def stale(n: TreeNode) -> TreeNode:
    """A handle with `n`'s id, key and states that is not the tree's node: what a caller
    holds after the node it matched was removed."""
    ghost = TreeNode(n.node_id, n.parent, n.key, 0, n.page_size)
    ghost.state, ghost.value = list(n.state), list(n.value)
    return ghost


def ids(nodes: Sequence[TreeNode]) -> list[int]:
    return [n.node_id for n in nodes]
