"""Freed windows (SWA tombstones): `TierPools.tombstone` frees a TREE anchor page's trailing
side pools (dsv4's `swa`, and the state pools on its indices) and keeps the anchor page and
its sidecars (spec/pools.md, "Freed windows").
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hicache.controller.controller import CacheController
from hicache.core.control import ControlPlane
from hicache.core.pages import FREE, TREE, Pages
from hicache.core.snapshot import TOMBSTONE
from hicache.core.tiers import Direction, Tier
from hicache.core.trace import ListSink, Tracer
from hicache.core.tree import TreeNode
from hicache.errors import IllegalTransition
from hicache.invariants import check_all
from hicache.pools.hits import agreed_hit
from hicache.pools.presets import group
from hicache.pools.spec import ALL_PAGES, PoolGroup
from hicache.pools.tierpools import TierPools
from tests.test_null_plane import A, make, serve, settle_all
from tests.test_upstream_scenarios import node_of

DSV4 = group("dsv4-tiny")
DSV41 = group("dsv41-tiny")


def published(tp: TierPools, n: int) -> Pages:
    p = tp.reserve(n)
    tp.publish(p)
    return p


@pytest.mark.parametrize("g", [DSV4, DSV41], ids=lambda g: g.name)
def test_tombstone_frees_the_window_and_keeps_the_anchor_and_sidecars(g: PoolGroup) -> None:
    tp = TierPools("L1", g, {"kv": 4, "swa": 4 * g.ratio("swa")})
    p = published(tp, 3)
    swa = tp.held_by["swa"][p[:2]].reshape(-1).copy()
    tp.tombstone(p[:2])
    assert tp.window_present(p).tolist() == [False, False, True]
    assert (tp.owner[p] == TREE).all()
    assert (tp.group_table.tables["swa"].owner[swa] == FREE).all()
    mapped = tp.pool_pages(p)
    r = g.ratio("swa")
    for spec in tp.group.pools:  # the backed-up pools (no request-scoped pair ring)
        if spec.source == "kv":  # the anchor and its sidecars stay on the anchor's indices
            assert mapped[spec.name].tolist() == p.tolist()
        else:  # swa and the state pools on its indices: the first two windows are gone
            assert (mapped[spec.name][: 2 * r] == TOMBSTONE).all()
            assert (mapped[spec.name][2 * r :] >= 0).all()
    assert tp.window_pages_free() == 3  # 4 anchor pages' windows, one held
    tp.free(p)  # the freed windows are skipped, the rest freed
    assert tp.free_count == 4 and (tp.group_table.tables["swa"].owner == FREE).all()


def test_tombstone_refuses_with_nothing_changed() -> None:
    tp = TierPools("L1", DSV4, {"kv": 4, "swa": 4})
    p = published(tp, 2)
    private = tp.reserve(1)
    tp.tombstone(p[:1])
    before = tp.group_table.tables["swa"].owner.copy()
    for bad in ([int(p[0])], [int(private[0])], [int(p[1]), int(p[1])], [9]):
        with pytest.raises(IllegalTransition):
            tp.tombstone(np.asarray(bad, dtype=np.int64))
    assert (tp.group_table.tables["swa"].owner == before).all()
    assert tp.window_present(p).tolist() == [False, True]


def test_a_group_without_a_window_has_nothing_to_tombstone() -> None:
    flat = PoolGroup(
        "flat",
        tuple(dataclasses.replace(p, hit_policy=ALL_PAGES, window_pages=0) for p in DSV4.pools),
    )
    tp = TierPools("L1", flat, {"kv": 4, "swa": 4})
    p = published(tp, 1)
    assert tp.window_present(p).tolist() == [True]
    with pytest.raises(IllegalTransition):
        tp.tombstone(p)


# -- the control plane: `tombstone`, the L1 hit under a freed window, backups -----------------

PS = 4


def three_nodes(policy: str = "all_pools") -> tuple[ControlPlane, list[int], list[TreeNode]]:
    """A plane whose tree holds prompt A's first 4 pages as nodes of 2, 1 and 1 pages (two
    other requests split it), every node RESIDENT in L1 and unlocked; dsv4-tiny: `swa` W=2.
    Under anchor_recompute_swa four nodes of 1 page: each admission also splits its L1 run
    where the window it would replay begins (2 pages before its end)."""
    cp = ControlPlane(PS, (16, 16, 16), pools=DSV4, hit_policy=policy)
    a = list(range(4 * PS + 1))
    for rid, prompt in enumerate(
        [
            a,
            a[: 2 * PS] + [900 + i for i in range(2 * PS + 1)],
            a[: 3 * PS] + [950 + i for i in range(PS + 1)],
        ]
    ):
        cp.begin_request(rid, prompt)
        cp.compute(rid, len(prompt) // PS * PS - cp.requests[rid].cached_len)
        cp.insert(rid)
        cp.end_request(rid)
    path = list(cp.tree.match(a[: 4 * PS], split=False, touch=False).path)
    assert [len(n.key) // PS for n in path] == ([2, 1, 1] if policy == "all_pools" else [1] * 4)
    return cp, a, path


@pytest.mark.parametrize(
    "freed, hit_pages",
    [
        ((), 4),  # every window present: the anchor's hit
        ((0,), 4),  # a gap at the root's child, then 2 pages reach W again
        ((2,), 3),  # the leaf's window freed: the hit ends before it
        ((1,), 2),  # only 1 page after the gap (< W), so the hit ends at 2, not 4
        ((0, 2), 0),  # no legal end but 0
        ((0, 1), 0),  # the last node alone (1 page < W) is not a window
    ],
)
def test_a_freed_window_ends_the_l1_hit_at_the_last_end_every_trailing_pool_accepts(
    freed: tuple[int, ...], hit_pages: int
) -> None:
    cp, a, path = three_nodes()
    for i in freed:
        cp.tombstone(path[i])
    m = cp.begin_request(7, a)
    assert m.lengths[0] == hit_pages * PS
    assert m.lengths[0] == hits_agreed(path, freed)  # the pure function agrees


def hits_agreed(path: list[TreeNode], freed: tuple[int, ...]) -> int:
    """The pure functions' answer, in tokens: the page-level `agreed_hit` (kv and sidecars all
    present; swa absent on the freed nodes), which here always falls on a node end."""
    swa = [i not in freed for i, n in enumerate(path) for _ in range(len(n.key) // PS)]
    presence = {p.name: [True] * len(swa) for p in DSV4.pools if p.role in ("anchor", "sidecar")}
    presence["swa"] = swa
    return agreed_hit(DSV4, presence, len(swa), "all_pools").hit * PS


def test_f23_a_freed_internal_window_then_a_whole_window_again_is_served_past_the_gap() -> None:
    """SGLang #29204: write-back frees an internal node's SWA value before the leaf goes. The
    hit may still end past the gap once W pages follow it (here the whole prompt, 4 pages),
    and never at an end whose window has the gap in it (pages 2 and 3 are refused)."""
    cp, a, path = three_nodes()
    cp.tombstone(path[0])
    assert cp.begin_request(7, a).lengths[0] == 4 * PS
    cp.end_request(7)
    assert cp.begin_request(8, a[: 3 * PS + 1]).lengths[0] == 0  # end 3: window [1, 3) has a gap


def test_f14_an_anchor_bound_between_trailing_endpoints_falls_back_to_the_last_legal_one() -> None:
    """SGLang #39147: the anchor serves 4 pages, swa's legal ends are {0, 1, 2} (node 1's
    window freed, W = 2): the hit is 2, the largest common end -- not min(4, largest swa end
    ignoring the gap) and not the anchor's 4."""
    cp, a, path = three_nodes()
    cp.tombstone(path[1])
    assert cp.begin_request(7, a).lengths[0] == 2 * PS


