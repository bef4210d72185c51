"""The invariant checks a replay runs on the reference, and when.

    check_every  after each call                 reports
    -----------  ------------------------------  -------------------------------------------
    1 (default)  the touched all-clear           the full checks' own, run when the
                 (touched.py) on what the call   all-clear says no (it never says yes when
                 changed                         they would find something)
    N > 1        the full checks, once N events  every violation `check_all` finds
                 have passed since the last
    0            nothing                         nothing

`full=True` with `check_every` 1 runs the full checks after every call (the reference mode
the all-clear is measured and tested against). A pool group's plane always does: the
all-clear does not read side pools, so I9 is the full checks' alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from hicache.core.control import ControlPlane
from hicache.core.tiers import TIERS
from hicache.core.trace import TraceEvent
from hicache.core.tree import TreeNode
from hicache.errors import ConfigError
from hicache.invariants import check_all
from hicache.invariants.violation import Violation
from hicache.oracle.checktrace.touched import TouchedChecks

TIER_INDEX = {str(t): i for i, t in enumerate(TIERS)}


class Scope:
    """What one call may have changed, in the reference's ids: the nodes it was asked about
    and their ancestors (before the call), the nodes, ops and requests its events name
    (`nodes`: checked whole); and its request's locked nodes and pins, before and after the
    call (`path`: with their ancestors, checked for lock counts only -- a call changes
    nothing else on a node no event of it names, and locks change without one)."""

    __slots__ = ("nodes", "ops", "pages", "path", "requests")

    def __init__(
        self,
        nodes: Iterable[TreeNode],
        request: int | None,
        op: int | None,
        locked: Iterable[TreeNode],
    ) -> None:
        ids: set[int] = set()
        for n in nodes:
            m: TreeNode | None = n
            while m is not None and not m.is_root:
                ids.add(m.node_id)
                m = m.parent
        path: set[int] = set()
        for n in locked:
            if not n.is_root:
                path.add(n.node_id)
        self.nodes, self.path = ids, path
        self.ops: set[int] = set() if op is None else {op}
        self.requests: set[int] = set() if request is None else {request}
        self.pages: list[set[int]] = [set(), set(), set()]  # per tier index: pages moved

    def add_holders(self, cp: ControlPlane) -> None:
        """After the call: the prefix lock and pins its live requests hold now (a match
        locks a prefix no event names)."""
        live, path = cp.requests, self.path
        for rid in self.requests:
            r = live.get(rid)
            if r is not None:
                path.add(r.locked.node_id)
                for n, _ in r.pins:
                    path.add(n.node_id)

    def add(self, events: Iterable[TraceEvent]) -> None:
        nodes, ops, requests, pages = self.nodes, self.ops, self.requests, self.pages
        for e in events:
            if e.node is not None:
                nodes.add(e.node)
            if e.op is not None:
                ops.add(e.op)
            if e.request is not None:
                requests.add(e.request)
            if e.pages and e.tier is not None:
                pages[TIER_INDEX[e.tier]].update(e.pages)
            if e.event == "split":
                upper = e.detail.get("upper")
                if isinstance(upper, int):
                    nodes.add(upper)


def scope_before(
    cp: ControlPlane, nodes: list[TreeNode], request: int | None, op: int | None
) -> Scope:
    """The scope of a call about to run: `nodes`, and the request's locked prefix and pins."""
    r = None if request is None else cp.requests.get(request)
    locked = [] if r is None else [r.locked, *[n for n, _ in r.pins]] if r.pins else [r.locked]
    return Scope(nodes, request, op, locked)


class Checks:
    """Runs the invariants on `cp` per `every` (see the module docstring)."""

    def __init__(
        self,
        cp: ControlPlane,
        every: int,
        full: bool = False,
        render: Callable[[Violation | object], str] = str,
    ) -> None:
        """`render`: how a violation is written (the replay's: in the trace's ids)."""
        self.render = render
        if every < 0:
            raise ConfigError("check_every", f"0 (never) or N >= 1 events, got {every}")
        self.cp, self.every = cp, every
        # The all-clear reads one page table per tier; a pool group's side pools (I9) are
        # the full checks' alone, so a group plane runs them after every call.
        group = any(len(t.pools) > 1 for t in cp.tables)
        self.touched = TouchedChecks(cp) if every == 1 and not full and not group else None
        self.needs_scope = self.touched is not None  # the replay builds each call's Scope
        self.since = 0
        self.full_runs = 0  # full checks run (after a no of the all-clear, or periodic)

    def after(self, n_events: int, scope: Scope | None) -> list[str]:
        """Violations (as text) after a call that emitted `n_events`; [] when all hold."""
        if not self.every:
            return []
        if self.touched is not None:
            assert scope is not None  # Verify: the replay passes a scope when asked for one.
            if self.touched.clear(scope.nodes, scope.ops, scope.requests, scope.pages, scope.path):
                return []
            found = self._full()
            self.touched.rebuild()
            return found
        self.since += n_events
        if self.since < self.every:
            return []
        self.since = 0
        return self._full()

    def _full(self) -> list[str]:
        self.full_runs += 1
        return [self.render(v) for v in check_all(self.cp.snapshot())]
