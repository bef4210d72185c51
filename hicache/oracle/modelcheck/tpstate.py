"""The TP model's state and how a rank takes each step: its own plane, the real controller code.

A state is every rank's `RankState`:

    field   what it is                                          in the key
    ------  --------------------------------------------------  -----------------------------
    cp      the rank's ControlPlane (tree, page tables, ops,    its canonical key
            requests), as in the one-plane search               (canonical.py), its L3 slots
                                                                concretely
    l3      the rank's L3Health (controller/l3health.py):       online, the quarantined slots
            bad-slot quarantine, L3 offline after a lost file
    ends    op id -> `End`: how this rank's handle of the op    per op, by direction and
            ended (refused: its issue refused here), and        node labels
            whether a tick has polled it

Each step on a rank runs the controller's own code over that plane and health, built fresh
for the step (`transfers`): an admission (`begin_request` whose C1a carries C4: `admit`),
`Transfers.issue` (reserve; C2, commit or abort, where L1 frees
windows and the transfer touches L1; elsewhere every rank takes the op, a refused one too),
`Transfers.conclude` (C4, then settle), `Transfers.cancel_ops` (C5: what
`CacheController._cancel_own` runs), with stand-ins for what those drive and the model
chooses instead:

    stand-in         for                what it does
    ---------------  -----------------  -----------------------------------------------------
    _ModelHooks      ControllerFaults   the rank's fault of this issue: `refused` refuses the
                                        reservation once, as if the tier were full (ALLOC_Ln)
    _ModelEngine     the data plane     a NullHandle per transfer; `lost`: the L3 file is gone
                                        (StorageError at issue)
    handle_of(End)   the op's handle    a NullHandle ended as the model chose, polled or not;
                                        a refused issue's `RefusedIssue`
    _ModelEvictor    Evictor            `make_room` evicts nothing (the search's own `evict`
                                        steps make room: every candidate, in every order)
    _NoBackups       BackupPlanner      the write policy plans nothing (no planned backups)

The cost model, metrics and restore stager are not state of the model: their answers change
no transition here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

from hicache.controller.l3health import L3Health
from hicache.controller.metrics import Metrics
from hicache.controller.replicas import ReplicatedL3
from hicache.controller.transfers import Rooms, Transfers
from hicache.core.control import ControlPlane
from hicache.core.pages import Pages
from hicache.core.tiers import Direction, Tier
from hicache.core.tree import MatchResult, TreeNode
from hicache.dataplane.handles import NullHandle, TransferHandle
from hicache.distributed.agreement import Agreed, Agreement, Local
from hicache.distributed.ledger import AckedWrite, L3Writes
from hicache.distributed.refused import RefusedIssue
from hicache.errors import CorruptSlot, HiCacheError, OutOfPages, StorageError, TransferError
from hicache.oracle.modelcheck.actions import is_refusal
from hicache.oracle.modelcheck.canonical import Key, _preorder, canonical_key
from hicache.policy import CostModel
from hicache.pools.spec import PoolGroup

L3_PATH = "<model L3>"  # the L3 file's name in errors (the model has no file)
_METRICS = Metrics()  # the controller's counters: no state of the model
_COSTS = CostModel()  # null handles take no time: it learns nothing

FAULTS = ("ok", "refused", "lost")
"""An issue's fault on one rank: none; the reservation refused as if the tier were full
(ALLOC_Ln); the L3 file found lost at issue (transfers to or from L3 only)."""


class End(NamedTuple):
    """How one rank's handle of one op ended. `kind`: pending, acked (an H2S this rank writes
    none of: finished at issue, C6b), refused (its issue was refused on this rank and the op
    taken all the same, C2 deferred; `arg` 1: its L3 file was lost), done, failed, part (a
    read that landed `arg` anchor pages, then failed) or bad (a read that met bad L3 slot
    `arg`). `seen`: a tick polled it, so its status is final (a cancel no longer changes
    it)."""

    kind: str
    arg: int = 0
    seen: bool = False


PENDING = End("pending")


def handle_of(end: End, direction: Direction, group: PoolGroup) -> TransferHandle:
    """A null handle in the state `end` describes (polled when `end.seen`); a refused
    issue's own handle (`RefusedIssue`, failed at its first poll)."""
    if end.kind == "refused":
        refused = RefusedIssue(
            direction,
            StorageError(L3_PATH, "the L3 file was lost")
            if end.arg
            else OutOfPages(str(direction.target), 0, 0),
        )
        if end.seen:
            refused.poll()
        return refused
    h = AckedWrite(direction, 0) if end.kind == "acked" else NullHandle(direction)
    if end.kind in ("acked", "done"):
        h.finish(True)
    elif end.kind in ("failed", "part", "bad"):
        h.finish(False)  # FAILED at the next poll, with the error set here
        if end.kind == "part":
            kept = group.backed_up()
            h.landed = {p.name: end.arg * kept.ratio(p.name) for p in kept.pools}
            h.error = TransferError("the read stopped part way (model)")
        elif end.kind == "bad":
            h.error = CorruptSlot(end.arg, L3_PATH)
    if end.seen:
        h.poll()
    return h