@pytest.mark.parametrize(
    "freed, hit_pages",
    [
        ((), 4),  # every window present: the anchor's hit
        ((0, 1), 4),  # the window before the end (pages 2, 3) is whole: the anchor's hit
        ((3,), 2),  # the window's last page freed: the window (2 pages) is replayed
        ((2,), 2),  # its first page freed: replayed too
        ((1, 3), 2),  # all_pools would serve 1 page; here the window alone is replayed
    ],
)
def test_under_anchor_recompute_swa_a_freed_window_ends_the_hit_where_its_replay_begins(
    freed: tuple[int, ...], hit_pages: int
) -> None:
    """The anchor serves its whole run, but when a page of the window before its end (W = 2
    anchor pages for dsv4-tiny) lost its window, the request replays that window: its L1
    hit ends where the window begins, and it recomputes the window from there (the test
    below: its copy revives the freed windows). Before, the hit was the anchor's whatever
    the window held, and the replay was only counted. (`freed`: pages, one node each.)"""
    cp, a, path = three_nodes("anchor_recompute_swa")
    for i in freed:
        cp.tombstone(path[i])
    assert cp.windows.replay_pages == 2 and cp.windows.hit_pages == 0
    assert cp.begin_request(7, a).lengths[0] == hit_pages * PS


