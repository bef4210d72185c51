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

Contract: this class is the facade; each concept has its own room and the facade only routes:

    build.py       the parts below, built in order (none refers back to the facade)
    restore.py     restore staging: parts, sharing, promotion, what a settled op means
    transfers.py   issue, conclude (C4) and settle transfers, planned backups included
    ranks.py       what this rank brings to the admit and serve agreements (C1a-C1c, C3)
    eviction.py    eviction and the write-back it triggers
    backup.py      the backup planner (write policy)
    l3health.py    L3 faults: bad slots, a lost file
    verify.py      restored bytes compared with what was computed

Every state change is a `ControlPlane` transition (invariants checked per the check mode),
and every question about a node is one of its queries: no module here reads a node's state,
value or lock. What each operation may raise, and the rules for pins, sharing and ends with
ops in flight, are in spec/restore.md; eviction in spec/eviction.md.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from hicache.controller.ahead import Ahead, compute_ahead, landing, take, write_kv, written
from hicache.controller.build import build_parts
from hicache.controller.config import CacheConfig
from hicache.controller.materialize import Materialization, plan_parts
from hicache.controller.pending import (
    LeakedOp,
    PendingTransfer,
    pending_transfers,
    quiesce_or_leak,
)
from hicache.controller.verify import RestoreMismatch
from hicache.core.records import PendingOp, UnknownRequest
from hicache.core.snapshot import RankView
from hicache.core.tiers import TIERS, Tier
from hicache.core.trace import Tracer
from hicache.core.tree import MatchResult
from hicache.dataplane.faults import FaultInjector, SimulatedCrash
from hicache.dataplane.handles import TransferHandle
from hicache.dataplane.leaks import park
from hicache.dataplane.plane import DataPlane
from hicache.distributed.agreement import Local
from hicache.distributed.collectives import Collectives
from hicache.distributed.rankview import build_view
from hicache.errors import (
    ConfigError,
    IllegalTransition,
    InvariantViolation,
    OutOfPages,
    QuiesceTimeout,
    RequestTooLarge,
    RestorePending,
    TransferError,
)
from hicache.policy.policies import prefill_end

if TYPE_CHECKING:  # torch-heavy: imported only when a plane with bytes is built
    from hicache.dataplane.engine import TransferEngine
    from hicache.producers import KVProducer
    from hicache.producers.base import LayerwiseProducer

__all__ = ["CacheController", "RestoreMismatch"]


