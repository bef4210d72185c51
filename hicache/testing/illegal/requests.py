"""Illegal calls of requests and of evictions: ids, ranges, prefixes, locks and leaves.

Each builder looks at the plane now and returns one call of its kind, or None (the table of
kinds is in hicache/testing/illegal/__init__.py).
"""

from __future__ import annotations

from collections.abc import Callable

from hicache.core.control import ControlPlane
from hicache.core.lifecycle import ABSENT, RESIDENT
from hicache.core.records import LiveRequest, Request, UnknownRequest
from hicache.core.tiers import TIERS, Tier
from hicache.core.tree import TreeNode
from hicache.errors import IllegalTransition
from hicache.testing.illegal.base import NOT_LIVE, Builder, IllegalCall, choose, stale


def _requests(cp: ControlPlane, private: bool | None = None) -> list[Request]:
    """The live requests (`private`: only those holding private pages, or only those not)."""
    return [
        r for r in cp.requests.values() if private is None or bool(r.private_pages.size) == private
    ]


def begin_live_id(cp: ControlPlane, pick: int) -> IllegalCall | None:
    r = choose(_requests(cp), pick)
    if r is None:
        return None
    return IllegalCall(
        "begin_live_id",
        f"begin_request({r.request_id}, which is live)",
        lambda: cp.begin_request(r.request_id, r.tokens),
        LiveRequest,
    )


def begin_match_len(cp: ControlPlane, pick: int) -> IllegalCall | None:
    """A prompt (a live request's, or a short one) matched to its last token, or empty."""
    r = choose(_requests(cp), pick)
    tokens = () if pick % 3 == 2 else r.tokens if r is not None else tuple(range(9))
    what = f"begin_request({NOT_LIVE}, {len(tokens)} tokens, match_len {len(tokens)})"
    return IllegalCall(
        "begin_match_len",
        what,
        lambda: cp.begin_request(NOT_LIVE, tokens, match_len=len(tokens)),
        IllegalTransition,
    )


def compute_misaligned(cp: ControlPlane, pick: int) -> IllegalCall | None:
    r = choose(_requests(cp, private=False), pick)
    if r is None:
        return None
    n = pick % cp.page_size  # 0 (an empty range) .. page_size - 1
    return IllegalCall(
        "compute_misaligned",
        f"compute({r.request_id}, {n} tokens)",
        lambda: cp.compute(r.request_id, n),
        IllegalTransition,
    )


