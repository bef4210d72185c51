"""CacheController: the control plane, a data plane, a policy and a KV producer, joined.

    admit(rid, tokens)   match -> policy -> plan and pin -> issue restores (or share one)
    tick()               observe completions: publish or fall back; continue restores/backups
    ready(rid)           whether the request's restore has settled (decode may run meanwhile)
    prefill(rid)         serve what arrived (cached_len), recompute the rest, insert, queue
                         the backup chain (write policy)
    finish(rid)          cancel the request's restore ops, release, unlock
    drain(), close()     wait for / cancel everything; status() reads the counters
    pending()            the transfers in flight: op id, direction, request, stage

The data plane is given (`engine=`, e.g. a NullEngine whose completions the caller picks op
by op) or built from the config (a TransferEngine); spec/faults.md says what each injected
fault does, including the crash between a transfer and its publication.

Contract: this class is the facade; each concept has its own room and the facade only routes.
Restore staging is restore.py, eviction and write-back eviction.py, the backup planner
backup.py, L3 faults l3health.py, verification verify.py. Every state change is a
`ControlPlane` transition (invariants checked per the check mode), and every question about
a node is one of its queries: no module here reads a node's state, value or lock. What each
operation may raise, and the rules for pins, sharing and ends with ops in flight, are in
spec/restore.md; eviction in spec/eviction.md.
"""

from __future__ import annotations

import time
import weakref
from typing import TYPE_CHECKING, Sequence

from hicache.control import ControlPlane
from hicache.records import PendingOp, UnknownRequest
from hicache.controller.backup import BackupPlanner, chain_lacking
from hicache.controller.clamp import clamped_nodes
from hicache.controller.config import CacheConfig
from hicache.controller.crashsite import ControllerFaults
from hicache.controller.digests import CachedDigests
from hicache.controller.eviction import Evictor
from hicache.controller.l3health import L3Health
from hicache.controller.materialize import Materialization, plan_parts
from hicache.controller.metrics import Metrics
from hicache.controller.pending import PendingTransfer, pending_transfers
from hicache.controller.planes import bind_group, choose_plane
from hicache.controller.replicas import ReplicatedL3
from hicache.controller.restore import RestoreStager
from hicache.controller.verify import RestoreMismatch
from hicache.dataplane.aimed import issue_aimed
from hicache.distributed.agreement import NO_SLOT, Agreement, Local
from hicache.distributed.collectives import Collectives
from hicache.distributed.ledger import AckedWrite, L3Writes
from hicache.distributed.rankview import rank_view
from hicache.dataplane.faults import FaultInjector, SimulatedCrash
from hicache.dataplane.handles import TransferHandle, TransferStatus
from hicache.dataplane.plane import DataPlane
from hicache.errors import (
    ConfigError, CorruptSlot, HiCacheError, IllegalTransition, InvariantViolation, OutOfPages,
    RequestTooLarge, ReservationAborted, RestorePending, StorageError, TransferError,
    UnreadableSlot,
)
from hicache.policy import CostModel, DecisionLog, make_policy
from hicache.policy.decisions import CHOICES
from hicache.policy.policies import Decision, price_candidates
from hicache.pools.presets import SINGLE_POOL, group as preset_group
from hicache.pools.spec import REPLICATED
from hicache.tiers import TIERS, Direction, Tier
from hicache.trace import Tracer
from hicache.tree import MatchResult, TreeNode

if TYPE_CHECKING:  # torch-heavy: imported only when a plane with bytes is built
    from hicache.dataplane.engine import TransferEngine
    from hicache.dataplane.groupengine import GroupTransferEngine
    from hicache.producers import KVProducer

__all__ = ["CacheController", "RestoreMismatch"]

BAD_SLOT = (CorruptSlot, UnreadableSlot)  # a read's bad-slot errors, in C4's reason order
BAD_SLOT_REASONS = ("corrupt", "unreadable")


