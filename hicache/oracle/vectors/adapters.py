"""The built-in adapter factories: `--adapter hicache.oracle.vectors.adapters:NAME`.

Each is a factory of the one protocol (hicache/testing/factory.py): `NAME(config:
EngineConfig) -> CacheUnderTest` builds a fresh engine for one case (or one fuzz run), or
raises `UnsupportedConfig` for a configuration its engine cannot take (the case is then
skipped, not failed). `hicache fuzz --adapter` takes every one of them too.

    factory      engine                                              takes
    -----------  --------------------------------------------------  -------------------------
    controller   hicache's controller on the null data plane (the    every case: three tiers,
                 engine the vectors were generated with)             or L1 only
    template     the adapter template's one-tier radix cache         L1-only cases
                 (hicache/testing/template.py)
    lru          a page-by-page LRU cache (hicache/testing/adapters/ L1-only cases
                 lru.py): wrong on purpose, it fails L1 eviction
    forgetful    the template's cache with a bug: an eviction not    L1-only cases
                 reported
    sglang       SGLang's RadixCache as its scheduler drives it      L1-only cases (sglang
                 (hicache/testing/adapters/sglang.py)                installed: its docstring
                                                                     says how)
"""

from __future__ import annotations

from hicache.oracle.vectors.format import TIERS
from hicache.testing.adapters.controller import ControllerAdapter, Setup
from hicache.testing.adapters.lru import forgetful_adapter as forgetful
from hicache.testing.adapters.lru import lru_adapter as lru
from hicache.testing.adapters.sglang import sglang_adapter as sglang
from hicache.testing.factory import EngineConfig, UnsupportedConfig
from hicache.testing.template import factory as template

__all__ = ["controller", "forgetful", "lru", "sglang", "template"]

CONTROLLER_PAGE_SIZE = 4
"""The page size (tokens) of the controller's geometry the adapter builds (preset "tiny")."""
L1_ONLY_LOWER_PAGES = 4
"""L2 pages and L3 slots of the controller behind an L1-only case: never used, since such a
case never ticks, so no backup is issued and nothing is restored (the runner observes L1
alone)."""


def controller(config: EngineConfig) -> ControllerAdapter:
    """hicache's controller on `config.plane` (the null data plane for every case), sized and
    configured as `config` says (on the null plane its own checks are off inside transitions:
    the runner and the fuzz call `check()` after every step)."""
    return ControllerAdapter(controller_setup(config))


def controller_setup(config: EngineConfig) -> Setup:
    """The controller adapter's `Setup` for `config`; UnsupportedConfig for a page size or
    tiers it cannot take."""
    l1_only = config.tiers == ("L1",)
    if config.page_size != CONTROLLER_PAGE_SIZE or not (l1_only or config.tiers == TIERS):
        raise UnsupportedConfig(
            f"the controller adapter takes page size {CONTROLLER_PAGE_SIZE} and "
            f"tiers {TIERS} or L1 alone; the case has {config.page_size}, {config.tiers}"
        )
    caps = config.capacities
    return Setup(
        l1_pages=caps["L1"],
        l2_pages=caps.get("L2", L1_ONLY_LOWER_PAGES),
        l3_slots=caps.get("L3", L1_ONLY_LOWER_PAGES),
        write_policy=config.write_policy,
        policy=config.restore_policy,
        promotion=config.promotion,
        plane=config.plane,
        check_mode="off" if config.plane == "null" else "every",
    )