def ends_of(cp: ControlPlane, op_id: int) -> list[End]:
    """The ends the data plane may give op `op_id` on one rank: done or failed; a read from
    L3 (S2H) may also land some anchor pages and fail, or meet a bad slot (each of its
    source slots)."""
    op = cp.ops[op_id]
    out = [End("done"), End("failed")]
    if op.direction is Direction.S2H:
        out += [End("part", k) for k in range(1, int(op.target_pages.size))]
        out += [End("bad", s) for s in sorted(set(op.source_pages.tolist()))]
    return out


@dataclass
class RankState:
    """One rank (module docstring). `ledger`: what the last tick (or admission) recorded as
    written to L3 per completed H2S (I11 reads it; history, so in no key). `plan_held`:
    whether the last admission's plan kept the L3 copy it pinned through the ends its C1a
    carried (the rule `carried` reads it; history, so in no key)."""

    rank: int
    cp: ControlPlane
    l3: L3Health
    ends: dict[int, End] = field(default_factory=dict)
    ledger: L3Writes | None = None
    plan_held: bool = True

    def copy(self) -> RankState:
        cp = self.cp.clone()
        l3 = L3Health(cp, _METRICS)
        l3.offline_reason, l3.quarantine = self.l3.offline_reason, dict(self.l3.quarantine)
        return RankState(self.rank, cp, l3, dict(self.ends))

    def key(self, request_ids: tuple[int, ...]) -> Key:
        """The plane's canonical key; its L3 slots concretely (C6b compares them as
        numbers); L3's health;
        each op's end on this rank, by (direction, node labels)."""
        order = _preorder(self.cp.tree.root)
        label = {n.node_id: i for i, n in enumerate(order)}
        l3_slots = tuple(
            [() if n.value[2] is None else tuple(n.value[2].tolist()) for n in order[1:]]
        )
        ops = sorted(
            (
                op.direction.value,
                tuple([label[n.node_id] for n in op.nodes]),
                tuple(op.source_pages.tolist()) if op.direction is Direction.S2H else (),
                tuple(op.target_pages.tolist()) if op.direction is Direction.H2S else (),
                self.ends.get(op_id, PENDING),
            )
            for op_id, op in self.cp.ops.items()
        )
        return (
            canonical_key(self.cp, request_ids),
            l3_slots,
            tuple(ops),
            self.l3.online,
            tuple(sorted(self.l3.quarantine)),
        )

    def transfers(
        self, group: PoolGroup, agree: Agreement, fault: str = "ok", ledger: L3Writes | None = None
    ) -> Transfers:
        """The controller's `Transfers` over this rank's plane and health, its handles those
        of `ends` (module docstring: the stand-ins)."""
        t = Transfers(
            self.cp,
            cast(Any, _ModelEngine(fault)),
            agree,
            group,
            {},
            Rooms(
                hooks=cast(Any, _ModelHooks(fault)),
                l3=self.l3,
                evictor=cast(Any, _ModelEvictor(self.cp)),
                backups=cast(Any, _NoBackups()),
                replicas=ReplicatedL3(self.cp, agree, group, None),
                l3_writes=ledger or L3Writes(self.rank),
                metrics=_METRICS,
                model=_COSTS,
                settled=_nothing,
            ),
        )
        for op_id, end in self.ends.items():
            t.handles[op_id] = handle_of(end, self.cp.ops[op_id].direction, group)
        return t

    def sync(self, t: Transfers) -> None:
        """Read the ends back from `t`'s handles after a step: an op settled is gone; a new
        op is pending (acked: an H2S this rank writes none of); a polled end is seen."""
        out: dict[int, End] = {}
        for op_id, h in t.handles.items():
            old = self.ends.get(op_id)
            if old is None and isinstance(h, RefusedIssue):
                out[op_id] = End("refused", int(h.lost), seen=h.status.final)
            elif old is None:
                out[op_id] = End("acked") if isinstance(h, AckedWrite) else PENDING
            else:
                out[op_id] = old._replace(seen=h.status.final)
        self.ends = out


