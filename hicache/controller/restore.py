"""Restore staging: a request's planned restore, from pins to ops to what `prefill` may use.

Contract (spec/restore.md, "Stages of a restore", "Locks a restore holds", "Sharing a
load-back", "A request that ends with ops in flight"):

- `start` pins the plan before any op is issued (shared and L2 parts in L2, the L3 part in
  L3; R37), then issues the L2 part's H2D and the L3 part's S2H -- unless the plan begins with a
  node another request's load-back is filling (`shared`): then it waits for that op and issues
  its own parts once it ended (`advance`; R39).
- Every completed stage pins what it filled in the tier it filled (an H2D: in L1), in the same
  step that publishes it, so a restored page is never an unlocked leaf before `prefill`; a
  shared op's completion pins it in L1 for every waiting request too.
- A part whose op fails, or that cannot be issued, is dropped: its pins go, its tokens are
  recomputed, one fallback is counted by reason. An S2H that stopped part way (its handle
  reports what each pool landed) keeps the whole nodes of its clamp (`kept`, clamp.py) as
  the L3 part, which is loaded back as after a completed S2H; the rest is recomputed, one
  fallback `prefetch_clamped`. A cancel (only when the request ends) is not
  a fallback. A waiter whose shared op failed or was cancelled loads those nodes itself.
- `deepest_in_l1` is what `prefill` may serve: the last planned node of the leading run that
  L1 holds; every pin is released by the controller once `cached_len` covers it, and
  `served` then counts the hits, verifies the restored pages and keeps or drops promotions.

The stager never reads node fields: every question goes to the control plane's queries.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from hicache.controller.l3health import L3Health
from hicache.controller.materialize import Materialization, Plan
from hicache.controller.metrics import Metrics
from hicache.controller.verify import RestoreVerifier
from hicache.core.control import ControlPlane
from hicache.core.records import PendingOp
from hicache.core.tiers import Direction, Tier
from hicache.core.tree import TreeNode
from hicache.dataplane.handles import TransferStatus
from hicache.errors import IllegalTransition, OutOfPages, StorageError, TransferError

Issue = Callable[[Direction, list[TreeNode], int], PendingOp]  # make room, reserve, start


class RestoreStager:
    def __init__(
        self,
        cp: ControlPlane,
        metrics: Metrics,
        l3: L3Health,
        verifier: RestoreVerifier | None,
        promotion: bool,
        *,
        share: bool = True,
    ) -> None:
        """`l3`: told when a dropped part let go of its pins (an offline L3's copies may go).
        The stager holds no transfers: `start` and `advance` issue through the `issue` they
        are given (`Transfers.issue`), which tells the stager each op's end (`settled`)."""
        self.cp = cp
        # A plan that meets another request's pending load-back: wait for it (True), or back
        # off and recompute everything past the L1 hit (False, SGLang's graft guard 3).
        self.share = share
        self.verifier = verifier  # None: restored pages are not compared (CacheConfig.verify)
        self.promotion = promotion  # False: an L3 restore's promoted L2 copies are dropped
        self.metrics = metrics
        self.l3 = l3
        self.restores: dict[int, Materialization] = {}  # request id -> its restore
        self.owner: dict[int, Materialization] = {}  # op id -> the restore that issued it
        self.waiters: dict[int, list[Materialization]] = {}  # op id -> restores sharing it
        # Called with (restore, part, reason) as a part is dropped, before its pins go: what
        # a probe judges a fallback by (hicache/testing/liveness/restores.py).
        self.on_drop: list[Callable[[Materialization, list[TreeNode], str], None]] = []

    # -- stages -----------------------------------------------------------------------------

    def start(self, mat: Materialization, plan: Plan, issue: Issue) -> None:
        """Pin the plan, then issue it through `issue`, or wait for the load-back it shares
        (or, when not sharing, back off: nothing pinned or issued, one fallback
        `load_back_pending`)."""
        if plan.shared and not self.share:
            self.metrics.fallback("load_back_pending")  # graft guard 3: the tokens are recomputed
            return
        mat.shared, mat.l2_part, mat.l3_part = (
            list(plan.shared),
            list(plan.l2_part),
            list(plan.l3_part),
        )
        head = mat.shared + mat.l2_part
        if head:
            self.cp.pin(mat.request_id, head[-1], Tier.L2)
        if mat.l3_part:
            self.cp.pin(mat.request_id, mat.l3_part[-1], Tier.L3)
        if mat.shared:
            self._await(mat, mat.shared[0])
            mat.deferred = bool(mat.l2_part or mat.l3_part)
            return
        self._issue_parts(mat, issue)

    def advance(self, issue: Issue) -> None:
        """Per tick, after completions were applied: issue (through `issue`) what a restore
        may issue now."""
        for mat in self.restores.values():
            if mat.deferred and not mat.awaited:
                self._resume(mat, issue)
            if mat.needs_l3_h2d:
                self._issue_l3_h2d(mat, issue)
            if mat.done and mat.ready_at is None:
                mat.ready_at = time.perf_counter()

    def settled(self, op: PendingOp, status: TransferStatus, kept: int | None = None) -> None:
        """Op `op` ended with `status` (the control plane already applied it). `kept`: an S2H
        that stopped part way, of which the control plane published that many leading
        nodes (None: no per-pool report, the usual all-or-nothing end)."""
        ok = status is TransferStatus.DONE
        for waiter in self.waiters.pop(op.op_id, []):
            waiter.awaited.discard(op.op_id)
            deepest = self.cp.leading_run(waiter.shared, Tier.L1)
            if ok and deepest is not None:
                self.cp.pin(waiter.request_id, deepest, Tier.L1)
                waiter.landed_pages += sum(
                    n.num_pages for n in self._through(waiter.shared, deepest)
                )
            elif not waiter.deferred:
                waiter.deferred = True  # load the shared nodes itself (`_resume`)
        mat = self.owner.pop(op.op_id, None)
        if mat is not None and kept is not None:
            self._settle_clamped(mat, op, kept)
        elif mat is not None:
            self._settle_own(mat, op, status)

    def forget(self, mat: Materialization) -> None:
        """The request ends: stop waiting for shared ops (its own ops are cancelled by the
        controller, which applies them through `settled`)."""
        for op_id in mat.awaited:
            waiting = self.waiters.get(op_id, [])
            if mat in waiting:
                waiting.remove(mat)
        mat.awaited.clear()

    def abandon(self, mat: Materialization) -> None:
        """The request keeps going without its restore (`cancel_restore`, after its own ops
        were cancelled and it stopped waiting for shared ones): nothing more is issued, and
        the pins on nodes L1 does not hold go now (those that landed stay until `prefill`)."""
        mat.deferred, mat.failed = False, True
        pinned = {id(n): n for n, _ in self.cp.requests[mat.request_id].pins}
        for node in pinned.values():
            if not self.cp.holds(node, Tier.L1):
                self.cp.unpin(mat.request_id, node)

    def served(self, mat: Materialization, start: int, end: int) -> None:
        """`prefill` served tokens `[start, end)` from the restore: count the hits by tier,
        verify the restored pages against recomputation, keep or drop the promotions."""
        self.metrics.restores += 1
        in_l1 = [n for n in mat.shared + mat.l2_part if self.cp.holds(n, Tier.L1)]
        from_l2 = sum(len(n.key) for n in in_l1)
        self.metrics.hit_tokens["L2"] += min(from_l2, end - start)
        self.metrics.hit_tokens["L3"] += max(0, end - start - from_l2)
        self.metrics.shared_load_back_pages += sum(n.num_pages for n in mat.shared if n in in_l1)
        if self.verifier is not None:
            pages = self.cp.prefix_pages(self.cp.prefix_node(mat.request_id), Tier.L1)
            ps = self.cp.page_size
            self.metrics.verified_pages += self.verifier.verify(
                mat.tokens, start, end, pages[start // ps :]
            )
        promoted = [n for n in mat.l3_part if self.cp.holds(n, Tier.L1)]
        if self.promotion:
            self.metrics.promoted_pages += sum(n.num_pages for n in promoted)
            return
        # R42: without promotion, give the L2 copies up leaf-first (each a leaf in L2 then).
        for node in reversed(promoted):
            if node not in self.cp.candidates(Tier.L2):
                break  # locked by another reader, or not a leaf any more: keep it
            self.cp.evict_node(node, Tier.L2)

    def deepest_in_l1(self, mat: Materialization) -> TreeNode | None:
        """The last planned node of the leading run L1 holds at whose end an L1 hit may end
        (what `prefill` may serve: a node another request loaded may have lost its window
        since, spec/pools.md "Freed windows")."""
        return self.cp.servable_in_l1(mat.nodes)

    # -- internals --------------------------------------------------------------------------

    def _await(self, mat: Materialization, node: TreeNode) -> None:
        op_id = self.cp.filling_op(node, Tier.L1)
        assert op_id is not None, "a shared node is H2D_PENDING in L1, so an op fills it"
        mat.awaited.add(op_id)
        self.waiters.setdefault(op_id, []).append(mat)

    def _resume(self, mat: Materialization, issue: Issue) -> None:
        """The shared op ended: what it filled is pinned; the nodes it did not fill (it failed
        or was cancelled) join this request's L2 part, loaded by this request."""
        mat.deferred = False
        head = self._refresh(mat.shared + mat.l2_part, mat.match.lengths[0])
        landed = self.cp.leading_run(head, Tier.L1)
        at = 0 if landed is None else head.index(landed) + 1
        mat.shared, mat.l2_part = head[:at], head[at:]
        mat.l3_part = self._refresh(
            mat.l3_part, self.cp.tree.prefix_tokens(head[-1]) if head else mat.match.lengths[0]
        )
        if mat.l2_part and self.cp.residency(mat.l2_part[0], Tier.L1) == "H2D_PENDING":
            mat.shared += mat.l2_part  # yet another request's load-back fills it now: wait again
            mat.l2_part = []
            self._await(mat, mat.shared[at])
            mat.deferred = True
            return
        self._issue_parts(mat, issue)

    def _refresh(self, part: list[TreeNode], start: int) -> list[TreeNode]:
        """`part` (planned to begin at token `start`) as the tree has it now: a split since
        planning inserted upper nodes, and split boundaries never move a part's start."""
        if not part:
            return part
        path = reversed(self.cp.tree.path_to_root(part[-1]))
        return [n for n in path if self.cp.tree.prefix_tokens(n) > start]

    def _issue_parts(self, mat: Materialization, issue: Issue) -> None:
        for part, direction in ((mat.l2_part, Direction.H2D), (mat.l3_part, Direction.S2H)):
            if not part:
                continue
            if direction is Direction.S2H and not self._backed_up_above(part[0]):
                # R42, graft guard 2 (SGLang's host_insert_dropped): no L2-only suffix under a
                # node L2 lacks. Refused before anything is reserved; the tokens are recomputed.
                self._drop_part(mat, mat.l3_part, "dropped")
                mat.l3_part = []
                continue
            try:
                op = issue(direction, part, mat.request_id)
            except (OutOfPages, IllegalTransition, StorageError, TransferError) as e:
                reason = (
                    "l3_offline"
                    if isinstance(e, StorageError)
                    else "transfer_failed"
                    if isinstance(e, TransferError)
                    else "no_room"
                )
                if direction is Direction.S2H:
                    self._drop_part(mat, mat.l3_part, reason)
                    mat.l3_part = []  # no promotion: those tokens are recomputed
                    continue
                if mat.l3_part:  # never promoted: its chain's parent will not reach L1
                    self._drop_part(mat, mat.l3_part, "restore_gap")
                self._drop_part(mat, mat.l2_part, reason)
                mat.l2_part, mat.l3_part = [], []
                return
            mat.ops.add(op.op_id)
            self.owner[op.op_id] = mat

    def _issue_l3_h2d(self, mat: Materialization, issue: Issue) -> None:
        """Second step of an L3 restore: once promoted, load back -- but only after the L2
        part is in L1, so the chain's parent holds L1 (no gap, S6)."""
        if mat.ops:
            return  # the promotion is done; what is still in flight is the L2 part's load-back
        mat.l3_h2d_issued = True
        parent = mat.l3_part[0].parent
        assert parent is not None, "a pinned node is live, and a live node has a parent"
        if not self.cp.holds(parent, Tier.L1):
            # The L2 part did not arrive: the promoted pages stay in L2, the tokens are recomputed.
            self._drop_part(mat, mat.l3_part, "restore_gap")
            return
        try:
            op = issue(Direction.H2D, mat.l3_part, mat.request_id)
        except (OutOfPages, IllegalTransition, TransferError) as e:
            mat.failed = True
            self._drop_part(
                mat, mat.l3_part, "transfer_failed" if isinstance(e, TransferError) else "no_room"
            )
            return
        mat.ops.add(op.op_id)
        self.owner[op.op_id] = mat

    def _settle_own(self, mat: Materialization, op: PendingOp, status: TransferStatus) -> None:
        """A stage of this request's restore ended: pin what landed, or drop the part."""
        ok = status is TransferStatus.DONE
        mat.ops.discard(op.op_id)
        # A split while in flight adds nodes to the op: the op's chain is the truth.
        if op.direction is Direction.S2H:
            mat.s2h_done = ok
            mat.l3_part = list(op.nodes)
        elif mat.l3_part and op.nodes[-1] is mat.l3_part[-1]:
            mat.l3_part = list(op.nodes)
        else:
            mat.l2_part = list(op.nodes)
        if ok:
            self.cp.pin(mat.request_id, op.nodes[-1], op.direction.target)
            if op.direction is Direction.H2D:
                mat.landed_pages += int(op.target_pages.size)
            return
        mat.failed = True
        if status is TransferStatus.CANCELLED:
            self.cp.unpin(mat.request_id, op.nodes[-1])
        else:
            self._drop_part(mat, list(op.nodes), "transfer_failed")

    def _settle_clamped(self, mat: Materialization, op: PendingOp, kept: int) -> None:
        """This restore's S2H stopped part way and its first `kept` nodes were published in
        L2: they become the L3 part (pinned in L2, loaded back next), the rest is dropped
        (its L3 pin goes, its tokens are recomputed), one fallback `prefetch_clamped`.

        `kept` == 0 leaves the plan as a failed S2H does (`_settle_own`): across ranks the
        one that read part way and the one that cancelled settle the same agreed end, and
        the plan a prefill serves from (C1c, without a collective) must be equal (I7)."""
        mat.ops.discard(op.op_id)
        if kept:
            mat.l3_part = list(op.nodes[:kept])
            mat.s2h_done = True
            self.cp.pin(mat.request_id, op.nodes[kept - 1], Tier.L2)
        else:
            mat.l3_part = list(op.nodes)
            mat.failed = True
        self._drop_part(mat, list(op.nodes), "prefetch_clamped")

    def _drop_part(self, mat: Materialization, part: list[TreeNode], reason: str) -> None:
        """A part cannot proceed: release its pins (R37), count one fallback by `reason` (R41);
        its tokens are recomputed."""
        for hook in self.on_drop:
            hook(mat, part, reason)
        if part:
            self.cp.unpin(mat.request_id, part[-1])
        self.metrics.fallback(reason)
        if not self.l3.online:
            self.l3.drop_unread()  # what the part held in L3 is free to go now

    def _backed_up_above(self, node: TreeNode) -> bool:
        """Whether `node`'s parent is the root or holds L2: where an L3 part may be grafted
        into L2 (the `parent(L2) == RESIDENT` guard of `s2h_issue`, asked before the issue)."""
        parent = node.parent
        assert parent is not None, "a planned node is live, and a live node has a parent"
        return parent.is_root or self.cp.holds(parent, Tier.L2)

    @staticmethod
    def _through(nodes: list[TreeNode], last: TreeNode) -> list[TreeNode]:
        return nodes[: nodes.index(last) + 1] if last in nodes else []
