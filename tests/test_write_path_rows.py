"""SGLang's write-path and read-path rules, as hicache states them (spec/lifecycle.md "Ack ids"
and spec/appendix-engines.md "Ack ids", spec/eviction.md "A victim whose backup is in flight",
spec/restore.md "The graft and its three guards"): ack ids cleared only by the matching ack
and re-pointed at both halves of a split, the unbacked-eviction drop, and the graft guards.
Each test names the upstream failure it would catch."""

from __future__ import annotations

import pytest
from hypothesis import settings

from hicache.controller.controller import CacheController
from hicache.core.control import ControlPlane
from hicache.core.records import UnknownOp
from hicache.core.tiers import Direction, Tier
from hicache.core.tree import TreeNode
from hicache.errors import IllegalTransition
from hicache.testing import make_machine
from hicache.testing.adapters.controller import controller_adapter, setups
from tests.test_control import fingerprint, plane, served
from tests.test_null_plane import A, finish, make, serve, settle_all

B = tuple(range(300, 312))  # 3 pages, A's child in AB


def only_node(cp: ControlPlane) -> TreeNode:
    (node,) = [n for n in cp.tree.nodes() if not n.is_root]
    return node


def no_pending_anywhere(cp: ControlPlane) -> bool:
    return not cp.ops and all(p is None for n in cp.tree.nodes() for p in n.pending)


# -- ack ids (write_through_pending_id, load_back_pending_id) -----------------------------------


def test_a_stale_ack_is_refused_and_changes_nothing() -> None:
    """A late ack of a cancelled backup must not clear the pending id of the backup that now
    fills the node (rule ack_matches_pending_id), neither by op id nor applied to the node."""
    cp, _ = plane()
    served(cp, 1, [1, 2, 3, 4])
    node = only_node(cp)
    stale = cp.issue(Direction.D2H, [node])
    cp.cancel(stale.op_id)
    live = cp.issue(Direction.D2H, [node])
    before = fingerprint(cp)
    for end in (cp.complete, cp.fail, cp.cancel):
        with pytest.raises(UnknownOp):
            end(stale.op_id)
    with pytest.raises(IllegalTransition, match=f"not pending on op {stale.op_id}"):
        cp.apply("d2h_complete", [node], live.target_pages, op_id=stale.op_id)
    assert fingerprint(cp) == before and node.pending[1] == live.op_id
    cp.complete(live.op_id)
    assert node.state[1] == "RESIDENT" and no_pending_anywhere(cp)


def test_an_ack_naming_another_nodes_op_is_refused() -> None:
    """Two backups in flight on two nodes: one op's ack applied to the other's node is refused."""
    cp, _ = plane()
    served(cp, 1, [1, 2, 3, 4])
    served(cp, 2, [5, 6, 7, 8])
    a, b = sorted((n for n in cp.tree.nodes() if not n.is_root), key=lambda n: n.node_id)
    op_a, op_b = cp.issue(Direction.D2H, [a]), cp.issue(Direction.D2H, [b])
    before = fingerprint(cp)
    with pytest.raises(IllegalTransition, match="not pending on op"):
        cp.apply("d2h_complete", [a], op_b.target_pages, op_id=op_b.op_id)
    assert fingerprint(cp) == before
    cp.complete(op_b.op_id)
    cp.complete(op_a.op_id)
    assert a.state[1] == b.state[1] == "RESIDENT" and no_pending_anywhere(cp)