def compute_past_prompt(cp: ControlPlane, pick: int) -> IllegalCall | None:
    """Whole pages that end one page past the prompt's last (possibly partial) page."""
    r = choose(_requests(cp, private=False), pick)
    if r is None:
        return None
    ps = cp.page_size
    n = -(-len(r.tokens) // ps) * ps - r.published_len + ps
    return IllegalCall(
        "compute_past_prompt",
        f"compute({r.request_id}, {n} tokens; its prompt has {len(r.tokens)})",
        lambda: cp.compute(r.request_id, n),
        IllegalTransition,
    )


def compute_twice(cp: ControlPlane, pick: int) -> IllegalCall | None:
    r = choose(_requests(cp, private=True), pick)
    if r is None:
        return None
    return IllegalCall(
        "compute_twice",
        f"compute({r.request_id}, one page) while it holds private pages",
        lambda: cp.compute(r.request_id, cp.page_size),
        IllegalTransition,
    )


def _path(cp: ControlPlane, n: TreeNode) -> list[TreeNode]:
    return cp.tree.path_to_root(n)


def advance_unpublished(cp: ControlPlane, pick: int) -> IllegalCall | None:
    """advance_cached_len to a node at or below the request's lock with a node on its path
    not RESIDENT in L1 (publication first, I5)."""
    found = [
        (r, n)
        for r in _requests(cp)
        for n in cp.tree.nodes()
        if (r.locked.is_root or r.locked in _path(cp, n))
        and any(m.state[0] != RESIDENT for m in _path(cp, n))
    ]
    return _advance("advance_unpublished", cp, found, pick, "a node on its path is not in L1")


def advance_off_prefix(cp: ControlPlane, pick: int) -> IllegalCall | None:
    """advance_cached_len to a node held in L1 that does not extend the request's lock."""
    found = [
        (r, n)
        for r in _requests(cp)
        if not r.locked.is_root
        for n in cp.tree.nodes()
        if r.locked not in _path(cp, n) and all(m.state[0] == RESIDENT for m in _path(cp, n))
    ]
    return _advance("advance_off_prefix", cp, found, pick, "it is off the request's prefix")


def advance_stale_node(cp: ControlPlane, pick: int) -> IllegalCall | None:
    """advance_cached_len to a removed handle, or (odd picks) to the root."""
    nodes = [cp.tree.root] if pick % 2 else [stale(n) for n in cp.tree.nodes()]
    found = [(r, n) for r in _requests(cp) for n in nodes]
    return _advance("advance_stale_node", cp, found, pick // 2, "not a live node")


def _advance(
    kind: str, cp: ControlPlane, found: list[tuple[Request, TreeNode]], pick: int, why: str
) -> IllegalCall | None:
    got = choose(found, pick)
    if got is None:
        return None
    r, n = got
    return IllegalCall(
        kind,
        f"advance_cached_len({r.request_id}, node {n.node_id}: {why})",
        lambda: cp.advance_cached_len(r.request_id, n),
        IllegalTransition,
    )


def pin_stale_node(cp: ControlPlane, pick: int) -> IllegalCall | None:
    r = choose(_requests(cp), pick)
    if r is None:
        return None
    nodes = list(cp.tree.nodes())
    n = cp.tree.root if pick % 2 or not nodes else stale(nodes[pick // 2 % len(nodes)])
    tier = TIERS[pick % len(TIERS)]
    which = "the root" if n.is_root else f"a removed handle of node {n.node_id}"
    return IllegalCall(
        "pin_stale_node",
        f"pin({r.request_id}, {which}, {tier})",
        lambda: cp.pin(r.request_id, n, tier),
        IllegalTransition,
    )


def unknown_request(cp: ControlPlane, pick: int) -> IllegalCall | None:
    """Every call that names a request, with an id that is not live."""
    nodes = list(cp.tree.nodes())
    node = nodes[pick % len(nodes)] if nodes else cp.tree.root
    calls: dict[str, Callable[[], object]] = {
        "compute": lambda: cp.compute(NOT_LIVE, cp.page_size),
        "insert": lambda: cp.insert(NOT_LIVE),
        "advance_cached_len": lambda: cp.advance_cached_len(NOT_LIVE, node),
        "pin": lambda: cp.pin(NOT_LIVE, node, Tier.L1),
        "unpin": lambda: cp.unpin(NOT_LIVE),
        "end_request": lambda: cp.end_request(NOT_LIVE),
    }
    name = list(calls)[pick % len(calls)]
    return IllegalCall(
        "unknown_request", f"{name}({NOT_LIVE}, not live)", calls[name], UnknownRequest
    )


def end_request_pending(cp: ControlPlane, pick: int) -> IllegalCall | None:
    found = sorted({op.request_id for op in cp.ops.values() if op.request_id is not None})
    rid = choose(found, pick)
    if rid is None:
        return None
    return IllegalCall(
        "end_request_pending",
        f"end_request({rid}) with its ops pending",
        lambda: cp.end_request(rid),
        IllegalTransition,
    )


# -- evictions and windows ------------------------------------------------------------------


def _leaf(n: TreeNode, t: int) -> bool:
    return all(c.state[t] == ABSENT for c in n.children.values())


def _evict(
    kind: str, cp: ControlPlane, found: list[tuple[int, TreeNode]], pick: int, why: str
) -> IllegalCall | None:
    """evict_node of the `pick`-th candidate (tier index, node); in L3 an odd pick names
    `invalidate_l3` (the same guards)."""
    got = choose(found, pick)
    if got is None:
        return None
    t, n = got
    tier = TIERS[t]
    name = "invalidate_l3" if tier is Tier.L3 and pick % 2 else f"evict_{str(tier).lower()}"
    return IllegalCall(
        kind,
        f"evict_node(node {n.node_id}, {tier}, {name}: {why})",
        lambda: cp.evict_node(n, tier, name),
        IllegalTransition,
    )


def evict_locked(cp: ControlPlane, pick: int) -> IllegalCall | None:
    found = [
        (t, n)
        for t in range(len(TIERS))
        for n in cp.tree.nodes()
        if n.state[t] == RESIDENT and _leaf(n, t) and n.lock[t] > 0
    ]
    return _evict("evict_locked", cp, found, pick, "it is locked there")


def evict_inner(cp: ControlPlane, pick: int) -> IllegalCall | None:
    found = [
        (t, n)
        for t in range(len(TIERS))
        for n in cp.tree.nodes()
        if n.state[t] == RESIDENT and not _leaf(n, t)
    ]
    return _evict("evict_inner", cp, found, pick, "a child holds the tier")


def evict_not_resident(cp: ControlPlane, pick: int) -> IllegalCall | None:
    found = [(t, n) for t in range(len(TIERS)) for n in cp.tree.nodes() if n.state[t] != RESIDENT]
    return _evict("evict_not_resident", cp, found, pick, "it is not RESIDENT there")


def evict_stale_node(cp: ControlPlane, pick: int) -> IllegalCall | None:
    nodes = list(cp.tree.nodes())
    n = cp.tree.root if pick % 2 or not nodes else stale(nodes[pick // 2 % len(nodes)])
    why = "the root" if n.is_root else "a removed handle"
    return _evict("evict_stale_node", cp, [(pick % len(TIERS), n)], 0, why)


def tombstone_refused(cp: ControlPlane, pick: int) -> IllegalCall | None:
    """tombstone of a node whose L1 window may not be freed: any node when L1 has no
    trailing pool; else one not RESIDENT in L1, locked there, already freed, or a removed
    handle."""
    nodes = list(cp.tree.nodes())
    if not cp.windows.tombstones:
        found = nodes
    else:
        found = [
            n for n in nodes if n.state[0] != RESIDENT or n.lock[0] > 0 or cp.windows.freed(n)
        ] + [stale(n) for n in nodes[:1]]
    n = choose(found, pick)
    if n is None:
        return None
    return IllegalCall(
        "tombstone_refused",
        f"tombstone(node {n.node_id})",
        lambda: cp.tombstone(n),
        IllegalTransition,
    )


BUILDERS: dict[str, Builder] = {
    b.__name__: b
    for b in (
        begin_live_id,
        begin_match_len,
        compute_misaligned,
        compute_past_prompt,
        compute_twice,
        advance_unpublished,
        advance_off_prefix,
        advance_stale_node,
        pin_stale_node,
        unknown_request,
        end_request_pending,
        evict_locked,
        evict_inner,
        evict_not_resident,
        evict_stale_node,
        tombstone_refused,
    )
}
"""This module's kinds, in catalogue order."""
