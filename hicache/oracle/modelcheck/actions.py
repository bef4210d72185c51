"""The actions the model checker may take: what the control plane lets a caller do.

An `Action` names its arguments by the plane's own ids (request id, node ids, op id), so the
same action can be re-applied to a fresh plane replaying the path (hicache/oracle/modelcheck/
counterexample.py): the plane is deterministic, so a replayed path yields the same ids.

    kind                 call                                   offered when
    -------------------  -------------------------------------  ------------------------------
    begin_request        begin_request(r, prompts[i])           r is not live, i one of r's prompts
    compute              compute(r, n)                          r live; n = 1.. pages to the
                                                                prompt's end
    insert               insert(r)                              r live
    end_request          end_request(r)                         r live (refused while r has ops)
    advance_cached_len   advance_cached_len(r, node)            node on r's prompt path
    pin                  pin(r, node, tier)                     node on r's path RESIDENT in tier,
                                                                not pinned there by r yet (a restore
                                                                pins what it plans and what lands)
    unpin                unpin(r, node)                         r pins node
    issue                issue(dir, chain, r)                   every parent-first chain; D2H/H2S
                                                                with no request, H2D/S2H for each
                                                                live r whose path holds the chain
    complete/fail/cancel complete(op) / fail(op) / cancel(op)   op pending (fail: config.faults,
                                                                cancel: config.aborts)
    evict                evict_node(node, tier)                 node RESIDENT in tier
    invalidate_l3        evict_node(node, L3, "invalidate_l3")  node RESIDENT in L3

The offer is generous on purpose: the plane's guards decide. (Eviction is offered on every
node holding the tier, not only on `candidates(tier)`: the candidates list filters by the
tree's own leaf sets and locks, which would hide a row whose guard was dropped.) A call that raises
a refusal (`is_refusal`) changes nothing (spec/README.md: "raise, state unchanged") and is no edge.
"""

from __future__ import annotations

from typing import NamedTuple

from hicache.core.control import ControlPlane
from hicache.core.lifecycle import RESIDENT
from hicache.core.tiers import TIERS, Direction, Tier
from hicache.core.tree import TreeNode
from hicache.errors import HiCacheError, InvariantViolation, PlanePoisoned
from hicache.oracle.modelcheck.config import ModelConfig


def is_refusal(e: BaseException) -> bool:
    """Whether `e` is the plane refusing a call (a HiCacheError: IllegalTransition, OutOfPages,
    UnknownOp, ...), which by contract changed nothing and is no edge. An InvariantViolation
    (or PlanePoisoned after one) is a finding, as is every exception that is no HiCacheError."""
    return isinstance(e, HiCacheError) and not isinstance(e, (InvariantViolation, PlanePoisoned))


_FOR_REQUEST = (Direction.H2D, Direction.S2H)  # restores: issued on behalf of a request
_BACKUPS = (Direction.D2H, Direction.H2S)  # write-through: no request


class Action(NamedTuple):
    """One call on the plane. `arg` is the prompt index (begin_request), tokens (compute), the
    tier (pin, evict), the direction (issue) or the op id (complete, fail, cancel)."""

    kind: str
    request: int | None = None
    nodes: tuple[int, ...] = ()
    arg: int | str | None = None

    def __str__(self) -> str:
        parts = [self.kind]
        if self.request is not None:
            parts.append(f"r{self.request}")
        if self.arg is not None:
            parts.append(
                f"op {self.arg}" if self.kind in ("complete", "fail", "cancel") else str(self.arg)
            )
        if self.nodes:
            parts.append("nodes " + ",".join(str(n) for n in self.nodes))
        return " ".join(parts)


