"""A minimal serving loop driving the controller: admission, batched decode, restores
overlapped with decode.

    each iteration
      admit      waiting requests, up to `batch_size` live ones (restores are issued here)
      tick       observe transfer completions (publish, fall back, continue chains)
      prefill    every request whose restore has settled: use it, recompute the rest; when
                 no request decodes and every live one is waiting for L1 pages the others
                 hold, the newest is preempted (finished, queued again; its pages stay
                 cached) -- otherwise the loop would wait forever. Its admission is
                 counted as a preemption (`Metrics.preempt`), so each admitted prompt
                 token is a hit, recomputed or preempted exactly once
      decode     one step for every request in decode -- while other requests' restores
                 are still in flight (the overlap the serving bench measures)
      finish     requests whose decode is done

With `prefetch=False` (the controller's config) admission blocks until the restore settles,
so nothing overlaps. The decode step is a stand-in for the model's: one GEMM per step sized
by the batch (`decode_dim`), on the controller's device -- real work that a restore must
overlap, not a sleep.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from hicache.app.workload import RequestSpec
from hicache.controller.controller import CacheController
from hicache.errors import ConfigError, OutOfPages

Progress = Callable[[int, int], None]
T = TypeVar("T")


@dataclass
class LoopReport:
    requests: int = 0  # served to the end
    admissions: int = 0  # requests + preemptions: a preempted request is admitted again
    prompt_tokens: int = 0  # over all admissions
    recomputed_tokens: int = 0
    wall_s: float = 0.0
    decode_steps: int = 0
    decode_s: float = 0.0
    decode_overlap_s: float = 0.0  # decode seconds while at least one restore was in flight
    latencies_s: list[float] = field(default_factory=list)  # admission -> prefill done
    preemptions: int = 0  # requests sent back to the queue to break an L1 deadlock

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.wall_s if self.wall_s > 0 else 0.0


class ServingLoop:
    def __init__(
        self, controller: CacheController, *, batch_size: int = 4, decode_dim: int = 256
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.ctl = controller
        self.batch_size = batch_size
        device = controller.byte_plane.device
        self._w = torch.randn(decode_dim, decode_dim, device=device)

    def run(self, requests: Sequence[RequestSpec], progress: Progress | None = None) -> LoopReport:
        ctl = self.ctl
        self._check_fits(requests)
        report = LoopReport()
        waiting = list(requests)
        waiting.reverse()
        restoring: dict[int, float] = {}  # rid -> admitted at
        decoding: dict[int, int] = {}  # rid -> decode tokens left
        specs = {r.request_id: r for r in requests}
        started = time.perf_counter()
        done = 0
        hold_admission = False  # set by a preemption until some request gets to decode
        credited: dict[int, dict[str, int]] = {}  # rid -> hits credited to its admission
        while waiting or restoring or decoding:
            while (
                not hold_admission and waiting and len(restoring) + len(decoding) < self.batch_size
            ):
                spec = waiting.pop()
                restoring[spec.request_id] = time.perf_counter()
                credit = credited[spec.request_id] = dict.fromkeys(ctl.metrics.hit_tokens, 0)
                self._crediting(credit, functools.partial(ctl.admit, spec.request_id, spec.tokens))
                report.admissions += 1
                report.prompt_tokens += len(spec.tokens)
            ctl.tick()
            blocked: list[int] = []
            no_room: OutOfPages | None = None
            for rid in [r for r in restoring if ctl.ready(r)]:
                try:
                    recomputed = self._crediting(credited[rid], functools.partial(ctl.prefill, rid))
                except OutOfPages as e:
                    blocked.append(rid)  # L1 is held by others: retry once some let go
                    no_room = e
                    continue
                report.recomputed_tokens += recomputed
                del credited[rid]
                report.latencies_s.append(time.perf_counter() - restoring.pop(rid))
                decoding[rid] = specs[rid].decode_tokens
                hold_admission = False
            if blocked and not decoding and len(blocked) == len(restoring):
                # Nobody decodes and every live request waits for L1 pages. Transfers in
                # flight (backups read L1 pages) let go on their own: wait for them first.
                if ctl.handles:
                    self._wait_for_transfers()
                    continue
                if len(restoring) == 1:
                    assert no_room is not None  # set with every blocked request
                    raise no_room  # alone, nothing in flight, and still no room
                # Deadlock: each holds L1 pages locked that the others need, and none will
                # finish. Preempt the newest (its pages stay cached, unlocked, so the others
                # can evict them); admit again once another request decodes.
                rid = max(blocked, key=restoring.__getitem__)
                ctl.finish(rid)
                del restoring[rid]
                waiting.append(specs[rid])
                ctl.metrics.preempt(len(specs[rid].tokens), credited.pop(rid))
                report.preemptions += 1
                hold_admission = True
                continue
            if decoding:
                in_flight = any(ctl.restores[r].in_flight for r in restoring)
                step_s = self._decode_step(len(decoding))
                report.decode_steps += 1
                report.decode_s += step_s
                if in_flight:
                    report.decode_overlap_s += step_s
                for rid in list(decoding):
                    decoding[rid] -= 1
                    if decoding[rid] <= 0:
                        del decoding[rid]
                        ctl.finish(rid)
                        done += 1
                        report.requests += 1
                        if progress is not None:
                            progress(done, len(requests))
            elif restoring:
                self._wait_for_restores(restoring)
        ctl.drain()
        report.wall_s = time.perf_counter() - started
        ctl.metrics.decode_overlap_s += report.decode_overlap_s
        ctl.metrics.decode_steps += report.decode_steps
        return report

    def _crediting(self, credit: dict[str, int], call: Callable[[], T]) -> T:
        """`call()`, adding the hit tokens the controller credits meanwhile to `credit`. The
        controller credits a request's hits inside its own `admit` (L1) and `prefill` (L2,
        L3) calls only, so these are the hits of the request the call is about -- the ones
        to take back if its admission is preempted (a raising prefill may have credited
        a restore before it ran out of L1 pages)."""
        hits = self.ctl.metrics.hit_tokens
        before = dict(hits)
        try:
            return call()
        finally:
            for tier, tokens in hits.items():
                credit[tier] += tokens - before[tier]

    def _check_fits(self, requests: Sequence[RequestSpec]) -> None:
        """ConfigError naming l1_pages when a prompt needs more pages than L1 has: its KV
        must sit in L1 whole, so it could never be served (the loop would stop half-way)."""
        if not requests:
            return
        ps, capacity = self.ctl.config.kv.page_size, self.ctl.config.l1_pages
        longest = max(requests, key=lambda r: len(r.tokens))
        needed = -(-len(longest.tokens) // ps)
        if needed > capacity:
            raise ConfigError(
                "l1_pages",
                f"request {longest.request_id} has {len(longest.tokens)} "
                f"prompt tokens, {needed} pages, but L1 holds {capacity}; give L1 "
                f"at least {needed} pages",
            )

    def _decode_step(self, batch: int) -> float:
        t0 = time.perf_counter()
        x = torch.ones(batch, self._w.shape[0], device=self._w.device)
        y = x @ self._w
        if y.is_cuda:
            torch.cuda.synchronize(y.device)
        return time.perf_counter() - t0

    def _wait_for_transfers(self) -> None:
        """Block until every transfer in flight now has finished, then apply them."""
        for handle in list(self.ctl.handles.values()):
            handle.wait()
        self.ctl.tick()

    def _wait_for_restores(self, restoring: dict[int, float]) -> None:
        """Nothing to decode: block on one in-flight restore instead of spinning."""
        for rid in restoring:
            if self.ctl.restores[rid].in_flight:
                self.ctl.wait(rid)
                return