def test_under_anchor_recompute_swa_the_node_across_the_window_start_is_split() -> None:
    """A 4-page node whose window is freed: the window a hit on it replays is its last 2
    pages, so the admission splits it there and the hit ends at the split; the upper part
    keeps its freed window, the lower one is replayed as a whole node."""
    cp = ControlPlane(PS, (16, 16, 16), pools=DSV4, hit_policy="anchor_recompute_swa")
    a = list(range(4 * PS + 1))
    cp.begin_request(1, a)
    cp.compute(1, 4 * PS)
    cp.insert(1)
    cp.end_request(1)
    (node,) = cp.tree.match(a[: 4 * PS], split=False, touch=False).path
    cp.tombstone(node)
    m = cp.begin_request(2, a)
    assert m.lengths[0] == 2 * PS and [len(n.key) // PS for n in m.path] == [2, 2]
    assert all(cp.windows.freed(n) for n in m.path) and not check_all(cp.snapshot())


def test_tombstone_is_refused_on_a_locked_node_and_twice() -> None:
    cp, a, path = three_nodes()
    cp.begin_request(7, a)  # locks the whole path in L1
    with pytest.raises(IllegalTransition, match="locked"):
        cp.tombstone(path[0])
    cp.end_request(7)
    cp.tombstone(path[0])
    with pytest.raises(IllegalTransition, match="already freed"):
        cp.tombstone(path[0])


def test_a_node_whose_window_is_freed_is_never_backed_up() -> None:
    cp, _, path = three_nodes()
    cp.tombstone(path[0])
    with pytest.raises(IllegalTransition, match="window is freed"):
        cp.issue(Direction.D2H, [path[0]])
    assert cp.tables[1].free_count == 16  # nothing reserved in L2


def test_tombstone_is_traced_with_the_nodes_anchor_pages() -> None:
    sink = ListSink()
    cp = ControlPlane(PS, (16, 16, 16), pools=DSV4, tracer=Tracer(sink))
    cp.begin_request(1, list(range(2 * PS + 1)))
    cp.compute(1, 2 * PS)
    cp.insert(1)
    cp.end_request(1)
    node = cp.tree.match(list(range(2 * PS)), split=False, touch=False).path[0]
    cp.tombstone(node)
    last = sink.events[-1]
    assert (last.event, last.tier, last.node) == ("tombstone", "L1", node.node_id)
    assert last.pages == tuple(int(p) for p in node.value[0])  # type: ignore[union-attr]


def test_a_prefix_loaded_after_admission_is_served_only_up_to_a_whole_window() -> None:
    """A request admitted with no L1 hit (its load-back failed, say) later finds its prompt
    in L1 -- another request loaded it -- but the leaf's window was freed since. Serving the
    whole run would end the hit on a gap: `servable_in_l1` stops at the last legal end and
    `advance_cached_len` refuses the leaf with nothing changed. (The fuzz found the
    controller's prefill serving the freed node: I9 reported the gap in request's prefix.)"""
    cp, a, path = three_nodes()
    cp.begin_request(7, a, match_len=0)
    cp.tombstone(path[2])
    assert cp.servable_in_l1(path) is path[1]
    with pytest.raises(IllegalTransition, match="window"):
        cp.advance_cached_len(7, path[2])
    assert cp.cached_len(7) == 0 and path[2].lock[0] == 0
    assert cp.advance_cached_len(7, path[1]) == 3 * PS


# -- the controller: decisions and replays over freed windows (issue 30, section 5) ---------------


def windowed_controller(policy: str) -> tuple[CacheController, TreeNode]:
    """A dsv4-tiny controller (null plane, policy `always`) holding A in L1, L2 and L3, with
    A's L1 window freed."""
    c = make(pools="dsv4-tiny", check_mode="every", write_policy="write_through", hit_policy=policy)
    serve(c, 1, A + (1,))
    settle_all(c)
    a = node_of(c, A)
    assert all(c.cp.holds(a, t) for t in Tier)
    c.cp.tombstone(a)
    return c, a


def test_no_restore_is_chosen_past_a_freed_window_that_no_plan_can_restore() -> None:
    """all_pools: A's freed window ends the L1 hit before A, and L2 holds A; but L1 holds A
    too, so every restore plan ends before it. Seen failing (the outside fuzzer, issue 30):
    the policy chose L2, the plan was empty, nothing was restored, no fallback was counted,
    and the decision log settled an L2 prediction against a full recompute. The policy now
    decides on the hits a plan reaches (`plan_reach`): a recompute, recorded as one."""
    c, a = windowed_controller("all_pools")
    mat = c.admit(2, A + (7,))
    assert mat.match.lengths[:2] == (0, len(A))  # L2 holds A; the L1 hit ends before it
    assert mat.decision.choice == "recompute" and not mat.nodes
    assert c.decisions.summary()["choices"] == {"recompute": 2, "L2": 0, "L3": 0}
    assert c.prefill(2) == len(A) + 1  # recomputed, and its copy revives A's window
    assert not c.cp.windows.freed(a) and c.metrics.window_clipped_tokens == len(A)
    c.finish(2)
    c.close()


def test_under_anchor_recompute_swa_a_replayed_window_is_revived() -> None:
    """A's window freed, A held in L1 (3 pages; the window W = 2 pages). The request replays
    the window: its hit ends 2 pages before A's end (A split there), it recomputes them, and
    its copy revives the lower part's window, so the next hit on A replays nothing. Seen
    failing (the outside fuzzer, issue 30): the hit was A's, the replay was counted but
    never made (prefill recomputed 1 token), A's window stayed freed, and every later hit
    replayed it again (window_recomputed_tokens 8 more each time)."""
    c, _ = windowed_controller("anchor_recompute_swa")
    mat = c.admit(2, A + (7,))
    assert mat.match.lengths[0] == len(A) - 2 * PS and mat.decision.choice == "recompute"
    assert c.metrics.window_recomputed_tokens == 2 * PS and c.metrics.window_clipped_tokens == 0
    assert c.prefill(2) == 2 * PS + 1  # the window replayed, then the prompt's last token
    upper, lower = c.cp.tree.match(A, split=False, touch=False).path
    assert c.cp.windows.freed(upper) and not c.cp.windows.freed(lower)
    c.finish(2)
    again = c.admit(3, A + (8,))
    assert again.match.lengths[0] == len(A) and c.metrics.window_recomputed_tokens == 2 * PS
    assert c.cp.checker.violations_found == 0
    c.finish(3)
    c.close()
