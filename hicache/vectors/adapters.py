"""Adapter factories for `hicache vectors run --adapter module:Name`.

A factory is any callable `Name(config: CaseConfig) -> CacheUnderTest` that builds a fresh
engine for one case; it raises `UnsupportedConfig` for a configuration its engine cannot take
(the case is then skipped, not failed).

    factory      engine                                              takes
    -----------  --------------------------------------------------  -------------------------
    controller   hicache's controller on the null data plane (the    every case: three tiers,
                 engine the vectors were generated with)             or L1 only
    lru          the plain LRU cache of hicache/testing/adapters/    L1-only cases
                 lru.py (one tier, evicts page by page)
    forgetful    the same with its bug: an eviction not reported     L1-only cases
    sglang       SGLang's RadixCache as its scheduler drives it      L1-only cases (sglang
                 (hicache/testing/adapters/sglang.py)                installed: its docstring
                                                                     says how)
"""

from __future__ import annotations

from hicache.testing.adapters.controller import ControllerAdapter, Setup
from hicache.testing.adapters.lru import ForgetfulLRU, LRUCache
from hicache.testing.adapters.sglang import SGLangRadixCache
from hicache.vectors.format import TIERS, CaseConfig, UnsupportedConfig

CONTROLLER_PAGE_SIZE = 4
"""The page size (tokens) of the controller's geometry the adapter builds (preset "tiny")."""
L1_ONLY_LOWER_PAGES = 4
"""L2 pages and L3 slots of the controller behind an L1-only case: never used, since such a
case never ticks, so no backup is issued and nothing is restored (the runner observes L1
alone)."""


def controller(config: CaseConfig) -> ControllerAdapter:
    """hicache's controller on the null data plane, sized and configured as `config` says
    (its own checks off inside transitions: the runner calls `check()` after every step)."""
    l1_only = config.tiers == ("L1",)
    if config.page_size != CONTROLLER_PAGE_SIZE or not (l1_only or config.tiers == TIERS):
        raise UnsupportedConfig(
            f"the controller adapter takes page size {CONTROLLER_PAGE_SIZE} and "
            f"tiers {TIERS} or L1 alone; the case has {config.page_size}, {config.tiers}"
        )
    caps = config.capacities
    setup = Setup(
        l1_pages=caps["L1"],
        l2_pages=caps.get("L2", L1_ONLY_LOWER_PAGES),
        l3_slots=caps.get("L3", L1_ONLY_LOWER_PAGES),
        write_policy=config.write_policy,
        policy=config.restore_policy,
        promotion=config.promotion,
        plane="null",
        check_mode="off",
    )
    return ControllerAdapter(setup)


def _l1_cache(config: CaseConfig, cls: type[LRUCache]) -> LRUCache:
    if config.tiers != ("L1",):
        raise UnsupportedConfig(f"the LRU cache has one tier (L1); the case needs {config.tiers}")
    return cls(config.capacities["L1"], config.page_size)


def lru(config: CaseConfig) -> LRUCache:
    """The plain LRU cache (hicache/testing/adapters/lru.py) for an L1-only case."""
    return _l1_cache(config, LRUCache)


def forgetful(config: CaseConfig) -> LRUCache:
    """The LRU cache that drops a page without reporting it, for an L1-only case."""
    return _l1_cache(config, ForgetfulLRU)


def sglang(config: CaseConfig) -> SGLangRadixCache:
    """SGLang's RadixCache for an L1-only case, its pool `capacities["L1"]` pages, matching
    again at prefill and refusing at admission what sglang's scheduler aborts (its input
    limit), as a server does. sglang is imported on the first call, not before; without it
    the call raises EngineUnavailable saying how to install it (the case then fails with
    that line: an engine that is not there has passed nothing)."""
    if config.tiers != ("L1",):
        raise UnsupportedConfig(
            f"SGLang's RadixCache has one tier (L1); the case needs {config.tiers}"
        )
    return SGLangRadixCache(
        capacity=config.capacities["L1"], page_size=config.page_size, rematch=True, input_limit=True
    )