@pytest.mark.parametrize("outcome", ["complete", "fail", "cancel"])
def test_a_split_repoints_a_pending_write_through_at_both_halves(outcome: str) -> None:
    """A node split while its backup is in flight: both halves carry the op's id, and the op's
    end clears both (no orphan id, I5 checked after every step)."""
    cp, _ = plane()
    served(cp, 1, [1, 2, 3, 4, 5, 6])  # one node, 3 pages
    node = only_node(cp)
    op = cp.issue(Direction.D2H, [node])
    served(cp, 2, [1, 2, 3, 4, 9, 9])  # matches 4 tokens: splits the pending node at 2 pages
    upper, lower = op.nodes
    assert lower is node and upper.pending[1] == lower.pending[1] == op.op_id
    getattr(cp, outcome)(op.op_id)
    assert no_pending_anywhere(cp)
    if outcome == "complete":  # the op's 3 target pages, cut 2 + 1 by the halves' keys
        assert upper.value[1] is not None and lower.value[1] is not None
        assert [*upper.value[1], *lower.value[1]] == list(op.target_pages)
    else:
        assert upper.state[1] == lower.state[1] == "ABSENT" and cp.free_pages(Tier.L2) == 16


@pytest.mark.parametrize("outcome", ["complete", "fail"])
def test_a_split_repoints_a_pending_load_back_at_both_halves(outcome: str) -> None:
    cp, _ = plane()
    served(cp, 1, [1, 2, 3, 4, 5, 6])
    node = only_node(cp)
    cp.complete(cp.issue(Direction.D2H, [node]).op_id)
    cp.evict("L1", 3)
    cp.begin_request(2, [1, 2, 3, 4, 5, 6, 7])
    op = cp.issue(Direction.H2D, [node], request_id=2)
    cp.begin_request(3, [1, 2, 3, 4, 8])  # its match splits the node being loaded back
    upper, lower = op.nodes
    assert upper.pending[0] == lower.pending[0] == op.op_id
    getattr(cp, outcome)(op.op_id)
    assert no_pending_anywhere(cp)
    want = "RESIDENT" if outcome == "complete" else "ABSENT"
    assert upper.state[0] == lower.state[0] == want


# -- the unbacked-eviction drop ------------------------------------------------------------------


def test_a_backup_in_flight_is_never_evicted() -> None:
    """SGLang's eviction between commit_backup and its ack: in hicache the D2H locks its source
    and evict_l1 is guarded by L2 != D2H_PENDING, so the node is no candidate and a direct
    eviction is refused with nothing changed."""
    cp, _ = plane()
    served(cp, 1, [1, 2, 3, 4])
    node = only_node(cp)
    cp.issue(Direction.D2H, [node])
    assert node not in cp.candidates(Tier.L1) and cp.evict("L1", 10) == 0
    before = fingerprint(cp)
    with pytest.raises(IllegalTransition):
        cp.evict_node(node, Tier.L1)
    assert fingerprint(cp) == before


def test_an_unacked_write_through_evicted_drops_exactly_the_nodes_tokens() -> None:
    """Write-through: the backup is in flight when L1 needs room (nothing evicted, nothing
    dropped); it fails (its L2 target released: the node does not count as backed up); the
    next eviction drops the node, and write_through_unbacked_eviction grows by exactly its
    tokens, once."""
    c = make(write_policy="write_through")
    c.admit(1, A)
    c.prefill(1)
    c.finish(1)
    c.tick()  # issues the write-through D2H of A's node
    (op_id,) = c.handles
    node = c.cp.ops[op_id].nodes[-1]
    assert (
        c.evict("L1", 16) == 0 and c.metrics.dropped_tokens["write_through_unbacked_eviction"] == 0
    )
    finish(c, op_id, False)
    c.tick()
    assert c.cp.residency(node, Tier.L2) == "ABSENT" and c.cp.free_pages(Tier.L2) == 32
    assert c.evict("L1", 16) == node.num_pages
    assert c.metrics.dropped_tokens["write_through_unbacked_eviction"] == len(node.key) == 12
    assert c.metrics.dropped_tokens["host_pressure"] == 0
    c.close()


# -- the graft guards ------------------------------------------------------------------------------


