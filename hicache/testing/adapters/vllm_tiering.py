"""vLLM's tiering manager with its file tier (`vllm==0.33.0`, unmodified) as a `CacheUnderTest`:
L1 (the GPU block pool) -> L2 (the CPU primary tier) -> L3 (one file per block).

Install as hicache/testing/adapters/vllm.py says (the file tier needs nothing more), then:

    cd /tmp && PYTHONPATH=REPO VENV/bin/python -m hicache fuzz --seed 1 --steps 2000 \\
        --adapter hicache.testing.adapters.vllm_tiering:vllm_tiering_adapter

What is driven, on vllm.py's adapter (L1, the connector's calls, the GPU<->CPU jobs it plays):
`TieringOffloadingManager`, built by vLLM's own `TieringOffloadingSpec` (vllm_filetier.py),
over a `CPUPrimaryTierOffloadingManager` of `L2` chunks (policy "lru") and a
`FileSystemTierManager` writing block files under a temporary directory (removed at close;
a restart opens the new engine on the same directory). The file tier's I/O pool and probe
thread are played on the adapter's thread (vllm_fs.py): that is how every completion stays
under the machine's control.

    CacheUnderTest  what the tiering manager adds to vllm.py's mapping
    --------------  -------------------------------------------------------------------------
    submit          lookup() reaches the file tier when the CPU tier misses: the first time a
                    block is asked for, RETRY (the existence probe is posted); a step later,
                    a HIT there starts a promotion (prepare_write in the CPU tier: the L2 page
                    PENDING) and answers HIT_PENDING; the request waits (deferred) until the
                    CPU tier answers HIT, then loads from L2 as vllm.py does
    tick            the file jobs the machine ended are played first (a store writes its block
                    files, a load reads them into the CPU chunks); then vllm.py's tick; every
                    step ends with on_schedule_end (it submits the step's promotions, one job
                    per request) and the probes posted in it answered
    (cascade)       complete_store of a GPU->CPU job cascades: one store job to the file tier,
                    reading the pinned CPU chunks (prepare_read: ref_cnt + 1)
    pending_ops     vllm.py's jobs and the file tier's (stores into L3, promotions into L2),
                    one op id sequence, in issue order
    fail            a file store: nothing written. A promotion: "error" reads nothing;
                    "unreadable" cuts the job's middle file first, so the tier's own read
                    finds it short, deletes it and keeps the blocks before it (a partial
                    promotion); "corrupt" as "error" (vLLM has no checksum: `corrupt_reads`
                    rewrites the file's bytes instead, and the machine sees them served)
    evict(L3, n)    nothing: the file tier has no capacity and no eviction (below)
    damage_storage  every block file cut to 3 bytes, or deleted
    check()         vllm.py's checks, the cascades' and promotions' pins counted in, and: the
                    manager's jobs are exactly the file jobs queued or ended unobserved, a
                    file job's task raised only where a fault was aimed

Bytes: a GPU->CPU store also writes its digest (vllm.py's) into the chunk's bytes in the
shared region, so the file tier writes and reads it for real; a promotion's chunk digest is
read back from the region (`served_digests` then shows a block served with other bytes).

Where the engine differs from the spec (results: benchmarks/results/2026-12-05-engine-vllm-
tiering.md), and what the adapter makes of it:

- cascade to every tier: every block stored into the CPU tier is written to the file tier,
  whatever the write policy: write_through alone (others: UnsupportedConfig), as vllm.py.
- promotion before read: a file block is read into the CPU tier first, then loaded into L1
  from there; it stays in L2 once loaded (promotion=True; promotion=False: UnsupportedConfig).
- hash-keyed blocks: the file tier may hold a block without its parent's (the parent's GPU->CPU
  store failed, or its file read short and was deleted). L3 is declared `hash_keyed_tiers`
  (spec/invariants.md S6's exception) and shown as it is; L2 is shown as vllm.py shows it.
- no capacity, no eviction in the file tier: files accumulate; `evict("L3")` has no vLLM call.
  The L3 capacity the machine draws is not enforced by anything.
- files outlive the engine: a new engine on the same directory serves the old blocks
  (benchmarks/repros/vllm_tiering_file_tier.py, B), even one a job wrote just before a crash.
  L3 is declared `persistent_tiers` (spec/faults.md, "Persistent tiers"): the reference keeps
  its RESIDENT pages across a restart, and judges the bytes served from them by the digests
  first served (`persistent=False`: a fresh directory per engine, the protocol's empty start).
- no integrity check on a read (repro C): hicache reads a corrupt copy as a miss, vLLM serves it.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hicache.choices import WritePolicy
from hicache.dataplane.faults import FaultSite, SimulatedCrash
from hicache.testing.adapters.vllm import VLLMOffloading
from hicache.testing.adapters.vllm_filetier import CHUNK_BYTES, FileTier, open_tiering
from hicache.testing.adapters.vllm_fs import LOAD, STORE, PlayedJob
from hicache.testing.adapters.vllm_jobs import DRAIN_ROUNDS_MAX, FAILS
from hicache.testing.adapters.vllm_state import Job, Prefix
from hicache.testing.adapters.vllm_tiering_trace import VLLMTieringTrace
from hicache.testing.adapters.vllm_trace import VLLMTrace
from hicache.testing.factory import EngineConfig, UnsupportedConfig
from hicache.testing.protocol import Admission, PageChange

TIERS = ("L1", "L2", "L3")
DIGEST_BYTES = 8  # the head of a chunk that holds its digest (little endian)
STORE_SITES = (FaultSite.IO_EIO, FaultSite.IO_ENOSPC, FaultSite.SHORT_WRITE)
LOAD_SITES = (FaultSite.IO_EIO,)  # SHORT_READ and CORRUPT_SLOT: `_read_fault`
TIERING_METRICS = "vllm:kv_offload_tiering_"  # the tiering manager's counters' prefix


@dataclass(eq=False)
class FileOp:
    """One file-tier job as the machine sees it: `job` is the tiering manager's job id,
    `kind` STORE (CPU -> file, L3's page PENDING) or LOAD (file -> CPU, a promotion),
    `outcome` None until the machine says, `aimed` a fault aimed at it."""

    job: int
    kind: str
    keys: list[Any]
    outcome: bool | None = None
    fault: str = "error"
    aimed: str | None = None


class VLLMTiering(VLLMOffloading):
    """`CacheUnderTest` over vLLM's tiering manager with a file tier (module docstring)."""

    tiers: tuple[str, ...] = TIERS
    hash_keyed_tiers: tuple[str, ...] = ("L2", "L3")

    def __init__(
        self,
        l1_pages: int,
        l2_pages: int,
        page_size: int = 4,
        corrupt_reads: bool = False,
        persistent: bool = True,
        traced: bool = False,
    ) -> None:
        self.corrupt_reads = corrupt_reads
        self.persistent_tiers: tuple[str, ...] = ("L3",) if persistent else ()
        self._l3_quiet = False  # the changes() right after a restart leaves L3 out
        self._synced_l3: dict[Prefix, str] = {}  # L3 as the last changes() reported it
        self.files: FileTier | None = None
        self.file_ops: dict[int, FileOp] = {}  # op id -> file job, in issue order
        self.l3_keys: dict[Any, Prefix] = {}  # keys ever cascaded, by page
        self.on_disk: set[Any] = set()  # keys whose block file exists
        self.expected_errors = 0  # task errors a fault made (a cut file read short)
        self.blocks_read: dict[int, int] = {}  # a traced promotion's job -> blocks its read read
        # op id -> a promotion played that vLLM has not polled yet, and the keys that landed
        self.unpolled: dict[int, tuple[FileOp, list[Any]]] = {}
        super().__init__(l1_pages, l2_pages, page_size, "lru", traced)

    # -- the engine's parts -------------------------------------------------------------------

    def _new_manager(self) -> Any:
        """A new tiering manager, the old one shut down: over the old directory when L3
        persists (its files found again), else over an empty one."""
        root = None
        if self.files is not None:
            root = self.files.root if self.persistent_tiers else None
            self.files.close(keep_files=root is not None)
        self.files = open_tiering(self.l2_pages, self.page_size, self.policy, root)
        self.file_ops.clear()  # queued file jobs went with the old engine, never run
        self.unpolled.clear()  # and the promotions it never polled: their trace ended with it
        self.blocks_read.clear()
        if root is None:
            self.l3_keys.clear()
        self.on_disk = {k for k in self.l3_keys if os.path.exists(self.ft.file(k))}
        self.expected_errors = 0
        self._watch_promotion_evictions(self.files.manager.primary_tier)
        self._watch_polls(self.files.manager)
        return self.files.manager

    def _watch_polls(self, manager: Any) -> None:
        """The tiering manager publishes a promoted chunk (complete_write) only when it
        polls the tier (`_process_finished_jobs`, once a step or before a store): until
        then its lookup answers HIT_PENDING. The spec's completion observed is that poll,
        so a promotion's end events are written after it, then the block files a short
        read deleted (the poll freed the last job that held them). A store's are written
        when it is played (`_play`): its block file is there, found by the next lookup."""
        poll = manager._process_finished_jobs

        def process_finished_jobs(*args: Any, **kwargs: Any) -> Any:
            out = poll(*args, **kwargs)
            for op_id, (f, landed) in list(self.unpolled.items()):
                if f.job not in manager._jobs:
                    del self.unpolled[op_id]
                    self._trace_file_end(op_id, f, landed)
            self._trace_vanished()
            return out

        manager._process_finished_jobs = process_finished_jobs

    def _watch_promotion_evictions(self, cpu: Any) -> None:
        """The CPU tier's `prepare_write` (a promotion's allocation, `_initiate_promotion`)
        may evict chunks, and the tiering manager drops what it says: report them as the
        base reports a store's evictions (evict_l2 in a trace), then pass the answer on."""
        write = cpu.prepare_write

        def prepare_write(keys: Any, ctx: Any) -> Any:
            out = write(keys, ctx)
            if out is not None and out.evicted_keys:
                self.stats["l2_evicted_by_promotion"] += len(out.evicted_keys)
                self._trace_l2_evicted(list(out.evicted_keys))
            return out

        cpu.prepare_write = prepare_write

    def restart(self) -> None:
        """The process starts again: vllm.py's restart over `_new_manager`. A persistent L3
        is shown as the reference keeps it (its RESIDENT pages as the last `changes()`
        reported them: a crash discards the rest of its step's), and the machine's call of
        `changes()` right after, whose changes it discards, leaves L3 out: a file a crashed
        job wrote is reported by the next call (ABSENT -> RESIDENT)."""
        kept = {p: s for p, s in self._synced_l3.items() if s == "RESIDENT"}
        reopened = self.files is not None  # not the first open, from __init__
        super().restart()
        if self.persistent_tiers and reopened:
            self.views.shown["L3"], self._l3_quiet = kept, True

    def _new_trace(self) -> VLLMTrace:
        base = super()._new_trace()
        caps, engine = dict(base.header.capacities), base.header.engine or ""
        keyed = tuple(t for t in self.hash_keyed_tiers if t in (*caps, "L3"))
        return VLLMTieringTrace(self.page_size, caps, engine, self._l3_hit, keyed)

    def _l3_hit(self, tokens: Prefix) -> int:
        """Tokens of `tokens`' leading pages whose block file exists (the admission's L3 hit)."""
        keys = self._hash_pages(tokens[: (len(tokens) - 1) // self.page_size * self.page_size])[1]
        n = 0
        while n < len(keys) and keys[n] in self.on_disk:
            n += 1
        return n * self.page_size

    @property
    def ft(self) -> FileTier:
        assert self.files is not None, "the engine is closed"
        return self.files

    def _cpu(self) -> Any:
        return self.manager.primary_tier

    def close(self) -> None:
        super().close()
        if self.files is not None:
            self.files.close()
            self.files = None

    def _end_step(self) -> None:
        """on_schedule_end (promotions submitted, probes posted), then the probes answered;
        the step's metrics taken as the scheduler takes them (get_stats), their tiering
        counters added to `stats` (promotion allocation failures: a full CPU tier)."""
        super()._end_step()
        self.ft.probes.settle()
        self._note()
        got = self.manager.get_stats()
        if got is not None:
            types, values = got.metric_sections()
            for key, by_label in values.items():
                if types.get(key) == "counter" and key.startswith(TIERING_METRICS):
                    self.stats[key[len(TIERING_METRICS) :]] += int(sum(by_label.values()))

    # -- file jobs ------------------------------------------------------------------------------

    def _register_file_jobs(self) -> None:
        """Give each file job the tier queued since the last look an op id; take an aim."""
        known = {f.job for f in self.file_ops.values()}
        for job_id, played in self.ft.jobs.queued.items():
            if job_id in known:
                continue
            keys = list(self.manager._jobs[job_id].transfer_job.keys)
            op = FileOp(job_id, played.kind, keys)
            into = "L3" if played.kind == STORE else "L2"
            if self._aim is not None and self._aim[1] == into and self._aim[0] != "refuse":
                op.aimed, self._aim = self._aim[0], None
            if played.kind == STORE:
                for key in keys:
                    self.l3_keys[key] = self.prefix_of[bytes(key)]
            self.file_ops[self.next_op] = op
            self._trace_file_issue(self.next_op, op, played)
            self.next_op += 1

    def _play(self, op_id: int, ok: bool, kind: str) -> None:
        """End file op `op_id`: ok, its tasks run; else per `kind` (module docstring)."""
        f = self.file_ops.pop(op_id)
        if not ok and f.kind == LOAD and kind == "corrupt" and self.corrupt_reads:
            self._rewrite(f.keys[len(f.keys) // 2])
            ok = True
        elif not ok and f.kind == LOAD and kind == "unreadable":
            os.truncate(self.ft.file(f.keys[len(f.keys) // 2]), 3)
            ok = True  # the tier's own read finds the file short
        if ok and f.kind == LOAD and not all(self._whole(k) for k in f.keys):
            self.expected_errors += 1  # a file cut or removed under the tier: its read fails
        ran = self.ft.jobs.play(f.job, ok)
        if f.kind == LOAD:
            self.unpolled[op_id] = (f, self._landed(f, ran))  # traced at vLLM's poll
        else:
            self._trace_file_end(op_id, f, self._landed(f, ran))
        self.stats[f"file_{f.kind}s_{'done' if ran else 'failed'}"] += 1
        self.on_disk = {k for k in self.on_disk | set(f.keys) if os.path.exists(self.ft.file(k))}
        self._trace_vanished()  # a short read deletes its block file
        if f.kind == LOAD:  # what landed (a failed key's chunk is freed unpublished)
            for chunk in self.manager._jobs[f.job].transfer_job.chunk_ids:
                self.l2_bytes[int(chunk)] = self._chunk_digest(int(chunk))

    def _trace_file_issue(self, op_id: int, f: FileOp, played: PlayedJob) -> None:
        """The file job's issue events; a promotion's read task watched for what it reads."""
        trace = self._trace
        if not isinstance(trace, VLLMTieringTrace):
            return
        if f.kind == LOAD:
            played.tasks = [self._watched(f.job, task) for task in played.tasks]
        trace.file_issue(op_id, f.kind, [self.prefix_of[bytes(k)] for k in f.keys])

    def _watched(self, job_id: int, task: Callable[[], Any]) -> Callable[[], Any]:
        """`task` (a promotion's read), counting the blocks it read into `blocks_read`."""

        def read() -> Any:
            self.blocks_read[job_id] = 0
            try:
                got = task()
            except Exception as e:
                self.blocks_read[job_id] = getattr(e, "num_succeeded", 0)
                raise
            self.blocks_read[job_id] = len(self.manager._jobs[job_id].transfer_job.keys)
            return got

        return read

    def _landed(self, f: FileOp, ran: bool) -> list[Any]:
        """The keys whose bytes file job `f` moved, counted when it is played: a store's
        if it ran; a promotion's, the blocks its read read (whatever the job reports:
        vllm_tiering_trace.py). The count is taken now, not at vLLM's poll: a crash may
        come between, and the next engine numbers its jobs from 0 again."""
        n = (len(f.keys) if ran else 0) if f.kind == STORE else self.blocks_read.pop(f.job, 0)
        return f.keys[:n]

    def _trace_file_end(self, op_id: int, f: FileOp, landed: list[Any]) -> None:
        """File job `op_id`'s end events (a store's when played, a promotion's when vLLM
        polls it: `_watch_polls`), `landed` the keys whose bytes it moved."""
        trace = self._trace
        if isinstance(trace, VLLMTieringTrace):
            trace.file_end(op_id, f.kind, [self.prefix_of[bytes(k)] for k in landed])

    def _trace_vanished(self) -> None:
        """The traced pages whose block file is gone, neither on disk nor being written."""
        trace = self._trace
        if isinstance(trace, VLLMTieringTrace):
            writing = self.ft.writing()
            gone = [p for k, p in self.l3_keys.items() if k not in self.on_disk | writing]
            trace.vanished(gone)

    def _held(self, r: Any, start: int) -> dict[int, str]:
        """vllm.py's, and the pages only a block file holds or a cascade writes, or that lie
        above such a page ("other": an L3 orphan keeps its ancestors' nodes, hash-keyed)."""
        out, in_l3 = super()._held(r, start), self.on_disk | self.ft.writing()
        files = [q for q in (self.prefix_of.get(bytes(k)) for k in in_l3) if q is not None]
        below = {q[:n] for q in files for n in range(self.page_size, len(q), self.page_size)}
        other = {
            k for k in range(start, len(r.keys)) if r.keys[k] in in_l3 or self._page(r, k) in below
        }
        return {**{k: "other" for k in other}, **out}

    def _whole(self, key: Any) -> bool:
        """Whether `key`'s block file is there, a whole chunk long."""
        path = self.ft.file(key)
        return os.path.exists(path) and os.path.getsize(path) >= CHUNK_BYTES

    def _rewrite(self, key: Any) -> None:
        """Another writer's bytes in `key`'s block file, same length (no checksum sees it)."""
        with open(self.ft.file(key), "r+b") as f:
            f.write(b"\xee" * DIGEST_BYTES)

    def _chunk_digest(self, chunk: int) -> int:
        with self.ft.manager.primary_tier.get_kv_memoryview().cast("B") as flat:
            head = bytes(flat[chunk * CHUNK_BYTES : chunk * CHUNK_BYTES + DIGEST_BYTES])
        return int.from_bytes(head, "little", signed=True)

    def _apply(self, job: Job, ok: bool) -> None:
        """vllm.py's completion; a stored chunk's digest written into its bytes first (the
        cascade that complete_store starts reads them)."""
        if job.store and ok:
            with self.ft.manager.primary_tier.get_kv_memoryview().cast("B") as flat:
                for block, chunk in zip(job.blocks, job.chunks):
                    digest = self.l1_bytes.get(block.block_id, -1)
                    at = int(chunk) * CHUNK_BYTES
                    flat[at : at + DIGEST_BYTES] = digest.to_bytes(
                        DIGEST_BYTES, "little", signed=True
                    )
        super()._apply(job, ok)

    def tick(self) -> None:
        for op_id, f in list(self.file_ops.items()):
            if f.outcome is None or self._fires(FaultSite.DELAY):
                continue  # not ended yet, or late
            kind = f.fault if f.aimed is None or f.aimed == "crash" else f.aimed
            sites = STORE_SITES if f.kind == STORE else LOAD_SITES
            ok = f.outcome and f.aimed not in FAILS and not any(self._fires(s) for s in sites)
            if ok and f.kind == LOAD:
                kind, ok = self._read_fault()
            self._play(op_id, ok, kind)
            if f.aimed == "crash" or self._fires(FaultSite.CRASH_BEFORE_PUBLISH):
                raise SimulatedCrash(f"file job {f.job} ended; the process died before publishing")
        super().tick()

    def _read_fault(self) -> tuple[str, bool]:
        """The schedule's read faults: a short read (the file cut), a corrupt copy."""
        if self._fires(FaultSite.SHORT_READ):
            return "unreadable", False
        if self._fires(FaultSite.CORRUPT_SLOT):
            return "corrupt", False
        return "error", True

    def has_work(self) -> bool:
        return bool(self.file_ops) or self.manager.has_pending_work() or super().has_work()

    def pending_ops(self) -> list[int]:
        return sorted(super().pending_ops() + list(self.file_ops))

    def settled_ops(self) -> list[int]:
        """vllm.py's stores and every file job: a promotion in flight would let the next
        request's promotion of the page after it start under a parent L2 lacks."""
        return sorted(super().settled_ops() + list(self.file_ops))

    def complete(self, op_id: int) -> None:
        if op_id in self.file_ops:
            self.file_ops[op_id].outcome = True
        super().complete(op_id)

    def fail(self, op_id: int, kind: str) -> None:
        if op_id in self.file_ops:
            self.file_ops[op_id].outcome, self.file_ops[op_id].fault = False, kind
        super().fail(op_id, kind)

    def drain(self) -> None:
        """Every transfer ends, file jobs too, with every cascade and promotion they start."""
        for _ in range(DRAIN_ROUNDS_MAX):
            if not self.has_work():
                return
            for f in self.file_ops.values():
                f.outcome = True if f.outcome is None else f.outcome
            super().drain()
            self.tick()
        for op_id, f in list(self.file_ops.items()):  # a schedule that keeps delaying
            self._play(op_id, bool(f.outcome) and f.aimed not in FAILS, f.fault)
        super().drain()

    def submit(self, request_id: int, tokens: Sequence[int]) -> Admission:
        """vllm.py's admission, with the file tier's hit: the leading pages whose block
        file exists (the files change only when a file job is played, or by damage)."""
        got = super().submit(request_id, tokens)
        keys = self.requests[request_id].keys[: (len(tokens) - 1) // self.page_size]
        n = 0
        while n < len(keys) and keys[n] in self.on_disk:
            n += 1
        return Admission({**got.hits, "L3": n * self.page_size}, got.cached_len)

    # -- storage and pressure ---------------------------------------------------------------------

    def damage_storage(self, how: str) -> None:
        self.stats["files_damaged"] += self.ft.damage(how)
        if how == "remove":
            self.on_disk.clear()
            self._trace_vanished()
        self._note()

    def evict(self, tier: str, n_pages: int) -> None:
        if tier == "L3":
            self.stats["l3_pressure_ignored"] += 1  # the file tier never evicts
            return
        super().evict(tier, n_pages)

    # -- observation ------------------------------------------------------------------------------

    def _note(self) -> None:
        if self.files is None:
            return
        self._register_file_jobs()
        for key in self._promoting():
            self.l2_keys.setdefault(key, self.prefix_of[bytes(key)])
        super()._note()
        if not self._l3_quiet:
            self._changes += self.views.diff("L3", self._l3_view())

    def changes(self) -> list[PageChange]:
        out = super().changes()
        self._l3_quiet = False
        self._synced_l3 = dict(self.views.shown["L3"])  # what the caller now knows of L3
        return out

    def _promoting(self) -> list[Any]:
        """Keys being promoted into the CPU tier: queued for this step's submit, or in a job."""
        m = self.manager
        keys = [k for t in m._pending_load_submissions.values() for p in t.values() for k in p.keys]
        keys += [
            k for j in m._jobs.values() if j.transfer_job.is_promotion for k in j.transfer_job.keys
        ]
        return keys

    def _l3_view(self) -> dict[Prefix, str]:
        writing = self.ft.writing()
        view = {}
        for key, prefix in self.l3_keys.items():
            if key in self.on_disk:
                view[prefix] = "RESIDENT"
            elif key in writing:
                view[prefix] = "PENDING"
        ps = self.page_size  # orphans: shown as they are (hash-keyed), counted for the results
        orphans = sum(len(p) > ps and view.get(p[:-ps]) != "RESIDENT" for p in view)
        self.stats["l3_orphan_pages_max"] = max(self.stats["l3_orphan_pages_max"], orphans)
        return view

    def _more_l2_transfers(self, reads: Counter[Any], writes: set[Any]) -> None:
        for job in self.manager._jobs.values():
            if job.transfer_job.is_promotion:
                writes.update(job.transfer_job.keys)
            else:
                reads.update(job.transfer_job.keys)  # a cascade pins what it reads
        writes.update(k for t in self.manager._pending_load_submissions.values()
                      for p in t.values() for k in p.keys)  # fmt: skip

    def _manager_findings(self) -> list[str]:
        found = super()._manager_findings()
        ended = {job_id for job_id, _, _ in self.ft.jobs.finished}
        queued = set(self.ft.jobs.queued)
        if set(self.manager._jobs) != queued | ended:
            found.append(
                f"tiering jobs {sorted(self.manager._jobs)}: the file tier holds {sorted(queued)} "
                f"queued and {sorted(ended)} ended"
            )
        if len(self.ft.jobs.errors) > self.expected_errors:
            found.append(f"file job errors no fault made: {self.ft.jobs.errors}")
        return found


def _verify_shape(config: EngineConfig) -> None:
    """UnsupportedConfig for a shape vLLM's tiering manager is not (module docstring)."""
    if (
        config.tiers != TIERS
        or config.write_policy is not WritePolicy.WRITE_THROUGH
        or not config.promotion
    ):
        raise UnsupportedConfig(
            f"vLLM's tiering manager has tiers {TIERS}, cascades every store "
            f"(write_through) and promotes file blocks into the CPU tier; asked for "
            f"{config.tiers}, {config.write_policy}, promotion {config.promotion}"
        )


def vllm_tiering_adapter(config: EngineConfig) -> VLLMTiering:
    """vLLM's tiering manager with its file tier, for a three-tier write-through configuration
    with promotion on; UnsupportedConfig for any other. vLLM is imported on the first call
    (EngineUnavailable, with the install line, without it)."""
    _verify_shape(config)
    caps = config.capacities
    return VLLMTiering(caps["L1"], caps["L2"], config.page_size)


def vllm_tiering_traced_adapter(config: EngineConfig) -> VLLMTiering:
    """`vllm_tiering_adapter` that traces what vLLM did (`hicache fuzz --report` counts its
    transitions, check-trace judges each run's trace), over a file tier that a restart does
    not keep: a trace starts from an empty cache (spec/trace.md), and a persistent L3 would
    start the next engine's trace with pages it never stored."""
    _verify_shape(config)
    caps = config.capacities
    return VLLMTiering(caps["L1"], caps["L2"], config.page_size, persistent=False, traced=True)


class VLLMTieringUnreadPromotion(VLLMTiering):
    """The adapter with one bug put in on purpose: a promotion is reported done to the tier
    without its file read running -- the CPU chunk is published holding whatever it held
    before (a completion observed before the bytes landed). A test (and the results page)
    shows what the machine says when an adapter over vLLM gets promotion wrong."""

    def _play(self, op_id: int, ok: bool, kind: str) -> None:
        f = self.file_ops[op_id]
        if f.kind == LOAD and ok:
            self.ft.jobs.queued[f.job].tasks = []  # the read never runs; the job succeeds
        super()._play(op_id, ok, kind)


def unread_promotion_adapter(config: EngineConfig) -> VLLMTiering:
    """`vllm_tiering_adapter` with the unread promotion put in (VLLMTieringUnreadPromotion)."""
    _verify_shape(config)
    caps = config.capacities
    return VLLMTieringUnreadPromotion(caps["L1"], caps["L2"], config.page_size)


def corrupt_reads_adapter(config: EngineConfig) -> VLLMTiering:
    """`vllm_tiering_adapter` where a "corrupt" read rewrites the block file's bytes before
    the tier reads it (`corrupt_reads`): vLLM has no checksum, so it serves them, and the
    machine names the page (the finding the results page triages)."""
    _verify_shape(config)
    caps = config.capacities
    return VLLMTiering(caps["L1"], caps["L2"], config.page_size, corrupt_reads=True)
