"""Group D2H and H2D: every pool of a pool group in one operation, one handle.

    D2H   compute: wait(caller) -> upload operands -> stage 0 gather, stage 1 gather, ...
          d2h:     (after stage k's gather) one DMA per run of consecutive L2 pages of each
                   pool of stage k, from its packed part straight into its L2 region
    H2D   h2d:     stage k's DMAs, L2 runs -> packed parts (every stage's, before the
                   operands are even built: the copy engine starts while the rest is issued)
          compute: wait(caller) -> upload operands -> (after stage k's DMAs) stage k scatter

A request names pages per allocating pool; derived pools move their source's pages
(groupplan.py). Stages and kernels per mode are in groupkernels.py: one stage and one launch
for the row table, one per pool otherwise. Why the caller wait comes first: the caller's
stream may still write what a D2H reads or what an H2D overwrites (bug class B05).

A D2H of at most GRAPH_MAX_BYTES issues as one stage whose upload and gathers are replayed as
one captured CUDA graph (issuegraphs.py; the first sight of its buffers and shape runs
eagerly, the second captures), then every pool's DMAs as one batch: its DMAs cannot start
before the gathers, and each launch costs the issuing thread tens of microseconds (one H100
host, 350 tokens of DeepSeek V4's six pools: issue 0.65 -> 0.26 ms, 65.2 -> 67.5% of one
pinned copy; MLA's one pool 70.0 -> 77.4%). Larger D2Hs keep one stage per pool, so a pool's
DMAs overlap the next pool's gather. An H2D's DMAs go first and need nothing issued before
them, so it keeps its stages: replaying its scatters after every DMA measured worse there
(52.8 -> 46.8% for DeepSeek V4, MLA unchanged).

A D2H goes mapped where the GPU addresses L2 in place (pinned, per_pool kernels; routes.py
and kernels/triton_mapped.py say why): one kernel per pool writes its L1 rows straight into
its L2 pages -- no workspace, no DMA -- after the operand upload, all replayed as one graph
(`mapped_d2h`); unless the transfer is one run of L2 pages in all (one pool, one DMA).

Completion is observed by polling the last event; the workspace (packed bytes, operands)
is held by the handle and returned only once the handle is final. On CPU the same code runs
synchronously (no streams) and the handle completes on its first poll. One thread issues and
polls. Every L2 run is one direct DMA (no host staging, unlike the single-pool mover's small
runs): fragmented L2 pages cost one DMA per page per pool.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from hicache.core.tiers import Direction
from hicache.dataplane.batchcopy import BatchedCopies, Span
from hicache.dataplane.faults import FaultInjector, FaultSite, completion_fault
from hicache.dataplane.groupkernels import GroupKernels, Operands, choose
from hicache.dataplane.groupplan import GroupPlan, GroupRequest, PoolMove, plan_group
from hicache.dataplane.grouppools import GroupDevicePool, GroupHostPool
from hicache.dataplane.handles import (
    OutcomeCounters,
    ReadyHandle,
    TransferHandle,
    TransferStatus,
    event_passed,
)
from hicache.dataplane.issuegraphs import IssueGraphs
from hicache.dataplane.pools import allocate
from hicache.dataplane.routes import RouteRequest, aligned, mapped_choice
from hicache.dataplane.streams import Event, Streams, landed
from hicache.dataplane.workspace import Workspace, WorkspaceCache, WorkspaceKind
from hicache.errors import ConfigError, TransferError
from hicache.kernels.reference import WORD_DTYPES, RowLayout, _word_bytes
from hicache.kernels.row_table import TableConfig

INDEX_MIN_BYTES = 64 << 10  # operand buffers start here: one serves most transfers
GRAPH_MAX_BYTES = 64 << 20  # D2Hs up to this size: one stage, replayed (module docstring)


@dataclass
class GroupCounters(OutcomeCounters):
    """Per direction, cumulative: the outcomes, and how the transfers were issued."""

    launches: int = 0  # kernel launches issued (a graph replay counts as one)
    replays: int = 0  # D2Hs whose upload and gathers were one graph replay
    dmas: int = 0  # host<->device copies issued (operand uploads excluded)
    mapped: int = 0  # D2Hs written into L2 in place by the SMs (no workspace, no DMA)
    issue_s: float = 0.0  # host time inside issuing calls, allocation excluded


@dataclass
class _QueuedDmas:
    """An H2D's DMAs, queued before its operands exist: the caller's stream as looked up
    then, the timing start, the stages and each stage's DMAs-done event, the DMA count."""

    caller: torch.cuda.Stream | None
    start: Event | None
    stages: list[tuple[PoolMove, ...]]
    dmas_done: list[Event | None]
    dmas: int