def a_in_l1_b_in_l3_only(c: CacheController) -> tuple[TreeNode, TreeNode]:
    """A (L1 and L3, not L2) with its child B (L3 only): a host-only suffix under a parent
    that is not backed up, reached through ordinary evictions."""
    serve(c, 1, A)
    serve(c, 2, A + B)
    settle_all(c)
    b = c.cp.tree.match(A + B, split=False, touch=False).path[-1]
    a = b.parent
    assert a is not None and len(a.key) == len(b.key) == 12
    c.cp.evict_node(b, Tier.L1)
    c.cp.evict_node(b, Tier.L2)
    c.cp.evict_node(a, Tier.L2)
    assert [c.cp.residency(a, t) for t in Tier] == ["RESIDENT", "ABSENT", "RESIDENT"]
    assert [c.cp.residency(b, t) for t in Tier] == ["ABSENT", "ABSENT", "RESIDENT"]
    return a, b


def test_a_graft_under_a_parent_not_backed_up_is_refused_by_the_row() -> None:
    c = make()
    _, b = a_in_l1_b_in_l3_only(c)
    before = fingerprint(c.cp)
    with pytest.raises(IllegalTransition, match="parent"):
        c.cp.issue(Direction.S2H, [b])
    assert fingerprint(c.cp) == before
    c.close()


def test_a_graft_under_a_parent_not_backed_up_is_dropped() -> None:
    """Guard 2 (SGLang's host_insert_dropped): the L3 part below an L1 hit that L2 lacks is
    dropped before any L2 page is reserved, counted as `dropped`, and recomputed."""
    c = make(write_policy="write_through")
    _a, b = a_in_l1_b_in_l3_only(c)
    free_l2 = c.cp.free_pages(Tier.L2)
    mat = c.admit(3, A + B + (7,))
    assert mat.done and not c.handles and not mat.l3_part
    assert c.metrics.fallbacks["dropped"] == 1 and c.metrics.fallbacks["no_room"] == 0
    assert c.cp.free_pages(Tier.L2) == free_l2 and c.cp.tables[1].count(1) == 0
    assert b.lock == [0, 0, 0]  # the part's L3 pin went with it
    assert c.prefill(3) == len(B) + 1  # B and the last token recomputed; A served from L1
    c.finish(3)
    settle_all(c)
    assert c.cp.checker.violations_found == 0
    c.close()


def test_a_second_load_back_never_claims_a_node_being_loaded() -> None:
    """Guard 3 in the table: h2d_issue leaves only L1 ABSENT, so a node H2D_PENDING (its
    load_back_pending_id names one op) is refused to a second op, alone or in a chain."""
    cp, _ = plane()
    served(cp, 1, [1, 2, 3, 4])
    served(cp, 2, [1, 2, 3, 4, 5, 6])
    parent = cp.tree.match([1, 2, 3, 4], split=False, touch=False).path[-1]
    (child,) = parent.children.values()
    cp.complete(cp.issue(Direction.D2H, [parent, child]).op_id)
    cp.evict("L1", 4)
    cp.begin_request(3, [1, 2, 3, 4, 5, 6, 7])
    first = cp.issue(Direction.H2D, [parent], request_id=3)
    before = fingerprint(cp)
    for chain in ([parent], [parent, child]):
        with pytest.raises(IllegalTransition):
            cp.issue(Direction.H2D, chain)
    assert fingerprint(cp) == before and parent.pending[0] == first.op_id


@pytest.mark.parametrize("overlap", ["share", "back_off"])
def test_two_load_backs_overlapping_a_path(overlap: str) -> None:
    """Request 2 wants A while request 1's load-back of A is in flight: hicache shares it
    (waits, serves A from the one op); with load_back_overlap = back_off (SGLang) request 2
    backs off and recomputes, counted `load_back_pending`. Never a second op on A."""
    c = make(load_back_overlap=overlap)
    serve(c, 1, A)
    settle_all(c)
    c.cp.evict("L1", 16)
    c.admit(2, A + (1,))
    (first,) = c.handles
    node = c.cp.ops[first].nodes[-1]
    mat = c.admit(3, A + (2,))
    assert list(c.handles) == [first] and node.pending[0] == first
    assert mat.shared == ([node] if overlap == "share" else [])
    assert c.metrics.fallbacks["load_back_pending"] == (0 if overlap == "share" else 1)
    finish(c, first, True)
    c.tick()
    assert c.ready(3)
    assert c.prefill(3) == (1 if overlap == "share" else len(A) + 1)
    assert c.prefill(2) == 1
    for rid in (2, 3):
        c.finish(rid)
    settle_all(c)
    assert c.cp.checker.violations_found == 0
    c.close()


