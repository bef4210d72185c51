"""Stateful fuzzing of the control plane alone (no bytes): random requests, backups,
restores, completions, failures, cancels and evictions, with every invariant checked after
every transition (check mode `every`). A rejected step must leave the state unchanged."""

from __future__ import annotations

from typing import Callable

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from hicache.control import ControlPlane
from hicache.errors import IllegalTransition, OutOfPages
from hicache.tiers import TIERS, Direction
from hicache.tree import TreeNode
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
    @initialize(caps=st.tuples(st.integers(2, 12), st.integers(2, 12), st.integers(2, 12)))
    def setup(self, caps: tuple[int, int, int]) -> None:
        self.cp = ControlPlane(PS, caps, check_mode="every")
        self.next_rid = 1
        self.rejections = 0

    def attempt(self, step: Callable[[], object]) -> None:
        before = fingerprint(self.cp)
        try:
            step()
        except (IllegalTransition, OutOfPages):
            self.rejections += 1
            assert fingerprint(self.cp) == before, "a rejected transition changed state"

    @rule(tokens=prompts)
    def serve(self, tokens: list[int]) -> None:
        rid, self.next_rid = self.next_rid, self.next_rid + 1
        m = self.cp.begin_request(rid, tokens)
        todo = (len(tokens) // PS) * PS - m.lengths[0]
        if todo > 0:
            self.attempt(lambda: self.cp.compute(rid, todo))
            self.cp.insert(rid)
        self.cp.end_request(rid)

    @rule(data=st.data(), direction=st.sampled_from(list(Direction)))
    def issue(self, data: st.DataObject, direction: Direction) -> None:
        src, dst = TIERS.index(direction.source), TIERS.index(direction.target)
        nodes = [n for n in self.cp.tree.nodes() if n.state[src] == "RESIDENT" and n.state[dst] == "ABSENT"]
        if not nodes:
            return
        node = data.draw(st.sampled_from(sorted(nodes, key=lambda n: n.node_id)))
        chain = chain_into(node, dst)
        self.attempt(lambda: self.cp.issue(direction, chain))

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

    def teardown(self) -> None:
        if not hasattr(self, "cp"):
            return
        for op_id in list(self.cp.ops):  # drain: nothing pending, no private page left (I6)
            self.cp.cancel(op_id)
        for t, table in zip(TIERS, self.cp.tables):
            assert table.count(1) == 0, f"{t}: private pages left after drain"


TestControlPlaneMachine = ControlPlaneMachine.TestCase