class CacheController:
    def __init__(self, config: CacheConfig, producer: KVProducer | None = None, *,
                 faults: FaultInjector | None = None, tracer: Tracer | None = None,
                 engine: DataPlane | None = None, collectives: Collectives | None = None) -> None:
        """`engine`: the data plane to drive (e.g. a `NullEngine`, whose completions the caller
        chooses op by op); None builds a `TransferEngine` from `config`. A plane without
        bytes (`has_bytes` False) gets no producer, no verifier and no digests: recompute
        is a no-op and torch is never imported (planes.py; its ConfigErrors). `faults` serves the controller's own
        sites (ALLOC_Ln, CRASH_BEFORE_PUBLISH, aimed faults) and, when the controller builds
        the engine, the data plane's; a caller-built engine takes its injector itself (pass
        the same one). `collectives`: this rank's, for a tensor-parallel cache (spec/tp.md;
        None: one rank): every rank agrees at the points of spec/tp.toml, the first (C0)
        here, before anything is built -- ConfigError when the ranks' configurations differ."""
        self.agree = Agreement(collectives)
        self.agree.startup(config.fingerprint())
        self.tp = self.agree.size > 1  # the same on every rank: no collective depends on it
        self.admissions = 0  # admit calls past the size check: equal on every rank (SPMD)
        self.rank_checks = 0  # cross-rank checks passed (C7-C9)
        self.config = config
        g = config.kv
        pools = config.group  # None: the single-pool plane (mha)
        self.group = pools or preset_group(SINGLE_POOL)  # what a partly landed S2H is clamped by
        plane = choose_plane(config, engine, producer, faults)
        self.l3_writes = L3Writes(self.agree.rank)  # what this rank wrote to L3 (I11)
        self.engine: DataPlane = plane.engine
        self._bytes = plane.byte_plane  # the engine again when it has bytes, else None
        self.producer: KVProducer | None = plane.producer
        self.cp = ControlPlane(
            g.page_size, (config.l1_pages, config.l2_pages, config.l3_slots),
            check_mode=config.check_mode, tracer=tracer, pools=pools,
            pool_capacities=config.pool_capacities, hit_policy=config.hit_policy,
        )
        bind_group(plane, self.cp.tables, self.group)  # anchor pages -> every pool's pages
        # Across ranks, rank 0's L3 copy of each replicated pool is the only one (C6a, C6b).
        self.replicas = ReplicatedL3(self.cp, self.agree, self.group, plane.byte_plane)
        if self.replicas.pools:
            try:
                self.replicas.share()
            except BaseException:
                plane.engine.close()
                raise
        if plane.byte_plane is not None:
            self.cp.digests = CachedDigests(plane.byte_plane.digests, self.cp.tables)
        self.model = CostModel()
        self.policy = make_policy(config.policy, self.model)
        self.decisions = DecisionLog()
        self.metrics = Metrics()
        self.handles: dict[int, TransferHandle] = {}
        # Across ranks a window may be freed on one rank only: chains are planned without
        # windows (the same on every rank) and a freed window refuses its rank's issue (C2).
        self.backups = BackupPlanner(self.cp, config.write_policy, windows=not self.tp)
        self.l3 = L3Health(self.cp, self.metrics)
        # The rooms call back into the facade through a weak proxy: a strong back-reference
        # would make a cycle that keeps a closed controller's pools (GPU and pinned memory)
        # alive until the garbage collector happens to run.
        me = weakref.proxy(self)
        self.evictor = Evictor(self.cp, self.metrics, config.write_policy,
                               lambda node: me._back_up_now(node), windows=not self.tp)
        self.verifier = plane.verifier  # None: bytes are not compared (no bytes, or verify off)
        self.stager = RestoreStager(self.cp, self.metrics,
                                    lambda d, chain, rid: me.issue(d, chain, rid),
                                    lambda: me._after_part_dropped(), plane.verifier,
                                    config.promotion, share=config.load_back_overlap == "share")
        self._observed: set[Direction] = set()  # directions whose warm-up transfer was seen
        self.hooks = ControllerFaults(faults)  # ALLOC_Ln and the crash before publication

    @property
    def transfer_engine(self) -> TransferEngine:
        """The real data plane (pools, L3 file, movers). ConfigError on a byte-free plane, and
        on a pool group's (`byte_plane` is either)."""
        if self._bytes is None:
            raise ConfigError("engine", "this controller drives a data plane without bytes "
                              "(has_bytes is False): it has no pools; use `engine` for transfers")
        from hicache.dataplane.engine import TransferEngine  # torch is in: a byte plane

        if not isinstance(self._bytes, TransferEngine):
            raise ConfigError("engine", "this controller drives a pool group's data plane; "
                              "use `byte_plane` (a GroupTransferEngine)")
        return self._bytes

    @property
    def byte_plane(self) -> TransferEngine | GroupTransferEngine:
        """The data plane with bytes, single-pool or group. ConfigError on a byte-free plane."""
        if self._bytes is None:
            raise ConfigError("engine", "this controller drives a data plane without bytes "
                              "(has_bytes is False)")
        return self._bytes

    @property
    def faults(self) -> FaultInjector | None:
        """The injector of the controller's own sites and aims (settable: a new schedule)."""
        return self.hooks.faults

    @faults.setter
    def faults(self, faults: FaultInjector | None) -> None:
        self.hooks.faults = faults

    @property
    def crashed(self) -> SimulatedCrash | None:
        """The injected crash this controller died of (then only `close` runs), or None."""
        return self.hooks.crashed

    @property
    def restores(self) -> dict[int, Materialization]:
        """Live requests' restores, by request id."""
        return self.stager.restores

    # -- requests ---------------------------------------------------------------------------

    def admit(self, request_id: int, tokens: Sequence[int]) -> Materialization:
        """Match, decide, pin the planned nodes and issue the restore the policy chose (it then
        proceeds on ticks; with `prefetch=False` this call blocks until it settles).

        Raises, with nothing changed: `RequestTooLarge` (the prompt needs more pages than L1
        has), `HiCacheError` (the request id is already live). A restore that cannot be
        issued (no room, L3 offline) is not an error: its tokens are recomputed and the
        fallback is counted by reason."""
        self.hooks.refuse_if_crashed()
        g = self.config.kv
        pages_needed = -(-len(tokens) // g.page_size)
        if pages_needed > self.config.l1_request_pages:
            raise RequestTooLarge(request_id, len(tokens), pages_needed, self.config.l1_request_pages)
        every = self.config.rank_check_every
        if self.tp and every and self.admissions and self.admissions % every == 0:
            self.check_ranks()  # C7-C9, before this admission changes anything
        self.admissions += 1
        # The last prompt token is always computed (it yields the first output's logits), so
        # a hit may cover at most len - 1 tokens (the insert guard of spec/tree.md).
        prompt = max(len(tokens) // g.page_size * g.page_size, 1)  # the page-aligned prompt
        # C1a's by-products: (this rank's own hits, its decision on them, rank 0's choice code
        # or None when rank 0's own hits were cut).
        own: list[tuple[tuple[int, int, int], Decision, int | None]] = []
        m = self.cp.begin_request(request_id, tokens, match_len=len(tokens) - 1,
                                  agree=(lambda m: self._agree_hits(m, prompt, own))
                                  if self.tp else None)
        l1, l2, l3 = self._policy_hits(m)
        if own and own[0][0] == (l1, l2, l3):
            decision = own[0][1]  # the agreed hits are this rank's own: so is the decision
        else:
            decision = self.policy.decide(l1, l2, l3, prompt, g.bytes_per_token)
        if self.tp:  # C1a (or C1b): rank 0's choice (a cost model's timings are its own)
            code = own[0][2]
            if code is None:  # rank 0's own hits were cut: it chooses again, on the agreed ones
                code = self.agree.choice(CHOICES.index(decision.choice))
            chosen = CHOICES[code]
            if chosen != decision.choice:
                cands = price_candidates(self.model, l1, l2, l3, prompt, g.bytes_per_token)
                decision = cands.decision(chosen, f"rank 0's choice ({chosen}; this rank's: "
                                                  f"{decision.choice}, {decision.reason})")
        mat = Materialization(request_id, tuple(tokens), decision, self.decisions.record(decision), m)
        self.stager.restores[request_id] = mat
        self.metrics.prompt_tokens += len(tokens)
        self.metrics.hit_tokens["L1"] += l1
        clipped, replayed = self.cp.windows.share(m.path, m.lengths[0])
        self.metrics.window_clipped_tokens += clipped
        self.metrics.window_recomputed_tokens += replayed
        self.metrics.decisions[decision.choice] += 1
        if decision.choice == "recompute" and decision.extension_tokens:
            self.metrics.policy_skips += 1
        self.backups.after_match(m.handles[0])
        if decision.choice != "recompute":
            target = l1 + decision.extension_tokens[decision.choice]
            plan = plan_parts(self.cp, m, decision.choice, target, unreadable=self.l3.stops_at)
            self.stager.start(mat, plan)
        if not self.config.prefetch:
            while not mat.done:
                self.wait(request_id, timeout_s=None)
                self.tick()
        return mat

    def check_ranks(self) -> None:
        """The cross-rank check (spec/tp.md C7-C9): every rank must call it at the same point
        of its script (`rank_check_every` calls it before every Nth admission). Raises
        `InvariantViolation` on every rank alike when the ranks' views differ, and poisons
        the control plane: the ranks are no longer one cache. One rank: nothing to compare."""
        if not self.tp:
            return
        self.hooks.refuse_if_crashed()
        found = self.agree.check(rank_view(self))
        if found:
            violation = InvariantViolation(tuple(found), "the cross-rank check (C7-C9)")
            self.cp.poison(violation)
            raise violation
        self.rank_checks += 1

    def _policy_hits(self, m: MatchResult) -> tuple[int, int, int]:
        """The hits, in tokens, the policy decides on for match `m`: L1, L2, and L3 as far
        as it may serve (a quarantined or offline L3 copy serves nothing)."""
        return m.lengths[0], m.lengths[1], max(m.lengths[1], self.l3.servable_len(m))

    def _agree_hits(self, m: MatchResult, prompt: int,
                    own: list[tuple[tuple[int, int, int], Decision, int | None]]) -> tuple[int, ...]:
        """C1a (spec/tp.md): the per-tier hits, in tokens, every rank uses for match `m` (this
        rank's own) of a prompt of `prompt` page-aligned tokens (at least 1). Appends to `own`
        this rank's own hits, its decision on them and rank 0's choice code (None: C1b must
        ask rank 0 again)."""
        g = self.config.kv
        ps = g.page_size
        deepest = self.cp.leading_run(m.path, Tier.L1)  # the L1 run, before any window rule
        run = list(m.path[:m.path.index(deepest) + 1]) if deepest is not None else []
        bounds = [sum(len(n.key) for n in run) // ps, m.lengths[1] // ps, m.lengths[2] // ps]
        hits = self._policy_hits(m)
        decision = self.policy.decide(*hits, prompt, g.bytes_per_token)
        windows = self.cp.windows
        # The mask spans the prompt's page ends: a length every rank knows (F17).
        mask = windows.endpoint_mask(run, prompt // ps) if windows.hit_pages else None
        agreed, rank0 = self.agree.admit(bounds, m.lengths[0] // ps, CHOICES.index(decision.choice),
                                         mask)
        own.append((hits, decision, rank0))
        return tuple(pages * ps for pages in agreed)

    def _agree_served(self, mat: Materialization) -> tuple[TreeNode | None, bool]:
        """C1c, carrying C3: (the planned node every rank may serve through, whether every
        rank can make the L1 room for the rest), by masks over the prompt's page ends (their
        length is the prompt's: the same on every rank, whatever each rank's restore plan
        holds now, F17). The room entry of each endpoint this rank can serve says whether it
        could compute the rest after it."""
        ps = self.config.kv.page_size
        ends: dict[int, TreeNode] = {}  # page end -> the servable planned node ending there
        for i, ok in enumerate(self.cp.servable_mask(mat.nodes)):
            if ok and i:  # (a planned node past the servable run may be gone from the tree)
                ends[self.cp.tree.prefix_tokens(mat.nodes[i - 1]) // ps] = mat.nodes[i - 1]
        servable = [0] * (len(mat.tokens) // ps + 1)
        room = [1] * len(servable)
        room[0] = int(self._room_for(mat, None))
        for end, node in ends.items():
            servable[end], room[end] = 1, int(self._room_for(mat, node))
        served, room_all = self.agree.serve(servable, room)
        return (ends.get(served) if served else None), room_all

    def _room_for(self, mat: Materialization, deepest: TreeNode | None) -> bool:
        """Whether this rank's L1 can take the pages a prefill of `mat` computes when it
        serves through `deepest` (None: through the request's `cached_len`): free pages, or
        pages eviction could free without touching the served prefix."""
        ps = self.config.kv.page_size
        start = self.cp.tree.prefix_tokens(deepest) if deepest is not None else self.cp.cached_len(mat.request_id)
        need = (-(-len(mat.tokens) // ps) * ps - start) // ps
        if need <= 0:
            return True
        keep = self.cp.tree.path_to_root(deepest) if deepest is not None else ()
        return self.cp.free_pages(Tier.L1) >= need or self.evictor.can_make_room_l1(need, keep)

    def ready(self, request_id: int) -> bool:
        """Whether the request's restore has settled (`prefill` may run). UnknownRequest for
        an id that is not live."""
        return self._restore(request_id).done

    def wait(self, request_id: int, timeout_s: float | None = 0.05) -> None:
        """Block (GIL released) until one of the transfers the request waits for (its own or
        a shared load-back) finishes, or `timeout_s` passes (None: no limit). Spinning on
        `tick` instead starves the L3 I/O threads of the GIL."""
        mat = self._restore(request_id)
        for op_id in sorted(mat.ops | mat.awaited):
            if op_id in self.handles:
                self.handles[op_id].wait(timeout_s)
                return

    def prefill(self, request_id: int) -> int:
        """Use what the restore delivered, recompute the rest of the page-aligned prompt,
        insert it, and queue its backup. Returns the tokens recomputed.

        Check, then change: `UnknownRequest` (not admitted, or finished), `RestorePending`
        (tick until `ready`), and `OutOfPages` (L1 cannot hold the pages to compute, because
        other requests hold it locked) are raised before the request changes -- its
        `cached_len` and the restore counters move once, on the call that succeeds. A prefill
        refused for room evicts nothing (it checks that eviction could make the room first);
        one that succeeds may evict unlocked cached pages to make it."""
        self.hooks.refuse_if_crashed()
        mat = self._restore(request_id)
        if not mat.done:
            raise RestorePending(request_id)
        deepest, room = self.stager.deepest_in_l1(mat), None
        if self.tp:  # C1c: the largest planned node every rank can serve, and (C3) the room
            deepest, room = self._agree_served(mat)
        g = self.config.kv
        start = self.cp.tree.prefix_tokens(deepest) if deepest is not None else self.cp.cached_len(request_id)
        # Compute through the prompt's last token: whole pages are inserted, a partial last
        # page (the tail) is computed into a private page that is never published.
        end = -(-len(mat.tokens) // g.page_size) * g.page_size
        todo = end - start
        if todo > 0:
            # The restored nodes are pinned in L1 (and the prefix locked): this evicts only
            # what nobody holds, never the prefix about to be served (a failed restore
            # stage unpins it; another request may have loaded it into L1 since).
            keep = self.cp.tree.path_to_root(deepest) if deepest is not None else ()
            need, free = todo // g.page_size, self.cp.free_pages(Tier.L1)
            if room is None:  # one rank (across ranks C3 rode on C1c: refused unless all can)
                room = self._room_for(mat, deepest)
            if not room:
                raise OutOfPages("L1", need, free)  # refused: nothing evicted
            self.evictor.make_room(Tier.L1, need, keep=keep)
            free = self.cp.free_pages(Tier.L1)
            if free < need:
                raise OutOfPages("L1", need, free)
        # -- change (nothing below can run out of L1 pages) --
        restored_from = self.cp.cached_len(request_id)
        if deepest is not None:
            self.cp.advance_cached_len(request_id, deepest)
        self.cp.unpin(request_id)  # cached_len covers every pin now: the prefix lock holds it
        cached = self.cp.cached_len(request_id)
        if deepest is not None:
            self.stager.served(mat, restored_from, cached)
        self.metrics.restored_unused_pages += max(0, mat.landed_pages - (cached - restored_from) // g.page_size)
        recomputed = max(0, len(mat.tokens) - cached)
        started = time.perf_counter()
        if todo > 0:
            self._compute(mat, cached, end)
        self.metrics.recomputed_tokens += recomputed
        observed = (mat.ready_at or started) - mat.started_at + (time.perf_counter() - started)
        if observed > 0:
            self.decisions.settle(mat.decision_id, observed)
        return recomputed

    def finish(self, request_id: int) -> None:
        """End a request, finished or aborted: cancel its restore ops (the data plane
        quiesces each first), stop waiting for shared ones, release what it holds (private
        pages, restore pins, its prefix lock). Backups are the cache's and continue. A request
        that shared a cancelled load-back loads those pages itself. Nothing it owned stays
        behind (B03). UnknownRequest for an id that is not live."""
        self.hooks.refuse_if_crashed()
        mat = self.stager.restores.pop(request_id, None)
        if mat is not None:
            self.stager.forget(mat)
            self._cancel_own(mat)
        self.cp.end_request(request_id)

    def cancel_restore(self, request_id: int) -> int:
        """Stop restoring but keep the request (a scheduler that gives up on a slow load-back):
        cancel its restore ops as `finish` does, stop waiting for shared ones, issue nothing
        more, and release the pins of what did not reach L1. The restore is then settled:
        `prefill` serves the prefix L1 holds and recomputes the rest. A cancel, not a failure
        (no fallback counted). Returns the ops cancelled (0 when the restore had settled
        already). UnknownRequest for an id that is not live."""
        self.hooks.refuse_if_crashed()
        mat = self._restore(request_id)
        if mat.done:
            return 0
        cancelled = len(mat.ops)
        self.stager.forget(mat)
        self._cancel_own(mat)
        self.stager.abandon(mat)
        return cancelled

    def _cancel_own(self, mat: Materialization) -> None:
        """Cancel the restore's own ops (each handle quiesces first) and apply each."""
        for op_id in sorted(mat.ops):
            self.handles[op_id].cancel()
            self._settle(op_id)

    # -- progress ---------------------------------------------------------------------------

    def evict(self, tier: Tier | str, n_pages: int) -> int:
        """Eviction pressure from outside the controller (the engine needs the memory): free
        at least `n_pages` pages of `tier` (more when a node's value goes whole; fewer only
        when no candidate is left) through the same loop and write-back hook as the
        controller's own make-room (spec/eviction.md), counted in `evicted_pages`. Returns the
        pages freed. A caller MUST NOT call `ControlPlane.evict` directly: under write-back it
        would skip the backup an unbacked L1 victim is owed."""
        return self.evictor.evict(Tier(tier), n_pages)

    def tick(self) -> None:
        """Observe every transfer once; apply what completed; continue restores and backups.
        Transfer failures become fallbacks or dropped backups (counted), an unusable L3 file
        takes L3 offline: nothing is raised in normal operation (spec/restore.md)."""
        self.hooks.refuse_if_crashed()
        self._conclude(sorted(self.handles))  # C4, unconditionally: every rank, every tick
        self.stager.advance()
        for direction, chain in self.backups.due():
            self._issue_backup(direction, chain)
        self.l3.drop_unread()  # quarantined copies (offline: all) once no reader holds them

    def drain(self, timeout_s: float = 60.0) -> None:
        """Wait for every transfer (backups included) and apply it. TransferError if some are
        still pending after `timeout_s` seconds."""
        self.hooks.refuse_if_crashed()
        deadline = time.perf_counter() + timeout_s
        while self.handles or self.backups.pending:
            for h in list(self.handles.values()):
                h.wait(max(0.0, deadline - time.perf_counter()))
            self.tick()
            if time.perf_counter() > deadline:
                raise TransferError(f"drain: {len(self.handles)} transfer(s) still pending after {timeout_s} s")
            if not self.handles:
                break

    def close(self) -> None:
        """Cancel everything in flight, end every request, close the data plane. Raises
        nothing in normal operation; idempotent. On a poisoned control plane (an invariant
        broke; it refuses every transition) the data plane is still quiesced and closed: each
        handle is cancelled and waited for, and the plane's records are left as they were for
        diagnosis (spec/invariants.md, "A poisoned plane"). After an injected crash
        (`SimulatedCrash`) the same: nothing in flight is published (spec/faults.md)."""
        if self.cp.poisoned is not None or self.crashed is not None:
            # A crashed process publishes nothing more (spec/faults.md): quiesce, release.
            for handle in self.handles.values():
                handle.cancel()  # returns once the hardware no longer touches its pages
            self.handles.clear()
            self.engine.close()
            self.cp.digests = None
            return
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
        `StorageError` for an L3 transfer when the L3 file is lost (L3 is then offline), and
        `TransferError` when the data plane refuses the transfer (no workspace); callers in
        this package turn the last into a fallback or a dropped backup, never an escape.
        Faults (`faults`): the op aimed at (`FaultInjector.aim`), and ALLOC_L1/L2/L3 (the
        reservation fails as if the tier were full: OutOfPages, nothing changed).

        Across ranks (spec/tp.md C2) the issue is two-phase: each rank reserves and issues
        here, the ranks agree, and unless every rank succeeded with the same pages every rank
        releases what it took and raises `ReservationAborted` (an OutOfPages): no rank
        evicts and retries alone."""
        self.hooks.refuse_if_crashed()
        parent = chain[0].parent
        assert parent is not None, "the root is never transferred"
        need = sum(n.num_pages for n in chain)
        op, handle, error, took_id = self._issue_here(direction, chain, request_id, need, parent)
        if self.tp:
            agreed, lost = self.agree.reserve(error is None, need, isinstance(error, StorageError))
            if not agreed and op is not None and handle is not None:
                handle.cancel()  # quiesced: the hardware no longer touches its pages
                self.cp.cancel(op.op_id)
            if not took_id:
                self.cp.skip_op_id()  # the id the ranks that issued took: ids stay equal
            if lost:  # some rank's L3 file is gone: L3 goes offline on every rank
                if self.l3.online:
                    self.l3.take_offline(error if isinstance(error, StorageError) else StorageError(
                        self.engine.l3_path, "another rank's L3 file was lost"))
                raise error if isinstance(error, StorageError) else StorageError(
                    self.engine.l3_path, f"L3 is offline: {self.l3.offline_reason}")
            if not agreed:
                raise ReservationAborted(str(direction.target), need,
                                         self.cp.free_pages(direction.target), error)
        if error is not None:
            raise error
        assert op is not None and handle is not None  # Verify: no error means an op in flight.
        self.handles[op.op_id] = handle
        return op

    def _issue_here(self, direction: Direction, chain: list[TreeNode], request_id: int | None,
                    need: int, parent: TreeNode
                    ) -> tuple[PendingOp | None, TransferHandle | None, HiCacheError | None, bool]:
        """This rank's half of `issue`: the op and its handle, or the error that refused it
        (whatever was taken released again), and whether this transfer took an op id. (Not
        "did the next id move": making room may issue write-back's own transfers first, each
        with its ids and agreement; only this transfer's id may be missing on a rank.)"""
        try:
            if not self.l3.online and Tier.L3 in (direction.source, direction.target):
                raise StorageError(self.engine.l3_path, f"L3 is offline: {self.l3.offline_reason}")
            aim = self.hooks.aimed(direction, request_id)
            # Keep the chain's parent: evicting it would open a backup gap under the chain.
            self.evictor.make_room(direction.target, need, keep=[parent])
            self.hooks.reserve(direction.target, need, self.cp.free_pages(direction.target), aim)
            op = self.cp.issue(direction, chain, request_id)
        except HiCacheError as e:
            return None, None, e, False
        if aim is not None and aim.action == "crash":
            self.hooks.crash_ops.add(op.op_id)
        if direction is Direction.H2S and not self.l3_writes.writes_any(self.group):
            return op, self._acked(op), None, True  # C6b: this rank writes none of these pools
        try:
            handle = issue_aimed(self.engine, direction, op.source_pages, op.target_pages, aim,
                                 self.hooks.landing(aim, self.group, need))
        except HiCacheError as e:
            self.cp.fail(op.op_id)
            if isinstance(e, StorageError):
                self.l3.take_offline(e)
            return None, None, e, True
        return op, handle, None, True

    def _acked(self, op: PendingOp) -> TransferHandle:
        """A finished handle for an H2S this rank does not write (spec/tp.md C6b)."""
        handle = AckedWrite(op.direction, 0)
        handle.finish(True)
        return handle

    def _conclude(self, op_ids: Sequence[int]) -> None:
        """C4 over ops `op_ids` (issue order): apply each that ended on every rank, or failed
        on some rank (a rank still moving it cancels first), keeping the fewest nodes any
        rank landed. One rank: each final op, as it ended."""
        local: list[Local] = []
        for op_id in op_ids:
            handle = self.handles[op_id]
            status = handle.poll()
            nodes = len(self.cp.ops[op_id].nodes)
            reason, slot = 0, NO_SLOT
            if isinstance(handle.error, (CorruptSlot, UnreadableSlot)):
                reason, slot = BAD_SLOT.index(type(handle.error)) + 1, min(handle.error.slots)
            if status is TransferStatus.FAILED:
                kept = (clamped_nodes(self.group, self.cp.ops[op_id].nodes, handle.landed)
                        if self.cp.ops[op_id].direction is Direction.S2H and handle.landed is not None
                        else 0)
                local.append((True, True, kept, reason, slot))
            else:
                local.append((status.final, False, nodes, reason, slot))
        agreed = self.agree.completion(local)
        if self.replicas.pools:
            self.replicas.ack([op_id for op_id, (ended, failed, *_) in zip(op_ids, agreed)
                          if ended and not failed
                          and self.cp.ops[op_id].direction is Direction.H2S])
        for op_id, (ended, failed, kept, reason, slot) in zip(op_ids, agreed):
            if op_id not in self.handles or not (ended or failed):
                continue  # settled meanwhile (a dropped restore part cancels its ops), or waits
            handle = self.handles[op_id]
            if failed and not handle.status.final:
                handle.cancel()  # another rank's copy failed: stop moving ours first
            clamp = kept if failed and (kept or handle.landed is not None) else None
            bad = (BAD_SLOT_REASONS[reason - 1], slot) if self.tp and reason else None
            self._settle(op_id, failed=failed, kept=clamp, bad=bad)

    def _settle(self, op_id: int, failed: bool | None = None, kept: int | None = None,
                bad: tuple[str, int] | None = None) -> None:
        """Apply one op's end to the control plane, then tell whoever cares. `failed`/`kept`:
        the agreed end (C4): failed on some rank, keeping `kept` leading nodes; None: the
        handle's own final status (a cancel, the caller's own). `bad`: across ranks, the bad
        L3 slot some rank's read found (reason, slot), dropped on every rank; one rank: the
        handle's own error says."""
        handle = self.handles.pop(op_id)
        op = self.cp.ops[op_id]
        status = handle.status
        if failed:
            status = TransferStatus.FAILED  # on some rank: on every rank
        elif failed is not None and status is not TransferStatus.CANCELLED:
            status = TransferStatus.DONE  # on every rank
        crash = self.hooks.crash_now(op_id, str(op.direction)) if status is TransferStatus.DONE else None
        if crash is not None:
            self.handles[op_id] = handle  # still unpublished: close() releases it
            raise crash
        self.metrics.transfer(op.direction, handle.nbytes, status, handle.timings)
        if status is TransferStatus.DONE:
            self.cp.complete(op_id)
            self._sample(op.direction, handle)
            if op.direction is Direction.D2H:
                self.backups.after_d2h(op.nodes[-1])
            elif op.direction is Direction.H2S:
                self.l3_writes.record(op_id, self.group, sum(n.num_pages for n in op.nodes),
                                      self._pool_bytes(),
                                      self.replicas.written(isinstance(handle, AckedWrite)))
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
        self.stager.settled(op, status, kept)
        backup = op.direction in (Direction.D2H, Direction.H2S)
        if backup and status is TransferStatus.FAILED:  # a cancel (shutdown) drops nothing
            self.metrics.drop("backup_failed", sum(len(n.key) for n in op.nodes))
        if self.tp:
            if bad is not None:  # some rank's read found it: every rank drops that copy
                self.l3.bad_slot(op.nodes, bad[1], bad[0])
        elif isinstance(handle.error, (CorruptSlot, UnreadableSlot)):
            reason = "corrupt" if isinstance(handle.error, CorruptSlot) else "unreadable"
            for slot in handle.error.slots:  # after the restore let go of its pins
                self.l3.bad_slot(op.nodes, slot, reason)

    def _pool_bytes(self) -> dict[str, int]:
        """Bytes of one own page per backed-up pool (the single pool: the geometry's)."""
        if self.config.group is None:
            return {p.name: self.config.kv.bytes_per_page for p in self.group.pools}
        return {p.name: p.bytes_per_page for p in self.group.backed_up().pools}

    def _sample(self, direction: Direction, handle: TransferHandle) -> None:
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

    def _issue_backup(self, direction: Direction, chain: list[TreeNode]) -> None:
        """Issue one planned backup; when no room can be made, or L3 is lost, it is dropped
        and its tokens counted, not retried."""
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

    def _back_up_now(self, node: TreeNode) -> bool:
        """Write-back: back `node` (and the chain it needs) up to L2 and wait. False if that
        cannot be done (no room, or blocked); the caller counts the victim's loss, once."""
        chain = chain_lacking(self.cp, node, Direction.D2H, windows=not self.tp)
        if not chain or chain[-1] is not node:
            return False
        try:
            op = self.issue(Direction.D2H, chain)
        except (OutOfPages, TransferError):  # across ranks, a freed window aborts it (C2)
            return False
        self.handles[op.op_id].wait()
        self._conclude([op.op_id])  # C4 for this one op: its end, agreed
        return self.cp.holds(node, Tier.L2)

    def _after_part_dropped(self) -> None:
        if not self.l3.online:
            self.l3.drop_unread()  # what the part held in L3 is free to go now

    # -- after a restore ----------------------------------------------------------------------

    def _compute(self, mat: Materialization, start: int, end: int) -> None:
        """Recompute tokens `[start, end)` into private L1 pages and insert them."""
        rid = mat.request_id
        new_pages = self.cp.compute(rid, end - start)
        prefix = self.cp.prefix_pages(self.cp.prefix_node(rid), Tier.L1)
        if self.producer is not None and self._bytes is not None:  # a byte-free plane computes nothing
            padded = tuple(mat.tokens) + (0,) * (end - len(mat.tokens))
            seconds = self.producer.produce(padded, start, end, self._bytes.l1.tensor, prefix, new_pages)
            self.model.observe("recompute", end - start, seconds)
        self.cp.insert(rid)
        self.backups.after_insert(self.cp.prefix_node(rid))

    # -- helpers ----------------------------------------------------------------------------

    @property
    def l3_online(self) -> bool:
        """Whether L3 serves restores and takes backups (False once its file was lost)."""
        return self.l3.online

    @property
    def l3_offline_reason(self) -> str | None:
        return self.l3.offline_reason

    def alive(self, node: TreeNode) -> bool:
        """Whether `node` is still in the tree (nodes are removed when empty everywhere)."""
        return self.cp.is_live(node)

    def _restore(self, request_id: int) -> Materialization:
        mat = self.stager.restores.get(request_id)
        if mat is None:
            raise UnknownRequest(request_id)
        return mat

    # -- observation ------------------------------------------------------------------------

    def pending(self) -> list[PendingTransfer]:
        """The transfers in flight (op id, direction, request, stage; controller/pending.py),
        in issue order: what a driver may finish or fail next through `handles[op_id]`."""
        return pending_transfers(self.cp, self.stager)

    def status(self) -> dict[str, object]:
        return {
            "tiers": {str(t): self.cp.usage(t) for t in TIERS},
            "pending_ops": len(self.cp.ops), "requests": len(self.cp.requests),
            "engine": self.engine.status(), "cost_model": self.model.state(),
            "policy": self.policy.name, "decisions": self.decisions.summary(),
            "l3": "online" if self.l3.online else f"offline: {self.l3.offline_reason}",
            "invariant_checks": {"run": self.cp.checker.checks_run, "violations": self.cp.checker.violations_found},
        }