def offered(cp: ControlPlane, cfg: ModelConfig) -> list[Action]:
    """Every action the configuration offers in `cp`'s state, in a fixed order (so a search
    is deterministic). Reads only."""
    out: list[Action] = []
    paths: dict[int, list[TreeNode]] = {}
    for r in range(cfg.requests):
        req = cp.requests.get(r)
        if req is None:
            out += [Action("begin_request", r, arg=i) for i in cfg.prompts_for(r)]
            continue
        path = list(cp.tree.match(req.tokens, split=False, touch=False).path)
        paths[r] = path
        out += _request_actions(cp, r, path)
    for chain in _chains(cp.tree.root):
        ids = tuple(n.node_id for n in chain)
        out += [Action("issue", None, ids, str(d)) for d in _BACKUPS]
        for r, path in paths.items():
            if all(any(n is p for p in path) for n in chain):
                out += [Action("issue", r, ids, str(d)) for d in _FOR_REQUEST]
    for op_id in sorted(cp.ops):
        out.append(Action("complete", arg=op_id))
        if cfg.faults:
            out.append(Action("fail", arg=op_id))
        if cfg.aborts:
            out.append(Action("cancel", arg=op_id))
    held = [n for n in cp.tree.nodes() if RESIDENT in n.state]
    for t, tier in enumerate(TIERS):
        out += [
            Action("evict", None, (n.node_id,), str(tier)) for n in held if n.state[t] == RESIDENT
        ]
    out += [
        Action("invalidate_l3", None, (n.node_id,), "L3") for n in held if n.state[2] == RESIDENT
    ]
    return out


def _request_actions(cp: ControlPlane, r: int, path: list[TreeNode]) -> list[Action]:
    req = cp.requests[r]
    ps = cp.page_size
    prompt_end = -(-len(req.tokens) // ps) * ps  # the end of the prompt's last (maybe partial) page
    out = [Action("compute", r, arg=n) for n in range(ps, prompt_end - req.published_len + 1, ps)]
    out += [Action("insert", r), Action("end_request", r)]
    out += [Action("advance_cached_len", r, (n.node_id,)) for n in path]
    pinned = {(n.node_id, t) for n, t in req.pins}
    out += [
        Action("pin", r, (n.node_id,), str(TIERS[t]))
        for n in path
        for t in range(len(TIERS))
        if n.state[t] == RESIDENT and (n.node_id, t) not in pinned
    ]
    out += [Action("unpin", r, (nid,)) for nid in sorted({n.node_id for n, _ in req.pins})]
    return out


def _chains(root: TreeNode) -> list[list[TreeNode]]:
    """Every parent-first chain of live nodes (a node and 0 or more descendants below it, one
    per level), in a fixed order."""
    out: list[list[TreeNode]] = []
    stack = [c for _, c in sorted(root.children.items(), reverse=True)]
    while stack:
        node = stack.pop()
        down = [[node]]
        while down:
            chain = down.pop()
            out.append(chain)
            down += [[*chain, c] for _, c in sorted(chain[-1].children.items(), reverse=True)]
        stack += [c for _, c in sorted(node.children.items(), reverse=True)]
    return out


def apply(cp: ControlPlane, cfg: ModelConfig, a: Action) -> None:
    """Make the call `a` names on `cp`. Raises what the plane raises (a refusal, `is_refusal`,
    changed nothing)."""
    nodes = [cp.tree.node(i) for i in a.nodes]
    r = a.request
    if a.kind == "begin_request":
        assert r is not None and isinstance(a.arg, int)  # Verify: built by `offered`.
        cp.begin_request(r, cfg.prompts[a.arg])
    elif a.kind in ("complete", "fail", "cancel"):
        assert isinstance(a.arg, int)  # Verify: an op id.
        getattr(cp, a.kind)(a.arg)
    elif a.kind == "issue":
        cp.issue(Direction(str(a.arg)), nodes, r)
    elif a.kind == "evict":
        cp.evict_node(nodes[0], str(a.arg))
    elif a.kind == "invalidate_l3":
        cp.evict_node(nodes[0], Tier.L3, "invalidate_l3")
    else:
        _apply_request(cp, a, nodes)


def _apply_request(cp: ControlPlane, a: Action, nodes: list[TreeNode]) -> None:
    r = a.request
    assert r is not None, f"{a.kind} names a request"  # Verify: built by `offered`.
    if a.kind == "compute":
        assert isinstance(a.arg, int)  # Verify: a token count.
        cp.compute(r, a.arg)
    elif a.kind == "insert":
        cp.insert(r)
    elif a.kind == "end_request":
        cp.end_request(r)
    elif a.kind == "advance_cached_len":
        cp.advance_cached_len(r, nodes[0])
    elif a.kind == "pin":
        cp.pin(r, nodes[0], str(a.arg))
    elif a.kind == "unpin":
        cp.unpin(r, nodes[0])
    else:
        raise ValueError(f"unknown action kind {a.kind!r}")