def test_a_match_that_is_not_a_page_multiple_is_aligned_down() -> None:
    """B08's units: a graft's match is aligned down to whole pages (never refused, never cut
    inside a page), and a split cuts every tier's value at the same page boundary."""
    cp, _ = plane()
    served(cp, 1, [1, 2, 3, 4, 5, 6])
    node = only_node(cp)
    cp.complete(cp.issue(Direction.D2H, [node]).op_id)
    cp.complete(cp.issue(Direction.H2S, [node]).op_id)
    cp.evict("L1", 3)
    cp.evict("L2", 3)
    l3 = list(node.value[2])  # type: ignore[arg-type]
    m = cp.begin_request(2, [1, 2, 3, 9, 9, 9, 9], match_len=3)  # 3 tokens: 1.5 pages
    assert m.lengths == (0, 0, 2) and len(m.path[-1].key) == 2
    upper = m.path[-1]
    op = cp.issue(Direction.S2H, [upper], request_id=2)
    assert op.source_pages.tolist() == l3[:1]  # the upper node's own L3 page, not a token slice
    cp.complete(op.op_id)
    assert upper.value[1] is not None and list(upper.value[1]) == list(op.target_pages)
    assert node.state == ["ABSENT", "ABSENT", "RESIDENT"] and list(node.value[2]) == l3[1:]  # type: ignore[arg-type]


def test_a_match_that_is_not_a_page_multiple_restores_its_own_bytes() -> None:
    """The same with bytes: an L3 restore behind a match of 22 tokens (5.5 pages) serves 20
    tokens whose pages the verifier finds equal to recomputation (I4)."""
    pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")
    from hicache.controller.config import CacheConfig
    from tests.test_controller import push_out_of
    from tests.test_controller import serve as serve_bytes

    c = CacheController(CacheConfig(policy="always", backend="torch", device="cpu"))
    prompt = tuple(range(100, 124))
    serve_bytes(c, 1, prompt)
    push_out_of(c, "12")
    verified = c.metrics.verified_pages
    assert serve_bytes(c, 2, prompt[:22] + (999,) * 4) == 6  # 20 restored, 6 computed
    assert c.metrics.hit_tokens["L3"] == 20 and c.metrics.verified_pages - verified == 5
    c.close()


def test_write_through_acks_drain_without_new_requests() -> None:
    """SGLang's acks were never polled during pure decode, so their locks pinned everything:
    here every tick observes every transfer, so with no request arriving the backup chain (D2H,
    then H2S) is acked within two rounds and no transfer lock is left."""
    c = make(write_policy="write_through")
    c.admit(1, A)
    c.prefill(1)
    c.finish(1)
    for _ in range(2):
        c.tick()  # observes what finished, issues what is due
        for op_id in list(c.handles):
            finish(c, op_id, True)
    c.tick()
    assert not c.handles and no_pending_anywhere(c.cp)
    assert all(n.lock == [0, 0, 0] for n in c.cp.tree.nodes() if not n.is_root)
    c.close()


# The fuzz machine with SGLang's back-off instead of sharing: its resubmit rule admits the same
# prompt twice at once, so the second meets the first's load-back and backs off; every
# invariant and the reference model's cached_len rule (cut at a page being loaded) still hold.
BackOffMachine = make_machine(
    controller_adapter, setups("null", load_back_overlap="back_off"), name="BackOffMachine"
)
BackOffMachine.TestCase.settings = settings(
    settings(), max_examples=100, stateful_step_count=50, deadline=None
)
TestBackOffMachine = BackOffMachine.TestCase
