"""What the vLLM adapters show of vLLM: the page changes, cached lengths, served bytes and
accounting the fuzz machine judges, and the trace hooks (vllm_trace.py) -- the observing half
of `VLLMOffloading` (vllm.py), which owns the state named below.

    tier  shown as (a page: its token prefix)
    ----  -----------------------------------------------------------------------------------
    L1    RESIDENT: some block holds it, hashed (published in the prefix cache; duplicates
          are one page); PENDING: a load not given up fills it and no block holds it yet
    L2    the manager's lookup: HIT -> RESIDENT, HIT_PENDING (a store in flight) -> PENDING;
          shown whole, orphans included (L2 is hash-keyed, spec/tree.md); pages held
          without their parent (vllm_state.closed's cut) are counted, in
          `stats["l2_orphan_pages"]`
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hicache.testing.adapters.vllm_check import manager_findings, pool_findings
from hicache.testing.adapters.vllm_state import (
    RESIDENT,
    Job,
    PageViews,
    Prefix,
    Request,
    View,
    closed,
)
from hicache.testing.adapters.vllm_trace import VLLMTrace
from hicache.testing.protocol import PENDING, PageChange


class Views:
    """The observing half of `VLLMOffloading` (module docstring)."""

    v: dict[str, Any]
    pool: Any  # BlockPool
    manager: Any  # OffloadingManager
    page_size: int
    l2_pages: int
    requests: dict[int, Request]
    jobs: dict[int, Job]
    next_op: int  # the next op id (a trace-only copy takes one too)
    l1_bytes: dict[int, int]
    l2_keys: dict[Any, Prefix]
    prefix_of: dict[bytes, Prefix]
    views: PageViews
    stats: Counter[str]
    traced: bool
    traces: list[VLLMTrace]
    _observer: Any  # the ReqContext the adapter's own lookups use
    _changes: list[PageChange]
    _orphans: set[Prefix]
    l2_announced: dict[bytes, bool]

    def _live(self, rid: int) -> Request:
        raise NotImplementedError  # vllm.py

    def _cpu(self) -> Any:
        raise NotImplementedError  # vllm.py: the CPU manager (a subclass's may wrap it)

    def _more_l2_transfers(self, reads: Counter[Any], writes: set[Any]) -> None:
        """Add the L2 chunks a subclass's own transfers pin (once per transfer) or write
        (not ready) to what `check` expects; the CPU manager alone has none."""

    def _page(self, r: Request, k: int) -> Prefix:
        return r.tokens[: (k + 1) * self.page_size]

    @property
    def _trace(self) -> VLLMTrace | None:
        return self.traces[-1] if self.traced else None

    def _cached(self) -> set[Prefix]:
        """The pages some block of L1 holds, published (hashed)."""
        return {
            self.prefix_of[bytes(b.block_hash)[:-4]]
            for b in self.pool.blocks
            if b.block_hash is not None
        }

    def _held(self, r: Request, start: int) -> dict[int, str]:
        """The request's pages from `start` on that L1 holds ("L1") or another tier or a job
        ("other") holds or fills now, or that lie above a page held (an L2 orphan keeps its
        ancestors' nodes, hash-keyed): the trace's reference has their nodes."""
        cached, out = self._cached(), {}
        filling = {p for j in self.jobs.values() if not j.orphan for p in self._job_pages(j)}
        held = filling | set(self._l2_view())
        below = {q[:n] for q in held for n in range(self.page_size, len(q), self.page_size)}
        for k in range(start, len(r.keys)):
            page = self._page(r, k)
            if page in cached:
                out[k] = "L1"
            elif page in held or page in below or self._l2_state(r.keys[k]) is not None:
                out[k] = "other"
        return out

    def _job_pages(self, job: Job) -> list[Prefix]:
        """The job's pages; a load's leaves out those L1 held already (a second copy: no
        page changes state, and the spec has no event for it)."""
        return [p for k in job.keys if (p := self.prefix_of[bytes(k)]) not in job.again]

    def _trace_l2_evicted(self, keys: list[Any]) -> None:
        if self._trace is not None:
            pages = [self.prefix_of[bytes(k)] for k in keys if bytes(k) in self.prefix_of]
            self._trace.evicted("L2", pages)

    def _trace_end(self, job: Job, ok: bool) -> None:
        """A job's end: d2h/h2d complete or fail (a given-up load was cancelled already)."""
        if self._trace is None or (not job.store and job.orphan):
            return
        end = "complete" if ok else "fail"
        event, tier = (f"d2h_{end}", "L2") if job.store else (f"h2d_{end}", "L1")
        self._trace.transfer(event, tier, job.op, self._job_pages(job), job.rid)
        lost = [p for p in job.again if p not in self._cached()] if ok and not job.store else []
        if lost:  # L1's copy went while the load ran: the load's copy is published, as a copy
            op, self.next_op = self.next_op, self.next_op + 1  # of its own, issued and done now
            self._trace.transfer("h2d_issue", "L1", op, lost, job.rid)
            self._trace.transfer("h2d_complete", "L1", op, lost, job.rid)

    def _trace_l1_evicted(self, pages: set[Prefix]) -> None:
        if self._trace is not None:
            self._trace.evicted("L1", pages)

    def _trace_cancel(self, job: Job) -> None:
        """A load given up (its request ended or stopped waiting): it runs on, unpublished."""
        if self._trace is not None:
            self._trace.transfer("h2d_cancel", "L1", job.op, self._job_pages(job), job.rid)

    def live(self) -> set[int]:
        return set(self.requests)

    def cached_len(self, request_id: int) -> int:
        return self._live(request_id).cached_len

    def served_digests(self, request_id: int) -> list[int] | None:
        r = self._live(request_id)
        return [
            self.l1_bytes.get(b.block_id, -1) for b in r.blocks[: r.cached_len // self.page_size]
        ]

    def _end_step(self) -> None:
        """The step's last manager calls (build_connector_meta's on_schedule_end, then the
        connector's take_events, which drains the manager's events)."""
        self.manager.on_schedule_end(self.v["ScheduleEndContext"]((), ()))
        self._take_events()
        self._note()

    def _take_events(self) -> None:
        """The manager's events so far: the last word on each key, stored or removed."""
        for event in self.manager.take_events():
            if getattr(event, "ownership", None) is not None:
                continue  # a secondary tier's (a tiering manager's): not the CPU tier's
            for key in event.keys:
                self.l2_announced[bytes(key)] = not event.removed

    def _note(self) -> None:
        """Compare the tiers now with what was last shown (so a call's evictions are
        reported before what it then inserts)."""
        self._changes += self.views.diff("L1", self._l1_view())
        self._changes += self.views.diff("L2", self._l2_view())

    def _l1_view(self) -> View:
        view: View = {}
        for job in self.jobs.values():
            if not job.store and not job.orphan:
                r = self.requests[job.rid]
                for page in job.pages:
                    view[r.tokens[: (page + 1) * self.page_size]] = PENDING
        for block in self.pool.blocks:
            if block.block_hash is not None:
                view[self.prefix_of[bytes(block.block_hash)[:-4]]] = RESIDENT
        return view

    def _l2_state(self, key: Any) -> str | None:
        """RESIDENT (HIT), PENDING (HIT_PENDING: a store in flight) or None (MISS)."""
        got = self._cpu().lookup(key, self._observer)
        lr = self.v["LookupResult"]
        return RESIDENT if got is lr.HIT else PENDING if got is lr.HIT_PENDING else None

    def _l2_view(self) -> View:
        held: View = {}
        for key, prefix in list(self.l2_keys.items()):
            state = self._l2_state(key)
            if state is None:
                del self.l2_keys[key]
            else:
                held[prefix] = state
        _, cut = closed(held, self.page_size)
        self.stats["l2_orphan_pages"] += len(cut - self._orphans)  # each page once
        self._orphans |= cut
        return held

    def changes(self) -> list[PageChange]:
        self._note()
        out, self._changes = self._changes, []
        return out

    def check(self) -> list[str]:
        """vLLM's accounting recounted (vllm_check.py)."""
        self._take_events()  # what a call outside a step (evict) announced
        return pool_findings(self) + self._manager_findings()

    def _manager_findings(self) -> list[str]:
        """The offloading manager's own accounting (a subclass checks its manager's)."""
        return manager_findings(self)
