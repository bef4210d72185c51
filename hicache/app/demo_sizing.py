"""Tier capacities for `hicache demo`, sized from its workload when the user gives none.

    tier  default (pages)                                   why
    ----  ------------------------------------------------  ----------------------------------
    L1    longest prompt + (batch - 1) x mean prompt        a prompt's KV sits in L1 whole while
                                                            it is prefilled; the other live
                                                            requests need room beside it
    L2    L1 x 3/2                                          more than L1, so it keeps what L1
                                                            evicts, but less than the working
                                                            set, so some restores come from L3
    L3    distinct full pages of the workload               every backup has a slot: nothing is
                                                            dropped for lack of L3 room

The hard rule is L1's: a prompt of P pages can never be served by an L1 of fewer than P pages
(the serving loop refuses it), so a smaller `--l1-pages` is an error that names the prompt.
Prompts are counted in whole pages (a partial last page takes a page).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hicache.app.workload import RequestSpec
from hicache.errors import ConfigError


@dataclass(frozen=True)
class TierSizes:
    """Capacities in pages (L3: slots), and which of them were sized from the workload."""

    l1_pages: int
    l2_pages: int
    l3_slots: int
    sized: frozenset[str]  # of "l1_pages", "l2_pages", "l3_slots"


@dataclass(frozen=True)
class Longest:
    """The workload's longest prompt: the least L1 that can serve it."""

    request_id: int
    tokens: int
    pages: int


def pages_of(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size)


def longest_prompt(requests: Sequence[RequestSpec], page_size: int) -> Longest:
    # Verify there is a prompt to size for (the demo refuses --requests < 1 before this).
    assert requests, "sizing needs at least one request"
    top = max(requests, key=lambda r: len(r.tokens))
    return Longest(top.request_id, len(top.tokens), pages_of(len(top.tokens), page_size))


def distinct_pages(requests: Sequence[RequestSpec], page_size: int) -> int:
    """Full pages of distinct prefixes: what the tree holds if nothing is ever evicted.
    Each page is keyed by a hash chained over the pages before it (a prefix's identity)."""
    seen: set[int] = set()
    for r in requests:
        key = 0
        for start in range(0, len(r.tokens) - page_size + 1, page_size):
            key = hash((key, r.tokens[start : start + page_size]))
            seen.add(key)
    return len(seen)


def size_tiers(
    requests: Sequence[RequestSpec],
    page_size: int,
    batch_size: int,
    *,
    l1_pages: int | None = None,
    l2_pages: int | None = None,
    l3_slots: int | None = None,
) -> TierSizes:
    """The capacities to run `requests` with: those given, the rest sized (module docstring).
    ConfigError naming l1_pages when a given L1 cannot hold the longest prompt."""
    longest = longest_prompt(requests, page_size)
    sized: set[str] = set()
    if l1_pages is None:
        # The mean prompt in pages, rounded up: sum of tokens over (page size x requests).
        mean_pages = pages_of(sum(len(r.tokens) for r in requests), page_size * len(requests))
        l1_pages = longest.pages + (batch_size - 1) * mean_pages
        sized.add("l1_pages")
    elif l1_pages < longest.pages:
        raise ConfigError("l1_pages", too_small_l1(l1_pages, longest, page_size))
    if l2_pages is None:
        l2_pages = l1_pages * 3 // 2
        sized.add("l2_pages")
    if l3_slots is None:
        l3_slots = max(1, distinct_pages(requests, page_size))
        sized.add("l3_slots")
    return TierSizes(l1_pages, l2_pages, l3_slots, frozenset(sized))


def too_small_l1(l1_pages: int, longest: Longest, page_size: int) -> str:
    """Why `l1_pages` cannot serve the workload, the needed value first."""
    return (
        f"{l1_pages} is too small: this workload needs at least {longest.pages} L1 pages, "
        f"because its longest prompt (request {longest.request_id}, {longest.tokens:,} "
        f"tokens) is {longest.pages} pages of {page_size} tokens and a prompt's KV must "
        f"sit in L1 whole while it is prefilled. Give --l1-pages {longest.pages} or more, "
        "or leave it out to size L1 from the workload"
    )
