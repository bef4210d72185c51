"""What the fuzz machine draws: prompts from a bundle of shared prefixes, fault schedules.

strategy             draws
-------------------  --------------------------------------------------------------------
prompts(page_size)   one of three shared prefixes of PREFIX_PAGES pages, then a suffix
                     that diverges after 0, 1 or more pages, then a partial tail; about
                     half of them then diverge again at any token (`diverged`), inside a
                     page too, where a match splits a node mid-key and rounds to pages
schedules()          a `FaultSchedule`: every `FaultSite` on with probability 1/3, then
                     firing at a rate of 0.1, 0.25 or 0.5 (a crash: CRASH_RATES);
                     S2H_PARTIAL is not drawn (the adapter's, for a pool group)
configs(shapes)      an `EngineConfig` of one of `shapes` (`hicache fuzz --adapter`): L1
                     alone of L1_ALONE_PAGES, or two or three tiers of THREE_TIER_PAGES
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from hicache.dataplane.faults import FaultSite
from hicache.testing.factory import EngineConfig
from hicache.testing.protocol import FaultSchedule

PREFIX_PAGES = 2  # pages every prompt of one bundle shares
SUFFIX_PAGES_MAX = 3
CRASH_RATES = (0.02, 0.05)  # a crash empties the cache: rarer than the other sites
L1_ALONE_PAGES = (PREFIX_PAGES + SUFFIX_PAGES_MAX + 3, 12)
"""L1 pages of a one-tier engine: the longest prompt (its tail page too) and 2 pages more,
so that no prompt reaches an input limit of `capacity * page_size - 6` tokens (sglang's
scheduler's: hicache/testing/adapters/sglang.py), up to room for two."""
THREE_TIER_PAGES = {"L1": (7, 12), "L2": (3, 12), "L3": (2, 16)}  # as the controller's setups
DIVERGED_BASE = 6000
"""First token of a `diverged` prompt's own run: above every bundle token (prefixes 1000-3999,
salted suffixes below 1000), below the rules' own prompts (7000 and up)."""
DIVERGED_RUNS = 3  # runs a diverged prompt may take from its cut: two prompts share one


def prompts(page_size: int) -> st.SearchStrategy[tuple[int, ...]]:
    """Three shared prefixes of PREFIX_PAGES pages, then 0..SUFFIX_PAGES_MAX pages drawn from
    three salts (so two prompts diverge after 0, 1 or more pages), then a partial tail; then,
    half of the time, the prompt diverges again at a token drawn from all of it
    (`diverged`): two prompts then share a prefix that ends inside a page as often as one
    that ends on a page start."""
    prefixes = [tuple(range(1000 * p, 1000 * p + PREFIX_PAGES * page_size)) for p in (1, 2, 3)]
    longest = (PREFIX_PAGES + SUFFIX_PAGES_MAX + 1) * page_size
    return st.builds(
        lambda p, extra, tail, salt, cut: diverged(
            prefixes[p] + tuple(range(50 * salt, 50 * salt + extra * page_size + tail)), cut
        ),
        st.integers(0, 2),
        st.integers(0, SUFFIX_PAGES_MAX),
        st.integers(1, page_size),
        st.integers(0, 2),
        st.one_of(
            st.none(), st.tuples(st.integers(1, longest - 1), st.integers(0, DIVERGED_RUNS - 1))
        ),
    )


def diverged(tokens: tuple[int, ...], cut: tuple[int, int] | None) -> tuple[int, ...]:
    """`tokens` as drawn, or, for `cut` = (at, run), its first `at` tokens and then run
    `run` of DIVERGED_RUNS (the same length): it shares exactly `at` tokens with every prompt
    drawn whole, and its whole length with another of the same cut and run. A cut at or past
    the end changes nothing."""
    if cut is None or cut[0] >= len(tokens):
        return tokens
    at, run = cut
    start = DIVERGED_BASE + 300 * run + at  # at < 300: each (at, run) its own first token
    return tokens[:at] + tuple(range(start, start + len(tokens) - at))


def l3_prompt(base: int, pages: int, page_size: int) -> tuple[int, ...]:
    """The prompt the machine's `restore_from_l3(base, pages)` restores from L3: `pages`
    pages no drawn prompt starts with, and one token more."""
    first = 8000 + 100 * base
    return tuple(range(first, first + pages * page_size)) + (base,)


def schedules() -> st.SearchStrategy[FaultSchedule]:
    """Each fault site switched on with probability 1/3, then firing at a rate in (0, 0.5]
    (CRASH_BEFORE_PUBLISH: at one of CRASH_RATES, since each crash empties the cache)."""
    # S2H_PARTIAL is the group machines' own (the adapter sets it): drawing it here would
    # change every seeded run of every machine.
    sites = [s.value for s in FaultSite if s is not FaultSite.S2H_PARTIAL]
    rate = st.one_of(st.just(0.0), st.just(0.0), st.sampled_from([0.1, 0.25, 0.5]))
    crash = FaultSite.CRASH_BEFORE_PUBLISH.value

    def build(seed: int, rates: list[float]) -> FaultSchedule:
        scaled = {
            s: (CRASH_RATES[0 if r <= 0.25 else 1] if s == crash else r)
            for s, r in zip(sites, rates)
            if r
        }
        return FaultSchedule(seed, scaled)

    return st.builds(
        build, st.integers(0, 2**16), st.lists(rate, min_size=len(sites), max_size=len(sites))
    )


def configs(shapes: Sequence[EngineConfig]) -> st.SearchStrategy[EngineConfig]:
    """A configuration of one of `shapes` (hicache/testing/factory.py, `shapes_taken`), its
    capacities drawn: L1 alone from L1_ALONE_PAGES, or each of its tiers from
    THREE_TIER_PAGES."""

    def sized(shape: EngineConfig) -> st.SearchStrategy[EngineConfig]:
        ranges = {"L1": L1_ALONE_PAGES} if shape.tiers == ("L1",) else THREE_TIER_PAGES
        ranges = {t: r for t, r in ranges.items() if t in shape.tiers}  # two tiers: no L3
        return st.builds(
            EngineConfig,
            page_size=st.just(shape.page_size),
            capacities=st.fixed_dictionaries({t: st.integers(*r) for t, r in ranges.items()}),
            write_policy=st.just(shape.write_policy),
            restore_policy=st.just(shape.restore_policy),
            promotion=st.just(shape.promotion),
            plane=st.just(shape.plane),
        )

    return st.sampled_from(list(shapes)).flatmap(sized)
