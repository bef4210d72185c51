"""Transfers: issue one, conclude those that ended (C4), settle each into the control plane.

    issue(direction, chain, rid)   evict for room, reserve, lock, start; across ranks the op is
                                   taken on every rank and a refusal agreed at the next C4
                                   (deferred), or, where L1 frees windows and the transfer
                                   touches L1, two-phase (reserve -> C2 -> commit or abort)
    conclude(op_ids)               C4: the agreed end of each op, applied (every rank, every tick)
    observe / apply                conclude's halves: this rank's ends; the agreed ends applied
                                   (C1a carries C4 between them at an admission, spec/tp.md)
    settle(op_id, ...)             one op's end: complete, clamp, fail or cancel, then the
                                   cost model, backups, L3 write ledger and bad-slot quarantine
    issue_backup / back_up_now     a planned backup (dropped and counted when refused), and
                                   write-back's backup of an eviction victim (waited for)

Contract: `handles` maps every op in flight to its data-plane handle; an op leaves it only
through `settle` (or `close`'s quiesce). A refused issue changes nothing (its errors are
`issue`'s). The room a transfer needs comes from the one eviction loop (eviction.py); what a
restore does with an op's end is the stager's (`settled`, restore.py). spec/restore.md says
what each end means, spec/tp.md C2/C4/C6 what the ranks agree on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import cast

from hicache.controller.backup import BackupPlanner, chain_lacking
from hicache.controller.clamp import clamped_nodes
from hicache.controller.crashsite import ControllerFaults
from hicache.controller.eviction import Evictor
from hicache.controller.l3health import L3Health
from hicache.controller.metrics import Metrics
from hicache.controller.replicas import ReplicatedL3
from hicache.core.control import ControlPlane
from hicache.core.records import PendingOp
from hicache.core.tiers import Direction, Tier
from hicache.core.tree import TreeNode
from hicache.dataplane.aimed import issue_aimed
from hicache.dataplane.handles import TransferHandle, TransferStatus
from hicache.dataplane.plane import DataPlane
from hicache.distributed.agreement import NO_SLOT, Agreed, Agreement, Local
from hicache.distributed.collectives import CollectiveError
from hicache.distributed.ledger import AckedWrite, L3Writes
from hicache.distributed.refused import RefusedIssue
from hicache.errors import (
    CorruptSlot,
    HiCacheError,
    IllegalTransition,
    OutOfPages,
    QuiesceTimeout,
    ReservationAborted,
    StorageError,
    TransferError,
    UnreadableSlot,
)
from hicache.policy import CostModel
from hicache.pools.spec import PoolGroup
from hicache.pools.table import InjectedShortage

__all__ = ["Rooms", "Settled", "Transfers"]

BAD_SLOT = (CorruptSlot, UnreadableSlot)  # a read's bad-slot errors, in C4's reason order
BAD_SLOT_REASONS = ("corrupt", "unreadable")

Settled = Callable[[PendingOp, TransferStatus, "int | None"], None]  # (op, end, nodes kept)


def first_bad_page(op: PendingOp, slots: Sequence[int]) -> int:
    """The position, in `op`'s source pages, of the first of `slots` (the bad L3 slots its
    read named), or NO_SLOT when it read none of them. Positions are equal on every rank
    (the ops are), L3 slot numbers need not be: C4 agrees on the least position (tp.md)."""
    named = {int(s) for s in slots}
    for position, slot in enumerate(op.source_pages.tolist()):
        if slot in named:
            return position
    return NO_SLOT


@dataclass(frozen=True)
class Rooms:
    """The controller's rooms a `Transfers` drives and tells, none of which refers back to
    it (the one path back, write-back's backup, is passed per call: `Evictor.make_room`)."""

    hooks: ControllerFaults  # the controller's fault sites; refuses once dead
    l3: L3Health  # offline, bad slots
    evictor: Evictor  # the room a transfer needs
    backups: BackupPlanner  # told of each completed D2H
    replicas: ReplicatedL3  # C6a/C6b: rank 0's L3 copy of a replicated pool
    l3_writes: L3Writes  # the L3 write ledger (I11)
    metrics: Metrics
    model: CostModel  # fed each completed transfer's time
    settled: Settled  # told after the control plane applied each op's end (the stager's)


class Transfers:
    def __init__(
        self,
        cp: ControlPlane,
        engine: DataPlane,
        agree: Agreement,
        group: PoolGroup,
        page_bytes: dict[str, int],
        rooms: Rooms,
    ) -> None:
        """`page_bytes`: bytes of one own page per backed-up pool (the L3 write ledger's
        unit). `rooms`: the controller's rooms this one drives; `rooms.settled(op, status,
        kept)` is told after the control plane applied each op's end (the restore stager)."""
        self.cp, self.engine, self.agree, self.group = cp, engine, agree, group
        self.tp = agree.tp
        self.page_bytes = page_bytes
        self.hooks, self.l3, self.evictor = rooms.hooks, rooms.l3, rooms.evictor
        self.backups, self.replicas, self.l3_writes = rooms.backups, rooms.replicas, rooms.l3_writes
        self.metrics, self.model = rooms.metrics, rooms.model
        self.settled = rooms.settled
        self.handles: dict[int, TransferHandle] = {}  # op id -> its handle, while in flight
        self._observed: set[Direction] = set()  # directions whose warm-up transfer was seen

    def issue(
        self, direction: Direction, chain: list[TreeNode], request_id: int | None = None
    ) -> PendingOp:
        """Reserve (evicting in the target tier if needed), lock, and start one transfer.

        Raises, with the control plane unchanged: `OutOfPages` (no room even after eviction),
        `IllegalTransition` (a guard fails, or a node was removed from the tree), and
        `StorageError` for an L3 transfer when the L3 file is lost (L3 is then offline), and
        `TransferError` when the data plane refuses the transfer (no workspace); callers in
        this package turn the last into a fallback or a dropped backup, never an escape.
        Faults (`faults`): the op aimed at (`FaultInjector.aim`), and ALLOC_L1/L2/L3 (the
        reservation fails as if the tier were full: OutOfPages, nothing changed).

        Across ranks (spec/tp.md C2) the issue is two-phase: each rank reserves and issues
        here, the ranks agree, and unless every rank succeeded with the same pages every rank
        releases what it took and raises `ReservationAborted` (an OutOfPages): no rank
        evicts and retries alone (R72). Where the reservation reads only state every rank
        holds equal (`defers`) no collective is made here: every rank takes the op, a rank
        whose own issue was refused holding a `RefusedIssue` in place of the data plane's
        handle, and the next C4 fails it on every rank (the deferred reserve); what refuses
        here then refuses on every rank alike."""
        self.hooks.refuse_if_crashed()
        parent = chain[0].parent
        assert parent is not None, "the root is never transferred"
        need = sum(n.num_pages for n in chain)
        deferred = self.tp and self.defers(direction)
        op, handle, error, took_id = self._issue_here(
            direction, chain, request_id, need, parent, deferred
        )
        if self.tp and not deferred:
            # Only a transfer into or out of L1 comes here: it never touches L3.
            agreed = self.agree.reserve(error is None, need)
            if not agreed and op is not None and handle is not None:
                try:
                    self.hooks.cancel(handle, op.op_id)  # the hardware no longer touches it
                except QuiesceTimeout:
                    self.handles[op.op_id] = handle  # still in flight: close() leaks it
                    raise
                self.cp.cancel(op.op_id)
                self.metrics.ended_at_issue(direction, TransferStatus.CANCELLED)
            if not took_id:
                self.cp.skip_op_id()  # the id the ranks that issued took: ids stay equal
            if not agreed:
                raise ReservationAborted(
                    str(direction.target), need, self.cp.free_pages(direction.target), error
                )
        if error is not None:
            raise error
        assert op is not None and handle is not None  # Verify: no error means an op in flight.
        self.handles[op.op_id] = handle
        return op

    def defers(self, direction: Direction) -> bool:
        """Whether a `direction` issue's outcome is agreed at the next C4 instead of at C2
        (spec/tp.md C2, the deferred reserve): its room, reservation and guards read only
        state every rank holds equal (the tree, locks, free counts, L3's health), so only
        what follows them -- an injected allocation fault, the data plane's refusal, an L3
        file lost -- may refuse it on one rank. Not so where L1 frees windows (a trailing
        pool: the configuration, equal on every rank) and the transfer reads or fills L1: a
        window freed on one rank refuses its issue before the op exists, and L1's trailing
        free counts may differ; there C2 agrees at once."""
        return not (self.cp.windows.tombstones and Tier.L1 in (direction.source, direction.target))

    def _issue_here(
        self,
        direction: Direction,
        chain: list[TreeNode],
        request_id: int | None,
        need: int,
        parent: TreeNode,
        deferred: bool = False,
    ) -> tuple[PendingOp | None, TransferHandle | None, HiCacheError | None, bool]:
        """This rank's half of `issue`: the op and its handle, or the error that refused it
        (whatever was taken released again), and whether this transfer took an op id. (Not
        "did the next id move": making room may issue write-back's own transfers first, each
        with its ids and agreement; only this transfer's id may be missing on a rank.)
        `deferred` (C2 deferred to C4): a refusal after the guards still takes the op, with
        a `RefusedIssue` for its handle, and returns no error."""
        refusal: HiCacheError | None = None
        try:
            if not self.l3.online and Tier.L3 in (direction.source, direction.target):
                raise StorageError(self.engine.l3_path, f"L3 is offline: {self.l3.offline_reason}")
            aim = self.hooks.aimed(direction, request_id)
            # R26: keep the chain's parent: evicting it would open a backup gap under the chain.
            self.evictor.make_room(direction.target, need, keep=[parent], back_up=self.back_up_now)
            try:
                self.hooks.reserve(
                    direction.target, need, self.cp.free_pages(direction.target), aim
                )
            except OutOfPages as e:
                if not deferred:
                    raise
                refusal = e  # a fault of this rank's: the op is taken all the same (C2)
            try:
                op = self.cp.issue(direction, chain, request_id)
            except InjectedShortage as e:  # a fault of one pool's, on this rank alone
                if not deferred:
                    raise
                refusal = refusal or e
                with self.cp.faults_off(direction.target):
                    op = self.cp.issue(direction, chain, request_id)
        except (CollectiveError, QuiesceTimeout):
            raise  # making room met a broken group or wedged hardware: no refusal, dead
        except HiCacheError as e:
            return None, None, e, False
        if aim is not None and aim.action == "crash":
            self.hooks.crash_ops.add(op.op_id)
        if refusal is not None:
            return op, RefusedIssue(direction, refusal), None, True
        if direction is Direction.H2S and not self.l3_writes.writes_any(self.group):
            return op, self._acked(op), None, True  # C6b: this rank writes none of these pools
        try:
            handle = issue_aimed(
                self.engine,
                direction,
                op.source_pages,
                op.target_pages,
                aim,
                self.hooks.landing(aim, self.group, need),
            )
        except HiCacheError as e:
            if deferred:  # C4 fails it on every rank, and takes L3 offline on all if lost
                return op, RefusedIssue(direction, e), None, True
            self.cp.fail(op.op_id)  # R13: an issue that raised left nothing in flight
            self.metrics.ended_at_issue(direction, TransferStatus.FAILED)
            if isinstance(e, StorageError):
                self.l3.take_offline(e)
            return None, None, e, True
        return op, handle, None, True

    def _acked(self, op: PendingOp) -> TransferHandle:
        """A finished handle for an H2S this rank does not write (spec/tp.md C6b)."""
        handle = AckedWrite(op.direction, 0)
        handle.finish(True)
        return handle

    def conclude(self, op_ids: Sequence[int]) -> None:
        """C4 over ops `op_ids` (issue order): apply each that ended on every rank, or failed
        on some rank (a rank still moving it cancels first), keeping the fewest nodes any
        rank landed. One rank: each final op, as it ended."""
        local = self.observe(op_ids)
        self.apply(op_ids, local, self.agree.completion(local))

    def observe(self, op_ids: Sequence[int]) -> list[Local]:
        """This rank's end of each of ops `op_ids` (issue order), polled now: C4's payload,
        or what C1a carries (spec/tp.md, "C4 carried by C1a"). Polling changes no state of
        the control plane."""
        local: list[Local] = []
        for op_id in op_ids:
            handle = self.handles[op_id]
            status = handle.poll()
            nodes = len(self.cp.ops[op_id].nodes)
            reason, first_bad = 0, NO_SLOT
            if isinstance(handle.error, BAD_SLOT):
                reason = BAD_SLOT.index(type(handle.error)) + 1
                first_bad = first_bad_page(self.cp.ops[op_id], handle.error.slots)
            lost = isinstance(handle, RefusedIssue) and handle.lost
            if status is TransferStatus.FAILED:
                kept = (
                    clamped_nodes(self.group, self.cp.ops[op_id].nodes, handle.landed)
                    if self.cp.ops[op_id].direction is Direction.S2H and handle.landed is not None
                    else 0
                )
                local.append((True, True, kept, reason, first_bad, lost))
            else:
                # Done here: every node landed. Still moving: none it can vouch for yet --
                # when another rank failed the op, this rank cancels it, and publishing
                # "the fewest whole nodes any rank landed" must not count its own as all.
                local.append(
                    (status.final, False, nodes if status.final else 0, reason, first_bad, False)
                )
        return local

    def apply(
        self, op_ids: Sequence[int], local: Sequence[Local], agreed: Sequence[Agreed]
    ) -> None:
        """Apply the agreed ends `agreed` of ops `op_ids` (this rank's own were `local`), from
        C4 or carried by C1a. An op settled since it was observed (a restore's own op that a
        call between cancelled: the same call on every rank) is passed over."""
        live = [i for i, op_id in enumerate(op_ids) if op_id in self.handles]
        if len(live) < len(op_ids):
            op_ids = [op_ids[i] for i in live]
            local, agreed = [local[i] for i in live], [agreed[i] for i in live]
        if any(gone for *_, gone in agreed) and self.l3.online:
            # C2 deferred: some rank's L3 file was lost at an issue: offline on every rank.
            mine = [self.handles[o] for o, x in zip(op_ids, local) if x[5]]
            refusal = cast(RefusedIssue, mine[0]).refusal if mine else None
            self.l3.take_offline(
                refusal
                if isinstance(refusal, StorageError)
                else StorageError(self.engine.l3_path, "another rank's L3 file was lost")
            )
        if self.replicas.pools:
            self.replicas.ack(
                [
                    op_id
                    for op_id, (ended, failed, *_) in zip(op_ids, agreed)
                    if ended and not failed and self.cp.ops[op_id].direction is Direction.H2S
                ]
            )
        for op_id, (ended, failed, kept, reason, first_bad, _) in zip(op_ids, agreed):
            if op_id not in self.handles or not (ended or failed):
                continue  # settled meanwhile (a dropped restore part cancels its ops), or waits
            handle = self.handles[op_id]
            if failed and not handle.status.final:
                self.hooks.cancel(handle, op_id)  # another rank's failed: stop ours first
            clamp = kept if failed and (kept or handle.landed is not None) else None
            bad = None
            if self.tp and reason and first_bad != NO_SLOT:  # C4: the first bad page any rank read
                slot = int(self.cp.ops[op_id].source_pages[first_bad])
                bad = (BAD_SLOT_REASONS[reason - 1], slot)
            self.settle(op_id, failed=failed, kept=clamp, bad=bad)

    def cancel(self, op_id: int) -> None:
        """Cancel op `op_id`'s handle (it stays in `handles` for `settle`), waiting at most
        quiesce_timeout_s: past it, QuiesceTimeout and the controller is wedged."""
        self.hooks.cancel(self.handles[op_id], op_id)

    def cancel_ops(self, op_ids: Iterable[int]) -> None:
        """C5 for these ops, in id order: cancel each handle (it quiesces first; QuiesceTimeout
        past the bound: wedged), then settle the op (what `CacheController.finish` and
        `cancel_restore` do with a restore's own ops)."""
        for op_id in sorted(op_ids):
            self.cancel(op_id)
            self.settle(op_id)

    def settle(
        self,
        op_id: int,
        failed: bool | None = None,
        kept: int | None = None,
        bad: tuple[str, int] | None = None,
    ) -> None:
        """Apply one op's end to the control plane, then tell whoever cares. `failed`/`kept`:
        the agreed end (C4): failed on some rank, keeping `kept` leading nodes; None: the
        handle's own final status (a cancel, the caller's own), and across ranks CANCELLED
        whatever that status (C5). `bad`: across ranks, (reason, slot) of the first bad page
        any rank's read found (C4), its copy dropped on every rank with every copy below it;
        one rank: the handle's own error names every bad slot."""
        handle = self.handles.pop(op_id)
        op = self.cp.ops[op_id]
        status = handle.status
        if failed is None and self.tp:
            # C5: a cancel is the same call on every rank, so every rank releases the op. A
            # handle a tick already saw end (a cancel leaves a final handle as it is) ended
            # on this rank only: C4 had not agreed on its end, and publishing it here alone
            # would part this rank's tree from the others' (I7).
            status = TransferStatus.CANCELLED
        if failed:
            status = TransferStatus.FAILED  # on some rank: on every rank
        elif failed is not None and status is not TransferStatus.CANCELLED:
            status = TransferStatus.DONE  # on every rank
        crash = (
            self.hooks.crash_now(op_id, str(op.direction))
            if status is TransferStatus.DONE
            else None
        )
        if crash is not None:
            self.handles[op_id] = handle  # still unpublished: close() releases it
            raise crash
        self.metrics.transfer(op.direction, handle.nbytes, status, handle.timings)
        if status is TransferStatus.DONE:
            self.cp.complete(op_id)
            self.sample(op.direction, handle)
            if op.direction is Direction.D2H:
                self.backups.after_d2h(op.nodes[-1])
            elif op.direction is Direction.H2S:
                self.l3_writes.record(
                    op_id,
                    self.group,
                    sum(n.num_pages for n in op.nodes),
                    self.page_bytes,
                    self.replicas.written(isinstance(handle, AckedWrite)),
                )
        elif status is TransferStatus.CANCELLED:
            self.cp.cancel(op_id)
        if status is not TransferStatus.FAILED:
            kept = None
        elif kept is None and op.direction is Direction.S2H and handle.landed is not None:
            kept = clamped_nodes(self.group, op.nodes, handle.landed)  # stopped part way
        if status is TransferStatus.FAILED:
            if kept is None:
                self.cp.fail(op_id)
            else:  # the whole nodes of the clamp published, the rest released
                self.cp.complete_part(op_id, min(kept, len(op.nodes)))
        self.settled(op, status, kept)
        backup = op.direction in (Direction.D2H, Direction.H2S)
        # R56: a failed transfer ends in its fail row, its loss counted once.
        if backup and status is TransferStatus.FAILED:  # a cancel (shutdown) drops nothing
            self.metrics.drop("backup_failed", sum(len(n.key) for n in op.nodes))
        if self.tp:
            if bad is not None:  # some rank's read found it: every rank drops that copy
                self.l3.bad_slot(op.nodes, bad[1], bad[0])
        elif isinstance(handle.error, (CorruptSlot, UnreadableSlot)):
            reason = "corrupt" if isinstance(handle.error, CorruptSlot) else "unreadable"
            for slot in handle.error.slots:  # after the restore let go of its pins
                self.l3.bad_slot(op.nodes, slot, reason)

    def sample(self, direction: Direction, handle: TransferHandle) -> None:
        """Feed a completed transfer's time to the cost model.

        The sample: enqueue + queue wait + service (the handle's `enqueue_s` already leaves
        one-time workspace setup out), not how late this loop happened to poll. The first
        transfer of each direction also pays one-time costs the handle cannot separate (kernel
        JIT for the real shapes, first touch): it is a warm-up, not a sample."""
        t = handle.timings
        steady = t.enqueue_s + t.queue_wait_s + t.service_s
        first = direction not in self._observed
        self._observed.add(direction)
        if steady > 0 and not first:
            self.model.observe(direction, handle.nbytes, steady)

    def issue_backup(self, direction: Direction, chain: list[TreeNode]) -> None:
        """Issue one planned backup; when no room can be made, or L3 is lost, it is dropped
        and its tokens counted, not retried (R30: a backup never blocks a request; R32: every
        loss of an owed copy is counted)."""
        try:
            self.issue(direction, chain)
        except (OutOfPages, StorageError, TransferError) as e:
            if isinstance(e, ReservationAborted) and isinstance(e.cause, IllegalTransition):
                reason = "window_freed"  # this rank's source window is freed (spec/tp.md C2)
            elif isinstance(e, StorageError):
                reason = "l3_offline"  # the file is lost; L1 and L2 keep serving
            elif isinstance(e, TransferError):
                reason = "backup_failed"  # refused at issue (no workspace): as a failed one
            else:
                reason = "host_pressure" if direction is Direction.D2H else "storage_pressure"
            self.metrics.drop(reason, sum(len(n.key) for n in chain))

    def back_up_now(self, node: TreeNode) -> bool:
        """Write-back: back `node` (and the chain it needs) up to L2 and wait. False if that
        cannot be done (no room, or blocked); the caller counts the victim's loss, once."""
        chain = chain_lacking(self.cp, node, Direction.D2H, windows=not self.tp)
        if not chain or chain[-1] is not node:
            return False
        try:
            op = self.issue(Direction.D2H, chain)
        except (OutOfPages, TransferError):  # across ranks, a freed window aborts it (C2)
            return False
        if self.handles[op.op_id].wait(self.hooks.quiesce_timeout_s) is TransferStatus.PENDING:
            raise self.hooks.wedge(f"op {op.op_id} (D2H) write-back wait")  # close() leaks it
        self.conclude([op.op_id])  # C4 for this one op: its end, agreed
        return self.cp.holds(node, Tier.L2)
