"""Stateful fuzzing of the control plane alone (no bytes): random requests, backups,
restores, completions, failures, cancels and evictions, with every invariant checked after
every transition (check mode `every`). A rejected step must leave the state unchanged.

Besides the legal moves, the machine tries moves the spec forbids and asserts they are
refused with nothing changed: a chain issued below a parent that lacks the target (a backup
gap, B07; also below every chain `back_up_and_drop` and `load_back_then_serve_early` issue,
a nested prompt made first where needed) and serving a prefix whose load-back is still in
flight (B01; `load_back_then_serve_early` starts one on purpose, then fails, cancels,
completes or splits it). After every step it
also recounts the tree (`HiRadixTree.audit`: leaf sets, counters, links) and tests the checker
itself: every transition was checked, and each tier's copy of the live snapshot with one page
put on the free list (I1) or leaked (I6) is reported for that tier. The bug zoo
(`hicache.testing.mutants`) measures what this catches."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hicache.core.control import ControlPlane
from hicache.core.pages import FREE, PRIVATE
from hicache.core.snapshot import Snapshot
from hicache.core.tiers import TIERS, Direction
from hicache.core.tree import TreeNode
from hicache.errors import IllegalTransition, OutOfPages
from hicache.invariants.registry import Check, check_all
from tests.test_control import fingerprint

PS = 2
prompts = st.lists(st.integers(0, 2), min_size=PS, max_size=5 * PS)


def chain_into(node: TreeNode, dst: int) -> list[TreeNode]:
    """`node` and its ancestors lacking tier `dst`, parent first: the chain an issue needs."""
    chain = []
    n: TreeNode | None = node
    while n is not None and not n.is_root and n.state[dst] == "ABSENT":
        chain.append(n)
        n = n.parent
    return chain[::-1]


class ControlPlaneMachine(RuleBasedStateMachine):
    @initialize(caps=st.tuples(st.integers(4, 12), st.integers(2, 12), st.integers(2, 12)))
    def setup(self, caps: tuple[int, int, int]) -> None:
        self.cp = ControlPlane(PS, caps, check_mode="every")
        self.next_rid = 1
        self.rejections = 0

    def attempt(self, step: Callable[[], object]) -> bool:
        """Run `step`; whether it was refused (then nothing may have changed)."""
        before = fingerprint(self.cp)
        try:
            step()
        except (IllegalTransition, OutOfPages):
            self.rejections += 1
            assert fingerprint(self.cp) == before, "a rejected transition changed state"
            return True
        return False

    @rule(tokens=prompts)
    def serve(self, tokens: list[int]) -> None:
        rid, self.next_rid = self.next_rid, self.next_rid + 1
        m = self.cp.begin_request(rid, tokens)
        todo = (len(tokens) // PS) * PS - m.lengths[0]
        if todo > 0:
            self.cp.evict("L1", todo // PS - self.cp.free_pages("L1"))  # make room, as a cache does
            self.attempt(lambda: self.cp.compute(rid, todo))
            self.cp.insert(rid)
        self.cp.end_request(rid)

    @rule(data=st.data(), gap=st.booleans())
    def issue(self, data: st.DataObject, gap: bool) -> None:
        """Issue the chain a node needs, in a direction it can go (any that has a node); with
        `gap`, the chain without its first node, whose parent then lacks the target: the
        issue guard must refuse it (no backup gap, B07)."""
        moves = [
            (d, n)
            for d in Direction
            for n in self.cp.tree.nodes()
            if n.state[TIERS.index(d.source)] == "RESIDENT"
            and n.state[TIERS.index(d.target)] == "ABSENT"
        ]
        # Prefer chains the source tier holds whole (the rest are refused by a guard).
        whole = [
            (d, n)
            for d, n in moves
            if all(
                c.state[TIERS.index(d.source)] == "RESIDENT"
                for c in chain_into(n, TIERS.index(d.target))
            )
        ]
        if not moves:
            return
        pick = whole or moves  # a direction first (uniform over those with a node), then a node
        direction = data.draw(st.sampled_from(sorted({d for d, _ in pick}, key=lambda d: d.value)))
        node = data.draw(st.sampled_from([n for d, n in pick if d is direction]))
        dst = TIERS.index(direction.target)
        chain = chain_into(node, dst)
        if gap and len(chain) > 1:
            refused = self.attempt(lambda: self.cp.issue(direction, chain[1:]))
            assert refused, (
                f"{direction} issued below node {chain[0].node_id}, which lacks {TIERS[dst]}"
            )
            return
        parent = chain[0].parent
        assert parent is not None  # Verify: a chain never starts at the root.
        # Make room as the controller does (never evicting the chain's parent, S6).
        short = sum(n.num_pages for n in chain) - self.cp.free_pages(direction.target)
        self.cp.evict(direction.target, short, keep=[parent])
        self.attempt(lambda: self.cp.issue(direction, chain))

    def _refused_below_a_gap(self, direction: Direction, chain: list[TreeNode]) -> None:
        """With room made for `chain`, the chain without its first node must be refused with
        nothing changed: its parent lacks the target (B07; `issue`'s `gap` draws such a
        chain rarely, these callers have one at hand)."""
        if len(chain) > 1:
            refused = self.attempt(lambda: self.cp.issue(direction, chain[1:]))
            assert refused, (
                f"{direction} issued below node {chain[0].node_id}, which lacks {direction.target}"
            )

    @rule(data=st.data())
    def back_up_and_drop(self, data: st.DataObject) -> None:
        """Back an L1 chain up to L2 at once (issue, complete), then drop L1 copies: the
        prefix is now L2-only, so later load-backs (and their failures) have a source."""
        nodes = [
            n for n in self.cp.tree.nodes() if n.state[0] == "RESIDENT" and n.state[1] == "ABSENT"
        ]
        if not nodes:
            return
        node = data.draw(st.sampled_from(nodes))
        if len(chain_into(node, 1)) == 1:
            # A prompt one page past the node, so that a chain of two nodes lacks L2: only
            # such a chain can test the guard below a gap (B07).
            path = [t for n in reversed(self.cp.tree.path_to_root(node)) for t in n.key]
            self.serve(path + [3] * PS)
            deeper = [
                n
                for n in self.cp.tree.nodes()
                if n.state[0] == "RESIDENT" and n.state[1] == "ABSENT" and len(chain_into(n, 1)) > 1
            ]
            node = deeper[0] if deeper else node
        chain = chain_into(node, 1)
        if any(n.state[0] != "RESIDENT" for n in chain):
            return
        parent = chain[0].parent
        assert parent is not None  # Verify: a chain never starts at the root.
        self.cp.evict(
            "L2", sum(n.num_pages for n in chain) - self.cp.free_pages("L2"), keep=[parent]
        )
        self._refused_below_a_gap(Direction.D2H, chain)
        if not self.attempt(lambda: self.cp.issue(Direction.D2H, chain)):
            self.cp.complete(max(self.cp.ops))  # the op just issued: ids only grow
        self.cp.evict("L1", 10_000)

    @precondition(lambda self: any(op.direction is Direction.H2D for op in self.cp.ops.values()))
    @rule(data=st.data())
    def serve_early(self, data: st.DataObject) -> None:
        """A request may not be served a prefix whose load-back is still in flight (B01):
        `advance_cached_len` over it is refused with nothing changed."""
        loads = sorted(i for i, op in self.cp.ops.items() if op.direction is Direction.H2D)
        node = self.cp.ops[data.draw(st.sampled_from(loads))].nodes[-1]
        tokens = [t for n in reversed(self.cp.tree.path_to_root(node)) for t in n.key] + [0]
        rid, self.next_rid = self.next_rid, self.next_rid + 1
        self.cp.begin_request(rid, tokens)
        refused = self.attempt(lambda: self.cp.advance_cached_len(rid, node))
        assert refused, (
            f"request {rid} was served node {node.node_id} before its load-back completed"
        )
        self.cp.end_request(rid)

    def _l2_only(self) -> list[TreeNode]:
        """Nodes a load-back may start at: in L2, not in L1, their chain into L1 in L2 whole."""
        return [
            n
            for n in self.cp.tree.nodes()
            if n.state[1] == "RESIDENT"
            and n.state[0] == "ABSENT"
            and all(c.state[1] == "RESIDENT" for c in chain_into(n, 0))
        ]

    @precondition(lambda self: bool(self._l2_only()))
    @rule(data=st.data(), outcome=st.sampled_from(["fail", "fail", "cancel", "complete", None]))
    def load_back_then_serve_early(self, data: st.DataObject, outcome: str | None) -> None:
        """A load-back, which `issue` starts rarely (it picks a direction first, and a node
        must be in L2 but not L1): an L2-only chain is loaded back and served at once, which
        must be refused (B01); then it ends by `outcome` (a failure, drawn twice as often as
        the others since nothing else fails load-backs much, must leave its L2 source alone,
        B02; a cancel must free its targets, B03), or stays in flight while a prompt
        diverging inside its last node splits that node (the op must follow, B06)."""
        chain = chain_into(data.draw(st.sampled_from(self._l2_only())), 0)
        parent = chain[0].parent
        assert parent is not None  # Verify: a chain never starts at the root.
        self.cp.evict(
            "L1", sum(n.num_pages for n in chain) - self.cp.free_pages("L1"), keep=[parent]
        )
        self._refused_below_a_gap(Direction.H2D, chain)
        if self.attempt(lambda: self.cp.issue(Direction.H2D, chain)):
            return
        op_id = max(self.cp.ops)  # the op just issued: ids only grow
        self.serve_early(data)
        if outcome is not None:
            getattr(self.cp, outcome)(op_id)
            return
        node = chain[-1]  # left in flight: a prompt diverging inside it splits it (B06)
        if node.num_pages > 1:
            path = [t for n in reversed(self.cp.tree.path_to_root(node)) for t in n.key]
            self.serve(path[: len(path) - len(node.key) + PS] + [3] * PS)

    @rule(tiers=st.sampled_from(["L1", "L2", "L1 L2"]))
    def push_out(self, tiers: str) -> None:
        """Evict everything evictable from these tiers, so that restores (from L2, or
        promotions from L3) have something to do."""
        for tier in tiers.split():
            self.cp.evict(tier, 10_000)

    @rule(data=st.data(), outcome=st.sampled_from(["complete", "fail", "cancel"]))
    def finish(self, data: st.DataObject, outcome: str) -> None:
        if not self.cp.ops:
            return
        op_id = data.draw(st.sampled_from(sorted(self.cp.ops)))
        getattr(self.cp, outcome)(op_id)

    @rule(tier=st.sampled_from(["L1", "L2", "L3"]), n=st.integers(1, 6))
    def evict(self, tier: str, n: int) -> None:
        self.cp.evict(tier, n)

    @invariant()
    def accounted(self) -> None:
        if hasattr(self, "cp"):
            for t, table in zip(TIERS, self.cp.tables):
                assert table.free_count + table.count(1) + table.count(2) == table.capacity, t

    @invariant()
    def tree_recounts(self) -> None:
        """The tree's own recount: links, counters, per-tier leaf sets, lock sums."""
        if hasattr(self, "cp"):
            problems = self.cp.tree.audit()
            assert not problems, f"the tree's recount disagrees: {problems[0]}"

    @invariant()
    def checker_sees_what_breaks(self) -> None:
        """The checker is under test too: it ran after every transition (mode `every`), and
        on the live snapshot with one page of a tier put on the free list (I1) or leaked
        (I6) it reports that tier (one tier per step, in turn: the cost of a third)."""
        if not hasattr(self, "cp"):
            return
        checker = self.cp.checker
        assert checker.checks_run == checker.transitions, (
            f"{checker.transitions} transitions but {checker.checks_run} checked (mode every)"
        )
        s = self.cp.snapshot()
        self.canary_turn = getattr(self, "canary_turn", -1) + 1
        tier = TIERS[self.canary_turn % len(TIERS)].value
        view = s.tiers[tier]
        held = [v for n in s.nodes if (v := n.values.get(tier)) is not None and v.size]
        if held:
            found = _found(_owned(s, tier, int(held[0][0]), FREE), checker.checks, "I1")
            assert ("I1", tier) in found, f"I1 misses a {tier} page in a node value and FREE"
        free = np.flatnonzero(view.owner == FREE)
        if free.size:
            found = _found(_owned(s, tier, int(free[0]), PRIVATE), checker.checks, "I6")
            assert ("I6", tier) in found, f"I6 misses a leaked PRIVATE page of {tier}"

    def teardown(self) -> None:
        if not hasattr(self, "cp"):
            return
        for op_id in list(self.cp.ops):  # drain: nothing pending, no private page left (I6)
            self.cp.cancel(op_id)
        for t, table in zip(TIERS, self.cp.tables):
            assert table.count(1) == 0, f"{t}: private pages left after drain"


def _owned(s: Snapshot, tier: str, page: int, owner: int) -> Snapshot:
    """A copy of `s` in which `page` of `tier` has owner code `owner`."""
    codes = s.tiers[tier].owner.copy()
    codes[page] = owner
    return replace(s, tiers={**s.tiers, tier: replace(s.tiers[tier], owner=codes)})


def _found(s: Snapshot, checks: tuple[Check, ...], check_id: str) -> set[tuple[str, str | None]]:
    """(check id, tier) of every violation the checker's check `check_id` finds in `s`."""
    return {
        (v.invariant, v.tier) for v in check_all(s, tuple(c for c in checks if c.id == check_id))
    }


_profile = settings()  # the loaded profile (dev, ci or fuzz); the zoo runs this machine longer
ControlPlaneMachine.TestCase.settings = settings(
    _profile,
    max_examples=min(_profile.max_examples, 50)
    if _profile.max_examples < 1000
    else _profile.max_examples,
    stateful_step_count=50,
    deadline=None,
)
TestControlPlaneMachine = ControlPlaneMachine.TestCase
