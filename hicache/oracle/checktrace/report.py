"""What a violation report shows about the state before the bad event.

`Before.capture` records, just before each reference call, the little a report needs about
the nodes and the request the call concerns (a few tuples: cheap enough to take every time,
since a divergence is only found after the call has changed the plane). From the record a
report lists the transitions that were enabled then -- each lifecycle row tried on each
node's recorded states, locks and tree context, nothing changed -- and the relevant state:
each node's composite state, locks and pending ops, the request's `cached_len`, private
pages, pins and ops.
"""

from __future__ import annotations

from typing import NamedTuple

from hicache.core.control import ControlPlane
from hicache.core.lifecycle import RESIDENT, Lifecycle, States, composite_name
from hicache.core.records import PendingOp
from hicache.core.tiers import TIERS, Tier
from hicache.core.tree import TreeNode
from hicache.errors import IllegalTransition
from hicache.oracle.checktrace.maps import IdMap


class NodeRecord(NamedTuple):
    """One node as it was: its triple, locks, pending ops, and the tree context guards read."""

    ref_id: int
    states: States
    locks: tuple[int, int, int]
    pending: tuple[int | None, int | None, int | None]
    leaf: tuple[bool, bool, bool]  # per tier: no child present there
    parent_resident: tuple[bool, bool, bool]  # per tier: the parent is the root or RESIDENT


class RequestRecord(NamedTuple):
    request_id: int
    live: bool
    cached_len: int = 0
    published_len: int = 0
    prompt_len: int = 0
    private_pages: int = 0
    pins: tuple[tuple[int, str], ...] = ()  # (reference node id, tier)
    ops: tuple[int, ...] = ()  # reference op ids it issued, pending


class _RecordContext:
    """The guard context of a recorded node (hicache.core.lifecycle.GuardContext)."""

    def __init__(self, rec: NodeRecord) -> None:
        self.rec = rec

    def leaf(self, tier: Tier) -> bool:
        return self.rec.leaf[TIERS.index(tier)]

    def parent_resident(self, tier: Tier) -> bool:
        return self.rec.parent_resident[TIERS.index(tier)]

    def parent_in(self, tier: Tier, state: str) -> bool:
        return self.parent_resident(tier)  # a report lists less for a stacked tier, never more

    def children_settled(self, tier: Tier) -> bool:
        return self.leaf(tier)  # the same: a leaf's children are settled

    def request(self, rule: str) -> bool:
        return False  # request rows are listed per request, not per node


_NodeRaw = tuple[
    int,
    tuple[str, ...],
    tuple[int, ...],
    tuple[int | None, ...],
    tuple[int, ...],
    bool,
    tuple[str, ...],
]
"""A node as `Before.capture` copies it: id, states, locks, pending ops, present children,
whether the parent is the root, the parent's states."""


def _node_record(raw: _NodeRaw) -> NodeRecord:
    node_id, st, lk, pd, pc, top, up = raw
    return NodeRecord(
        node_id,
        (st[0], st[1], st[2]),
        (lk[0], lk[1], lk[2]),
        (pd[0], pd[1], pd[2]),
        (pc[0] == 0, pc[1] == 0, pc[2] == 0),
        (top or up[0] == RESIDENT, top or up[1] == RESIDENT, top or up[2] == RESIDENT),
    )


_RequestRaw = tuple[int, int, int, int, tuple[tuple[TreeNode, int], ...], tuple[PendingOp, ...]]
"""A live request as `Before.capture` copies it: cached_len, published_len, prompt length,
private pages, pins, and every pending op (an op's id and request never change)."""