def issue(
    rs: RankState,
    group: PoolGroup,
    agree: Agreement,
    step: tuple[Direction, tuple[int, ...], int | None],
    fault: str,
) -> HiCacheError | None:
    """`Transfers.issue` on this rank (C2 inside it, where made); the refusal it raised, or
    None."""
    direction, chain, rid = step
    t = rs.transfers(group, agree, fault)
    try:
        t.issue(direction, [rs.cp.tree.node(i) for i in chain], rid)
    except HiCacheError as e:
        if not is_refusal(e):
            raise
        rs.sync(t)
        return e
    rs.sync(t)
    return None


def admit(
    rs: RankState, group: PoolGroup, agree: Agreement, request_id: int, prompt: Sequence[int]
) -> HiCacheError | None:
    """An admission on this rank (`CacheController.admit` as far as the model holds it):
    `begin_request` whose C1a carries this rank's ends of the ops in flight, observed at the
    match (`Transfers.observe`; the gather is `Agreement.admit`, its hits the local match's,
    equal on every rank since the planes are), then `plan_then_carry`, then the L3 drops.
    The refusal `begin_request` raised (before C1a, alike on every rank), or None."""
    rs.ledger = L3Writes(rs.rank)
    t = rs.transfers(group, agree, ledger=rs.ledger)
    flying = sorted(t.handles)
    mine: list[Local] = []
    ends: list[Agreed] = []
    ps = rs.cp.page_size

    def c1a(m: MatchResult) -> tuple[int, ...]:
        mine.extend(t.observe(flying))
        bounds = [n // ps for n in m.lengths]
        hits, _, agreed = agree.admit(bounds, bounds[0], 0, None, mine)
        ends.extend(agreed)
        return tuple(h * ps for h in hits)

    try:
        m = rs.cp.begin_request(request_id, prompt, agree=c1a)
    except HiCacheError as e:
        if not is_refusal(e):
            raise
        rs.sync(t)
        return e
    rs.plan_held = plan_then_carry(rs, t, request_id, m, flying, mine, ends)
    rs.l3.drop_unread()
    rs.sync(t)
    return None


def planned_l3(rs: RankState, m: MatchResult) -> TreeNode | None:
    """The node a restore of match `m` pins in L3 (the deepest of its L3 part: the servable
    L3 run past the L1 and L2 hits, `RestoreStager.start`), or None when it reads no L3."""
    reach = rs.l3.servable_len(m)
    if reach <= max(m.lengths[0], m.lengths[1]):
        return None
    deepest, tokens = None, 0
    for node in m.path:
        tokens += len(node.key)
        if tokens > reach:
            break
        deepest = node
    return deepest


def plan_then_carry(
    rs: RankState,
    t: Transfers,
    request_id: int,
    m: MatchResult,
    flying: Sequence[int],
    mine: Sequence[Local],
    ends: Sequence[Agreed],
) -> bool:
    """R85 (spec/tp.md, "C4 carried by C1a"): pin the plan's L3 part, then apply the ends
    C1a carried, then let the plan's pin go (the model leaves the restore itself to its
    other steps). Whether the copy the plan pinned still held L3 once the ends were applied
    (a carried bad slot's drop waits for the pin)."""
    node = planned_l3(rs, m)
    if node is not None:
        rs.cp.pin(request_id, node, Tier.L3)
    t.apply(flying, mine, ends)
    if node is None:
        return True
    held = rs.cp.holds(node, Tier.L3)
    rs.cp.unpin(request_id, node)
    return held


def conclude(rs: RankState, group: PoolGroup, agree: Agreement) -> None:
    """A tick's transfer part on this rank: `Transfers.conclude` over every op in flight (C4,
    unconditionally; no collective when none is), then `L3Health.drop_unread`
    (`CacheController.tick`)."""
    rs.ledger = L3Writes(rs.rank)
    t = rs.transfers(group, agree, ledger=rs.ledger)
    t.conclude(sorted(t.handles))
    rs.l3.drop_unread()
    rs.sync(t)


def cancel(rs: RankState, group: PoolGroup, agree: Agreement, op_id: int) -> None:
    """C5 on this rank: `CacheController._cancel_own` for one op (`Transfers.cancel_ops`:
    what `finish`, `cancel_restore` and `close` do: cancel the handle, then settle it)."""
    t = rs.transfers(group, agree)
    t.cancel_ops([op_id])
    rs.sync(t)


def _nothing(*_: object) -> None:
    return None


class _ModelHooks:
    """`ControllerFaults` for one issue: `refused` refuses the first reservation."""

    def __init__(self, fault: str) -> None:
        self.fault = fault
        self.crash_ops: set[int] = set()

    def refuse_if_crashed(self) -> None:
        return None

    def aimed(self, direction: Direction, request_id: int | None) -> None:
        return None

    def reserve(self, tier: Tier, need: int, free: int, aim: object) -> None:
        if self.fault == "refused":
            self.fault = "ok"  # one draw per reservation: a retry is not refused again
            raise OutOfPages(str(tier), need, free)

    def landing(self, aim: object, group: PoolGroup, anchor_pages: int) -> None:
        return None

    def crash_now(self, op_id: int, what: str) -> None:
        return None

    quiesce_timeout_s = None  # a null handle is quiet at once

    def cancel(self, handle: TransferHandle, op_id: int) -> None:
        handle.cancel()


class _ModelEngine:
    """The data plane of one step: a null handle per transfer, or (`lost`) a lost L3 file."""

    l3_path = L3_PATH

    def __init__(self, fault: str) -> None:
        self.fault = fault

    def _transfer(self, direction: Direction) -> NullHandle:
        if self.fault == "lost":
            raise StorageError(L3_PATH, "the L3 file was lost")
        return NullHandle(direction)

    def d2h(self, source: Pages, target: Pages) -> NullHandle:
        return self._transfer(Direction.D2H)

    def h2d(self, source: Pages, target: Pages) -> NullHandle:
        return self._transfer(Direction.H2D)

    def s2h(self, source: Pages, target: Pages) -> NullHandle:
        return self._transfer(Direction.S2H)

    def h2s(self, source: Pages, target: Pages) -> NullHandle:
        return self._transfer(Direction.H2S)


class _ModelEvictor:
    """`make_room` evicts nothing (module docstring); `evict`, which no correct issue calls,
    frees at least `need` pages of `tier` as `Evictor.evict` does: candidates outside `keep`,
    lowest node first."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp

    def make_room(self, tier: Tier, need: int, keep: list[TreeNode], back_up: object) -> int:
        return 0

    def evict(self, tier: Tier, need: int, keep: list[TreeNode], back_up: object = None) -> int:
        freed = 0
        for node in sorted(self.cp.candidates(tier), key=lambda n: n.node_id):
            if freed >= need:
                break
            if all(node is not k for k in keep):
                freed += self.cp.evict_node(node, tier)
        return freed


class _NoBackups:
    """The backup planner of a write policy that plans nothing."""

    after_d2h: Callable[[TreeNode], None] = staticmethod(_nothing)


__all__ = [
    "FAULTS",
    "PENDING",
    "End",
    "RankState",
    "admit",
    "cancel",
    "conclude",
    "ends_of",
    "handle_of",
    "issue",
    "plan_then_carry",
    "planned_l3",
]