class GroupHandle(TransferHandle):
    """One group transfer; returns its workspaces when final. `launches` and `dmas` say
    how it was issued."""

    def __init__(
        self,
        mover: GroupMover,
        plan: GroupPlan,
        held: list[tuple[WorkspaceCache, Workspace]],
        start: Event | None,
        end: Event | None,
        launches: int,
        dmas: int,
    ) -> None:
        super().__init__(plan.direction, plan.nbytes)
        self.plan, self.launches, self.dmas = plan, launches, dmas
        self._mover, self._held, self._start, self._end = mover, held, start, end
        self._delay_polls = 0

    def _probe(self) -> TransferStatus:
        if self._end is not None and not landed(self._end):
            return TransferStatus.PENDING
        if self._delay_polls > 0:  # DELAY fault: the completion is observed late
            self._delay_polls -= 1
            return TransferStatus.PENDING
        self.error = completion_fault(self._mover.faults, self.direction)  # once per group
        return TransferStatus.DONE if self.error is None else TransferStatus.FAILED

    def _quiesce(self, timeout_s: float | None) -> bool:
        return event_passed(self._end, timeout_s)

    def _finish(self, status: TransferStatus) -> None:
        super()._finish(status)
        if self._start is not None and self._end is not None:
            self.timings.service_s = self._start.elapsed_time(self._end) / 1e3
        held, self._held = self._held, []
        for cache, ws in held:
            cache.release(ws)
        self._mover._retire(self, status)
        self._mover._streams.recycle(self._start, self._end)  # its timing events, for reuse
        self._start = self._end = None


