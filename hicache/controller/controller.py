"""CacheController: the control plane, a data plane, a policy and a KV producer, joined.

    admit(rid, tokens)   match -> policy -> issue restores (pending materialization)
    tick()               observe completions: publish or fall back; continue restores/backups
    ready(rid)           whether the request's restore has settled (decode may run meanwhile)
    prefill(rid)         advance cached_len over what arrived, recompute the rest, insert,
                         queue the backup chain (write policy)
    finish(rid)          cancel what is still pending for it, release, unlock
    close()              cancel everything, drain, close the data plane

Every step goes through `ControlPlane` (a spec transition, invariants checked per the check
mode). Pressure in a tier evicts that tier's LRU leaves, never locked or in-flight nodes.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np
import torch

from hicache.control import ControlPlane, PendingOp, UnknownRequest
from hicache.controller.backup import BackupChain, chain_lacking
from hicache.controller.config import CacheConfig
from hicache.controller.digests import CachedDigests
from hicache.controller.materialize import Materialization, plan_parts
from hicache.controller.metrics import Metrics
from hicache.dataplane.faults import FaultInjector
from hicache.dataplane.handles import TransferHandle, TransferStatus
from hicache.errors import (
    CorruptSlot, HiCacheError, IllegalTransition, OutOfPages, RequestTooLarge, RestorePending,
    StorageError, TransferError, UnreadableSlot,
)
from hicache.pages import Pages
from hicache.kernels import gather
from hicache.lifecycle import ABSENT, RESIDENT
from hicache.policy import CostModel, DecisionLog, make_policy
from hicache.producers import KVProducer, SyntheticProducer
from hicache.tiers import TIERS, Direction, Tier
from hicache.trace import Tracer
from hicache.tree import TreeNode


class RestoreMismatch(HiCacheError):
    """A restored page's bytes differ from what recomputation writes: a real bug (B15)."""


