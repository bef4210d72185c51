"""The reference model: what an engine's observable outputs must be, kept by the harness.

Independent of any engine's tree: a page is named by its token prefix, and the model holds,
per tier, the state of every page the engine has reported (`PageChange`), plus each live
request's tokens and `cached_len`. It does not choose victims or plans (those are the
engine's freedom); it checks that what the engine says is consistent with what it did:

    check                         rule
    ----------------------------  -------------------------------------------------------------
    page step                     ABSENT -> PENDING | RESIDENT, PENDING -> RESIDENT | ABSENT,
                                  RESIDENT -> ABSENT; nothing else (no state reported twice)
    closed under ancestors        after every call, in every tier, a RESIDENT page's parent
                                  page (one page shorter) is RESIDENT, a PENDING page's is
                                  RESIDENT or PENDING (spec/invariants.md S6): eviction
                                  frees leaves only, a prefix never loses its middle
                                  (`tier_closure` "hierarchy": a parent RESIDENT in a tier
                                  above counts; protocol.py TIER_CLOSURES) -- except in a
                                  tier the engine declares `hash_keyed_tiers` (S6's
                                  exception: blocks keyed by chained hashes, where an
                                  orphan is legal and only the leading run is a hit)
    eviction order (one tier)     the pages a call frees are whole nodes, least recently used
                                  unlocked leaf first; `evict(T, n)` stops once n are freed
                                  (spec/eviction.md; evictorder.py, which says why one tier)
    served pages stay             an L1 page inside a live request's first `cached_len` tokens
                                  never leaves L1 while the request lives
    hit lengths (admission)       tier T's hit is the leading run of the prompt's pages (its
                                  first len - 1 tokens) RESIDENT in T, page by page; in L1,
                                  with `hit_window` > 0, cut to the last page end whose
                                  `hit_window` pages before it (or all, near the start) kept
                                  their window; with `replay_window` > 0, cut by those pages
                                  (to 0 when fewer) when one of the last `replay_window` lost
                                  its window: the window replayed
    freed windows                 WINDOW_FREED only on a RESIDENT L1 page that has its window,
                                  never one a live request is served from; a page that leaves
                                  L1 and comes back has its window again
    cached_len at admission       the L1 hit
    cached_len after prefill      the prompt's whole pages, cut at the first page another
                                  request's load-back is filling (PENDING in L1) at the time
                                  (not cut with `duplicate_copies`: its own copy is served);
                                  its last `hit_window` (or `replay_window`) pages hold their
                                  window: what a prefill recomputed revived what was freed
    cached_len between steps      unchanged except by `prefill`
    live requests                 exactly those submitted and not finished
    served bytes                  a page prefix's digest is the same every time it is served
    damaged L3 copies             a page whose last-tier copy was damaged under the engine
                                  (`l3_damaged`: bytes changed, the file cut, removed or
                                  taken over) is never restored from it: its L2 page does
                                  not turn RESIDENT while L1 lacks it (then only a read of
                                  that copy could fill it) until the copy has left the tier
    refusals (`verify_refused`)   a call the protocol refuses raises a HiCacheError, and the
                                  engine reports no page change for it

A failed check raises `Mismatch` naming what differed, the engine's value and the model's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hicache.dataplane.faults import SimulatedCrash
from hicache.errors import HiCacheError
from hicache.testing.evictorder import EvictionViolation, OneTierTree
from hicache.testing.protocol import (
    PENDING,
    TIER_CLOSURES,
    WINDOW_FREED,
    WINDOW_REVIVED,
    Admission,
    CacheUnderTest,
    PageChange,
)

ABSENT = "ABSENT"
RESIDENT = "RESIDENT"
STEPS = {
    (ABSENT, PENDING),
    (ABSENT, RESIDENT),
    (PENDING, RESIDENT),
    (PENDING, ABSENT),
    (RESIDENT, ABSENT),
}
"""The page steps an engine may report (from-state, to-state)."""

Prefix = tuple[int, ...]


class Mismatch(AssertionError):
    """The engine's output differs from the reference model's."""

    def __init__(self, what: str, engine: object, reference: object, context: str = "") -> None:
        self.what, self.engine, self.reference = what, engine, reference
        where = f" ({context})" if context else ""
        super().__init__(
            f"differential check failed: {what}: engine {engine!r}, reference {reference!r}{where}"
        )


@dataclass
class RefRequest:
    tokens: tuple[int, ...]
    cached_len: int


class ReferenceModel:
    """Pages by tier and token prefix, live requests, and digests of served prefixes."""

    def __init__(
        self,
        page_size: int,
        tiers: Sequence[str],
        hit_window: int = 0,
        replay_window: int = 0,
        tier_closure: str = "tier",
        duplicate_copies: bool = False,
        hash_keyed_tiers: Sequence[str] = (),
        persistent_tiers: Sequence[str] = (),
    ) -> None:
        if tier_closure not in TIER_CLOSURES:
            raise HiCacheError(f"tier_closure {tier_closure!r}: one of {TIER_CLOSURES}")
        self.page_size = page_size
        self.tiers = tuple(tiers)
        self.tier_closure = tier_closure  # spec/invariants.md S6: per tier, or over tiers above
        self.hash_keyed_tiers = frozenset(hash_keyed_tiers)  # S6 not required there
        self.persistent_tiers = frozenset(persistent_tiers)  # survive a restart
        self.hit_window = hit_window  # pages an L1 hit needs with their window (0: none)
        self.replay_window = replay_window  # pages a hit replays when one lost its window
        self.duplicate_copies = duplicate_copies  # L1 may hold two copies of one page
        self.pages: dict[str, dict[Prefix, str]] = {t: {} for t in self.tiers}
        self.freed: set[Prefix] = set()  # L1 pages RESIDENT without their window
        self.requests: dict[int, RefRequest] = {}
        self.digests: dict[Prefix, int] = {}
        self.damaged: set[Prefix] = set()  # last-tier copies damaged under the engine
        self.checks = 0  # comparisons made (a test reads it to see the model really ran)
        # The eviction order is checked on an engine of one tier without windows (why:
        # evictorder.py); every engine's tiers are checked closed under ancestors.
        one_tier = len(self.tiers) == 1 and not hit_window
        self.tree = OneTierTree(page_size) if one_tier else None

    # -- what the engine did ------------------------------------------------------------------

    def apply(self, changes: Sequence[PageChange], evict_want: int | None = None) -> None:
        """Take one call's page changes (or several calls'), each checked as a legal step,
        then the tiers as they are after them (closed under ancestors) and, on one tier, the
        pages freed (`evict_want`: the pages an `evict` call asked for)."""
        touched: set[tuple[str, Prefix]] = set()
        freed: list[Prefix] = []
        added: list[Prefix] = []
        served = self._served_pages()  # before the call: what its evictions must spare
        for c in changes:
            if c.tier not in self.pages:
                raise Mismatch("tier of a page change", c.tier, self.tiers)
            if len(c.prefix) % self.page_size or not c.prefix:
                raise Mismatch(
                    "page prefix length", len(c.prefix), f"a positive multiple of {self.page_size}"
                )
            was = self.pages[c.tier].get(c.prefix, ABSENT)
            self.checks += 1
            if c.state in (WINDOW_FREED, WINDOW_REVIVED):
                self._window_step(c)
                continue
            if (was, c.state) not in STEPS:
                raise Mismatch(
                    f"{c.tier} page step of a {len(c.prefix)}-token prefix",
                    f"{was} -> {c.state}",
                    sorted(f"{a} -> {b}" for a, b in STEPS if a == was),
                )
            if c.tier == self.tiers[0] and was == RESIDENT:
                self._verify_unserved(c.prefix)
            if c.prefix in self.damaged:
                self._verify_not_restored_from_damage(c, was)
            touched.add((c.tier, c.prefix))
            (freed if c.state == ABSENT else added).append(c.prefix)
            if c.state == ABSENT:
                del self.pages[c.tier][c.prefix]
                if c.tier == self.tiers[0]:
                    self.freed.discard(c.prefix)  # back in L1 later: with its window
            else:
                self.pages[c.tier][c.prefix] = c.state
        for tier, prefix in sorted(touched):
            if tier not in self.hash_keyed_tiers:
                self._verify_closed(tier, prefix)
        if self.tree is not None:
            try:
                self.tree.batch(freed, added, served, evict_want)
            except EvictionViolation as e:
                raise Mismatch(e.what, e.engine, e.spec) from None

    def _served_pages(self) -> set[Prefix]:
        """The pages live requests are served from (their first `cached_len` tokens')."""
        ps = self.page_size
        return {
            r.tokens[:end]
            for r in self.requests.values()
            for end in range(ps, r.cached_len + 1, ps)
        }

    def _above(self, tier: str, prefix: Prefix) -> bool:
        """Whether a tier above `tier` holds `prefix` RESIDENT and the knob lets that count
        (tier_closure "hierarchy", spec/invariants.md S6)."""
        if self.tier_closure != "hierarchy":
            return False
        upper = self.tiers[: self.tiers.index(tier)]
        return any(self.pages[t].get(prefix) == RESIDENT for t in upper)

    def _verify_closed(self, tier: str, prefix: Prefix) -> None:
        """S6 at a page a call changed: held, its parent page is held (RESIDENT, or PENDING
        under a PENDING page: one transfer fills a parent-first chain); gone, no page one
        page longer is held. Under tier_closure "hierarchy", a parent RESIDENT in a tier
        above counts as held, and a page gone from a tier is checked in every tier below
        it too (a child there needs the page in its own tier or one above)."""
        if self.tier_closure == "hierarchy":
            for lower in self.tiers[self.tiers.index(tier) + 1 :]:
                self._verify_closed_at(lower, prefix, gone_only=True)
        self._verify_closed_at(tier, prefix)

    def _verify_closed_at(self, tier: str, prefix: Prefix, gone_only: bool = False) -> None:
        held, ps = self.pages[tier], self.page_size
        state = held.get(prefix, ABSENT)
        if state != ABSENT and len(prefix) > ps and not gone_only:
            up = held.get(prefix[:-ps], ABSENT)
            if (
                up != RESIDENT
                and (state, up) != (PENDING, PENDING)
                and not self._above(tier, prefix[:-ps])
            ):
                raise Mismatch(
                    f"{tier} page of a {len(prefix)}-token prefix held without the page before "
                    "it (spec/invariants.md S6: a tier is closed under ancestors)",
                    f"{state} under {up}",
                    f"{state} under RESIDENT" + (" or PENDING" if state == PENDING else ""),
                )
        if state == ABSENT and not self._above(tier, prefix):
            below = [q for q in held if len(q) == len(prefix) + ps and q[: len(prefix)] == prefix]
            if below:
                raise Mismatch(
                    f"{tier} page of a {len(prefix)}-token prefix gone while the page after it "
                    "stays (spec/invariants.md S6: eviction frees leaves only)",
                    f"ABSENT above {held[below[0]]}",
                    "leaves go first",
                )

    def _window_step(self, c: PageChange) -> None:
        """WINDOW_FREED of a RESIDENT L1 page with its window, never one a live request is
        served from; WINDOW_REVIVED of one without."""
        freeing = c.state == WINDOW_FREED
        if (
            c.tier != self.tiers[0]
            or self.pages[c.tier].get(c.prefix) != RESIDENT
            or (c.prefix in self.freed) == freeing
        ):
            want = "with its window" if freeing else "whose window is freed"
            raise Mismatch(
                f"{c.tier} {c.state} of a {len(c.prefix)}-token prefix",
                f"{self.pages[c.tier].get(c.prefix, ABSENT)}, window freed "
                f"{c.prefix in self.freed}",
                f"a RESIDENT {self.tiers[0]} page {want}",
            )
        if freeing:
            self._verify_unserved(c.prefix)
            self.freed.add(c.prefix)
        else:
            self.freed.discard(c.prefix)

    # -- damaged last-tier copies (issue 31: storage damaged under the engine) -------------

    def l3_damaged(self, prefixes: Sequence[Prefix]) -> None:
        """The last tier's copies of `prefixes` were damaged under the engine (their bytes
        changed, or the file was cut, removed or taken over by another writer): none may be
        restored from now on. A page whose L2 copy is PENDING is left out (a read already
        made may land: the machine damages only between transfers' I/O). An engine of fewer
        than three tiers restores nothing from its last: nothing to watch."""
        if len(self.tiers) < 3:
            return
        last, l2 = self.pages[self.tiers[-1]], self.pages[self.tiers[1]]
        self.damaged.update(p for p in prefixes if last.get(p) == RESIDENT and l2.get(p) != PENDING)

    def _verify_not_restored_from_damage(self, c: PageChange, was: str) -> None:
        """A damaged page's L2 copy arrives only from L1 (a backup), never from its damaged
        last-tier copy; once that copy has left the tier, the damage is forgotten (a later
        backup writes a fresh one)."""
        if c.tier == self.tiers[-1] and c.state == ABSENT:
            self.damaged.discard(c.prefix)
        elif (
            c.tier == self.tiers[1]
            and (was, c.state) == (PENDING, RESIDENT)
            and self.pages[self.tiers[0]].get(c.prefix) != RESIDENT
        ):
            raise Mismatch(
                f"L2 page of a {len(c.prefix)}-token prefix restored from its damaged "
                f"{self.tiers[-1]} copy (the read must fail its checksum: a miss)",
                "RESIDENT",
                "PENDING -> ABSENT",
            )

    def _verify_unserved(self, prefix: Prefix) -> None:
        for rid, r in self.requests.items():
            if len(prefix) <= r.cached_len and r.tokens[: len(prefix)] == prefix:
                raise Mismatch(
                    f"L1 page of a {len(prefix)}-token prefix left while request {rid} "
                    f"is served from it (cached_len {r.cached_len})",
                    "ABSENT",
                    RESIDENT,
                )

    def pending_in(self, tier: str, tokens: Sequence[int]) -> bool:
        """Whether some whole page of `tokens` is PENDING in `tier` (a transfer fills it)."""
        pages, ps = self.pages[tier], self.page_size
        return any(
            pages.get(tuple(tokens[:end])) == PENDING for end in range(ps, len(tokens) + 1, ps)
        )

    def unclaimed(self, tier: str) -> bool:
        """Whether `tier` holds a RESIDENT page that no live request's prompt begins with
        (one that eviction pressure may free)."""
        claimed = [r.tokens for r in self.requests.values()]
        return any(
            state == RESIDENT and not any(t[: len(p)] == p for t in claimed)
            for p, state in self.pages[tier].items()
        )

    def holds_any(self, tokens: Sequence[int]) -> bool:
        """Whether the first page of `tokens` is in some tier (RESIDENT or PENDING)."""
        first = tuple(tokens[: self.page_size])
        return len(first) == self.page_size and any(first in self.pages[t] for t in self.tiers)

    # -- requests -----------------------------------------------------------------------------

    def hits(self, tokens: Sequence[int]) -> dict[str, int]:
        """Per tier, the leading run of `tokens`' whole pages RESIDENT there (in tokens)."""
        ps, out = self.page_size, {}
        for t in self.tiers:
            n = 0
            while (n + 1) * ps <= len(tokens) and self.pages[t].get(
                tuple(tokens[: (n + 1) * ps])
            ) == RESIDENT:
                n += 1
            out[t] = n * ps
        first, run = self.tiers[0], out[self.tiers[0]] // ps
        if self.hit_window and any(tuple(tokens[: (k + 1) * ps]) in self.freed for k in range(run)):
            out[first] = self._window_cut(tokens, run) * ps
        window = max(0, run - self.replay_window)
        if self.replay_window and any(
            tuple(tokens[: (k + 1) * ps]) in self.freed for k in range(window, run)
        ):
            out[first] = window * ps  # the window is replayed: recomputed from its start
        return out

    def _window_cut(self, tokens: Sequence[int], run: int) -> int:
        """The largest end e <= run (in pages) whose `hit_window` pages before it (all of
        [0, e) when e < hit_window) kept their window."""
        ps, w = self.page_size, self.hit_window
        whole = [tuple(tokens[: (k + 1) * ps]) not in self.freed for k in range(run)]
        return max(e for e in range(run + 1) if all(whole[max(0, e - w) : e]))

    def admit(self, request_id: int, tokens: Sequence[int], got: Admission) -> None:
        """Check an admission against the model as it was before it (call before `apply`ing
        the admission's own changes), then track the request."""
        context = f"request {request_id}, {len(tokens)} tokens"
        if request_id in self.requests:
            raise Mismatch("admitted a live request id again", request_id, "refused")
        want = self.hits(tokens[: len(tokens) - 1])
        self.checks += 1
        for t in self.tiers:
            if got.hits.get(t) != want[t]:
                raise Mismatch(f"{t} hit length at admission", got.hits.get(t), want[t], context)
        if got.cached_len != want[self.tiers[0]]:
            raise Mismatch("cached_len at admission", got.cached_len, want[self.tiers[0]], context)
        self.requests[request_id] = RefRequest(tuple(tokens), got.cached_len)
        if self.tree is not None:
            self.tree.admitted(tokens[: len(tokens) - 1])

    def expected_after_prefill(self, request_id: int, own: tuple[int, int] | None = None) -> int:
        """`cached_len` a prefill must reach, judged before it runs: the whole pages, cut at
        one another request's load-back is filling -- unless L1 may hold `duplicate_copies`
        (spec/tree.md, "Duplicate copies"): then the request serves its own copy. `own`:
        the token range of the request's *own* load-back still landing layer by layer
        (spec/restore.md, "Layer-wise load-back"): its prefill applies that op's end first
        (the pages are then served, or recomputed and inserted), so they cut nothing."""
        r = self.requests[request_id]
        ps, l1 = self.page_size, self.pages[self.tiers[0]]
        aligned = len(r.tokens) // ps * ps
        if self.duplicate_copies:
            return aligned
        for end in range(ps, aligned + 1, ps):
            mine = own is not None and own[0] < end <= own[1]
            if l1.get(r.tokens[:end]) == PENDING and not mine:
                return end - ps
        return aligned

    def prefilled(self, request_id: int, expected: int, got: int) -> None:
        self.checks += 1
        if got != expected:
            raise Mismatch("cached_len after prefill", got, expected, f"request {request_id}")
        self.requests[request_id].cached_len = got
        tokens, ps = self.requests[request_id].tokens, self.page_size
        if self.tree is not None:
            self.tree.inserted(tokens[:got])
        # Verify the served prefix ends with its window whole, under either hit policy: decode
        # reads it (a replayed window was recomputed, and its copy revived what was freed).
        window = max(self.hit_window, self.replay_window)
        freed = [
            k
            for k in range(max(0, got // ps - window), got // ps)
            if tuple(tokens[: (k + 1) * ps]) in self.freed
        ]
        if freed:
            raise Mismatch(
                "window before cached_len after prefill",
                f"page {freed[0]} freed",
                "whole",
                f"request {request_id}",
            )

    def finished(self, request_id: int) -> None:
        self.requests.pop(request_id, None)

    def restart(self) -> None:
        """The engine closed and opened again: nothing cached, nobody live -- but the
        RESIDENT pages of a persistent tier (spec/faults.md, "Persistent tiers")."""
        self.pages = {
            t: {p: s for p, s in self.pages[t].items() if s == RESIDENT}
            if t in self.persistent_tiers
            else {}
            for t in self.tiers
        }
        self.freed.clear()
        self.damaged &= set(self.pages[self.tiers[-1]])  # a surviving copy stays damaged
        self.requests.clear()
        if self.tree is not None:
            self.tree.clear()

    # -- after every step ---------------------------------------------------------------------

    def compare(self, live: set[int], cached: dict[int, int]) -> None:
        """The engine's live requests and their `cached_len` against the model's."""
        self.checks += 1
        if live != set(self.requests):
            raise Mismatch("live requests", sorted(live), sorted(self.requests))
        for rid, r in self.requests.items():
            if cached.get(rid) != r.cached_len:
                raise Mismatch("cached_len", cached.get(rid), r.cached_len, f"request {rid}")
            end = r.cached_len
            l1 = self.pages[self.tiers[0]]
            for k in range(self.page_size, end + 1, self.page_size):
                if l1.get(r.tokens[:k]) != RESIDENT:
                    raise Mismatch(
                        f"L1 page {k // self.page_size - 1} of request {rid}'s served prefix",
                        l1.get(r.tokens[:k], ABSENT),
                        RESIDENT,
                    )

    def served(self, request_id: int, digests: list[int] | None) -> None:
        """The digests of the pages a request is served from: each must equal the digest its
        token prefix had when first served."""
        if digests is None:
            return
        r = self.requests[request_id]
        ps = self.page_size
        if len(digests) != r.cached_len // ps:
            raise Mismatch(
                "served pages", len(digests), r.cached_len // ps, f"request {request_id}"
            )
        for i, d in enumerate(digests):
            prefix = r.tokens[: (i + 1) * ps]
            self.checks += 1
            known = self.digests.setdefault(prefix, d)
            if known != d:
                raise Mismatch(
                    f"bytes of page {i} (a {len(prefix)}-token prefix)",
                    hex(d),
                    hex(known),
                    f"request {request_id}",
                )


def verify_refused(
    cache: CacheUnderTest, what: str, call: Callable[[], object], dead: bool = False
) -> None:
    """`call` (`what` it does) is refused as protocol.py asks: it raises a HiCacheError and
    the engine reports no page change for it (the machine's step checks see the rest
    unchanged). A crash passes through (the machine reopens the engine) -- unless the engine
    is `dead` already: then its refusal (R57), the crash's own again for hicache's controller."""
    try:
        call()
    except HiCacheError as e:
        if isinstance(e, SimulatedCrash) and not dead:
            raise
        changed = cache.changes()
        if changed:
            raise Mismatch(f"page changes of a refused {what}", changed[:4], []) from None
        return
    except Exception as e:  # an untyped refusal: the finding to report
        raise Mismatch(
            f"{what}: the refusal's type",
            f"{type(e).__name__}: {e}",
            "a HiCacheError (protocol.py: refused input raises one, nothing changed)",
        ) from e
    raise Mismatch(f"{what}: refused", "accepted", "a HiCacheError, nothing changed")