class GroupMover:
    """Moves a group's pages between `l1` and `l2` (module docstring). `kernels`: a mode of
    groupkernels.REQUESTS ("auto" verifies a Triton mode on CUDA, torch on CPU). On CUDA L2
    must be pinned. `faults`: the sites of the single-pool mover, drawn once per group
    transfer (DEVICE_ALLOC / PINNED_ALLOC at a new workspace, DELAY at issue, D2H_COMPLETE /
    H2D_COMPLETE when completion is observed); None draws nothing. `batched`: each stage's
    DMAs, every pool's runs, as one cuMemcpyBatchAsync where the driver has it
    (batchcopy.py; None: unless HICACHE_BATCHED_COPIES=0). `issue_graphs`: D2Hs up to
    `graph_max_bytes` replay their upload and gathers as one captured graph (issuegraphs.py;
    None: on CUDA unless HICACHE_ISSUE_GRAPHS=0). `mapped_d2h`: D2Hs written into L2 in
    place (module docstring). None: on CUDA with the per_pool kernels and pinned L2 whose
    probe page landed, every pool's (triton_mapped.probe_layout), unless HICACHE_MAPPED_D2H=0,
    off on CPU unless HICACHE_MAPPED_D2H=1 (with the per_pool kernels, the interpreted kernel
    probed the same way); True where it cannot run raises ConfigError;
    "every" (routes.EVERY, as HICACHE_MAPPED_D2H=all) every D2H, one DMA's too.
    `mapped_reason` says which and why."""

    def __init__(
        self,
        l1: GroupDevicePool,
        l2: GroupHostPool,
        kernels: str = "auto",
        *,
        table_config: TableConfig = TableConfig(),
        faults: FaultInjector | None = None,
        batched: bool | None = None,
        issue_graphs: bool | None = None,
        graph_max_bytes: int = GRAPH_MAX_BYTES,
        mapped_d2h: RouteRequest = None,
    ) -> None:
        if l2.geometry != l1.geometry:
            raise ConfigError(
                "l2.geometry",
                f"L2 holds group {l2.geometry.group.name}, L1 {l1.geometry.group.name}",
            )
        if l1.device.type == "cuda" and not l2.pinned:
            raise ConfigError("l2.pin", "L1 is on CUDA: L2 must be pinned for asynchronous DMA")
        self.l1, self.l2 = l1, l2
        self.kernels: GroupKernels = choose(kernels, l1, l2, table_config)
        self._streams = Streams(l1.device)
        self.copies = BatchedCopies(l1.device, enabled=batched)
        self.graphs = IssueGraphs(l1.device, enabled=issue_graphs)
        if not isinstance(graph_max_bytes, int) or graph_max_bytes < 0:
            raise ConfigError("graph_max_bytes", f"a number of bytes >= 0, got {graph_max_bytes!r}")
        self.graph_max_bytes = graph_max_bytes
        pin = self._streams.cuda
        self.faults = faults
        self.workspaces = WorkspaceCache(
            l1.device, pin=pin, faults=faults, alloc_stream=self._streams.compute
        )
        self.operand_buffers = WorkspaceCache(
            l1.device,
            pin=pin,
            faults=faults,
            alloc_stream=self._streams.compute,
            max_idle=4,
            min_bytes=INDEX_MIN_BYTES,
        )
        self.counters = {Direction.D2H: GroupCounters(), Direction.H2D: GroupCounters()}
        self.in_flight: set[GroupHandle] = set()
        # `mapped_every`: one DMA's too (HICACHE_MAPPED_D2H=all: the route on every D2H).
        self.mapped_d2h, self.mapped_every, self.mapped_reason = self._mapped_choice(mapped_d2h)

    def _mapped_choice(self, requested: RouteRequest) -> tuple[bool, bool, str]:
        """(on, every, why) for the mapped D2H (class docstring; routes.mapped_choice)."""
        cuda = self._streams.cuda
        why_not = ""
        if cuda and self.kernels.mode != "per_pool":
            why_not = f"the group kernels are {self.kernels.mode} (mapped copies run per pool)"
        elif cuda and not self.l2.pinned:
            why_not = "L2 is not pinned"
        on = "on: a D2H is one mapped copy per pool unless one pool in one L2 run (one DMA)"
        choice = mapped_choice(requested, cuda=cuda, why_not=why_not, on=on)
        if choice[0] and (cuda or self.kernels.mode == "per_pool"):
            # The Triton kernel must run here: on a GPU writing pinned L2 in place; on a CPU in
            # Triton's interpreter, which some Triton and numpy pairs cannot run it in.
            from hicache.kernels.select import load_mapped

            mapped = load_mapped()
            for p in self.l1.geometry.pools:  # compiled now, never inside an issue
                layout, l1_words, l2_words = self._mapped_operands(p.name, 1)
                if cuda:
                    mapped.prebuild_layout(layout, l1_words, l2_words)
                # Written in place? One page of the pool into a scratch page allocated as L2.
                shape, cpu = (layout.rows_per_page * layout.row_words,), torch.device("cpu")
                scratch = allocate(shape, l2_words.dtype, cpu, pin=self.l2.pinned, field="l2")
                if failed := mapped.probe_layout(layout, l1_words, scratch):
                    return mapped_choice(requested, cuda=cuda, why_not=f"{p.name}: {failed}", on=on)
        return choice

    def _mapped_operands(self, name: str, n: int) -> tuple[RowLayout, torch.Tensor, torch.Tensor]:
        """Pool `name`'s row layout for `n` pages and its L1 region and L2 part as words."""
        p = self.l1.geometry.pool(name)
        region, l2 = self.l1.region(name), self.l2.bytes_view(name)
        word = _word_bytes(p.row_bytes | self.l1.arena.offsets[name] | self.l2.arena.offsets[name])
        layout = RowLayout(p.layers, region.shape[1], n, p.row_bytes, word, p.rows_per_layer)
        words = WORD_DTYPES[word]
        return layout, region.reshape(-1).view(words), l2.reshape(-1).view(words)

    def d2h(
        self, request: GroupRequest, *, after: torch.cuda.Stream | None = None
    ) -> TransferHandle:
        """L1 -> L2 for every pool: request[source] = (L1 pages, L2 pages)."""
        return self._issue(Direction.D2H, request, after)

    def h2d(
        self, request: GroupRequest, *, after: torch.cuda.Stream | None = None
    ) -> TransferHandle:
        """L2 -> L1 for every pool: request[source] = (L2 pages, L1 pages)."""
        return self._issue(Direction.H2D, request, after)

    def _issue(
        self, direction: Direction, request: GroupRequest, after: torch.cuda.Stream | None
    ) -> TransferHandle:
        entered = time.perf_counter()
        plan = plan_group(direction, request, self.l1, self.l2)  # raises with nothing issued
        counters = self.counters[direction]
        counters.ops += 1
        if not plan.moves:
            counters.done += 1
            return ReadyHandle(direction, 0)
        if direction is Direction.D2H and self._goes_mapped(plan):
            return self._issue_mapped(plan, after, entered)
        try:
            held, packed, setup_s = self._borrow_workspace(plan)
        except TransferError as e:
            counters.failed += 1
            return ReadyHandle(direction, plan.nbytes, error=e)
        # An H2D's DMAs need only the plan and the workspace: queued before the operands are
        # built, the copy engine starts while the rest is issued.
        queued = self._queue_h2d_dmas(plan, packed) if direction is Direction.H2D else None
        ops = self.kernels.operands(plan, self.l1)
        try:
            host, words, seconds = self._borrow_operands(ops, held)
        except TransferError as e:
            self._abandon(held, queued)
            counters.failed += 1
            return ReadyHandle(direction, plan.nbytes, error=e)
        setup_s += seconds
        if queued is None:
            start, end, launches, dmas = self._enqueue_d2h(plan, ops, packed, host, words, after)
        else:
            start, end, launches, dmas = self._enqueue_h2d(
                plan, ops, packed, host, words, after, queued
            )
        handle = GroupHandle(self, plan, held, start, end, launches, dmas)
        return self._issued(handle, entered, setup_s)

    def _issued(self, handle: GroupHandle, entered: float, setup_s: float) -> GroupHandle:
        """An issued handle's DELAY draw, counters and timings; it joins the in-flight set."""
        counters = self.counters[handle.direction]
        if self.faults is not None and self.faults.fire(FaultSite.DELAY):
            handle._delay_polls = self.faults.delay_polls
        counters.launches += handle.launches
        counters.dmas += handle.dmas
        t = handle.timings
        t.issued_at, t.workspace_setup_s = entered, setup_s
        t.enqueue_s = time.perf_counter() - entered - setup_s
        counters.issue_s += t.enqueue_s
        self.in_flight.add(handle)
        return handle

    def _goes_mapped(self, plan: GroupPlan) -> bool:
        """A D2H's route (module docstring): mapped when its DMAs would be more than one
        (several pools, or a pool's L2 pages in several runs)."""
        if not self.mapped_d2h:
            return False
        return self.mapped_every or len(plan.moves) > 1 or len(plan.moves[0].runs()) > 1

    def _issue_mapped(
        self, plan: GroupPlan, after: torch.cuda.Stream | None, entered: float
    ) -> TransferHandle:
        """A mapped D2H: each pool's L1 and L2 pages side by side in the operands (each list
        16-byte aligned), one upload, one kernel per pool writing L2 in place."""
        counters = self.counters[Direction.D2H]
        index_at: dict[str, int] = {}
        parts: list[np.ndarray[tuple[int], np.dtype[np.int64]]] = []
        at = 0
        for m in plan.moves:
            n = int(m.l1.size)
            span = aligned(n)
            index_at[m.pool.name] = at
            pad = np.zeros(span - n, dtype=np.int64)
            parts += [m.l1, pad, m.l2, pad]
            at += 2 * span
        ops = Operands(np.concatenate(parts).astype(np.int64, copy=False), index_at, None)
        held: list[tuple[WorkspaceCache, Workspace]] = []
        try:
            host, words, setup_s = self._borrow_operands(ops, held)
        except TransferError as e:
            counters.failed += 1
            return ReadyHandle(Direction.D2H, plan.nbytes, error=e)
        start, end, launches = self._enqueue_mapped(plan, ops, host, words, after)
        counters.mapped += 1
        handle = GroupHandle(self, plan, held, start, end, launches, 0)
        return self._issued(handle, entered, setup_s)

    def _enqueue_mapped(
        self,
        plan: GroupPlan,
        ops: Operands,
        host: torch.Tensor,
        words: torch.Tensor,
        after: torch.cuda.Stream | None,
    ) -> tuple[Event | None, Event | None, int]:
        """Upload and every pool's mapped copy on the D2H stream after the caller's work (B05:
        it reads L1), replayed as one graph where it can; (start, end, launches)."""
        s = self._streams
        host.copy_(torch.from_numpy(ops.host))  # pinned: the upload reads it later
        caller = s.current()
        s.wait_for(s.d2h, after if after is not None else caller)
        start = s.timer(s.d2h)

        def work() -> None:  # on the current stream, eagerly or captured
            words.copy_(host, non_blocking=True)
            for m in plan.moves:
                self._copy_mapped(m, words, ops.index_at[m.pool.name])

        shape = tuple((m.pool.name, ops.index_at[m.pool.name], int(m.l1.size)) for m in plan.moves)
        key = ("mapped", host.data_ptr(), words.data_ptr(), int(words.numel()), shape)
        with s.use(s.d2h, caller):
            replayed = self.graphs.enabled and self.graphs.run(key, work)
            if not replayed:
                work()
        self.counters[Direction.D2H].replays += replayed
        return start, s.timer(s.d2h), 1 if replayed else len(plan.moves)

    def _copy_mapped(self, m: PoolMove, words: torch.Tensor, at: int) -> None:
        """Pool m's L1 rows into its L2 pages, on the current stream: the Triton kernel with
        the per_pool kernels, else torch's index ops (one device: CPU)."""
        n = int(m.l1.size)
        slots_at = at + aligned(n)  # where `_issue_mapped` put the L2 pages
        idx, slots = words[at : at + n], words[slots_at : slots_at + n]
        if self.kernels.mode == "per_pool":
            from hicache.kernels.select import load_mapped

            layout, l1_words, l2_words = self._mapped_operands(m.pool.name, n)
            load_mapped().launch_mapped(layout, l1_words, l2_words, idx, slots, to_pool=True)
            return
        p = m.pool
        rows = self.l2.bytes_view(p.name).view(-1, p.rows_per_page, p.row_bytes)
        rows.index_copy_(0, slots, self.l1.region(p.name).index_select(1, idx).transpose(0, 1))

    def _borrow_workspace(
        self, plan: GroupPlan
    ) -> tuple[list[tuple[WorkspaceCache, Workspace]], torch.Tensor, float]:
        """The packed workspace (flat uint8), or TransferError with nothing kept."""
        ws, seconds = self.workspaces.acquire(WorkspaceKind.DEVICE, plan.packed_bytes)
        return [(self.workspaces, ws)], ws.view(torch.uint8, (plan.packed_bytes,)), seconds

    def _borrow_operands(
        self, ops: Operands, held: list[tuple[WorkspaceCache, Workspace]]
    ) -> tuple[torch.Tensor, torch.Tensor, float]:
        """Host and device operand buffers, added to `held`; TransferError with neither kept
        (what `held` held before stays)."""
        words = max(1, int(ops.host.size))
        taken: list[tuple[WorkspaceCache, Workspace]] = []
        views = []
        setup = 0.0
        try:
            for kind in (WorkspaceKind.HOST, WorkspaceKind.DEVICE):
                ws, seconds = self.operand_buffers.acquire(kind, words * 8)
                taken.append((self.operand_buffers, ws))
                setup += seconds
                views.append(ws.view(torch.int64, (words,))[: ops.host.size])
        except TransferError:
            for cache, ws in taken:
                cache.release(ws)
            raise
        held.extend(taken)
        return views[0], views[1], setup

    def _abandon(
        self, held: list[tuple[WorkspaceCache, Workspace]], queued: _QueuedDmas | None
    ) -> None:
        """An issue failed after borrowing: wait for the DMAs it queued (they write the
        workspace), then give every buffer back -- nothing stays in flight or borrowed."""
        if queued is not None:
            if self._streams.h2d is not None:
                self._streams.h2d.synchronize()
            self._streams.recycle(queued.start)
        for cache, ws in held:
            cache.release(ws)

    def _enqueue_d2h(
        self,
        plan: GroupPlan,
        ops: Operands,
        packed: torch.Tensor,
        host: torch.Tensor,
        words: torch.Tensor,
        after: torch.cuda.Stream | None,
    ) -> tuple[Event | None, Event | None, int, int]:
        s = self._streams
        host.copy_(torch.from_numpy(ops.host))  # the operands, pinned: the upload reads them
        caller = s.current()
        s.wait_for(s.compute, after if after is not None else caller)  # before L1 is read (B05)
        start = s.timer(s.compute)
        launches = dmas = 0
        if plan.nbytes <= self.graph_max_bytes and self.graphs.enabled:
            with s.use(s.compute, caller):
                replayed = self._replay_gathers(plan, ops, packed, host, words)
            if replayed:
                s.wait_for(s.d2h, s.compute)  # every DMA after every gather
                with s.use(s.d2h, caller):
                    dmas = self._dmas(plan.moves, packed, to_host=True, stream=s.d2h)
                return start, s.timer(s.d2h), 1, dmas
        with s.use(s.compute, caller):
            words.copy_(host, non_blocking=True)
        with s.use(s.d2h, caller):  # DMAs are `copy_` calls: they run on the current stream
            for stage in self.kernels.stages(plan):
                launches += self.kernels.copy(
                    stage, ops, words, self.l1, packed, gather=True, stream=s.compute
                )
                s.wait_for(s.d2h, s.compute)
                dmas += self._dmas(stage, packed, to_host=True, stream=s.d2h)
        return start, s.timer(s.d2h), launches, dmas

    def _queue_h2d_dmas(self, plan: GroupPlan, packed: torch.Tensor) -> _QueuedDmas:
        """Every stage's DMAs of an H2D, L2 runs -> the workspace: they read locked L2 pages
        and wait for nothing, so they go first (the scatters wait for them, `_enqueue_h2d`)."""
        s = self._streams
        caller = s.current()
        start = s.timer(s.h2d)
        stages = self.kernels.stages(plan)
        dmas_done: list[Event | None] = []
        dmas = 0
        with s.use(s.h2d, caller):
            for k, stage in enumerate(stages):
                dmas += self._dmas(stage, packed, to_host=False, stream=s.h2d)
                dmas_done.append(s.relay(s.h2d, k))  # waited on in this issue
        return _QueuedDmas(caller, start, stages, dmas_done, dmas)

    def _enqueue_h2d(
        self,
        plan: GroupPlan,
        ops: Operands,
        packed: torch.Tensor,
        host: torch.Tensor,
        words: torch.Tensor,
        after: torch.cuda.Stream | None,
        queued: _QueuedDmas,
    ) -> tuple[Event | None, Event | None, int, int]:
        """The scatters of an H2D whose DMAs are `queued`: each stage's after its DMAs and
        after the caller's stream (B05: it may still write the L1 pages they overwrite)."""
        s, caller = self._streams, queued.caller
        host.copy_(torch.from_numpy(ops.host))  # the operands, pinned, while the DMAs copy
        s.wait_for(s.compute, after if after is not None else caller)  # before L1 is written
        with s.use(s.compute, caller):
            words.copy_(host, non_blocking=True)
        launches = 0
        for stage, done in zip(queued.stages, queued.dmas_done):
            s.wait(s.compute, done)  # stage k's scatter after its DMAs
            launches += self.kernels.copy(
                stage, ops, words, self.l1, packed, gather=False, stream=s.compute
            )
        return queued.start, s.timer(s.compute), launches, queued.dmas

    def _replay_gathers(
        self,
        plan: GroupPlan,
        ops: Operands,
        packed: torch.Tensor,
        host: torch.Tensor,
        words: torch.Tensor,
    ) -> bool:
        """The operand upload and every stage's gathers as one graph replay on the current
        stream (issuegraphs.py); False when they are still to be run eagerly. The key names
        every address and length the work touches: the operand buffers, the workspace, and
        per pool where its indices and packed part start and how many pages it moves."""
        shape = tuple(
            (m.pool.name, ops.index_at.get(m.pool.name, -1), int(m.l1.size), m.packed_at)
            for m in plan.moves
        )
        table = None if ops.table is None else (ops.table.word_bytes, ops.table.vec)
        buffers = (host.data_ptr(), words.data_ptr(), int(words.numel()), packed.data_ptr())
        key = (buffers, shape, table)

        def work() -> None:  # exactly the eager path's calls, on the current stream
            words.copy_(host, non_blocking=True)
            for stage in self.kernels.stages(plan):
                self.kernels.copy(stage, ops, words, self.l1, packed, gather=True, stream=None)

        replayed = self.graphs.run(key, work)
        self.counters[plan.direction].replays += replayed
        return replayed

    def _dmas(
        self,
        stage: tuple[PoolMove, ...],
        packed: torch.Tensor,
        *,
        to_host: bool,
        stream: torch.cuda.Stream | None,
    ) -> int:
        """One copy per run of consecutive L2 pages of each pool of `stage`, on the current
        stream (`stream`: it, or None on CPU), as byte spans of the pool's L2 region and the
        workspace (batchcopy.py: by address, no tensor per run); returns how many."""
        spans: list[Span] = []
        runs: dict[int, list[tuple[int, int, int]]] = {}  # pools of one source share its runs
        for m in stage:
            bpp = m.pool.bytes_per_page
            l2 = self.l2.bytes_view(m.pool.name)
            if id(m.l2) not in runs:
                runs[id(m.l2)] = m.runs()
            for lo, hi, first in runs[id(m.l2)]:
                at, n = m.packed_at + lo * bpp, (hi - lo) * bpp
                spans.append(
                    (l2, first * bpp, packed, at, n)
                    if to_host
                    else (packed, at, l2, first * bpp, n)
                )
        self.copies.copy_spans(spans, stream=stream)  # one batched driver call (batchcopy.py)
        return len(spans)

    def _retire(self, handle: GroupHandle, status: TransferStatus) -> None:
        self.in_flight.discard(handle)
        self.counters[handle.direction].finished(status, handle.nbytes)

    @property
    def buffers_busy(self) -> int:
        """Workspaces held by transfers not yet final (0 when idle: nothing leaked)."""
        return self.workspaces.busy + self.operand_buffers.busy

    def status(self) -> dict[str, object]:
        return {"kernels": self.kernels.reason, "mapped_d2h": self.mapped_reason}

    def close(self) -> None:
        """Cancel every transfer in flight (waiting for its hardware); drop idle buffers."""
        for handle in list(self.in_flight):
            handle.cancel()
        self.workspaces.clear_idle()
        self.operand_buffers.clear_idle()
        self._streams.release()
