"""Adapter factories for `hicache vectors run --adapter module:Name`.

A factory is any callable `Name(config: CaseConfig) -> CacheUnderTest` that builds a fresh
engine for one case; it raises `UnsupportedConfig` for a configuration its engine cannot take
(the case is then skipped, not failed). `controller` is hicache's own: the controller on the
null data plane, the engine the vectors were generated with.
"""

from __future__ import annotations

from hicache.testing.adapters.controller import ControllerAdapter, Setup
from hicache.vectors.format import TIERS, CaseConfig, UnsupportedConfig

CONTROLLER_PAGE_SIZE = 4
"""The page size (tokens) of the controller's geometry the adapter builds (preset "tiny")."""


def controller(config: CaseConfig) -> ControllerAdapter:
    """hicache's controller on the null data plane, sized and configured as `config` says
    (its own checks off inside transitions: the runner calls `check()` after every step)."""
    if config.page_size != CONTROLLER_PAGE_SIZE or config.tiers != TIERS:
        raise UnsupportedConfig(f"the controller adapter takes page size {CONTROLLER_PAGE_SIZE} and "
                                f"tiers {TIERS}; the case has {config.page_size}, {config.tiers}")
    caps = config.capacities
    return ControllerAdapter(Setup(
        l1_pages=caps["L1"], l2_pages=caps["L2"], l3_slots=caps["L3"],
        write_policy=config.write_policy, policy=config.restore_policy, promotion=config.promotion,
        plane="null", check_mode="off"))
