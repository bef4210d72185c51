"""The vLLM adapters' job player: the transfers the connector issues, played on the CPU (the
worker side needs CUDA), with the machine's faults, and eviction pressure from outside.

    call          what the player does (vLLM's counterpart)
    ------------  -----------------------------------------------------------------------------
    complete/fail  decides a job's outcome; nothing moves until the next tick (a worker's
                   completion is seen by the scheduler at its next step)
    tick          each decided job in issue order, unless DELAY fires (a late completion):
                  its bytes move (digests), then complete_store(success=...) / complete_load
                  (offloading/scheduler.py `_update_connector_output`); a crash aimed or drawn
                  (CRASH_BEFORE_PUBLISH) raises SimulatedCrash before the completion is seen
    _alloc        BlockPool.get_new_blocks, a store reading a block about to be handed out
                  flushed first (the connector's jobs_to_flush)
    evict         L1: evict_blocks of the free queue's first cached blocks (the stores reading
                  them flushed first, as an allocation would); L2: a store by an outside
                  request that makes the policy evict, then fails

Fault sites reached: D2H_COMPLETE (a store fails), H2D_COMPLETE (a load fails), DELAY,
CRASH_BEFORE_PUBLISH, ALLOC_L1 (a load's blocks refused: the request waits, as when
allocate_slots fails). An aimed "refuse" into L2 has no counterpart (the manager refuses a
store only when it is full: the small L2s the fuzz draws get there by themselves).
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from hicache.dataplane.faults import FaultSite, SimulatedCrash
from hicache.errors import HiCacheError
from hicache.testing.adapters.vllm_state import Hashes, Job, Request
from hicache.testing.protocol import FaultSchedule

FAILS = ("error", "corrupt", "unreadable")
DRAIN_ROUNDS_MAX = 64  # ticks a drain gives delayed jobs before it ends them regardless


class JobPlayer:
    """The transfer, fault and pressure half of `VLLMOffloading` (vllm.py), which owns the
    state below and supplies the three hooks at the end."""

    v: dict[str, Any]
    pool: Any  # BlockPool
    manager: Any  # OffloadingManager
    page_size: int
    tiers: tuple[str, ...]
    requests: dict[int, Request]
    jobs: dict[int, Job]
    next_op: int
    l1_bytes: dict[int, int]
    l2_bytes: dict[int, int]
    being_loaded: Counter[Any]
    schedule: FaultSchedule
    rng: random.Random
    fired: Counter[str]
    stats: Counter[str]
    _aim: tuple[str, str] | None

    def _note(self) -> None:
        """Report the tiers' page changes so far (vllm.py)."""
        raise NotImplementedError

    def _end_step(self) -> None:
        """The step's last manager call (vllm.py)."""
        raise NotImplementedError

    def _cpu(self) -> Any:
        """The CPU offloading manager holding L2 (vllm.py)."""
        raise NotImplementedError

    def _lookup_and_load(self, rid: int, r: Request) -> None:
        raise NotImplementedError

    def _store(self, rid: int, r: Request) -> None:
        raise NotImplementedError

    def _cached(self) -> set[Any]:
        raise NotImplementedError

    def _trace_end(self, job: Job, ok: bool) -> None:
        """A job's end events (vllm.py)."""
        raise NotImplementedError

    def _trace_l1_evicted(self, pages: set[Any]) -> None:
        raise NotImplementedError

    def _trace_l2_evicted(self, keys: list[Any]) -> None:
        raise NotImplementedError

    def _alloc(self, n: int) -> list[Any]:
        """get_new_blocks(n), a pending store reading a block about to be reused flushed
        first (jobs_to_flush); what the allocation evicted is reported before what follows."""
        if n <= 0:
            return []
        self._flush({b.block_id for b in self.pool.free_block_queue.get_all_free_blocks()[:n]})
        self._note()
        before = self._cached()
        blocks = self.pool.get_new_blocks(n)
        self._trace_l1_evicted(before - self._cached())
        for b in blocks:
            self.l1_bytes.pop(b.block_id, None)  # reused: what it held is gone
        self._note()
        return list(blocks)

    def _flush(self, block_ids: set[int]) -> None:
        """End every store still reading one of `block_ids` (as told, or successfully: the
        worker finishes it) before those blocks are reused or dropped (jobs_to_flush)."""
        for job in [j for j in self.jobs.values() if j.store]:
            if any(b.block_id in block_ids for b in job.blocks):
                self.stats["stores_flushed"] += 1
                self._apply(job, job.outcome is not False)

    def _apply(self, job: Job, ok: bool) -> None:
        """The worker reported `job` (ok: its bytes moved): the connector's completion."""
        del self.jobs[job.op]
        self._trace_end(job, ok)
        if job.store:
            if ok:
                for block, chunk in zip(job.blocks, job.chunks):
                    self.l2_bytes[chunk] = self.l1_bytes.get(block.block_id, -1)
            self.manager.complete_store(job.keys, job.ctx, success=ok)
            self.stats["stores_done" if ok else "stores_failed"] += 1
        else:
            self._finish_load(job, ok)
        self._note()

    def _finish_load(self, job: Job, ok: bool) -> None:
        if ok:
            for block, chunk in zip(job.blocks, job.chunks):
                self.l1_bytes[block.block_id] = self.l2_bytes.get(chunk, -1)
        self.manager.complete_load(job.keys, job.ctx)
        self.being_loaded.subtract(job.keys)
        self.stats["loads_done" if ok else "loads_failed"] += 1
        r = self.requests.get(job.rid)
        if job.orphan or r is None:
            self.pool.free_blocks(reversed(job.blocks))
            return
        r.load = None
        if ok:
            end = r.load_start + len(job.blocks)
            self.pool.cache_full_blocks(
                Hashes(r.hashes), r.blocks, r.load_start, end, self.page_size, 0
            )
        else:  # recompute: the blocks go back unpublished
            r.blocks = r.blocks[: r.load_start]
            self.pool.free_blocks(reversed(job.blocks))

    def tick(self) -> None:
        for job in list(self.jobs.values()):
            if job.outcome is None or job.op not in self.jobs:
                continue
            if self._fires(FaultSite.DELAY):
                continue  # a late completion: the job stays in flight
            site = FaultSite.D2H_COMPLETE if job.store else FaultSite.H2D_COMPLETE
            ok = job.outcome and job.aimed not in FAILS and not self._fires(site)
            if job.aimed == "crash" or self._fires(FaultSite.CRASH_BEFORE_PUBLISH):
                raise SimulatedCrash(f"job {job.op} ended; the process died before publishing")
            self._apply(job, ok)
        for rid, r in list(self.requests.items()):
            if r.waiting:
                self._lookup_and_load(rid, r)
            elif r.store_refused:
                self._store(rid, r)
        self._end_step()

    def has_work(self) -> bool:
        return bool(self.jobs) or any(r.waiting or r.store_refused for r in self.requests.values())

    def pending_ops(self) -> list[int]:
        return list(self.jobs)

    def settled_ops(self) -> list[int]:
        """The pending ops a settled workload ends at once (vllm_trace.workload): stores."""
        return [op for op, job in self.jobs.items() if job.store]

    def complete(self, op_id: int) -> None:
        if op_id in self.jobs:
            self.jobs[op_id].outcome = True

    def fail(self, op_id: int, kind: str) -> None:
        if op_id in self.jobs:
            self.jobs[op_id].outcome = False

    def drain(self) -> None:
        for _ in range(DRAIN_ROUNDS_MAX):
            if not self.jobs:
                return
            for job in self.jobs.values():
                job.outcome = True if job.outcome is None else job.outcome
            self.tick()
        for job in list(self.jobs.values()):  # a schedule that keeps delaying: end them now
            self._apply(job, bool(job.outcome) and job.aimed not in FAILS)
        self._end_step()

    # -- faults ------------------------------------------------------------------------------

    def set_faults(self, schedule: FaultSchedule) -> None:
        self.schedule, self.rng = schedule, random.Random(schedule.seed)

    def aim(self, action: str, tier: str) -> None:
        self._aim = (action, tier)

    def _fires(self, site: FaultSite) -> bool:
        rate = self.schedule.rates.get(site.value, 0.0)
        if rate and self.rng.random() < rate:
            self.fired[site.value] += 1
            return True
        return False

    def _refused(self, tier: str) -> bool:
        """An allocation refused: the aimed "refuse" at `tier`, or ALLOC_L1's rate."""
        if self._aim == ("refuse", tier):
            self._aim = None
            self.fired["ALLOC_" + tier] += 1
            return True
        return tier == "L1" and self._fires(FaultSite.ALLOC_L1)

    def damage_storage(self, how: str) -> None: ...  # no file tier

    def fault_counts(self) -> dict[str, int]:
        return dict(self.fired)

    # -- pressure ----------------------------------------------------------------------------

    def evict(self, tier: str, n_pages: int) -> None:
        if tier not in self.tiers:
            raise HiCacheError(f"tier {tier!r}: this engine has {self.tiers}")
        self._note()
        if tier == "L1":
            free = self.pool.free_block_queue.get_all_free_blocks()
            victims = [b.block_id for b in free if b.block_hash is not None][:n_pages]
            self._flush(set(victims))  # pressure is an allocation: a reused block flushes
            self._note()
            before = self._cached()
            self.pool.evict_blocks(set(victims))
            self._trace_l1_evicted(before - self._cached())
        else:
            self._l2_pressure(n_pages)
        self._note()

    def _l2_pressure(self, n_pages: int) -> None:
        """Another request stores `free + n` fresh chunks (the policy evicts n), and its
        store fails: n chunks freed by the manager's own choice."""
        m = min(n_pages, int(self._cpu()._num_evictable_cache_chunks))
        if m <= 0:
            return
        ctx = self.v["ReqContext"](req_id=f"hicache-pressure-{self.next_op}")
        self.next_op += 1
        free = int(self._cpu()._get_num_free_chunks())
        keys = [
            self.v["make_offload_key"](b"hicache-pressure-%d-%d" % (self.next_op, i), 0)
            for i in range(free + m)
        ]
        self.manager.on_new_request(ctx)
        out = self.manager.prepare_store(keys, ctx)
        if out is not None:
            self.stats["l2_pressure_evicted"] += len(out.evicted_keys)
            self._trace_l2_evicted(out.evicted_keys)
            self.manager.complete_store(keys, ctx, success=False)
        self.manager.on_request_finished(ctx)