class Before:
    """The records of one call's concerned nodes and request, taken before the call.

    Taken before every call and read only by a report: `capture` copies the few values the
    records need (tuples of the live lists, the pending ops as they are), and `nodes` and
    `request` build the records from them when first asked."""

    __slots__ = ("_nodes", "_raw_nodes", "_raw_request", "_request", "_request_id")

    def __init__(
        self,
        raw_nodes: tuple[_NodeRaw, ...],
        request_id: int | None,
        raw_request: _RequestRaw | None,
    ) -> None:
        self._raw_nodes, self._request_id, self._raw_request = raw_nodes, request_id, raw_request
        self._nodes: tuple[NodeRecord, ...] | None = None
        self._request: RequestRecord | None = None

    @staticmethod
    def capture(cp: ControlPlane, nodes: list[TreeNode], request: int | None) -> Before:
        raw: _RequestRaw | None = None
        r = None if request is None else cp.requests.get(request)
        if r is not None:
            raw = (
                r.cached_len,
                r.published_len,
                len(r.tokens),
                int(r.private_pages.size),
                tuple(r.pins),
                tuple(cp.ops.values()),
            )
        raws: list[_NodeRaw] = []  # a `_NodeRaw` each (a loop: a comprehension is a call)
        for n in nodes:
            if not n.is_root:
                p = n.parent
                raws.append(
                    (
                        n.node_id,
                        tuple(n.state),
                        tuple(n.lock),
                        tuple(n.pending),
                        tuple(n.present_children),
                        p is None or p.is_root,
                        () if p is None else tuple(p.state),
                    )
                )
        return Before(tuple(raws), request, raw)

    @property
    def nodes(self) -> tuple[NodeRecord, ...]:
        """The concerned nodes' records (the root's left out)."""
        if self._nodes is None:
            self._nodes = tuple(_node_record(raw) for raw in self._raw_nodes)
        return self._nodes

    @property
    def request(self) -> RequestRecord | None:
        """The concerned request's record (not live: `live` False); None when none."""
        request, raw = self._request_id, self._raw_request
        if request is None or self._request is not None:
            return self._request
        if raw is None:
            self._request = RequestRecord(request, False)
            return self._request
        cached_len, published_len, prompt_len, private, pins, ops = raw
        self._request = RequestRecord(
            request,
            True,
            cached_len,
            published_len,
            prompt_len,
            private,
            tuple((n.node_id, str(TIERS[t])) for n, t in pins),
            tuple(o.op_id for o in ops if o.request_id == request),
        )
        return self._request

    def enabled(self, lc: Lifecycle, nodes: IdMap, ops: IdMap) -> list[str]:
        """One line per concerned node and request: the transitions enabled then."""
        out: list[str] = []
        for rec in self.nodes:
            names: list[str] = []
            for t in lc.transitions.values():
                if t.acts_on_copy or t.source == "PRIVATE":
                    continue  # a request's rows: listed with the request
                try:
                    lc.check(t.name, rec.states, rec.locks, _RecordContext(rec))
                except IllegalTransition:
                    continue
                filling = rec.pending[TIERS.index(t.tier)]
                names.append(
                    t.name if filling is None else f"{t.name} ({ops.engine_name(filling)})"
                )
            out.append(f"{nodes.engine_name(rec.ref_id)}: {', '.join(names) or 'none'}")
        r = self.request
        if r is not None:
            if not r.live:
                out.append(f"trace request {r.request_id}: begin_request (it is not live)")
            else:
                names = []
                if r.private_pages == 0 and r.published_len < r.prompt_len:
                    names.append("compute")
                if r.private_pages:
                    names.append("insert")
                if r.pins:
                    names.append("unlock (unpin)")
                names.append("end_request" if not r.ops else "end_request after its ops end")
                out.append(f"trace request {r.request_id}: {', '.join(names)}")
        return out

    def state(self, nodes: IdMap, ops: IdMap) -> list[str]:
        """One line per concerned node and request: its state then."""
        out: list[str] = []
        for rec in self.nodes:
            locks = " ".join(f"{t}={n}" for t, n in zip(TIERS, rec.locks))
            pend = ", ".join(
                f"{t} by {ops.engine_name(o)}" for t, o in zip(TIERS, rec.pending) if o is not None
            )
            out.append(
                f"{nodes.engine_name(rec.ref_id)}: {composite_name(rec.states)}; "
                f"locks {locks}; pending: {pend or 'none'}"
            )
        r = self.request
        if r is not None:
            if not r.live:
                out.append(f"trace request {r.request_id}: not live")
            else:
                pins = ", ".join(f"{nodes.engine_name(n)} in {t}" for n, t in r.pins) or "none"
                mine = ", ".join(ops.engine_name(o) for o in r.ops) or "none"
                out.append(
                    f"trace request {r.request_id}: cached_len {r.cached_len} of {r.prompt_len} "
                    f"prompt tokens, published {r.published_len}, private pages {r.private_pages}, "
                    f"pins: {pins}, ops pending: {mine}"
                )
        return out
