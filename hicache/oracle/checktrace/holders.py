"""The lock holders' locked paths, kept per holder: S7's expected counts without a walk.

A holder is a live request (its prefix lock: its locked node in L1, unless that is the root;
its pins: a (node, tier) each) or a pending op (its source lock: its last node, in the source
tier). A holder's lock on a node is a lock on every node of its path, the node and its
ancestors below the root (S7: a node's lock count per tier is the number of holder paths
through it in that tier).

`LockHolders` keeps, per holder, the node ids of its paths as it last read them, and per node
id the lock counts those paths add up to there (`expected`: S7's right-hand side, read in
O(1) a node). A holder's paths change only when its record changes -- its request or op is
named by the call -- or when a node on them changes (a split or a removal names the node):
`refresh` re-reads exactly those holders, so a call costs what it touched, not the number of
live requests. `recompute` derives the same from every live holder (the tests compare the
two after every call of fuzzed traces: a holder a call changed and `refresh` missed shows
there).
"""

from __future__ import annotations

from collections.abc import Iterable

from hicache.core.control import ControlPlane
from hicache.core.tiers import TIERS, Direction
from hicache.core.tree import TreeNode

SOURCE = {d: TIERS.index(d.source) for d in Direction}

Held = tuple[tuple[tuple[int, ...], int], ...]
"""A holder's paths: (node ids from its node up to the root's child, tier index) per lock."""


class LockHolders:
    """Every live holder's locked paths and the lock counts they add up to (one per plane)."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.paths: dict[tuple[str, int], Held] = {}  # (kind, id) -> its paths
        self.through: dict[int, set[tuple[str, int]]] = {}  # node id -> holders through it
        self.expected: dict[int, list[int]] = {}  # node id -> per tier, holder paths through it
        self.whole = self.rebuild()  # False: a read failed, the records are partial

    def rebuild(self) -> bool:
        """The records from every live holder; False if a holder's node is not in the tree
        (the records are then partial: the next `refresh` rebuilds them)."""
        self.paths, self.through, self.expected = {}, {}, {}
        keys = [("request", r) for r in self.cp.requests] + [("op", o) for o in self.cp.ops]
        self.whole = all(self._read(key) for key in keys)
        return self.whole

    def refresh(
        self, nodes: Iterable[int], requests: Iterable[int], ops: Iterable[int]
    ) -> list[int] | None:
        """Re-read the holders of `requests` and `ops` (live or ended) and every holder whose
        paths passed through `nodes` (node ids, live or removed). Returns the ids of the
        requests re-read, or None if a holder's node is not in the tree. After a None the
        records are partial, and the next call rebuilds them first (every live request is
        then re-read)."""
        if not self.whole:
            if not self.rebuild():
                return None
            requests = list(self.cp.requests)
        through = self.through
        moved: set[tuple[str, int]] | None = None  # the holders through a node it names
        for i in nodes:
            held = through.get(i)
            if held:
                moved = set(held) if moved is None else moved | held
        reread: list[int] = []
        for i in requests:
            if moved is None or ("request", i) not in moved:
                if not self._read(("request", i)):
                    self.whole = False
                    return None
                reread.append(i)
        for i in ops:
            if (moved is None or ("op", i) not in moved) and not self._read(("op", i)):
                self.whole = False
                return None
        for key in moved or ():
            if not self._read(key):
                self.whole = False
                return None
            if key[0] == "request":
                reread.append(key[1])
        return reread

    def recompute(self) -> tuple[dict[tuple[str, int], Held], dict[int, list[int]]]:
        """(paths, expected) as read from every live holder now, nothing kept."""
        fresh = LockHolders(self.cp)
        return fresh.paths, fresh.expected

    def _read(self, key: tuple[str, int]) -> bool:
        """Replace `key`'s recorded paths by the ones it holds now (most often the same: then
        nothing changes); False (nothing changed) if one of its nodes is not in the tree."""
        cp = self.cp
        live, root = cp.tree.nodes_by_id.get, cp.tree.root
        # The (node, tier index) locks the holder records now; none for an ended one.
        locks: list[tuple[TreeNode, int]]
        if key[0] == "op":  # one without nodes holds none (its own clause says no: I5)
            op = cp.ops.get(key[1])
            locks = [] if op is None or not op.nodes else [(op.nodes[-1], SOURCE[op.direction])]
        else:
            r = cp.requests.get(key[1])
            if r is None:
                locks = []
            else:
                locks = [(r.locked, 0)] if r.locked.parent is not None else []
                if r.pins:
                    locks = locks + r.pins
        paths: list[tuple[tuple[int, ...], int]] = []
        for node, t in locks:
            if node is not root and live(node.node_id) is not node:
                return False  # a holder's node is not in the tree (cp.tree.contains)
            path: list[int] = []
            m = node
            while m.parent is not None:  # up to the root's child
                path.append(m.node_id)
                m = m.parent
            paths.append((tuple(path), t))
        now = tuple(paths)
        old = self.paths.get(key)
        if old == now or (old is None and not now):
            return True
        expected, through = self.expected, self.through
        if old is not None:
            del self.paths[key]
            for was, t in old:
                for i in was:
                    left = expected[i]
                    left[t] -= 1
                    if not (left[0] or left[1] or left[2]):
                        del expected[i]
                    held = through.get(i)  # None: another of its paths passed here
                    if held is not None:
                        held.discard(key)
                        if not held:
                            del through[i]
        if not now:
            return True
        for path_ids, t in now:
            for i in path_ids:
                counts = expected.get(i)
                if counts is None:
                    counts = expected[i] = [0, 0, 0]
                counts[t] += 1
                held = through.get(i)
                if held is None:
                    through[i] = {key}
                else:
                    held.add(key)
        self.paths[key] = now
        return True
