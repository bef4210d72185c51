"""hicache.testing: stateful fuzzing of a KV cache against the spec, importable by any project.

    module          what
    --------------  ----------------------------------------------------------------------
    protocol        `CacheUnderTest`: what an engine implements to be driven
    factory         `factory(config: EngineConfig) -> CacheUnderTest`: the one adapter
                    factory protocol of `hicache fuzz --adapter` and `vectors run --adapter`
    template        an adapter to copy (`python3 -m hicache.testing.template > mine.py`)
    reference       the reference model the engine's outputs are compared with
    machine         `make_machine(adapter, setups)`: the Hypothesis RuleBasedStateMachine
    coverage        transitions, composite states and fault sites reached
    runner          `hicache fuzz`: seeds, replay, reports, outside pytest
    walking         `every_plane_walked()`: every control plane built inside walks its trace
    adapters/       the controller (null, cpu, cuda planes), SGLang's RadixCache, and caches
                    that are wrong on purpose (lru.py)

Quick start (pytest collects the TestCase):

    from hicache.testing import make_machine
    from hicache.testing.adapters.controller import controller_adapter, setups
    TestController = make_machine(controller_adapter, setups("null")).TestCase

Another engine implements `CacheUnderTest` and a factory of `EngineConfig` (template.py is a
complete one to copy), then runs `hicache fuzz --adapter module:factory`; in pytest,
`make_machine(factory, strategy)` with a strategy of its configurations.
"""

from hicache.testing.coverage import Coverage
from hicache.testing.factory import EngineConfig, UnsupportedConfig
from hicache.testing.machine import make_machine
from hicache.testing.protocol import Admission, CacheUnderTest, FaultSchedule, PageChange
from hicache.testing.reference import Mismatch, ReferenceModel

__all__ = [
    "Admission",
    "CacheUnderTest",
    "Coverage",
    "EngineConfig",
    "FaultSchedule",
    "Mismatch",
    "PageChange",
    "ReferenceModel",
    "UnsupportedConfig",
    "make_machine",
]
