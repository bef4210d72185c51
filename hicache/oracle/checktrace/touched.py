"""Incremental invariant checking: an all-clear over what one call touched.

The full checks (`hicache.invariants.check_all`) read a snapshot of the whole plane: tens of
microseconds even for a small tree, after every call. But when every invariant held before a
call, one can only break now through a record the call changed. `TouchedChecks.clear`
tests exactly those, reading the plane's live records (no snapshot):

    scope                                   what is tested there (the full check's rule)
    --------------------------------------  ----------------------------------------------
    the touched nodes and their ancestors   links both ways (S1), not dead (S2), locks >= 0
                                            (S4) and equal to the holders' path locks (S7),
                                            key and values whole pages (I3), value <->
                                            RESIDENT, pending <-> an op filling that tier for
                                            it (I5), parent present in the tier (S6)
    the touched nodes' other children       what reads the touched parent: in the tree under
                                            their key (S1, S2), the parent present in each
                                            tier they hold or fill (S6); their own records
                                            are unchanged (a change to one is an event)
    ops touched or covering such a node     source locked, RESIDENT, read as its nodes'
                                            values, TREE-owned (I2); nodes name it (I5);
                                            target never TREE (I5); ranges aligned (I3)
    the requests named, or whose locked     its locked path in the tree and RESIDENT in L1,
    paths pass a touched node               cached_len within it (I5)
    pages: the claims index (below) for     claimed at most once (S5, I6), in range, with
    the touched records, and every page     the claimant's owner code, or FREE when none
    whose owner code changed                claims it (I1, I6); the tree's page counters
                                            (S3)

Which owner codes changed: the pages the table logged moving (a `RunIndexTable`, the
replay's: O(pages moved)), else the whole owner array compared with its copy from the last
call (O(capacity) per call).

The lock counts S7 expects are kept per holder (holders.py): the holders a call names, or
whose locked paths pass a node it touched, are read again; the rest cannot have changed.

The claims index maps each tier's pages to the record claiming them (a node's value, an op's
target, a request's private pages); a call re-indexes only the records it touched.

`clear` is an all-clear, never a report: when it says no, the caller runs the full checks and
reports what they find (so the reports are the full checks' own), and when it says yes the
full checks find nothing (tests/test_checktrace_touched.py corrupts touched records at random
and compares). Its assumption is the full checks' verdict on the state before the call: a
change outside the call's scope (a bug changing a record the call never named) is seen by
the full checks only, which `--check-every N` runs.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import numpy as np

from hicache.core.control import ControlPlane
from hicache.core.lifecycle import ABSENT, RESIDENT
from hicache.core.pages import FREE, PRIVATE, TREE, PageTable
from hicache.core.records import PendingOp, Request
from hicache.core.tiers import TIERS, Direction
from hicache.core.tree import TreeNode
from hicache.core.treenode import ROOT_ID
from hicache.oracle.checktrace.holders import LockHolders
from hicache.oracle.checktrace.pagetable import RunIndexTable

Holder = tuple[str, int, int]
"""A claiming record: ("node", node id, tier index), ("op", op id, tier), ("request", id, tier)."""

CODE = {"node": TREE, "op": PRIVATE, "request": PRIVATE}
SOURCE = {d: TIERS.index(d.source) for d in Direction}
TARGET = {d: TIERS.index(d.target) for d in Direction}
_UNLOCKED = [0, 0, 0]
INT64 = np.dtype(np.int64)  # a page array's dtype (hicache.core.pages.pages)
SETTLED_MAX = 65_536  # entries of `TouchedChecks.settled` kept at most (memory stays bounded)


def _op_claim(op: PendingOp | None) -> tuple[int, tuple[int, ...]] | None:
    """(tier index, pages) a pending op claims: its target pages; None for an ended one."""
    return None if op is None else (TARGET[op.direction], tuple(op.target_pages.tolist()))


def _request_claim(r: Request | None) -> tuple[int, tuple[int, ...]] | None:
    """(tier index, pages) a live request claims: its private L1 pages; None for none."""
    return None if r is None or not r.private_pages.size else (0, tuple(r.private_pages.tolist()))


class TouchedChecks:
    """The all-clear over a call's scope, and the claims index it keeps (one per plane)."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.claims: list[dict[int, Holder]] = [{} for _ in TIERS]
        self.held: dict[Holder, tuple[int, ...]] = {}  # record -> the pages it claims
        self.raw_held: dict[Holder, bytes] = {}  # a node's: its value's bytes, as claimed
        # Node id -> its three values' bytes (None: no value) when last seen claiming them:
        # the same bytes again, the node claims what it claimed (`_pages`' fast path).
        self.node_raw: dict[int, tuple[bytes | None, ...]] = {}
        self.where: dict[tuple[str, int], Holder] = {}  # an op's / request's key (its tier)
        # Touched node -> what `_children` read of it when its children last passed (states,
        # pending ops, child count): the same again, they pass again (`_children`).
        self.settled: dict[TreeNode, tuple[object, ...]] = {}
        self.owner_seen = [bytearray(t.owner.tobytes()) for t in cp.tables]  # one byte a page
        self.tree_pages = [0 for _ in TIERS]
        for table in cp.tables:
            if isinstance(table, RunIndexTable):
                table.moved = set()  # the pages each call moves, read by `_pages`
        # The tiers S6 holds in: not a hash-keyed one (spec/tree.md, "Hash-keyed tiers").
        self.closed = [i for i, t in enumerate(TIERS) if t not in cp.lifecycle.hash_keyed_tiers]
        self.holders = LockHolders(cp)  # the holders' locked paths (S7, I5's request clause)

    def clear(
        self,
        node_ids: Collection[int],
        op_ids: Collection[int],
        request_ids: Collection[int],
        moved: list[set[int]],
        path: Iterable[int] = (),
    ) -> bool:
        """Whether no invariant can have broken in the scope of a call that touched these
        nodes (live or removed), ops (pending or ended) and requests (live or ended) and
        moved these pages (per tier index). `path`: nodes whose lock counts alone the call
        may have changed (its request's locked nodes and pins): they and their ancestors
        are checked for S7 only, unless touched. The id collections are read, never
        changed; `moved` is (the pages it names join the claims index's own). After a no,
        `rebuild` before the next call (the index may be half updated)."""
        cp = self.cp
        root = cp.tree.root
        get = cp.tree.nodes_by_id.get
        touched: set[TreeNode] = set()
        gone: list[int] = []
        for i in node_ids:
            n = get(i)
            if n is None:
                gone.append(i)
            elif n is not root:
                touched.add(n)
        scope = touched  # and the ancestors: each one's own are in it already (a copy once
        for n in touched:  # one adds a node)
            p = n.parent
            while p is not None and p.parent is not None and p not in scope:  # to the root's child
                if scope is touched:
                    scope = set(touched)
                scope.add(p)
                p = p.parent
        locked = scope  # and the locked paths: S7 there (a copy once one adds a node)
        for i in path:
            p = get(i)
            while p is not None and p.parent is not None and p not in locked:
                if locked is scope:
                    locked = set(scope)
                locked.add(p)
                p = p.parent
        ops = op_ids  # and the pending ops covering a node there
        for pending in cp.ops.values():
            if pending.op_id not in ops and not locked.isdisjoint(pending.nodes):
                ops = {*ops, pending.op_id}
        requests = request_ids
        if not self._pages(gone, touched, ops, requests, moved):
            return False
        for n in scope:
            if not self._node(n):
                return False
        settled = self.settled
        if gone or len(settled) > SETTLED_MAX:
            settled.clear()  # a removed child may still be linked: read every child again
        for n in touched:
            if not n.children:
                continue
            mark = (n.node_id, *n.state, *n.pending, len(n.children))
            if settled.get(n) == mark:
                continue  # what its children read of it is as when they were last read
            if not self._children(n, scope):
                return False
            settled[n] = mark
        for o in ops:
            if not self._op(o):
                return False
        # A holder's paths, and a request's clause, read its own record and its paths' nodes:
        # the holders the call named or whose paths pass a node it touched are read again.
        reread = self.holders.refresh(node_ids, requests, op_ids)
        return reread is not None and self._requests(reread) and self._locks(locked)

    def rebuild(self) -> None:
        """The claims index and counters from scratch (after `clear` said no)."""
        cp = self.cp
        self.claims = [{} for _ in TIERS]
        self.held, self.where = {}, {}
        self.raw_held.clear()
        self.node_raw.clear()
        self.settled.clear()
        self.holders.rebuild()
        self.owner_seen = [bytearray(t.owner.tobytes()) for t in cp.tables]  # one byte a page
        self.tree_pages = [0 for _ in TIERS]
        for table in cp.tables:
            if isinstance(table, RunIndexTable):
                table.take_moved()  # from the state as it is now
        records = [("node", n.node_id, t) for n in cp.tree.nodes() for t in range(3)]
        records += [("op", o, -1) for o in cp.ops] + [("request", r, -1) for r in cp.requests]
        for kind, i, t in records:
            found = self._current(kind, i, t)
            if found is not None:
                self._claim((kind, i, found[0]), found[1])

    # -- pages ------------------------------------------------------------------------------

    def _current(self, kind: str, i: int, t: int) -> tuple[int, tuple[int, ...]] | None:
        """(tier index, pages) record (kind, i) claims now (a node: in tier t), or None."""
        cp = self.cp
        if kind == "node":
            n = cp.tree.get(i)
            v = None if n is None else n.value[t]
            return None if v is None else (t, tuple(v.tolist()))
        if kind == "op":
            return _op_claim(cp.ops.get(i))
        return _request_claim(cp.requests.get(i))

    def _release(self, key: Holder, dirty: list[set[int]]) -> None:
        self.raw_held.pop(key, None)
        if key[0] == "node":
            self.node_raw.pop(key[1], None)
        old = self.held.pop(key, None)
        if old is None:
            return
        t = key[2]
        claims = self.claims[t]
        for p in old:
            if claims.get(p) == key:
                del claims[p]
        dirty[t].update(old)
        if key[0] == "node":
            self.tree_pages[t] -= len(old)

    def _claim(self, key: Holder, pages: tuple[int, ...]) -> bool:
        """Index `pages` as `key`'s; False (nothing indexed) if one is named twice, out of
        range, or claimed by another record."""
        t = key[2]
        claims, capacity = self.claims[t], self.cp.tables[t].capacity
        if len(set(pages)) != len(pages):
            return False
        for p in pages:
            if p in claims or not 0 <= p < capacity:
                return False
        for p in pages:
            claims[p] = key
        self.held[key] = pages
        if key[0] != "node":
            self.where[(key[0], key[1])] = key
        else:
            self.tree_pages[t] += len(pages)
        return True

    def _pages(
        self,
        gone: list[int],
        touched: Iterable[TreeNode],
        ops: Iterable[int],
        requests: Iterable[int],
        moved: list[set[int]],
    ) -> bool:
        """Re-index the nodes (removed ones: `gone`, live ones: `touched`) and the op and
        request records; every page they claim(ed), and every page `moved` names (the pages
        whose owner code the call changed), must be claimed at most once, by a record whose
        code it carries -- and no other page may have changed its code."""
        dirty = moved
        now: list[tuple[Holder, tuple[int, ...]]] = []
        held, raw_held = self.held, self.raw_held
        for i in gone:  # every old claim first: a page may move between records
            for t in range(3):
                self._release(("node", i, t), dirty)
        node_raw = self.node_raw
        for n in touched:  # a node's key is its tier: (kind, id, t) whatever it holds
            value = n.value
            v0, v1, v2 = value
            raws = (
                None if v0 is None or v0.dtype is not INT64 else v0.tobytes(),
                None if v1 is None or v1.dtype is not INT64 else v1.tobytes(),
                None if v2 is None or v2.dtype is not INT64 else v2.tobytes(),
            )
            if (
                node_raw.get(n.node_id) == raws
                and (v0 is None) == (raws[0] is None)
                and (v1 is None) == (raws[1] is None)
                and (v2 is None) == (raws[2] is None)
            ):
                continue  # the node claims what it claimed, in every tier
            for t in range(3):
                key, v = ("node", n.node_id, t), value[t]
                was = held.get(key)
                if v is None:
                    if was is not None:
                        self._release(key, dirty)
                    continue
                raw = raws[t] or v.tobytes()  # cheaper to compare than the list
                if was is not None and raw_held.get(key) == raw and v.dtype is INT64:
                    continue  # the node claims what it claimed
                listed = tuple(v.tolist())
                if was == listed:
                    raw_held[key] = raw
                    continue  # the node claims what it claimed
                if was is not None:
                    self._release(key, dirty)
                now.append((key, listed))
                raw_held[key] = raw  # its claim, once `now` is indexed (else: a rebuild)
            node_raw[n.node_id] = raws  # (else: a rebuild)
        live_ops, live_requests, where = self.cp.ops, self.cp.requests, self.where
        for o in ops:
            self._record("op", o, _op_claim(live_ops.get(o)), now, dirty)
        for i in requests:
            found = _request_claim(live_requests.get(i))
            if found is not None or ("request", i) in where:  # else: claims none, as before
                self._record("request", i, found, now, dirty)
        for key, pages in now:
            if not self._claim(key, pages):
                return False
            dirty[key[2]].update(pages)
        if self.tree_pages != self.cp.tree.pages_held:  # S3, every tier in one comparison
            return False
        t = 0
        for table in self.cp.tables:
            named = dirty[t]
            if isinstance(table, RunIndexTable):  # its log names every page whose code changed
                logged = table.moved
                assert logged is not None  # Verify: __init__ turned the log on.
                if logged:
                    named |= logged
                    logged.clear()
                owner = table.owner
                size = owner.size
                if size != table.capacity:
                    return False
                if named:  # each carries its claimant's code, or FREE when none claims it
                    claims, codes = self.claims[t], owner.data  # a byte a page, in place
                    for p in named:
                        holder = claims.get(p)
                        if not 0 <= p < size or codes[p] != (
                            FREE if holder is None else CODE[holder[0]]
                        ):
                            return False
            elif not self._scanned(t, table, named):
                return False
            t += 1
        return True

    def _record(
        self,
        kind: str,
        i: int,
        found: tuple[int, tuple[int, ...]] | None,
        now: list[tuple[Holder, tuple[int, ...]]],
        dirty: list[set[int]],
    ) -> None:
        """An op's or a request's claim (`found`: as `_current` reads it): unchanged, or its
        old claim released and the new one queued in `now`."""
        old = self.where.get((kind, i))
        if found is not None and old == (kind, i, found[0]) and self.held.get(old) == found[1]:
            return  # the record claims what it claimed
        if old is not None:
            del self.where[(kind, i)]
            self._release(old, dirty)
        if found is not None:
            now.append(((kind, i, found[0]), found[1]))

    def _scanned(self, t: int, table: PageTable, dirty: set[int]) -> bool:
        """For a table that keeps no log: the pages of `dirty` checked as `_pages` checks a
        logged table's, and every other page's code compared with its copy from the last
        call."""
        owner, seen = table.owner, self.owner_seen[t]
        if owner.size != table.capacity:
            return False
        codes = owner.tobytes()  # the owner codes (uint8: a byte a page), read once
        if not dirty:
            return codes == seen  # else a code changed that no record and no event names
        claims, size = self.claims[t], owner.size
        for p in dirty:
            holder = claims.get(p)
            if not 0 <= p < size or codes[p] != (FREE if holder is None else CODE[holder[0]]):
                return False
            seen[p] = codes[p]
        return codes == seen

    # -- nodes, ops, requests ---------------------------------------------------------------

    def _node(self, n: TreeNode) -> bool:
        """S1, S2, S4, I3, I5 (node clause) and S6 for one live node."""
        cp = self.cp
        ps = cp.page_size
        parent = n.parent
        live = cp.tree.nodes_by_id.get
        if (
            parent is None
            or live(n.node_id) is not n
            or parent.children.get(n.key[:ps]) is not n
            or (parent.parent is not None and live(parent.node_id) is not parent)
        ):
            return False
        for c in n.children.values():
            if c.parent is not n:
                return False
        state, lock, pending, value = n.state, n.lock, n.pending, n.value
        if (
            not n.children
            and state.count(ABSENT) == 3
            and lock == _UNLOCKED
            and pending.count(None) == 3
            and all(v is None for v in value)
        ):
            return False  # dead, yet in the tree (S2)
        pages = len(n.key) // ps
        if len(n.key) % ps:
            return False
        # Per tier: a pending op filling it here, else a value exactly when RESIDENT; and
        # S6 where it holds or fills the tier (a parent below the root present there, or
        # filled by the same op).
        below = parent.parent is not None
        up, up_pending, closed, ops = parent.state, parent.pending, self.closed, cp.ops
        for t in range(3):
            v, st, op_id = value[t], state[t], pending[t]
            if lock[t] < 0 or (v is not None and v.size != pages):
                return False
            if op_id is not None:
                op = ops.get(op_id)
                if (
                    st == RESIDENT
                    or v is not None
                    or op is None
                    or TARGET[op.direction] != t
                    or n not in op.nodes
                ):
                    return False
                if below and up[t] != RESIDENT and t in closed and up_pending[t] != op_id:
                    return False
            elif v is not None:
                if st != RESIDENT or (below and up[t] != RESIDENT and t in closed):
                    return False
            elif st == RESIDENT:
                return False
        return True

    def _children(self, n: TreeNode, scope: set[TreeNode]) -> bool:
        """S1, S2 (in the tree) and S6 between touched node `n` and each child of it outside
        `scope`. Such a child's own records are as the last checks left them (a change to one
        is an event naming it), and its locks change only with a holder at or below it (which
        puts it in `scope`, an ancestor of a touched node): what can break is what reads `n`,
        the child's entry in `n.children` and `n` present in each tier the child holds or is
        filling. The same clauses as `_node`'s on the child; the rest of them cannot fail.
        So when `n`'s states, pending ops and child count are what they were when its
        children last passed, and no node was removed (a removed child still linked), they
        pass again: `clear` skips the call then (`settled`), which keeps a call on a node
        with many children at the cost of the children it names."""
        live, ps = self.cp.tree.nodes_by_id.get, self.cp.page_size
        up, up_pending = n.state, n.pending
        loose = []  # where S6 can fail (a loop: a list comprehension is a call of its own)
        for t in self.closed:
            if up[t] != RESIDENT:
                loose.append(t)
        for key, c in n.children.items():
            if c in scope:
                continue  # checked whole by `_node`
            if live(c.node_id) is not c or c.key[:ps] != key:
                return False
            state, pending = c.state, c.pending
            for t in loose:
                op_id = pending[t]
                if (op_id is not None or state[t] == RESIDENT) and (
                    op_id is None or up_pending[t] != op_id
                ):
                    return False
        return True

    def _op(self, op_id: int) -> bool:
        """I2, I5 (op clause) and I3 for one pending op (an ended one: nothing)."""
        cp = self.cp
        op = cp.ops.get(op_id)
        if op is None:
            return True
        ps = cp.page_size
        if not op.nodes:
            return False
        src, dst = SOURCE[op.direction], TARGET[op.direction]
        start, end = op.token_range
        want = (end - start) // ps
        source_pages, target_pages = op.source_pages.tolist(), op.target_pages.tolist()
        if start % ps or end % ps or len(source_pages) != want or len(target_pages) != want:
            return False
        read: list[int] = []
        for n in op.nodes:
            v = n.value[src]
            if (
                not cp.tree.contains(n)
                or n.lock[src] <= 0
                or n.state[src] != RESIDENT
                or n.pending[dst] != op_id
                or v is None
            ):
                return False
            read += v.tolist()
        if read != source_pages:
            return False
        source, target = cp.tables[src].owner, cp.tables[dst].owner
        codes, size = source.data, source.size  # one byte a page, read in place
        for p in source_pages:
            if not 0 <= p < size or codes[p] != TREE:
                return False
        codes, size = target.data, target.size
        for p in target_pages:
            if not 0 <= p < size or codes[p] == TREE:
                return False
        return True

    def _requests(self, ids: Iterable[int]) -> bool:
        """I5's request clause for the live requests of `ids`."""
        live = self.cp.requests
        tree = self.cp.tree
        root, get = tree.root, tree.nodes_by_id.get
        for i in ids:
            r = live.get(i)
            if r is None:
                continue
            tokens = 0
            n: TreeNode | None = r.locked
            if n is not root and get(r.locked.node_id) is not n:  # tree.contains, inline
                return False
            while n is not None and n.node_id != ROOT_ID:  # not n.is_root
                if n.state[0] != RESIDENT:
                    return False
                tokens += len(n.key)
                n = n.parent
            if r.cached_len > tokens:
                return False
        return True

    def _locks(self, scope: set[TreeNode]) -> bool:
        """S7 on the scope: each lock count equals the path locks its holders record on the
        node or below it (requests' prefix locks and pins, ops' source locks), as
        `LockHolders` keeps them (its `refresh` checked each re-read holder's node is in
        the tree)."""
        expected = self.holders.expected
        for n in scope:
            lock, want = n.lock, expected.get(n.node_id, _UNLOCKED)
            if lock[0] != want[0] or lock[1] != want[1] or lock[2] != want[2]:
                return False
        return True
