"""`CacheUnderTest`: what an engine implements to be driven by the fuzz machine.

The machine (hicache/testing/machine.py) calls the methods below in an order it chooses and,
after every step, compares what the engine reports with the reference model
(hicache/testing/reference.py). An engine reports three kinds of things:

    what                   method                 the reference checks
    ---------------------  ---------------------  ------------------------------------------
    per-tier hit lengths   `submit` -> Admission  each tier's hit is the leading run of pages
                                                  the engine itself reported RESIDENT there
    page changes           `changes()`            each is a legal step of one tier's page
                                                  (ABSENT -> PENDING -> RESIDENT -> ABSENT),
                                                  and no page a live request is served from
                                                  leaves L1
    cached_len, live set   `cached_len`, `live`   admission: the L1 hit; after `prefill`: the
                                                  prompt's whole pages, short only of a page
                                                  another request is loading
    served bytes           `served_digests`       a page's digest is the same every time the
                                                  same token prefix is served (None: no bytes)

An engine whose L1 can free a page's *window* (a pool group with a sliding-window pool,
spec/pools.md "Freed windows") reports it as the page change `WINDOW_FREED` (L1 only: the
page stays RESIDENT without its window; `WINDOW_REVIVED` when it has it again) and sets `hit_window`
to the pages an L1 hit needs, each with its window, just before its end (0, the default, for every
other engine): the reference then ends an L1 hit at the last page end with a whole window before it.
An engine that replays such a window instead (`anchor_recompute_swa`) sets `replay_window` to its
pages: the reference then ends an L1 hit before the window when a page of it is freed (the
request recomputes it). Under either, a served prefix ends with its window whole after `prefill`.

An engine whose L1 may hold two copies of one page (vLLM's block pool keys blocks by hash, several
blocks to a hash) sets `duplicate_copies` (spec/tree.md, "Duplicate copies"): a request that
computes a page another request is loading then serves its own copy, and the reference does not
cut its `cached_len` at that page.

An engine whose tier keys each page by a chained hash of its prefix rather than by a node
of a tree (vLLM's offloading tiers) may hold a page without its parent page there (an orphan:
the parent's store failed or was evicted first; nothing can match it, a lookup stops at the
first missing page). It names such tiers in `hash_keyed_tiers` (() by default): the reference
then does not require that tier closed under ancestors (spec/invariants.md S6, "Hash-keyed
tiers"); every other check, the hit as the leading run of RESIDENT pages among them, holds.

A *page* is named by its token prefix: `tokens[:k * page_size]` names the k-th page of a
prompt, in every tier, whatever node or slot holds it. That is what keeps the reference
independent of the engine's tree.

Contract for implementers: every method raises only `HiCacheError` subclasses for refused
input, and a refused call changes nothing. Refused input includes (the fuzz machine makes
these calls; spec/vectors.md's `l1_refused` cases too): `submit` of an empty prompt, of a
prompt that needs more L1 pages than L1 has (its partial last page too), or of a live id;
`prefill` of a request served already; `prefill` and `finish` of a request that is not
live. A factory builds an adapter for an `EngineConfig` (factory.py; template.py is one to
copy). `pending_ops` lists the transfers the machine may
complete or fail, in a stable order; `complete`/`fail` take effect on the next `tick` (the
engine observes them then), as a real completion would. `check()` returns the engine's own
structural findings (empty when it has none to offer). `trace()` returns the lifecycle trace
events so far (spec/trace.md) for coverage; an engine without one returns [].

A crash: any call that observes a transfer (`tick`, `drain`, `finish`, `submit`, `prefill`,
`evict` under write-back, which waits for a victim's backup)
may raise `hicache.dataplane.faults.SimulatedCrash` when the schedule's CRASH_BEFORE_PUBLISH
fires -- the process died between a transfer and its publication. The machine then calls
`restart()` and, as spec/faults.md says, expects the engine to start empty: the reference
model forgets every page and request -- but the RESIDENT pages of a tier the engine names in
`persistent_tiers` (() by default: a content-addressed store such as vLLM's file tier, which a
new engine on the same directory reads again; spec/faults.md, "Persistent tiers").
An engine whose object lives on after its crash point (hicache's controller: the process is
simulated, so a caller may still call it) sets `refuses_when_dead` (False by default: the
process is gone): before `restart()` the machine then calls `submit`, `ready`, `prefill`,
`cancel_restore`, `finish`, `evict` and `tick` on the crashed engine once each, and each must
raise a `HiCacheError` with no page change (spec/faults.md R57: all but `close` refused, nothing
published after the crash point).
`damage_storage` cuts or removes the last tier's backing file (an engine without one does
nothing); the engine must answer with misses and recomputation, never with the lost bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from hicache.core.trace import TraceEvent

PENDING = "PENDING"
"""A page-change state: a transfer is filling the page in that tier (any direction)."""

TIER_CLOSURES = ("tier", "hierarchy")
"""How an engine keeps its tiers closed under ancestors (spec/invariants.md S6), its
`tier_closure` (the reference reads it; "tier", the spec's own, when absent): "tier", each
tier holds every held page's parent itself; "hierarchy", a parent RESIDENT in a tier above
counts (an engine that reclaims lower-tier copies of upper-tier pages in any order)."""

WINDOW_FREED = "WINDOW_FREED"
"""A page-change state of L1 only: the RESIDENT page lost its window (its trailing pools'
pages); it stays RESIDENT, and an L1 hit never ends with it in the `hit_window` before."""

WINDOW_REVIVED = "WINDOW_REVIVED"
"""A page-change state of L1 only: a page whose window was freed has it again (a request
that recomputed the same tokens gave it its copy)."""


@dataclass(frozen=True)
class PageChange:
    """One page of one tier changed state: `state` is ABSENT, PENDING or RESIDENT. `prefix`
    is the page's token prefix (its length a multiple of the page size)."""

    tier: str
    prefix: tuple[int, ...]
    state: str


@dataclass(frozen=True)
class Admission:
    """What `submit` reports: each tier's hit length (tokens, page aligned) for the prompt's
    first `len(tokens) - 1` tokens, and the request's `cached_len` right after admission."""

    hits: dict[str, int]
    cached_len: int


@dataclass
class FaultSchedule:
    """Per fault site: the probability that it fires each time it is reached (0: off).
    Sites are `hicache.dataplane.faults.FaultSite` names; an engine ignores sites it has
    not got. `seed` makes the draws repeatable."""

    seed: int = 0
    rates: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class CacheUnderTest(Protocol):
    """An engine as the machine drives it (see the module docstring)."""

    page_size: int
    tiers: tuple[str, ...]  # e.g. ("L1", "L2", "L3"); a plain cache: ("L1",)

    def submit(self, request_id: int, tokens: Sequence[int]) -> Admission:
        """Admit a request: match, plan, start restores."""
        ...

    def ready(self, request_id: int) -> bool:
        """Whether the request's restore has settled (`prefill` may run)."""
        ...

    def prefill(self, request_id: int) -> bool:
        """Serve what arrived, compute the rest, insert. False (nothing changed: no page
        evicted either, spec/restore.md) when the engine refuses for lack of room -- which
        it lacks only while others hold it: a request alone in the engine, nothing in flight,
        whose prompt L1 admitted, is served (an injected ALLOC_L1 aside)."""
        ...

    def finish(self, request_id: int) -> None:
        """End a request, finished or aborted, in whatever state it is."""
        ...

    def cancel_restore(self, request_id: int) -> None:
        """Give up the request's restore but keep the request (cancel its transfers, stop
        waiting for shared ones): it is ready at once, and `prefill` serves what L1 published
        and computes the rest. Nothing to do for an engine without restores, or when the
        restore settled already."""
        ...

    def tick(self) -> None:
        """One scheduler step: observe completions, continue restores and backups."""
        ...

    def has_work(self) -> bool:
        """Whether a `tick` could change anything now: a transfer in flight, a restore not
        settled, or work queued for the next tick (a wanted backup)."""
        ...

    def pending_ops(self) -> list[int]:
        """Ids of the transfers in flight, in issue order."""
        ...

    def complete(self, op_id: int) -> None:
        """Let transfer `op_id` succeed (observed on the next tick)."""
        ...

    def fail(self, op_id: int, kind: str) -> None:
        """Let transfer `op_id` fail (`kind`: "error", "corrupt" or "unreadable"; an engine
        treats a kind it does not know as "error")."""
        ...

    def evict(self, tier: str, n_pages: int) -> None:
        """Eviction pressure from outside: free at least `n_pages` pages of `tier` while
        candidates are left, least recently used leaf first and no more once `n_pages` are
        free (a node's value goes whole, so it may free more: spec/eviction.md)."""
        ...

    def set_faults(self, schedule: FaultSchedule) -> None:
        """Use `schedule` from now on."""
        ...

    def aim(self, action: str, tier: str) -> None:
        """Aim a fault at the next transfer whose target is `tier` (one aim at a time: a new
        one replaces it): "refuse" (its reservation fails as if the tier were full), "crash"
        (the process dies once it is done, before it is published), it fails as `fail`'s
        kinds say ("error", "corrupt", "unreadable"), or -- drawn only for an engine with a
        pool group -- "partial" (an L3 read stops with part of each pool landed; the engine
        publishes what every pool holds). An engine without such transfers ignores it."""
        ...

    def damage_storage(self, how: str) -> None:
        """The last tier's backing store is damaged under the engine: `how` is "truncate"
        (cut to a few bytes: what it held reads short) or "remove" (the file is gone)."""
        ...

    def drain(self) -> None:
        """Let every transfer end (each per the fault schedule) and apply it."""
        ...

    def restart(self) -> None:
        """Close and open again: every request ends, the cache starts empty."""
        ...

    def close(self) -> None:
        """Release everything; the adapter is not used again."""
        ...

    def live(self) -> set[int]:
        """Ids of the live requests."""
        ...

    def cached_len(self, request_id: int) -> int:
        """Tokens of the request's prompt served from the cache."""
        ...

    def served_digests(self, request_id: int) -> list[int] | None:
        """A digest of each page the request is served from (its first `cached_len` tokens),
        in token order; None when the engine holds no bytes."""
        ...

    def changes(self) -> list[PageChange]:
        """The page changes since the last call, in order: what a call evicts before what it
        then inserts, even a page it evicts and inserts again (reported both times: the
        reference model checks the eviction order from them)."""
        ...

    def check(self) -> list[str]:
        """The engine's own invariant and structural findings now ([]: none)."""
        ...

    def trace(self) -> list[TraceEvent]:
        """Every lifecycle trace event so far ([] when the engine has no trace)."""
        ...

    def fault_counts(self) -> dict[str, int]:
        """How often each fault site fired so far."""
        ...