class CacheController:
    def __init__(
        self,
        config: CacheConfig,
        producer: KVProducer | None = None,
        *,
        faults: FaultInjector | None = None,
        tracer: Tracer | None = None,
        engine: DataPlane | None = None,
        collectives: Collectives | None = None,
    ) -> None:
        """`engine`: the data plane to drive (e.g. a `NullEngine`, whose completions the caller
        chooses op by op); None builds a `TransferEngine` from `config`. A plane without
        bytes (`has_bytes` False) gets no producer and no verifier: recompute moves no bytes
        and torch is never imported (planes.py; its ConfigErrors); one that keeps content
        tags (a NullEngine, one rank) is told each compute, and its tags are the digests. `faults`
        serves the controller's own sites (ALLOC_Ln, CRASH_BEFORE_PUBLISH, aimed faults) and, when
        the controller builds the engine, the data plane's; a caller-built engine takes its injector
        itself (pass the same one). `collectives`: this rank's, for a tensor-parallel cache
        (spec/tp.md; None: one rank): every rank agrees at the points of spec/tp.toml, the first
        (C0) here, before anything is built -- ConfigError when the ranks' configurations differ."""
        p = build_parts(
            config, producer, faults=faults, tracer=tracer, engine=engine, collectives=collectives
        )  # the parts, none referring back to the controller (build.py)
        self.agree = p.agree
        self.tp = self.agree.tp
        self.admissions = 0  # admit calls past the size check: equal on every rank (SPMD)
        self.carried = False  # an admission's C1a carried C4 since the last tick (agreed)
        self.rank_checks = 0  # cross-rank checks passed (C7-C9)
        self.config = config
        self.group = p.group  # what a partly landed S2H is clamped by
        plane = p.plane
        self.l3_writes = p.l3_writes  # what this rank wrote to L3 (I11)
        self.engine: DataPlane = plane.engine
        self._bytes = plane.byte_plane  # the engine again when it has bytes, else None
        self.producer: KVProducer | None = plane.producer
        self.cp = p.cp
        self.replicas = p.replicas
        self.tagged = p.tagged  # a byte-free plane whose content tags I4 reads
        self.model, self.policy, self.decisions = p.model, p.policy, p.decisions
        self.metrics = p.metrics
        self.backups = p.backups
        self.l3 = p.l3
        self.evictor = p.evictor
        self.hooks = p.hooks  # ALLOC_Ln, the crash before publication, a cancel never ending
        self.ranks = p.ranks  # C1a-C1c, C3
        self.transfers = p.transfers
        self.handles = self.transfers.handles  # op id -> handle: what a driver finishes or fails
        self.leaked: list[LeakedOp] = []  # ops close() could not quiesce (spec/faults.md)
        self._closed = False
        self.verifier = plane.verifier  # None: bytes are not compared (no bytes, or verify off)
        self.stager = p.stager
        self._ahead: dict[int, Ahead] = {}  # request id -> KV computed on its landing restore

    @property
    def transfer_engine(self) -> TransferEngine:
        """The data plane with bytes (pools, L3 files, movers): `byte_plane`'s old name."""
        return self.byte_plane

    @property
    def byte_plane(self) -> TransferEngine:
        """The data plane with bytes, single-pool or group. ConfigError on a byte-free plane."""
        if self._bytes is None:
            raise ConfigError(
                "engine",
                "this controller drives a data plane without bytes "
                "(has_bytes is False): it has no pools; use `engine` for transfers",
            )
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
        """Match, decide, pin the planned nodes and issue the restore the policy chose (R36: in
        that order; it then proceeds on ticks; with `prefetch=False` this call blocks until it
        settles).

        Raises, with nothing changed: `RequestTooLarge` (the prompt needs more pages than L1
        has), `HiCacheError` (the request id is already live). A restore that cannot be
        issued (no room, L3 offline) is not an error: its tokens are recomputed and the
        fallback is counted by reason."""
        self.hooks.refuse_if_crashed()
        g = self.config.kv
        pages_needed = -(-len(tokens) // g.page_size)
        if pages_needed > self.config.l1_request_pages:
            raise RequestTooLarge(
                request_id, len(tokens), pages_needed, self.config.l1_request_pages
            )
        every = self.config.rank_check_every
        if self.tp and every and self.admissions and self.admissions % every == 0:
            self.check_ranks()  # C7-C9, before this admission changes anything
        self.admissions += 1
        # The last prompt token is always computed (it yields the first output's logits), so
        # a hit may cover at most len - 1 tokens (the insert guard of spec/tree.md).
        prompt = max(len(tokens) // g.page_size * g.page_size, 1)  # the page-aligned prompt
        # The policy prices every path through the prefill's end: the partial last page is
        # computed whatever is restored, so a restore pays a prefill (and its fixed cost) too.
        priced = max(prefill_end(len(tokens), g.page_size), 1)
        # Across ranks C1a carries C4 over the ops in flight (spec/tp.md, "C4 carried by
        # C1a"): each rank's ends, observed at the match, agreed by the gather, applied once
        # this admission pinned its plan (below), so the next tick makes no C4 of its own.
        flying = sorted(self.handles) if self.tp else []
        mine: list[Local] = []

        def agree(m: MatchResult) -> tuple[int, ...]:
            mine.extend(self.transfers.observe(flying))
            return self.ranks.hits(m, prompt, priced, mine)

        m = self.cp.begin_request(
            request_id, tokens, match_len=len(tokens) - 1, agree=agree if self.tp else None
        )
        carried, self.ranks.carried_ends = self.ranks.carried_ends, []
        l1, l2, l3 = self.ranks.policy_hits(m)
        decision = self.ranks.decide((l1, l2, l3), priced)  # across ranks, rank 0's choice
        mat = Materialization(
            request_id, tuple(tokens), decision, self.decisions.record(decision), m
        )
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
            self.stager.start(mat, plan, self.transfers.issue)
        if self.tp:
            # R85: the plan is pinned, so a bad slot carried here quarantines a copy it may
            # read, whose drop then waits for the pin (drop_unread), as after a tick's C4.
            self.transfers.apply(flying, mine, carried)
            self.l3.drop_unread()
            self.carried = True  # the next tick's ends rode on this C1a: it makes no C4
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
        self.hooks.refuse_if_crashed()
        if not self.tp:
            return
        found = self.agree.check(self.rank_view())
        if found:
            violation = InvariantViolation(tuple(found), "the cross-rank check (C7-C9)")
            self.cp.poison(violation)
            raise violation
        self.rank_checks += 1

    def rank_view(self) -> RankView:
        """This rank's view (hicache/distributed/rankview.py): what the cross-rank check
        compares (spec/invariants.md, I7-I11). Changes nothing."""
        plane = self._bytes  # a closed cache holds no bytes, on any rank
        per_pool = None if plane is None or plane.closed else plane.pool_digests
        return build_view(
            self.cp,
            rank=self.agree.rank,
            size=self.agree.size,
            hits={rid: tuple(mat.match.lengths) for rid, mat in self.restores.items()},
            restores={rid: mat.record() for rid, mat in self.restores.items()},
            log=self.agree.c.log,
            l3_writes=self.l3_writes,
            quiescent=not self.handles and not self.backups.pending,
            group=self.group,
            pool_digests=per_pool,
        )

    def ready(self, request_id: int) -> bool:
        """Whether `prefill` may run: the request's restore has settled, or (`layerwise`) it
        is landing layer by layer (controller/ahead.py). UnknownRequest for an id that is not
        live."""
        self.hooks.refuse_if_crashed()
        mat = self._restore(request_id)
        return mat.done or self._landing(mat) is not None

    def _landing(self, mat: Materialization) -> tuple[PendingOp, TransferHandle] | None:
        """The restore's H2D that `prefill` may compute on while it lands (R82), or None."""
        if not self.config.layerwise or self.tp or self._bytes is None:
            return None
        if not callable(getattr(self.producer, "compute_kv", None)):
            return None
        return landing(mat, self.cp, self.handles)

    def wait(self, request_id: int, timeout_s: float | None = 0.05) -> None:
        """Block (GIL released) until one of the transfers the request waits for (its own or
        a shared load-back) finishes, or `timeout_s` passes (None: no limit). Spinning on
        `tick` instead starves the L3 I/O threads of the GIL."""
        self.hooks.refuse_if_crashed()
        mat = self._restore(request_id)
        for op_id in sorted(mat.ops | mat.awaited):
            if op_id in self.handles:
                self.handles[op_id].wait(timeout_s)
                return

    def prefill(self, request_id: int) -> int:
        """Use what the restore delivered, recompute the rest of the page-aligned prompt,
        insert it, and queue its backup. Returns the tokens recomputed.

        Check, then change: `UnknownRequest` (not admitted, or finished), `IllegalTransition`
        (served already: a request is prefilled once), `RestorePending` (tick until `ready`),
        and `OutOfPages` (L1 cannot hold the pages to compute, because other requests hold it
        locked) are raised before the request changes -- its `cached_len` and the restore
        counters move once, on the call that succeeds. A prefill refused for room evicts
        nothing (it checks that eviction could make the room first); one that succeeds may
        evict unlocked cached pages to make it."""
        self.hooks.refuse_if_crashed()
        mat = self._restore(request_id)
        if mat.prefilled:  # whatever its room or its alignment: the call is wrong, not early
            raise IllegalTransition(
                "prefill", "L1", "-", f"request {request_id} is served already; finish it"
            )
        if not mat.done:
            self._settle_landing(mat)  # RestorePending unless it is landing layer by layer
        deepest, room = self.stager.deepest_in_l1(mat), None
        if self.tp:  # C1c: the largest planned node every rank can serve, and (C3) the room
            deepest, room = self.ranks.served(mat)
        g = self.config.kv
        start = (
            self.cp.tree.prefix_tokens(deepest)
            if deepest is not None
            else self.cp.cached_len(request_id)
        )
        # Compute through the prompt's last token: whole pages are inserted, a partial last
        # page (the tail) is computed into a private page that is never published.
        end = prefill_end(len(mat.tokens), g.page_size)
        todo = end - start
        if todo > 0:
            # The restored nodes are pinned in L1 (and the prefix locked): this evicts only
            # what nobody holds, never the prefix about to be served (a failed restore
            # stage unpins it; another request may have loaded it into L1 since).
            keep = self.cp.tree.path_to_root(deepest) if deepest is not None else ()
            need, free = todo // g.page_size, self.cp.free_pages(Tier.L1)
            if room is None:  # one rank (across ranks C3 rode on C1c: refused unless all can)
                room = self.ranks.room_for(mat, deepest)
            if not room:
                raise OutOfPages("L1", need, free)  # refused: nothing evicted (R25)
            self.evictor.make_room(Tier.L1, need, keep=keep, back_up=self.transfers.back_up_now)
            free = self.cp.free_pages(Tier.L1)
            if free < need:
                raise OutOfPages("L1", need, free)
        # -- change (nothing below can run out of L1 pages) --
        restored_from = self.cp.cached_len(request_id)
        if deepest is not None:
            self.cp.advance_cached_len(request_id, deepest)
        self.cp.unpin(request_id)  # R37: cached_len covers every pin now: the prefix lock holds it
        cached = self.cp.cached_len(request_id)
        if deepest is not None:
            self.stager.served(mat, restored_from, cached)
        # R38: a page the restore delivered and prefill did not serve is counted.
        self.metrics.restored_unused_pages += max(
            0, mat.landed_pages - (cached - restored_from) // g.page_size
        )
        recomputed = max(0, len(mat.tokens) - cached)
        started = time.perf_counter()
        if todo > 0:
            self._compute(mat, cached, end)
        self.metrics.recomputed_tokens += recomputed
        mat.prefilled = True
        observed = (mat.ready_at or started) - mat.started_at + (time.perf_counter() - started)
        if observed > 0:
            self.decisions.settle(mat.decision_id, observed)
        return recomputed

    def _settle_landing(self, mat: Materialization) -> None:
        """A landing restore (R82): compute its prefill's KV ahead on the landing prefix,
        then wait for the H2D's end and apply it, so the restore settles as it would have
        (controller/ahead.py). RestorePending when the restore is not landing, or its end is
        still not observed after `quiesce_timeout_s` (the KV computed stays for the retry)."""
        rid = mat.request_id
        found = self._landing(mat)
        if found is None:
            raise RestorePending(rid)
        op, handle = found
        assert self._bytes is not None and self.producer is not None, "checked by _landing"
        # Refused for room as it would be once the op landed: before anything changes (R25).
        if not self.ranks.room_for(mat, op.nodes[-1]):
            start = self.cp.tree.prefix_tokens(op.nodes[-1])
            need = (prefill_end(len(mat.tokens), self.config.kv.page_size) - start) // (
                self.config.kv.page_size
            )
            raise OutOfPages("L1", need, self.cp.free_pages(Tier.L1))
        if rid not in self._ahead:
            end = prefill_end(len(mat.tokens), self.config.kv.page_size)
            producer = cast("LayerwiseProducer", self.producer)
            ahead = compute_ahead(mat, op, handle, self.cp, producer, self._bytes.l1_arena, end)
            if ahead is not None:
                self._ahead[rid] = ahead
        # The op's end, observed and applied as phase 1 of a tick would, for this op alone
        # (no other restore advances, no backup is issued: that is the next tick's work).
        if not handle.wait(self.config.quiesce_timeout_s).final:
            raise RestorePending(rid)
        self.transfers.conclude([op.op_id])
        if not mat.done:
            raise RestorePending(rid)

    def finish(self, request_id: int) -> None:
        """End a request, finished or aborted: cancel its restore ops (the data plane
        quiesces each first; R40), stop waiting for shared ones, release what it holds (private
        pages, restore pins, its prefix lock). Backups are the cache's and continue. A request
        that shared a cancelled load-back loads those pages itself. Nothing it owned stays
        behind (B03). UnknownRequest for an id that is not live."""
        self.hooks.refuse_if_crashed()
        self._ahead.pop(request_id, None)
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
        self.transfers.cancel_ops(mat.ops)  # QuiesceTimeout past the bound: wedged

    # -- progress ---------------------------------------------------------------------------

    def evict(self, tier: Tier | str, n_pages: int) -> int:
        """Eviction pressure from outside the controller (the engine needs the memory): free
        at least `n_pages` pages of `tier` (more when a node's value goes whole; fewer only
        when no candidate is left) through the same loop and write-back hook as the
        controller's own make-room (spec/eviction.md), counted in `evicted_pages`. Returns the
        pages freed. A caller MUST NOT call `ControlPlane.evict` directly: under write-back it
        would skip the backup an unbacked L1 victim is owed."""
        self.hooks.refuse_if_crashed()  # R57: a dead controller publishes no eviction either
        return self.evictor.evict(Tier(tier), n_pages, back_up=self.transfers.back_up_now)

    def tick(self) -> None:
        """Observe every transfer once; apply what completed; continue restores and backups
        (R36: these four phases, in this order).
        Transfer failures become fallbacks or dropped backups (counted), an unusable L3 file
        takes L3 offline: nothing is raised in normal operation (spec/restore.md). Across
        ranks a tick after an admission observes no end: that admission's C1a carried C4
        (R85), and the ends it did not carry wait for the next tick or admission."""
        self.hooks.refuse_if_crashed()
        if self.carried:  # an admission's C1a carried C4 since the last tick (agreed state)
            self.carried = False
        else:
            self.transfers.conclude(sorted(self.handles))  # C4 (none in flight: none)
        self.stager.advance(self.transfers.issue)
        for direction, chain in self.backups.due():
            self.transfers.issue_backup(direction, chain)
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
                raise TransferError(
                    f"drain: {len(self.handles)} transfer(s) still pending after {timeout_s} s"
                )
            if not self.handles:
                break

    def close(self) -> None:
        """Cancel everything in flight, end every request, close the data plane. Raises
        nothing; idempotent. On a poisoned control plane (an invariant broke; it refuses
        every transition) the data plane is still quiesced and closed: each handle is
        cancelled and waited for, and the plane's records are left as they were for
        diagnosis (spec/invariants.md, "A poisoned plane"). After an injected crash
        (`SimulatedCrash`) the same: nothing in flight is published (spec/faults.md). Once
        wedged (a cancel met hardware that never went quiet, `QuiesceTimeout`) the same, but
        the ops still busy after quiesce_timeout_s are leaked: listed in `leaked`, their
        pages left private, and the data plane parked open, L3 file and lock included
        (hicache.dataplane.leaks), instead of closed."""
        if self._closed:
            return
        self._closed = True
        if self.cp.poisoned is None and not self.hooks.dead:
            try:
                for rid in list(self.cp.requests):
                    self.finish(rid)
                for op_id in list(self.handles):
                    self.transfers.cancel(op_id)
                    self.transfers.settle(op_id)
            except QuiesceTimeout:
                pass  # wedged: what is left is quiesced below, or leaked
        # R57, R79: dead (poisoned, crashed, wedged) publishes nothing more; quiesce,
        # release, or leak what the hardware never let go.
        busy = {i: h for i, h in self.handles.items() if not h.status.final}
        self.leaked = quiesce_or_leak(self.cp, self.handles, self.config.quiesce_timeout_s)
        stuck = [busy[op.op_id] for op in self.leaked]
        if stuck:
            park(self.engine, stuck)  # the hardware may still write its memory and file
        else:
            self.engine.close()
        # The control plane and its tree reference each other (split callbacks); without this
        # the cycle would hold the engine's pools until the garbage collector runs.
        self.cp.digests = None

    # -- after a restore ----------------------------------------------------------------------

    def _compute(self, mat: Materialization, start: int, end: int) -> None:
        """Recompute tokens `[start, end)` into private L1 pages and insert them."""
        rid = mat.request_id
        new_pages = self.cp.compute(rid, end - start)
        prefix = self.cp.prefix_pages(self.cp.prefix_node(rid), Tier.L1)
        padded = tuple(mat.tokens) + (0,) * (end - len(mat.tokens))
        ahead = self._ahead.pop(rid, None)
        kv = take(ahead, start, end, prefix)  # R84: only if its H2D ended DONE, same prefix
        if ahead is not None:
            self.metrics.layerwise_prefills += kv is not None
            self.metrics.ahead_discarded += kv is None
        if kv is not None and self._bytes is not None:
            write_kv(self._bytes.l1_arena, new_pages, kv)
        elif self.producer is not None and self._bytes is not None:
            seconds = self.producer.produce(
                padded, start, end, self._bytes.l1_arena, prefix, new_pages
            )
            self.model.observe_prefill(end - start, start, seconds)  # a tail when start > 0
        elif self.tagged is not None:  # no bytes: the pages' content tags
            self.tagged.computed(padded, start, end, new_pages)
        self.cp.insert(rid)
        self.backups.after_insert(self.cp.prefix_node(rid))
        if kv is not None and self._bytes is not None:
            written(self._bytes.l1_arena)  # the backup above was queued behind it (B05)

    # -- helpers ----------------------------------------------------------------------------

    @property
    def l3_online(self) -> bool:
        """Whether L3 serves restores and takes backups (False once its file was lost)."""
        return self.l3.online

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
            "pending_ops": len(self.cp.ops),
            "requests": len(self.cp.requests),
            "engine": self.engine.status(),
            "cost_model": self.model.state(),
            "policy": self.policy.name,
            "decisions": self.decisions.summary(),
            "l3": "online" if self.l3.online else f"offline: {self.l3.offline_reason}",
            "leaked": {"ops": len(self.leaked), "pages": sum(op.pages for op in self.leaked)},
            "invariant_checks": {
                "run": self.cp.checker.checks_run,
                "violations": self.cp.checker.violations_found,
            },
        }
