"""Metrics: what the controller counts and times, and their Prometheus text form.

Contract: every name carries its unit (`_tokens`, `_pages`, `_s`/`_seconds`, `bytes`) or is
a count of events (Prometheus `_total`); the Python attribute, the summary key and the
Prometheus family (prefix `hicache_`, suffix `_total` for counters) are the same words.
Counters only grow (never clamped); `token_shares` derives the per-source split, it stores
nothing.

    attribute                  unit     Prometheus family
    -------------------------  -------  -------------------------------------------------
    hit_tokens[tier]           tokens   hit_tokens_total{tier}
    recomputed_tokens          tokens   recomputed_tokens_total
    prompt_tokens              tokens   prompt_tokens_total
    evicted_pages[tier]        pages    evicted_pages_total{tier}       (pressure only)
    window_freed_pages         pages    window_freed_pages_total        (L1 anchor pages)
    window_clipped_tokens      tokens   window_clipped_tokens_total     (all_pools)
    window_recomputed_tokens   tokens   window_recomputed_tokens_total  (anchor_recompute_swa)
    l3_invalidated_pages[why]  pages    l3_invalidated_pages_total{reason} (bad slot, offline)
    promoted_pages             pages    promoted_pages_total
    shared_load_back_pages     pages    shared_load_back_pages_total
    restored_unused_pages      pages    restored_unused_pages_total
    verified_pages             pages    verified_pages_total
    layerwise_prefills         events   layerwise_prefills_total  (computed on a landing restore)
    ahead_discarded            events   ahead_discarded_total     (that KV thrown away, R82)
    fallbacks[reason]          parts    fallbacks_total{reason}
    dropped_tokens[reason]     tokens   dropped_tokens_total{reason}
    restores, policy_skips,    events   restores_total, policy_skips_total,
    preemptions, decisions              preemptions_total, decisions_total{choice}
    preempted_tokens           tokens   preempted_tokens_total
    decode_overlap_s           seconds  decode_overlap_seconds_total
    directions[d].count        events   transfers_done_total{direction}
    directions[d].failed       events   transfers_failed_total{direction}   (never a cancel)
    directions[d].cancelled    events   transfers_cancelled_total{direction}
    directions[d].bytes        bytes    transfer_bytes_total{direction}
    directions[d].seconds      seconds  transfer_seconds_total{direction}  (issue -> observed)
    directions[d].<stage>_s    seconds  transfer_<stage>_seconds_total{direction}
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from hicache.core.tiers import Direction, Tier
from hicache.dataplane.handles import TransferStatus, TransferTimings

GIB = float(1 << 30)
# Why a planned restore (or one part of it) fell back to recompute:
#   transfer_failed  its transfer failed (a cancel, when the request ends, is not counted)
#   no_room          the tier it needed could not make room even after eviction (live
#                    requests hold the pages)
#   restore_gap      the L2 part before an L3 part did not reach L1 (failed, or not issued:
#                    the L3 part is dropped with it), so loading the L3 part back would leave
#                    a gap; a promoted one stays in L2, the tokens are recomputed
#   l3_offline       the L3 file is offline (removed or replaced under us)
#   dropped          the L3 part's graft into L2 was refused: the node above it is not backed
#                    up in L2 (SGLang's host_insert_dropped, reported with reason "dropped")
#   load_back_pending  another request's load-back fills a node on the path, and the config
#                    says back off (load_back_overlap = "back_off", SGLang's guard 3)
#   prefetch_clamped an S2H stopped part way (some pool's pages did not all land): the whole
#                    nodes of `prefetch_clamp` are kept, the rest recomputed (F11, F12)
FALLBACK_REASONS = (
    "transfer_failed",
    "no_room",
    "restore_gap",
    "l3_offline",
    "dropped",
    "load_back_pending",
    "prefetch_clamped",
)
# Why tokens left the cache without a copy below (`dropped_tokens`; SGLang's
# hicache_dropped_tokens_total names the first two):
#   host_pressure                    a D2H backup, or write-back of an L1 victim, found no L2 room
#   write_through_unbacked_eviction  L1 evicted a node whose write-through backup was not in time
#   storage_pressure                 an H2S backup found no L3 room
#   backup_failed                    a backup transfer failed, or was refused at issue
#   l3_offline                       the L3 file went offline under a planned backup or a copy
#   window_freed                     write-back evicted an L1 victim whose window was freed: the
#                                    host tiers hold whole groups, so it cannot be backed up
DROP_REASONS = (
    "host_pressure",
    "write_through_unbacked_eviction",
    "storage_pressure",
    "backup_failed",
    "l3_offline",
    "window_freed",
)
# Why L3 copies were dropped outside eviction (`invalidate_l3`), in pages: the node's slot
# failed its checksum, could not be read (I/O error, file ended early), or the whole file went
# offline. Only the bad slot's node is invalidated; pressure evictions count in evicted_pages.
#   below_bad_slot: healthy L3 copies under a bad slot's node, *evicted* (`evict_l3`) first
#   so that L3 stays closed under ancestors (S6) when that node's copy is dropped.
INVALIDATION_REASONS = ("corrupt", "unreadable", "l3_offline", "below_bad_slot")


@dataclass
class DirectionStats:
    """One transfer direction. `seconds` is end to end: issue until the completion is observed."""

    count: int = 0  # completed (DONE)
    failed: int = 0  # FAILED: a fault; never a cancel
    cancelled: int = 0  # CANCELLED: the request ended, or shutdown
    bytes: int = 0
    seconds: float = 0.0
    enqueue_s: float = 0.0
    workspace_setup_s: float = 0.0
    queue_wait_s: float = 0.0
    service_s: float = 0.0

    @property
    def steady_s(self) -> float:
        """Issue + queue wait + service: the transfers' own time (`enqueue_s` leaves workspace
        setup out; it is counted apart, in `workspace_setup_s`)."""
        return self.enqueue_s + self.queue_wait_s + self.service_s

    @property
    def gib_per_s(self) -> float:
        """Bandwidth over the steady time (not over `seconds`, which includes poll latency)."""
        return self.bytes / GIB / self.steady_s if self.steady_s > 0 else 0.0


@dataclass
class Metrics:
    hit_tokens: dict[str, int] = field(default_factory=lambda: {"L1": 0, "L2": 0, "L3": 0})
    recomputed_tokens: int = 0
    prompt_tokens: int = 0
    evicted_pages: dict[str, int] = field(default_factory=lambda: {"L1": 0, "L2": 0, "L3": 0})
    # Freed windows (spec/pools.md): L1 anchor pages whose window make-room freed; tokens an
    # L1 run held that a freed window kept out of the hit (all_pools); tokens of the window
    # replayed before a hit (anchor_recompute_swa).
    window_freed_pages: int = 0
    window_clipped_tokens: int = 0
    window_recomputed_tokens: int = 0
    promoted_pages: int = 0  # L3 -> L2 pages kept in L2 after a restore
    shared_load_back_pages: int = 0  # pages a request got from another request's load-back
    # Pages a restore put into L1 that `prefill` did not serve (recomputed instead). The pins
    # make this 0; it is counted, never silent, should a path ever waste a restore.
    restored_unused_pages: int = 0
    fallbacks: dict[str, int] = field(default_factory=lambda: {r: 0 for r in FALLBACK_REASONS})
    policy_skips: int = 0
    restores: int = 0
    verified_pages: int = 0
    layerwise_prefills: int = 0  # prefills whose KV was computed while their H2D landed
    ahead_discarded: int = 0  # KV computed ahead and thrown away: its H2D did not end DONE
    decode_overlap_s: float = 0.0
    decode_steps: int = 0
    dropped_tokens: dict[str, int] = field(default_factory=lambda: {r: 0 for r in DROP_REASONS})
    l3_invalidated_pages: dict[str, int] = field(
        default_factory=lambda: {r: 0 for r in INVALIDATION_REASONS}
    )
    directions: dict[str, DirectionStats] = field(
        default_factory=lambda: {d.value: DirectionStats() for d in Direction}
    )
    decisions: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    latency_s: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    # Admissions a serving loop abandoned to break an L1 deadlock (the request is admitted
    # again later, and that admission is counted anew): their prompt tokens, and the hit
    # tokens already credited to them, which `token_shares` moves out of the hits.
    preemptions: int = 0
    preempted_tokens: int = 0
    preempted_hit_tokens: dict[str, int] = field(
        default_factory=lambda: {"L1": 0, "L2": 0, "L3": 0}
    )

    def transfer(
        self, direction: Direction, nbytes: int, status: TransferStatus, timings: TransferTimings
    ) -> None:
        """Count one transfer's observed final `status`; time and bytes only when DONE."""
        d = self.directions[direction.value]
        if status is TransferStatus.CANCELLED:
            d.cancelled += 1
            return
        if status is not TransferStatus.DONE:
            d.failed += 1
            return
        d.count += 1
        d.bytes += nbytes
        end = timings.observed_at if timings.observed_at is not None else timings.issued_at
        d.seconds += max(0.0, end - timings.issued_at)
        d.enqueue_s += timings.enqueue_s
        d.workspace_setup_s += timings.workspace_setup_s
        d.queue_wait_s += timings.queue_wait_s
        d.service_s += timings.service_s

    def ended_at_issue(self, direction: Direction, status: TransferStatus) -> None:
        """Count a transfer that ended inside its issuing call, before any handle was observed:
        FAILED (its issue raised, R13) or, across ranks, CANCELLED (a rank refused its
        reservation). The trace ends it there too (`<dir>_fail`, `<dir>_cancel`)."""
        assert status in (TransferStatus.FAILED, TransferStatus.CANCELLED), status
        self.transfer(direction, 0, status, TransferTimings())

    def evicted(self, tier: Tier | str, n_pages: int) -> None:
        self.evicted_pages[str(tier)] += n_pages

    def fallback(self, reason: str) -> None:
        assert reason in self.fallbacks, f"unknown fallback reason {reason!r}"
        self.fallbacks[reason] += 1

    def drop(self, reason: str, tokens: int) -> None:
        assert reason in self.dropped_tokens, f"unknown drop reason {reason!r}"
        self.dropped_tokens[reason] += tokens

    def invalidated(self, reason: str, n_pages: int) -> None:
        assert reason in self.l3_invalidated_pages, f"unknown invalidation reason {reason!r}"
        self.l3_invalidated_pages[reason] += n_pages

    def preempt(self, prompt_tokens: int, credited_hits: dict[str, int]) -> None:
        """Count one abandoned admission of `prompt_tokens` tokens, to which `credited_hits`
        (tier -> tokens) had been credited as hits before it was abandoned."""
        # Verify the credits are this admission's: never more than its prompt, never negative.
        assert all(n >= 0 for n in credited_hits.values()), f"negative credit {credited_hits}"
        assert sum(credited_hits.values()) <= prompt_tokens, "credited more than the prompt"
        self.preemptions += 1
        self.preempted_tokens += prompt_tokens
        for tier, tokens in credited_hits.items():
            self.preempted_hit_tokens[tier] += tokens

    def token_shares(self) -> dict[str, int]:
        """Where every admitted prompt token went, in tokens: hit in L1, L2 or L3 or
        recomputed by an admission that was served, or `preempted` with an abandoned one.
        The values add up to `prompt_tokens` exactly."""
        shares = {tier: n - self.preempted_hit_tokens[tier] for tier, n in self.hit_tokens.items()}
        return {**shares, "recomputed": self.recomputed_tokens, "preempted": self.preempted_tokens}

    def summary(self) -> dict[str, object]:
        return {
            "hit_tokens": dict(self.hit_tokens),
            "recomputed_tokens": self.recomputed_tokens,
            "prompt_tokens": self.prompt_tokens,
            "evicted_pages": dict(self.evicted_pages),
            "window_freed_pages": self.window_freed_pages,
            "window_clipped_tokens": self.window_clipped_tokens,
            "window_recomputed_tokens": self.window_recomputed_tokens,
            "promoted_pages": self.promoted_pages,
            "fallbacks": dict(self.fallbacks),
            "shared_load_back_pages": self.shared_load_back_pages,
            "restored_unused_pages": self.restored_unused_pages,
            "policy_skips": self.policy_skips,
            "restores": self.restores,
            "verified_pages": self.verified_pages,
            "layerwise_prefills": self.layerwise_prefills,
            "ahead_discarded": self.ahead_discarded,
            "decode_overlap_s": self.decode_overlap_s,
            "decode_steps": self.decode_steps,
            "dropped_tokens": dict(self.dropped_tokens),
            "l3_invalidated_pages": dict(self.l3_invalidated_pages),
            "decisions": dict(self.decisions),
            "preemptions": self.preemptions,
            "preempted_tokens": self.preempted_tokens,
            "token_shares": self.token_shares(),
            "directions": {
                k: {**vars(v), "gib_per_s": v.gib_per_s} for k, v in self.directions.items()
            },
        }

    def to_prometheus(self, prefix: str = "hicache") -> str:
        """Prometheus text exposition format (version 0.0.4)."""
        out: list[str] = []

        def family(name: str, kind: str, help_: str, rows: list[tuple[str, float]]) -> None:
            out.append(f"# HELP {prefix}_{name} {help_}")
            out.append(f"# TYPE {prefix}_{name} {kind}")
            out.extend(f"{prefix}_{name}{labels} {value:g}" for labels, value in rows)

        family(
            "hit_tokens_total",
            "counter",
            "Prompt tokens served from each tier.",
            [(f'{{tier="{t}"}}', v) for t, v in self.hit_tokens.items()],
        )
        family(
            "recomputed_tokens_total",
            "counter",
            "Prompt tokens recomputed.",
            [("", self.recomputed_tokens)],
        )
        family(
            "prompt_tokens_total", "counter", "Prompt tokens admitted.", [("", self.prompt_tokens)]
        )
        family(
            "evicted_pages_total",
            "counter",
            "Pages evicted per tier under pressure (LRU leaves).",
            [(f'{{tier="{t}"}}', v) for t, v in self.evicted_pages.items()],
        )
        family(
            "window_freed_pages_total",
            "counter",
            "L1 anchor pages whose window (trailing side pools) was freed.",
            [("", self.window_freed_pages)],
        )
        family(
            "window_clipped_tokens_total",
            "counter",
            "L1 tokens a freed window kept out of a hit (all_pools).",
            [("", self.window_clipped_tokens)],
        )
        family(
            "window_recomputed_tokens_total",
            "counter",
            "Window tokens replayed before a hit (anchor_recompute_swa).",
            [("", self.window_recomputed_tokens)],
        )
        family(
            "promoted_pages_total",
            "counter",
            "Pages restored from L3 that stayed in L2.",
            [("", self.promoted_pages)],
        )
        family(
            "shared_load_back_pages_total",
            "counter",
            "Pages a request got from another request's load-back.",
            [("", self.shared_load_back_pages)],
        )
        family(
            "restored_unused_pages_total",
            "counter",
            "Pages restored into L1 that prefill recomputed instead.",
            [("", self.restored_unused_pages)],
        )
        family(
            "verified_pages_total",
            "counter",
            "Restored pages compared with recomputation.",
            [("", self.verified_pages)],
        )
        family(
            "layerwise_prefills_total",
            "counter",
            "Prefills computed while their restore's H2D was landing, layer by layer.",
            [("", self.layerwise_prefills)],
        )
        family(
            "ahead_discarded_total",
            "counter",
            "KV computed on a landing restore and thrown away (the H2D did not end DONE).",
            [("", self.ahead_discarded)],
        )
        family(
            "restores_total",
            "counter",
            "Restores that delivered pages to L1.",
            [("", self.restores)],
        )
        family(
            "fallbacks_total",
            "counter",
            "Restores that fell back to recompute, by reason.",
            [(f'{{reason="{r}"}}', v) for r, v in self.fallbacks.items()],
        )
        family(
            "policy_skips_total",
            "counter",
            "Restore candidates the policy declined.",
            [("", self.policy_skips)],
        )
        family(
            "dropped_tokens_total",
            "counter",
            "Tokens whose backup was dropped, by reason.",
            [(f'{{reason="{r}"}}', v) for r, v in self.dropped_tokens.items()],
        )
        family(
            "l3_invalidated_pages_total",
            "counter",
            "L3 pages dropped outside eviction (corrupt, unreadable, file offline), by reason.",
            [(f'{{reason="{r}"}}', v) for r, v in self.l3_invalidated_pages.items()],
        )
        family(
            "decisions_total",
            "counter",
            "Policy decisions by choice.",
            [(f'{{choice="{c}"}}', v) for c, v in sorted(self.decisions.items())],
        )
        family(
            "preemptions_total",
            "counter",
            "Admissions abandoned to break an L1 deadlock.",
            [("", self.preemptions)],
        )
        family(
            "preempted_tokens_total",
            "counter",
            "Prompt tokens of abandoned admissions.",
            [("", self.preempted_tokens)],
        )
        for name, attr, help_ in (
            ("transfers_done_total", "count", "Completed transfers."),
            (
                "transfers_failed_total",
                "failed",
                "Failed transfers (faults; cancels are not failures).",
            ),
            (
                "transfers_cancelled_total",
                "cancelled",
                "Cancelled transfers (request ended, shutdown).",
            ),
            ("transfer_bytes_total", "bytes", "Bytes moved."),
            ("transfer_seconds_total", "seconds", "Seconds from issue to observed completion."),
            ("transfer_enqueue_seconds_total", "enqueue_s", "Seconds spent issuing."),
            (
                "transfer_workspace_setup_seconds_total",
                "workspace_setup_s",
                "Seconds allocating workspaces.",
            ),
            (
                "transfer_queue_wait_seconds_total",
                "queue_wait_s",
                "Seconds waiting for an I/O thread.",
            ),
            ("transfer_service_seconds_total", "service_s", "Seconds of kernel/DMA/I/O service."),
        ):
            family(
                name,
                "counter",
                help_,
                [(f'{{direction="{d}"}}', getattr(s, attr)) for d, s in self.directions.items()],
            )
        family(
            "decode_overlap_seconds_total",
            "counter",
            "Decode seconds that overlapped a pending restore.",
            [("", self.decode_overlap_s)],
        )
        return "\n".join(out) + "\n"