class CacheController:
    def __init__(self, config: CacheConfig, producer: KVProducer | None = None, *,
                 faults: FaultInjector | None = None, tracer: Tracer | None = None) -> None:
        from hicache.dataplane.engine import TransferEngine  # torch-heavy; only here

        self.config = config
        g = config.kv
        self.engine = TransferEngine(
            g, config.l1_pages, config.l2_pages, config.l3_slots, device=config.device,
            l3_path=config.l3_path, backend=config.backend, io_threads=config.io_threads, faults=faults,
            l3_overwrite=config.l3_overwrite,
        )
        self.cp = ControlPlane(
            g.page_size, (config.l1_pages, config.l2_pages, config.l3_slots),
            check_mode=config.check_mode, tracer=tracer,
        )
        self.cp.digests = CachedDigests(self.engine.digests, self.cp.tables)
        self.producer: KVProducer = producer or SyntheticProducer(g, device=self.engine.device)
        self.model = CostModel()
        self.policy = make_policy(config.policy, self.model)
        self.decisions = DecisionLog()
        self.metrics = Metrics()
        self.handles: dict[int, TransferHandle] = {}
        self.owner: dict[int, Materialization] = {}  # restore op id -> its materialization
        self.restores: dict[int, Materialization] = {}
        self.backups = BackupChain(self)
        self._observed: set[Direction] = set()  # directions whose warm-up transfer was seen
        self.l3_offline_reason: str | None = None  # set once the L3 file is lost (for good)

    # -- requests ---------------------------------------------------------------------------

    def admit(self, request_id: int, tokens: Sequence[int]) -> Materialization:
        """Match, decide, pin the planned nodes and issue the restore the policy chose (it then
        proceeds on ticks; with `prefetch=False` this call blocks until it settles).

        Raises, with nothing changed: `RequestTooLarge` (the prompt needs more pages than L1
        has), `HiCacheError` (the request id is already live). A restore that cannot be
        issued (no room, L3 offline) is not an error: its tokens are recomputed and the
        fallback is counted by reason."""
        g = self.config.kv
        pages_needed = -(-len(tokens) // g.page_size)
        if pages_needed > self.config.l1_pages:
            raise RequestTooLarge(request_id, len(tokens), pages_needed, self.config.l1_pages)
        # The last prompt token is always computed (it yields the first output's logits), so
        # a hit may cover at most len - 1 tokens (the second write-up's insert guard).
        m = self.cp.begin_request(request_id, tokens, match_len=len(tokens) - 1)
        aligned = len(tokens) // g.page_size * g.page_size
        l1, l2, l3 = m.lengths
        if not self.l3_online:
            l3 = l2  # an offline L3 serves nothing (what it still holds is being dropped)
        decision = self.policy.decide(l1, l2, l3, max(aligned, 1), g.bytes_per_token)
        mat = Materialization(request_id, tuple(tokens), decision, self.decisions.record(decision), m)
        self.restores[request_id] = mat
        self.metrics.prompt_tokens += len(tokens)
        self.metrics.hit_tokens["L1"] += l1
        self.metrics.decisions[decision.choice] += 1
        if decision.choice == "recompute" and decision.extension_tokens:
            self.metrics.policy_skips += 1
        self.backups.after_match(m.handles[0])
        if decision.choice != "recompute":
            target = l1 + decision.extension_tokens[decision.choice]
            mat.l2_part, mat.l3_part = plan_parts(m, decision.choice, target)
            self._pin_planned(mat)
            self._issue_restore(mat)
        if not self.config.prefetch:
            while not mat.done:
                for op_id in list(mat.ops):
                    self.handles[op_id].wait()
                self.tick()
        return mat

    def ready(self, request_id: int) -> bool:
        """Whether the request's restore has settled (`prefill` may run). UnknownRequest for
        an id that is not live."""
        return self._restore(request_id).done

    def wait(self, request_id: int, timeout_s: float = 0.05) -> None:
        """Block (GIL released) until one of the request's transfers finishes or `timeout_s`
        passes. Spinning on `tick` instead starves the L3 I/O threads of the GIL."""
        for op_id in self._restore(request_id).ops:
            self.handles[op_id].wait(timeout_s)
            return

    def prefill(self, request_id: int) -> int:
        """Use what the restore delivered, recompute the rest of the page-aligned prompt,
        insert it, and queue its backup. Returns the tokens recomputed.

        Check, then change: `UnknownRequest` (not admitted, or finished), `RestorePending`
        (tick until `ready`), and `OutOfPages` (L1 cannot hold the pages to compute, because
        other requests hold it locked) are raised before the request changes -- its
        `cached_len` and the restore counters move once, on the call that succeeds. Trying
        to make room may evict unlocked cached pages (cache maintenance, not request state)."""
        mat = self._restore(request_id)
        if not mat.done:
            raise RestorePending(request_id)
        req = self.cp.requests[request_id]
        deepest = self._deepest_in_l1(mat)
        g = self.config.kv
        start = self.cp.tree.prefix_tokens(deepest) if deepest is not None else req.cached_len
        # Compute through the prompt's last token: whole pages are inserted, a partial last
        # page (the tail) is computed into a private page that is never published.
        end = -(-len(mat.tokens) // g.page_size) * g.page_size
        todo = end - start
        if todo > 0:
            # The restored nodes are pinned in L1 (and the prefix locked), so this evicts
            # only what nobody holds.
            self._make_room(0, todo // g.page_size)
            free = self.cp.tables[0].free_count
            if free < todo // g.page_size:
                raise OutOfPages("L1", todo // g.page_size, free)
        # -- change (nothing below can run out of L1 pages) --
        restored_from = req.cached_len
        if deepest is not None:
            self.cp.advance_cached_len(request_id, deepest)
        self.cp.unpin(request_id)  # the request's own lock now covers what it uses
        if deepest is not None:
            self._after_restore(mat, restored_from, req.cached_len)
        recomputed = max(0, len(mat.tokens) - req.cached_len)
        started = time.perf_counter()
        if todo > 0:
            new_pages = self.cp.compute(request_id, todo)
            prefix = self._l1_prefix_pages(req.locked)
            padded = tuple(mat.tokens) + (0,) * (end - len(mat.tokens))
            seconds = self.producer.produce(padded, req.cached_len, end, self.engine.l1.tensor,
                                            prefix, new_pages)
            self.model.observe("recompute", todo, seconds)
            self.cp.insert(request_id)
            self.backups.after_insert(req.locked)
        self.metrics.recomputed_tokens += recomputed
        observed = (mat.ready_at or started) - mat.started_at + (time.perf_counter() - started)
        if observed > 0:
            self.decisions.settle(mat.decision_id, observed)
        return recomputed

    def finish(self, request_id: int) -> None:
        """End a request, finished or aborted: cancel its pending restores, release what it
        holds (private pages, restore pins, its prefix lock). Nothing it owned stays behind
        (B03). UnknownRequest for an id that is not live."""
        mat = self.restores.pop(request_id, None)
        if mat is not None:
            for op_id in sorted(mat.ops):
                self.handles[op_id].cancel()
                self._settle(op_id)
        self.cp.end_request(request_id)

    # -- progress ---------------------------------------------------------------------------

    def tick(self) -> None:
        """Observe every transfer once; apply what completed; continue restores and backups.
        Transfer failures become fallbacks or dropped backups (counted), an unusable L3 file
        takes L3 offline: nothing is raised in normal operation (spec/restore.md)."""
        for op_id in list(self.handles):
            if op_id in self.handles and self.handles[op_id].poll().final:
                self._settle(op_id)
        for mat in self.restores.values():
            if mat.needs_l3_h2d:
                self._issue_l3_h2d(mat)
            if mat.done and mat.ready_at is None:
                mat.ready_at = time.perf_counter()
        self.backups.tick()
        if not self.l3_online:
            self._drop_l3_copies()  # copies that in-flight readers held are dropped once free

    def drain(self, timeout_s: float = 60.0) -> None:
        """Wait for every transfer (backups included) and apply it. TransferError if some are
        still pending after `timeout_s` seconds."""
        deadline = time.perf_counter() + timeout_s
        while self.handles or any(self.backups.wanted.values()):
            for h in list(self.handles.values()):
                h.wait(max(0.0, deadline - time.perf_counter()))
            self.tick()
            if time.perf_counter() > deadline:
                raise TransferError(f"drain: {len(self.handles)} transfer(s) still pending after {timeout_s} s")
            if not self.handles:
                break

    def close(self) -> None:
        """Cancel everything in flight, end every request, close the data plane. Raises
        nothing in normal operation."""
        for rid in list(self.cp.requests):
            self.finish(rid)
        for op_id in list(self.handles):
            self.handles[op_id].cancel()
            self._settle(op_id)
        self.engine.close()
        # The control plane and its tree reference each other (split callbacks); without this
        # the cycle would hold the engine's pools until the garbage collector runs.
        self.cp.digests = None

    # -- transfers --------------------------------------------------------------------------

    def issue(self, direction: Direction, chain: list[TreeNode], request_id: int | None = None) -> PendingOp:
        """Reserve (evicting in the target tier if needed), lock, and start one transfer.

        Raises, with the control plane unchanged: `OutOfPages` (no room even after eviction),
        `IllegalTransition` (a guard fails, or a node was removed from the tree), and
        `StorageError` for an L3 transfer when the L3 file is lost (L3 is then offline)."""
        if not self.l3_online and Tier.L3 in (direction.source, direction.target):
            raise StorageError(self.engine.l3.path, f"L3 is offline: {self.l3_offline_reason}")
        dst = TIERS.index(direction.target)
        parent = chain[0].parent
        assert parent is not None, "the root is never transferred"
        # Keep the chain's parent: evicting it would open a backup gap under the chain.
        self._make_room(dst, sum(n.num_pages for n in chain), keep=[parent, *chain])
        op = self.cp.issue(direction, chain, request_id)
        try:
            handle = getattr(self.engine, direction.value.lower())(op.source_pages, op.target_pages)
        except HiCacheError as e:
            self.cp.fail(op.op_id)
            if isinstance(e, StorageError):
                self._take_l3_offline(e)
            raise
        self.handles[op.op_id] = handle
        return op

    def _settle(self, op_id: int) -> None:
        """Apply one observed final status to the control plane (publish or release)."""
        handle = self.handles.pop(op_id)
        op = self.cp.ops[op_id]
        status = handle.status
        ok = status is TransferStatus.DONE
        self.metrics.transfer(op.direction, handle.nbytes, ok, handle.timings)
        mat = self.owner.pop(op_id, None)
        if ok:
            self.cp.complete(op_id)
            self._sample(op.direction, handle)
            if op.direction is Direction.D2H:
                self.backups.after_d2h(op.nodes[-1])
        elif status is TransferStatus.CANCELLED:
            self.cp.cancel(op_id)
        else:
            self.cp.fail(op_id)
        if mat is not None:
            self._settle_restore(mat, op, status)
        elif not ok and op.direction in (Direction.D2H, Direction.H2S):
            self.metrics.drop("backup_failed", sum(len(n.key) for n in op.nodes))
        if isinstance(handle.error, (CorruptSlot, UnreadableSlot)):
            reason = "corrupt" if isinstance(handle.error, CorruptSlot) else "unreadable"
            for slot in handle.error.slots:  # after the restore let go of its pins
                self._invalidate_slot(op, slot, reason)

    def _sample(self, direction: Direction, handle: TransferHandle) -> None:
        """Feed a completed transfer's time to the cost model.

        The write-up's sample: enqueue + queue wait + service, not one-time workspace setup,
        and not how late this loop happened to poll. The first transfer of each direction
        also pays one-time costs the handle cannot separate (kernel JIT for the real shapes,
        first touch): it is a warm-up, not a sample."""
        t = handle.timings
        steady = t.enqueue_s + t.queue_wait_s + t.service_s - t.workspace_setup_s
        first = direction not in self._observed
        self._observed.add(direction)
        if steady > 0 and not first:
            self.model.observe(direction, handle.nbytes, steady)

    def _settle_restore(self, mat: Materialization, op: PendingOp, status: TransferStatus) -> None:
        """A restore stage ended: pin what landed, or drop the part (its tokens recomputed;
        a failure is a counted fallback, a cancel -- the request is ending -- is not)."""
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
            self._pin_landed(mat, op)
            return
        mat.failed = True
        if status is TransferStatus.CANCELLED:
            self.cp.unpin(mat.request_id, op.nodes[-1])
        else:
            self._drop_part(mat, list(op.nodes), "transfer_failed")

    def _pin_planned(self, mat: Materialization) -> None:
        """Pin the restore's planned chains in the tier each is read from, before anything is
        issued: a nested make-room (an L1 eviction that backs a victim up under write_back
        evicts in L2) must not evict or remove them. Each stage pins the next tier as its
        data lands (`_pin_landed`); `prefill` (or the request's end) releases every pin."""
        rid = mat.request_id
        if mat.l2_part:
            self.cp.pin(rid, mat.l2_part[-1], 1)
        if mat.l3_part:
            self.cp.pin(rid, mat.l3_part[-1], 2)

    def _pin_landed(self, mat: Materialization, op: PendingOp) -> None:
        """A restore stage completed: pin what it filled in the tier it filled, so that the
        next stage (or `prefill`) finds it there."""
        self.cp.pin(mat.request_id, op.nodes[-1], TIERS.index(op.direction.target))

    def _drop_part(self, mat: Materialization, part: list[TreeNode], reason: str) -> None:
        """A restore part cannot proceed: release its pins and count one fallback by
        `reason`; its tokens are recomputed."""
        if part:
            self.cp.unpin(mat.request_id, part[-1])
        self.metrics.fallback(reason)
        if not self.l3_online:
            self._drop_l3_copies()  # what the part held in L3 is free to go now

    def _issue_restore(self, mat: Materialization) -> None:
        for part, direction in ((mat.l2_part, Direction.H2D), (mat.l3_part, Direction.S2H)):
            if not part:
                continue
            try:
                op = self.issue(direction, part, mat.request_id)
            except (OutOfPages, IllegalTransition, StorageError) as e:
                reason = "l3_offline" if isinstance(e, StorageError) else "no_room"
                if direction is Direction.S2H:
                    self._drop_part(mat, mat.l3_part, reason)
                    mat.l3_part = []  # no promotion: those tokens are recomputed
                    continue
                if mat.l3_part:
                    self.cp.unpin(mat.request_id, mat.l3_part[-1])
                self._drop_part(mat, mat.l2_part, reason)
                mat.l2_part, mat.l3_part = [], []
                return
            mat.ops.add(op.op_id)
            self.owner[op.op_id] = mat

    def _issue_l3_h2d(self, mat: Materialization) -> None:
        """Second step of an L3 restore: once promoted, load back -- but only after the L2
        part is in L1, so the chain's parent holds L1 (no gap, S6)."""
        if mat.ops:
            return  # the promotion is done; what is still in flight is the L2 part's load-back
        mat.l3_h2d_issued = True
        parent = mat.l3_part[0].parent
        assert parent is not None, "a pinned node is live, and a live node has a parent"
        if not parent.is_root and parent.state[0] != RESIDENT:
            # The L2 part did not arrive: the promoted pages stay in L2, the tokens are recomputed.
            self._drop_part(mat, mat.l3_part, "restore_gap")
            return
        try:
            op = self.issue(Direction.H2D, mat.l3_part, mat.request_id)
        except (OutOfPages, IllegalTransition):
            mat.failed = True
            self._drop_part(mat, mat.l3_part, "no_room")
            return
        mat.ops.add(op.op_id)
        self.owner[op.op_id] = mat

    def _invalidate_slot(self, op: PendingOp, slot: int, reason: str) -> None:
        """A slot failed its checksum or could not be read: drop the L3 copy of the node
        holding it (and of its L3 descendants, leaf-first), so it is a miss from now on,
        never served, and never read again."""
        holder = next((n for n in op.nodes if n.value[2] is not None and slot in n.value[2]), None)
        if holder is None:
            return
        doomed: list[TreeNode] = []
        stack = [holder]
        while stack:
            n = stack.pop()
            if n.state[2] == RESIDENT:
                doomed.append(n)
                stack.extend(n.children.values())
        for n in reversed(doomed):
            try:
                self.metrics.invalidated(reason, self.cp.evict_node(n, 2, "invalidate_l3"))
            except IllegalTransition:
                return  # a reader holds it: it stays (and fails its checksum again), counted

    @property
    def l3_online(self) -> bool:
        """Whether L3 serves restores and takes backups (False once its file was lost)."""
        return self.l3_offline_reason is None

    def _take_l3_offline(self, error: StorageError) -> None:
        """The L3 file was removed or replaced under us: its slots are lost for good. L3 goes
        offline for the rest of this controller's life (restores plan no L3 part, backups to L3
        are dropped and counted, every L3 copy is dropped as soon as no reader holds it);
        L1 and L2 keep serving. Recovery: close this controller, build one on a new L3 path."""
        if self.l3_offline_reason is None:
            self.l3_offline_reason = str(error)
        self._drop_l3_copies()

    def _drop_l3_copies(self) -> None:
        """Drop (`invalidate_l3`) every L3 copy that no reader holds, leaves first."""
        while True:
            dropped = 0
            for node in self.cp.tree.evictable(2):
                try:
                    self.metrics.invalidated("l3_offline", self.cp.evict_node(node, 2, "invalidate_l3"))
                    dropped += 1
                except IllegalTransition:
                    continue  # a promotion reads it into L2 right now: next tick
            if not dropped:
                return

    # -- helpers ----------------------------------------------------------------------------

    def _restore(self, request_id: int) -> Materialization:
        mat = self.restores.get(request_id)
        if mat is None:
            raise UnknownRequest(request_id)
        return mat

    def _deepest_in_l1(self, mat: Materialization) -> TreeNode | None:
        deepest = None
        for node in mat.l2_part + mat.l3_part:
            if node.state[0] != RESIDENT:
                break
            deepest = node
        return deepest

    def _after_restore(self, mat: Materialization, start: int, end: int) -> None:
        """Count, verify every restored page against recomputation, drop promotions if off."""
        g = self.config.kv
        self.metrics.restores += 1
        from_l2 = sum(len(n.key) for n in mat.l2_part if n.state[0] == RESIDENT)
        self.metrics.hit_tokens["L2"] += min(from_l2, end - start)
        self.metrics.hit_tokens["L3"] += max(0, end - start - from_l2)
        promoted = [n for n in mat.l3_part if n.state[0] == RESIDENT]
        if self.config.verify:
            self._verify(mat.tokens, start, end, self._l1_prefix_pages(self.cp.requests[mat.request_id].locked)[start // g.page_size:])
        if not promoted:
            return
        if self.config.promotion:
            self.metrics.promotions += sum(n.num_pages for n in promoted)
            return
        for node in reversed(promoted):  # leaf-first, so each is a leaf in L2 when evicted
            try:
                self.cp.evict_node(node, 1)
            except IllegalTransition:
                break  # locked by another reader, or not a leaf any more: keep it

    def _verify(self, tokens: Sequence[int], start: int, end: int, pages: Pages) -> None:
        # Why the empty range is checked first: a restore can settle with nothing new in L1
        # (another request's restore already made the deepest node resident), and producers
        # refuse an empty range (ProducerError) -- the demo failed that way, now and then.
        if end <= start:
            return
        expected = self.producer.expected(tokens, start, end)  # part of the KVProducer protocol
        if expected is None:
            return
        l1 = self.engine.l1.tensor
        got = torch.empty_like(expected, device=l1.device)
        gather(l1, torch.as_tensor(pages, device=l1.device), got, backend="torch")
        a = got.cpu().view(torch.uint8).reshape(len(pages), -1)
        b = expected.cpu().view(torch.uint8).reshape(len(pages), -1)
        bad = (a != b).any(dim=1).nonzero().flatten().tolist()
        if bad:
            raise RestoreMismatch(
                f"restored pages {[int(pages[i]) for i in bad[:8]]} (tokens {start}..{end}) differ "
                "from recomputation: a cross-prefix mix-up or a torn transfer"
            )
        self.metrics.verified_pages += len(pages)

    def _l1_prefix_pages(self, node: TreeNode) -> Pages:
        path = list(reversed(self.cp.tree.path_to_root(node))) if not node.is_root else []
        values = [n.value[0] for n in path]
        assert all(v is not None for v in values), "a locked L1 prefix holds L1 on every node"
        return np.concatenate([v for v in values if v is not None]) if values else np.zeros(0, np.int64)

    def _make_room(self, t: int, n_pages: int, keep: Sequence[TreeNode] = ()) -> None:
        """Evict LRU leaves of tier index `t` until `n_pages` are free (or none is left).
        Under write_back, an L1 leaf without an L2 copy is backed up (and waited for) first;
        otherwise its tokens are counted as dropped."""
        table = self.cp.tables[t]
        kept = {n.node_id for n in keep}
        while table.free_count < n_pages:
            candidates = [n for n in self.cp.tree.evictable(t) if n.node_id not in kept]
            if not candidates:
                return
            node = candidates[0]
            if t == 0 and node.state[1] == ABSENT:
                if self.config.write_policy == "write_back" and self._backup_now(node):
                    continue  # the node is backed up now; take the next candidate round
                self.metrics.drop("write_through_unbacked_eviction", len(node.key))
            self.cp.evict_node(node, t)
            self.metrics.evictions[str(TIERS[t])] += 1

    def _backup_now(self, node: TreeNode) -> bool:
        """Write-back: back `node` (and the chain it needs) up to L2 and wait. False if
        that cannot be done (no room, or blocked)."""
        chain = chain_lacking(node, Direction.D2H)
        if not chain or chain[-1] is not node:
            return False
        try:
            op = self.issue(Direction.D2H, chain)
        except OutOfPages:
            self.metrics.drop("host_pressure", sum(len(n.key) for n in chain))
            return False
        self.handles[op.op_id].wait()
        self._settle(op.op_id)
        return node.state[1] == RESIDENT

    def alive(self, node: TreeNode) -> bool:
        """Whether `node` is still in the tree (nodes are removed when empty everywhere)."""
        return node.is_root or node.parent is not None and any(c is node for c in node.parent.children.values())

    # -- observation ------------------------------------------------------------------------

    def status(self) -> dict[str, object]:
        tiers = {}
        nodes = list(self.cp.tree.nodes())
        for i, (t, table) in enumerate(zip(TIERS, self.cp.tables)):
            tiers[str(t)] = {
                "capacity": table.capacity, "free": table.free_count, "private": table.count(1),
                "tree": table.count(2),
                "evictable": sum(n.num_pages for n in self.cp.tree.evictable(i)),
                "locked": sum(n.num_pages for n in nodes if n.lock[i] > 0 and n.state[i] == RESIDENT),
            }
        return {
            "tiers": tiers, "pending_ops": len(self.cp.ops), "requests": len(self.cp.requests),
            "engine": self.engine.status(), "cost_model": self.model.state(),
            "policy": self.policy.name, "decisions": self.decisions.summary(),
            "l3": "online" if self.l3_online else f"offline: {self.l3_offline_reason}",
            "invariant_checks": {"run": self.cp.checker.checks_run, "violations": self.cp.checker.violations_found},
        }
