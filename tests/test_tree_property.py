"""The HiRadixTree against a naive model: per tier, the set of cached page-aligned prefixes.

The state machine inserts prefixes into tiers the way the control plane does (match, add_child
for the rest, publish parent before child), matches, evicts each tier's LRU leaf and takes and
releases locks (and tries to release one not held, which must be refused). After every step the tree
must agree with the model and with a brute-force recount of its own counters, leaf sets and locks.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hicache.core.lifecycle import ABSENT, RESIDENT
from hicache.core.pages import pages
from hicache.core.tree import HiRadixTree, TreeNode
from hicache.errors import TreeError

TIER = st.integers(0, 2)
Prefix = tuple[int, ...]


def _decode(length_and_code: tuple[int, int]) -> Prefix:
    """`length` tokens in 0..3, the base-4 digits of `code` (two draws per list instead of two
    per token: Hypothesis' own overhead dominates this test's run time)."""
    length, code = length_and_code
    return tuple((code >> (2 * i)) & 3 for i in range(length))


TOKENS = st.tuples(st.integers(0, 8), st.integers(0, 4**8 - 1)).map(_decode)


def full_tokens(tree: HiRadixTree, node: TreeNode) -> Prefix:
    """The tokens from the root to the end of `node`."""
    out: Prefix = ()
    for n in reversed(tree.path_to_root(node)):
        out += n.key
    return out


class TreeMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tree = HiRadixTree(1)
        self.model: list[set[Prefix]] = [set(), set(), set()]
        self.next_page = [0, 0, 0]
        self.locks: list[tuple[TreeNode, int]] = []  # (node, tier), one entry per lock taken
        self.pending: list[dict[Prefix, int]] = [{}, {}, {}]  # per tier: page prefix -> op id
        self.op_id = 0

    @initialize(page_size=st.integers(1, 4), tiers=st.lists(TIER, max_size=4), data=st.data())
    def start(self, page_size: int, tiers: list[int], data: st.DataObject) -> None:
        """A fresh tree, seeded with a few related prefixes so that runs start from some depth."""
        self.tree = HiRadixTree(page_size)
        for tier in tiers:
            self.insert(tier, data)

    def _draw_tokens(self, data: st.DataObject) -> Prefix:
        """Random tokens, or (to reach deep paths and splits) a cut of a live node's prefix
        followed by random tokens."""
        tail = data.draw(TOKENS)
        live = list(self.tree.nodes())
        if not live or data.draw(st.booleans()):
            return tail
        head = full_tokens(self.tree, data.draw(st.sampled_from(live)))
        return head[: data.draw(st.integers(0, len(head)))] + tail

    def _aligned(self, tokens: Prefix) -> Prefix:
        ps = self.tree.page_size
        return tokens[: len(tokens) - len(tokens) % ps]

    def _node_prefixes(self, node: TreeNode) -> list[Prefix]:
        """The page-aligned prefixes ending inside or at the end of `node`."""
        seq, ps = full_tokens(self.tree, node), self.tree.page_size
        return [seq[:k] for k in range(len(seq) - len(node.key) + ps, len(seq) + 1, ps)]

    def _model_len(self, tier: int, seq: Prefix) -> int:
        ps = self.tree.page_size
        n = 0
        while n + ps <= len(seq) and seq[: n + ps] in self.model[tier]:
            n += ps
        return n

    # -- rules ----------------------------------------------------------------------------

    @rule(tier=TIER, data=st.data())
    def insert(self, tier: int, data: st.DataObject) -> None:
        seq = self._aligned(self._draw_tokens(data))
        m = self.tree.match(seq, touch=False)
        path = list(m.path)
        if m.matched_len < len(seq):
            parent = path[-1] if path else self.tree.root
            path.append(self.tree.add_child(parent, seq[m.matched_len :]))
        for node in path:  # parent first: the tier's prefix set stays ancestor-closed
            if node.state[tier] == ABSENT:
                start = self.next_page[tier]
                self.next_page[tier] += node.num_pages
                self.tree.set_value(
                    node, tier, pages(range(start, start + node.num_pages)), RESIDENT
                )
        ps = self.tree.page_size
        self.model[tier].update(seq[:k] for k in range(ps, len(seq) + 1, ps))

    @rule(data=st.data())
    def match(self, data: st.DataObject) -> None:
        seq = self._aligned(self._draw_tokens(data))
        loose = self.tree.match(seq, split=False, touch=False)
        m = self.tree.match(seq)
        assert m.lengths == tuple(self._model_len(t, seq) for t in range(3))
        assert m.matched_len == sum(len(n.key) for n in m.path)
        assert all(length % self.tree.page_size == 0 for length in m.lengths)
        # Splitting only adds a boundary below the unsplit match.
        assert m.path[: len(loose.path)] == loose.path
        assert all(a <= b for a, b in zip(loose.lengths, m.lengths))
        for t in range(3):
            h = m.handles[t]
            assert self.tree.prefix_tokens(h) == m.lengths[t]
            # Every node of the hit run, not only the handle, is now the most recent in t.
            newest = max(n.last_access[t] for n in self.tree.nodes()) if len(self.tree) else 0
            assert all(
                n.last_access[t] == newest
                for n in m.path
                if self.tree.prefix_tokens(n) <= m.lengths[t]
            )

    @rule(tier=TIER)
    def evict_lru(self, tier: int) -> None:
        candidates = self.tree.candidates(tier)
        if not candidates:
            return
        victim = candidates[0]
        prefixes = self._node_prefixes(victim)
        self.tree.set_value(victim, tier, None, ABSENT)
        removed = self.tree.remove_if_dead(victim)
        assert all(n.parent is None for n in removed)
        self.model[tier].difference_update(prefixes)

    @rule(tier=TIER, data=st.data())
    def lock(self, tier: int, data: st.DataObject) -> None:
        """Lock a node of a match: the tier's hit handle (what a request does) or any path
        node (the tree counts locks per subtree whatever the tier holds)."""
        m = self.tree.match(self._aligned(self._draw_tokens(data)))
        node = data.draw(st.sampled_from((m.handles[tier],) + m.path))
        if not node.is_root:
            self.tree.lock(node, tier)
            self.locks.append((node, tier))

    @precondition(lambda self: bool(self.locks))
    @rule(data=st.data())
    def unlock(self, data: st.DataObject) -> None:
        node, tier = self.locks.pop(data.draw(st.integers(0, len(self.locks) - 1)))
        self.tree.unlock(node, tier)
        # The lock may have been all that kept an evicted node (locked in a tier it did not
        # hold); the control plane only locks held tiers, the tree allows either.
        self.tree.remove_if_dead(node)

    @rule(tier=TIER, data=st.data())
    def unlock_unheld(self, tier: int, data: st.DataObject) -> None:
        """Releasing a lock a node does not hold (a double release) is refused with nothing
        changed: a count clamped at zero instead would hide the bug, and the ancestors'
        counts would lose locks other holders still take (B11)."""
        free = [n for n in self.tree.nodes() if n.lock[tier] == 0]
        if not free:
            return
        node = data.draw(st.sampled_from(free))
        before = [(n.node_id, tuple(n.lock)) for n in self.tree.nodes()]
        try:
            self.tree.unlock(node, tier)
        except TreeError:
            assert [(n.node_id, tuple(n.lock)) for n in self.tree.nodes()] == before
            return
        raise AssertionError(
            f"unlock of node {node.node_id}, which holds no lock in tier {tier}, was accepted"
        )

    @rule(tier=TIER, data=st.data())
    def toggle_pending(self, tier: int, data: st.DataObject) -> None:
        live = list(self.tree.nodes())
        if not live:
            return
        node = data.draw(st.sampled_from(live))
        self.op_id += 1
        prefixes = self._node_prefixes(node)
        if node.pending[tier] is None:
            self.tree.set_pending(node, tier, self.op_id)
            self.pending[tier].update((p, self.op_id) for p in prefixes)
        else:
            self.tree.set_pending(node, tier, None)
            self.tree.remove_if_dead(node)  # an evicted node kept only by its pending op
            for p in prefixes:
                del self.pending[tier][p]

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def tree_agrees_with_model(self) -> None:
        cached: list[set[Prefix]] = [set(), set(), set()]
        pending: list[dict[Prefix, int]] = [{}, {}, {}]
        for n in self.tree.nodes():
            prefixes = self._node_prefixes(n)
            for t in range(3):
                if n.holds(t):
                    cached[t].update(prefixes)
                if (op := n.pending[t]) is not None:
                    pending[t].update((p, op) for p in prefixes)
        assert cached == self.model
        assert pending == self.pending

    @invariant()
    def counters_links_and_pages_exact(self) -> None:
        assert self.tree.audit() == []
        nodes = list(self.tree.nodes())
        for t in range(3):
            held = [int(p) for n in nodes if (v := n.value[t]) is not None for p in v]
            assert len(held) == self.tree.pages_held[t] == len(set(held))
        for n in nodes:
            assert n.parent is not None and n.parent.children[n.key[: self.tree.page_size]] is n
            assert not n.is_dead()

    @invariant()
    def evictable_is_exact(self) -> None:
        for t in range(3):
            got = self.tree.candidates(t)
            want = {
                n
                for n in self.tree.nodes()
                if n.holds(t)
                and n.lock[t] == 0
                and n.pending[t] is None
                and all(c.state[t] == ABSENT for c in n.children.values())
            }
            assert set(got) == want and len(got) == len(want)
            ticks = [n.last_access[t] for n in got]
            assert ticks == sorted(ticks)

    @invariant()
    def locks_count_held_locks_below(self) -> None:
        # A locked node is never removed, whatever its tiers hold.
        assert all(self.tree.node(h.node_id) is h for h, _ in self.locks)
        for n in self.tree.nodes():
            for t in range(3):
                assert n.lock[t] == sum(
                    1 for h, ht in self.locks if ht == t and n in self.tree.path_to_root(h)
                )


TestTreeMachine = TreeMachine.TestCase
