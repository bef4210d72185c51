"""The HiRadixTree: one token topology for all tiers, with each tier's residency on its nodes.

    root ─┬─ [a b c d e f g h] ─┬─ [i j k l]      page_size 4: every key is whole pages;
          │                     └─ [m n o p]      children are keyed by their first page
          └─ [q r s t]

Per tier (index 0, 1, 2 = L1, L2, L3; `hicache.core.tiers.TIERS`) every node carries:

    value        that tier's physical pages for the node's key (int64, one per page), or None
    state        residency sub-state from spec/lifecycle.toml ("ABSENT", "RESIDENT",
                 "<DIR>_PENDING"); never "PRIVATE", which only requests hold
    lock         lock count (request holds and transfer sources); never negative
    pending      op id of the transfer filling this tier, or None
    last_access  LRU tick from the tree's monotonic counter

The tree is mechanical: it keeps topology, counters and per-tier leaf sets exact and rejects
misuse with `TreeError`, changing nothing. Which transition is legal is the control plane's
business (hicache/core/control.py checks the lifecycle tables before it calls in here).

Contract for callers: change `value` and `state` only through `set_value` (the per-tier leaf
sets and `pages_held` are maintained there), locks only through `lock`/`unlock`. `pending` may
be assigned directly or through `set_pending`; it is read when `candidates` is asked.

Poisoning: once the control plane that owns the tree finds an invariant broken, it calls
`poison`; from then on every mutator (and a `match` that would split or refresh LRU ticks)
raises `PlanePoisoned` with nothing changed. Read-only queries keep working.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from hicache.core.lifecycle import ABSENT, RESIDENT
from hicache.core.pages import Pages
from hicache.core.tiers import TIERS
from hicache.core.treenode import N_TIERS, ROOT_ID, Cut, MatchResult, TreeNode, node_states
from hicache.errors import ConfigError, InvariantViolation, PlanePoisoned, TreeError

__all__ = ["Cut", "HiRadixTree", "MatchResult", "Tokens", "TreeNode", "node_states"]

Tokens = Sequence[int] | npt.NDArray[np.integer[Any]]
"""Token ids: any int sequence, or an integer numpy array."""


class HiRadixTree:
    """The shared radix tree of all tiers (spec/tree.md)."""

    def __init__(self, page_size: int) -> None:
        if not isinstance(page_size, int) or page_size < 1:
            raise ConfigError(
                "page_size", f"must be a positive integer of tokens, got {page_size!r}"
            )
        self.page_size = page_size
        self._tick = 0
        self._next_id = ROOT_ID + 1
        self.root = TreeNode(ROOT_ID, None, (), 0, page_size)
        self._nodes: dict[int, TreeNode] = {ROOT_ID: self.root}
        # The live nodes by id, the root's included: the index itself, to read only (`get`
        # is its `.get`: a checker reads it without a call per node). Always `_nodes`.
        self.nodes_by_id: Mapping[int, TreeNode] = self._nodes
        # Per tier: nodes RESIDENT there with no non-ABSENT child there (eviction candidates
        # before the lock/pending filter), keyed by node id.
        self._leaves: list[dict[int, TreeNode]] = [{} for _ in TIERS]
        self.pages_held: list[int] = [0] * N_TIERS
        self.on_split: list[Callable[[TreeNode, TreeNode], None]] = []
        self.poisoned: InvariantViolation | None = None  # set once by `poison`, never cleared

    # -- lookup ---------------------------------------------------------------------------

    def node(self, node_id: int) -> TreeNode:
        """The live node with this id; TreeError if there is none (never created, or removed)."""
        found = self._nodes.get(node_id)
        if found is None:
            raise TreeError(
                f"no live node {node_id}; it was removed or never existed -- match again"
            )
        return found

    def get(self, node_id: int) -> TreeNode | None:
        """The live node with this id (the root's included), or None: removed, or never
        created (`node` raises instead)."""
        return self._nodes.get(node_id)

    def node_ids(self) -> list[int]:
        """The ids of the live nodes, the root's included, in creation order."""
        return list(self._nodes)

    @property
    def tick(self) -> int:
        """The LRU clock: the last tick given out (0: none yet)."""
        return self._tick

    @property
    def next_id(self) -> int:
        """The id the next node gets (ids are never reused)."""
        return self._next_id

    def in_leaf_sets(self, node: TreeNode) -> tuple[bool, ...]:
        """Per tier, whether that tier's leaf set (its eviction candidates before the lock
        and pending filter) holds `node`."""
        return tuple([node.node_id in leaves for leaves in self._leaves])

    def contains(self, node: TreeNode) -> bool:
        """Whether `node` (this very object) is a live node of this tree, the root included."""
        return node is self.root or self._nodes.get(node.node_id) is node

    def nodes(self) -> Iterator[TreeNode]:
        """Every live node except the root, in creation order (a copy: safe to mutate while
        iterating)."""
        return iter([n for n in self._nodes.values() if not n.is_root])

    def __len__(self) -> int:
        """Live nodes, the root excluded."""
        return len(self._nodes) - 1

    def path_to_root(self, node: TreeNode) -> list[TreeNode]:
        """`node`, its parent, ... up to the root's child (the root itself excluded)."""
        self._own(node)
        out: list[TreeNode] = []
        n: TreeNode | None = node
        while n is not None and not n.is_root:
            out.append(n)
            n = n.parent
        return out

    def prefix_tokens(self, node: TreeNode) -> int:
        """Tokens from the root to the end of `node` (0 for the root)."""
        return sum(len(n.key) for n in self.path_to_root(node))

    # -- match ----------------------------------------------------------------------------

    def match(
        self,
        tokens: Tokens,
        *,
        split: bool = True,
        touch: bool = True,
        l1_clip: Callable[[Sequence[TreeNode]], int] | None = None,
    ) -> MatchResult:
        """Walk `tokens` (aligned down to page_size first) from the root.

        `l1_clip(run)`, when given, says how many pages of the L1 run (the leading nodes
        RESIDENT in L1) the L1 hit may cover, always a node end (a freed window ends it
        early: pools/windows.py).

        When the match ends inside a node: with `split`, that node is split so `path` ends
        exactly at `matched_len`; without, the partly matched node is left out of `path`.
        With `touch`, every per-tier hit node gets a fresh LRU tick in that tier and every
        `path` node's `hits` grows by one (R15).
        """
        if split or touch:
            self._writable("match (with split or touch)")
        path, pos, cut = self._walk(_as_tuple(tokens))
        if split and cut is not None:
            path.append(self.split(cut.node, cut.at_tokens))
            pos += cut.at_tokens
        lengths, handles = [0] * N_TIERS, [self.root] * N_TIERS
        runs = [0] * N_TIERS
        for t in range(N_TIERS):
            for i, n in enumerate(path):
                if n.state[t] != RESIDENT:
                    break
                lengths[t] += len(n.key)
                handles[t] = n
                runs[t] = i + 1
        if l1_clip is not None and runs[0]:
            self._clip_l1(path, runs, lengths, handles, l1_clip(path[: runs[0]]))
        result = MatchResult(
            (lengths[0], lengths[1], lengths[2]),
            (handles[0], handles[1], handles[2]),
            tuple(path),
            pos,
        )
        if touch:
            self.touch_match(result)
        return result

    def touch_match(self, m: MatchResult) -> None:
        """What `match(touch=True)` does to the tree, for a match made with `touch=False`
        whose hits were cut since (tensor-parallel ranks touch only the agreed hits: a rank
        that refreshed its own longer hit would evict other victims than the others): one
        fresh LRU tick for every node of each tier's hit, and one more hit on every `path`
        node."""
        self._writable("touch")
        tick = self._next_tick()
        for t in range(N_TIERS):
            pos = 0
            for n in m.path:
                pos += len(n.key)
                if pos > m.lengths[t]:
                    break
                n.last_access[t] = tick
        for n in m.path:
            n.hits += 1

    def _clip_l1(
        self,
        path: list[TreeNode],
        runs: list[int],
        lengths: list[int],
        handles: list[TreeNode],
        pages: int,
    ) -> None:
        """Shorten the L1 run to its first `pages` pages (`match`'s `l1_clip`), in place."""
        keep, pos = 0, 0
        while keep < runs[0] and pos + len(path[keep].key) <= pages * self.page_size:
            pos += len(path[keep].key)
            keep += 1
        # Verify the clip shortens the run to a node end: a window is freed for a whole node,
        # so the largest legal end is never inside one (spec/pools.md, "Freed windows").
        assert pos == pages * self.page_size, f"l1_clip to {pages} pages is not a node end"
        runs[0], lengths[0] = keep, pos
        handles[0] = path[keep - 1] if keep else self.root

    def cut(self, tokens: Tokens) -> Cut | None:
        """The split `match(tokens)` would make, without making it (nothing changes, no LRU
        tick): the node the walk ends inside and the tokens it shares, or None when the walk
        ends on a node boundary. What a caller validates before it lets `match` split."""
        return self._walk(_as_tuple(tokens))[2]

    def _walk(self, seq: tuple[int, ...]) -> tuple[list[TreeNode], int, Cut | None]:
        """The whole-key nodes of `seq` (aligned down to page_size) from the root, the tokens
        they cover, and where the walk ends inside a node's key (>= 1 page shared, < the key).
        Reads only."""
        ps = self.page_size
        end = len(seq) - len(seq) % ps
        node, pos = self.root, 0
        path: list[TreeNode] = []
        while pos < end:
            child = node.children.get(seq[pos : pos + ps])
            if child is None:
                break
            klen = len(child.key)
            if pos + klen <= end and seq[pos : pos + klen] == child.key:
                path.append(child)
                node, pos = child, pos + klen
                continue
            return path, pos, Cut(child, _common_pages(child.key, seq, pos, end, ps) * ps)
        return path, pos, None

    # -- topology -------------------------------------------------------------------------

    def split(self, node: TreeNode, at_tokens: int) -> TreeNode:
        """Split `node` after `at_tokens` tokens (page aligned, inside the key).

        A new upper node takes key[:at] and, in every tier, value[:at/page_size] with the same
        state, lock, pending op and LRU tick; `node` keeps the rest and becomes its only child
        (locks are per subtree, so the upper node's equal count is exact); no page changes
        owner (R18). Returns the upper node, after calling every `on_split` hook with (upper,
        node).
        """
        self._writable("split")
        self._own(node)
        ps = self.page_size
        if node.is_root:
            raise TreeError("the root has no key to split")
        if not isinstance(at_tokens, int) or not 0 < at_tokens < len(node.key) or at_tokens % ps:
            raise TreeError(
                f"split of node {node.node_id} ({len(node.key)} tokens) at {at_tokens!r}: "
                f"need a multiple of page_size {ps} strictly inside the key"
            )
        parent = node.parent
        assert parent is not None  # Verify: only the root lacks a parent.
        k = at_tokens // ps
        upper = TreeNode(self._new_id(), parent, node.key[:at_tokens], 0, ps)
        upper.value = [None if v is None else v[:k].copy() for v in node.value]
        upper.state = list(node.state)
        upper.lock = list(node.lock)
        upper.pending = list(node.pending)
        upper.last_access = list(node.last_access)
        upper.hits = node.hits
        upper.present_children = [int(s != ABSENT) for s in node.state]
        node.value = [None if v is None else v[k:].copy() for v in node.value]
        node.key = node.key[at_tokens:]
        node.parent = upper
        upper.children[node.key[:ps]] = node
        parent.children[upper.key[:ps]] = upper
        self._nodes[upper.node_id] = upper
        # Leaf sets are unchanged: upper has `node` below it in every tier it is not ABSENT in,
        # and the parent sees upper in exactly the states it saw `node` in.
        for hook in self.on_split:
            hook(upper, node)
        return upper

    def add_child(self, parent: TreeNode, key: Tokens) -> TreeNode:
        """A new node under `parent` for `key` (page aligned, non-empty, no sibling with the
        same first page), holding nothing in any tier; its LRU ticks are fresh."""
        self._writable("add_child")
        self._own(parent)
        ps = self.page_size
        k = _as_tuple(key)
        if not k or len(k) % ps:
            raise TreeError(
                f"child key of {len(k)} tokens: need a positive multiple of page_size {ps}"
            )
        first = k[:ps]
        if first in parent.children:
            raise TreeError(
                f"node {parent.node_id} already has child {parent.children[first].node_id} "
                "starting with that page; match (and split) instead of adding"
            )
        child = TreeNode(self._new_id(), parent, k, self._next_tick(), ps)
        parent.children[first] = child
        self._nodes[child.node_id] = child
        return child

    def remove_if_dead(self, node: TreeNode) -> list[TreeNode]:
        """Remove `node` if it is dead (`TreeNode.is_dead`), then its parent likewise, up the
        path: the only way a node leaves the tree (R20). Returns the removed nodes, deepest
        first (their `parent` is then None)."""
        self._writable("remove_if_dead")
        self._own(node)
        removed: list[TreeNode] = []
        n = node
        while n.is_dead():
            parent = n.parent
            assert parent is not None  # Verify: a dead node is never the root.
            del parent.children[n.key[: self.page_size]]
            del self._nodes[n.node_id]
            n.parent = None
            removed.append(n)
            n = parent
        return removed

    # -- per-tier residency ---------------------------------------------------------------

    def set_value(self, node: TreeNode, tier: int, value: Pages | None, state: str) -> None:
        """Set `node`'s value and sub-state in `tier`. A value is present exactly when the state
        is RESIDENT (pending targets live in the op, not the node), one page per key page. The
        tree stores its own int64 copy. Becoming RESIDENT refreshes the node's LRU tick there."""
        # `_writable`, `_own` and `_check_tier`, tested inline (a write per trace event); each
        # raises its own error when its test fails.
        if self.poisoned is not None:
            self._writable("set_value")
        if self._nodes.get(node.node_id) is not node:
            self._own(node)
        if type(tier) is not int or not 0 <= tier < N_TIERS:
            self._check_tier(tier)
        if node.is_root:
            raise TreeError("the root holds no pages")
        if state not in node_states()[tier]:
            raise TreeError(
                f"{state!r} is not a node state of {TIERS[tier]}: "
                f"one of {sorted(node_states()[tier])}"
            )
        if (value is None) != (state != RESIDENT):
            raise TreeError(
                f"node {node.node_id} {TIERS[tier]}: a value is given exactly when the "
                f"state is RESIDENT (got state {state}, value "
                f"{'None' if value is None else 'pages'})"
            )
        stored: Pages | None = None
        if value is not None:
            want = node.num_pages
            if (
                not isinstance(value, np.ndarray)
                or value.ndim != 1
                or len(value) != want
                or value.dtype.kind not in "iu"
            ):  # np.issubdtype(.., np.integer), cheaper
                raise TreeError(
                    f"node {node.node_id} {TIERS[tier]}: value must be a 1-D integer array "
                    f"of {want} pages (one per key page), got {value!r}"
                )
            stored = value.astype(np.int64, copy=True)
        old, before = node.value[tier], node.state[tier]
        self.pages_held[tier] += (0 if stored is None else len(stored)) - (
            0 if old is None else len(old)
        )
        node.value[tier], node.state[tier] = stored, state
        if state == RESIDENT and before != RESIDENT:
            node.last_access[tier] = self._next_tick()
        parent = node.parent
        assert parent is not None  # Verify: checked not root above.
        if (before == ABSENT) != (state == ABSENT):
            parent.present_children[tier] += 1 if before == ABSENT else -1
            self._refresh_leaf(parent, tier)
        self._refresh_leaf(node, tier)

    def set_pending(self, node: TreeNode, tier: int, op_id: int | None) -> None:
        """Mark (op id) or clear (None) the transfer filling `node` in `tier`. Replacing one op id
        by another is refused: the first op would be lost."""
        self._writable("set_pending")
        self._own(node)
        self._check_tier(tier)
        held = node.pending[tier]
        if op_id is not None and held is not None and held != op_id:
            raise TreeError(
                f"node {node.node_id} {TIERS[tier]} is already pending on op {held}; "
                f"finish it before op {op_id}"
            )
        node.pending[tier] = op_id

    def lock(self, node: TreeNode, tier: int) -> None:
        """+1 on `node` and every ancestor in `tier` (the root is never counted; locking it is
        a no-op, which is what a zero-length hit needs)."""
        self._writable("lock")
        self._check_tier(tier)
        for n in self.path_to_root(node):
            n.lock[tier] += 1

    def unlock(self, node: TreeNode, tier: int) -> None:
        """-1 on `node` and every ancestor in `tier`; TreeError, nothing changed, if any count
        would go negative (a lock released twice, or never taken)."""
        self._writable("unlock")
        self._check_tier(tier)
        path = self.path_to_root(node)
        zero = [n.node_id for n in path if n.lock[tier] < 1]
        if zero:
            raise TreeError(
                f"unlock of node {node.node_id} in {TIERS[tier]}: nodes {zero} hold no "
                "lock there (released twice, or never taken; R19: never clamped at zero)"
            )
        for n in path:
            n.lock[tier] -= 1

    def touch(self, node: TreeNode, tier: int) -> None:
        """Give `node` and its ancestors a fresh LRU tick in `tier`."""
        self._writable("touch")
        self._check_tier(tier)
        path = self.path_to_root(node)
        tick = self._next_tick()
        for n in path:
            n.last_access[tier] = tick

    def candidates(self, tier: int) -> list[TreeNode]:
        """Eviction candidates of `tier`, least recently used first (ties: older node first):
        RESIDENT there, unlocked there, no transfer pending there, and a leaf in that tier
        (every child ABSENT there; children holding only other tiers do not count): R23.
        Cost: linear in the tier's leaves, not in the tree."""
        self._check_tier(tier)
        found = [
            n for n in self._leaves[tier].values() if n.lock[tier] == 0 and n.pending[tier] is None
        ]
        found.sort(key=lambda n: (n.last_access[tier], n.node_id))  # R24: a total LRU order
        return found

    # -- copy -----------------------------------------------------------------------------

    def clone(self) -> HiRadixTree:
        """An independent copy, made field by field (the model checker branches on it): every
        node copied (its per-tier lists, children), the node index, the leaf sets and the
        counters; node keys and values shared (no change writes into one: every writer
        replaces them). The copy has no split listeners (`on_split` is empty)."""
        new: HiRadixTree = object.__new__(HiRadixTree)
        new.__dict__.update(self.__dict__)
        nodes: dict[int, TreeNode] = {}
        new_node = TreeNode.__new__
        for nid, old in self._nodes.items():
            n: TreeNode = new_node(TreeNode)
            n.node_id, n.key, n.hits, n.page_size, n.is_root = (
                nid,
                old.key,
                old.hits,
                old.page_size,
                old.is_root,
            )
            n.value, n.state, n.lock = old.value[:], old.state[:], old.lock[:]
            n.pending, n.last_access, n.present_children = (
                old.pending[:],
                old.last_access[:],
                old.present_children[:],
            )
            nodes[nid] = n
        for nid, old in self._nodes.items():
            n = nodes[nid]
            parent = old.parent
            n.parent = None if parent is None else nodes[parent.node_id]
            n.children = {k: nodes[c.node_id] for k, c in old.children.items()}
        new._nodes = nodes
        new.nodes_by_id = nodes
        new.root = nodes[self.root.node_id]
        new._leaves = [{i: nodes[i] for i in leaves} for leaves in self._leaves]
        new.pages_held = list(self.pages_held)
        new.on_split = []
        return new

    # -- self-check -----------------------------------------------------------------------

    def state_key(self) -> tuple[object, ...]:
        """Everything the tree records, as a plain hashable tuple: every live node's fields
        (id, parent, key, per-tier value, state, lock, pending op, LRU tick, hits, children,
        present-children count, leaf-set membership), the LRU clock, the next node id and
        the per-tier page counts. Equal keys mean equal trees, history included: what a
        refused change must leave exactly as it was (ControlPlane.state_key)."""
        leaves = self._leaves
        return (
            tuple(
                [
                    (
                        n.node_id,
                        -1 if n.parent is None else n.parent.node_id,
                        n.key,
                        tuple([None if v is None else v.tobytes() for v in n.value]),
                        tuple(n.state),
                        tuple(n.lock),
                        tuple(n.pending),
                        tuple(n.last_access),
                        n.hits,
                        tuple([c.node_id for c in n.children.values()]),
                        tuple(n.present_children),
                        tuple([n.node_id in tier for tier in leaves]),
                    )
                    for n in self._nodes.values()
                ]
            ),
            self._tick,
            self._next_id,
            tuple(self.pages_held),
        )

    def audit(self) -> list[str]:
        """Recount everything from scratch; one line per disagreement ([] when consistent).
        Checks links, key alignment, value/state agreement, lock counts, the per-tier
        present-children counts and leaf sets, and `pages_held`."""
        problems: list[str] = []
        held = [0] * N_TIERS
        reached = self._audit_links(problems)
        for n in reached:
            for t in range(N_TIERS):
                v = n.value[t]
                held[t] += 0 if v is None else len(v)
                if (v is None) != (n.state[t] != RESIDENT):
                    problems.append(
                        f"node {n.node_id} {TIERS[t]}: state {n.state[t]} with value {v}"
                    )
                if v is not None and len(v) * self.page_size != len(n.key):
                    problems.append(
                        f"node {n.node_id} {TIERS[t]}: {len(v)} pages for {len(n.key)} tokens"
                    )
                if not n.is_root and n.lock[t] < sum(c.lock[t] for c in n.children.values()):
                    problems.append(
                        f"node {n.node_id} {TIERS[t]}: lock {n.lock[t]} < its children's"
                    )
                present = sum(c.state[t] != ABSENT for c in n.children.values())
                if present != n.present_children[t]:
                    problems.append(
                        f"node {n.node_id} {TIERS[t]}: present_children "
                        f"{n.present_children[t]}, counted {present}"
                    )
                leaf = not n.is_root and n.state[t] == RESIDENT and present == 0
                if leaf != (n.node_id in self._leaves[t]):
                    problems.append(
                        f"node {n.node_id} {TIERS[t]}: leaf set says {not leaf}, is {leaf}"
                    )
        problems += [
            f"{TIERS[t]}: pages_held {self.pages_held[t]}, counted {held[t]}"
            for t in range(N_TIERS)
            if held[t] != self.pages_held[t]
        ]
        return problems

    def _audit_links(self, problems: list[str]) -> list[TreeNode]:
        """Walk from the root checking parent/child links and keys; the nodes reached."""
        ps, reached, stack = self.page_size, [self.root], [self.root]
        while stack:
            n = stack.pop()
            for first, c in n.children.items():
                if c.parent is not n or first != c.key[:ps] or not c.key or len(c.key) % ps:
                    problems.append(f"node {c.node_id}: bad link or key under node {n.node_id}")
                if any(x < 0 for x in c.lock):
                    problems.append(f"node {c.node_id}: negative lock {c.lock}")
                reached.append(c)
                stack.append(c)
        if {n.node_id for n in reached} != set(self._nodes) or len(reached) != len(self._nodes):
            problems.append("the nodes reachable from the root differ from the node index")
        return reached

    def poison(self, cause: InvariantViolation) -> None:
        """Refuse every later change (`PlanePoisoned`, naming `cause`); reads keep working.
        Called by the control plane when a check fails; the first cause is kept."""
        if self.poisoned is None:
            self.poisoned = cause

    # -- internals ------------------------------------------------------------------------

    def _writable(self, op: str) -> None:
        if self.poisoned is not None:
            raise PlanePoisoned(f"tree.{op}", self.poisoned)

    def _own(self, node: TreeNode) -> None:
        # Verify the handle is live in this tree: a removed node or another tree's node would
        # silently corrupt counters.
        if self._nodes.get(node.node_id) is not node:
            raise TreeError(
                f"node {node.node_id} is not live in this tree (removed, or from another "
                "tree); match again for a live handle"
            )

    @staticmethod
    def _check_tier(tier: int) -> None:
        if not isinstance(tier, int) or not 0 <= tier < N_TIERS:
            raise TreeError(f"tier index {tier!r}: need 0..{N_TIERS - 1} (L1, L2, L3)")

    def _refresh_leaf(self, node: TreeNode, tier: int) -> None:
        if not node.is_root and node.state[tier] == RESIDENT and node.present_children[tier] == 0:
            self._leaves[tier][node.node_id] = node
        else:
            self._leaves[tier].pop(node.node_id, None)

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def _next_tick(self) -> int:
        self._tick += 1
        return self._tick


_NODE_SLOTS = {
    "node_id",
    "key",
    "hits",
    "page_size",
    "is_root",
    "value",
    "state",
    "lock",
    "pending",
    "last_access",
    "present_children",
    "parent",
    "children",
}
# Verify `HiRadixTree.clone` sets every slot TreeNode has (a slot added later must be copied).
assert _NODE_SLOTS == set(TreeNode.__slots__), set(TreeNode.__slots__) ^ _NODE_SLOTS


def _as_tuple(tokens: Tokens) -> tuple[int, ...]:
    """Tokens as a tuple of Python ints (tuple slices hash and compare in C)."""
    if isinstance(tokens, tuple):
        return tokens
    if isinstance(tokens, np.ndarray):
        return tuple(tokens.reshape(-1).tolist())
    return tuple(tokens)


def _common_pages(key: tuple[int, ...], seq: tuple[int, ...], pos: int, end: int, ps: int) -> int:
    """Whole pages `key` shares with seq[pos:end], given that the first page is shared.
    Binary search over slice equality: prefix equality is monotone in length."""
    lo, hi = 1, min(len(key), end - pos) // ps
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if key[: mid * ps] == seq[pos : pos + mid * ps]:
            lo = mid
        else:
            hi = mid - 1
    return lo
