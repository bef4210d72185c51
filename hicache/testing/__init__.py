"""hicache.testing: stateful fuzzing of a KV cache against the spec, importable by any project.

    module          what
    --------------  ----------------------------------------------------------------------
    protocol        `CacheUnderTest`: what an engine implements to be driven
    factory         `factory(config: EngineConfig) -> CacheUnderTest`: the one adapter
                    factory protocol of `hicache fuzz --adapter` and `vectors run --adapter`
    template        an adapter to copy (`python3 -m hicache.testing.template > mine.py`)
    reference       the reference model the engine's outputs are compared with
    machine         `CacheMachine`, the Hypothesis RuleBasedStateMachine an engine's test
                    subclasses (`make_machine(adapter, setups)` builds one from arguments)
    coverage        transitions, composite states and fault sites reached
    runner          `hicache fuzz`: seeds, replay, reports, outside pytest
    hypofuzz_targets  the machines as HypoFuzz targets (TestCases), for many cores
    hypofuzz_command  `hicache hypofuzz`: HypoFuzz on them (the optional `fuzz` extra)
    fuzzstats       the steps and failures each HypoFuzz worker counts, and their sum
    walking         `every_plane_walked()`: every control plane built inside walks its trace
    adapters/       the controller (null, cpu, cuda planes), SGLang's RadixCache, and caches
                    that are wrong on purpose (lru.py)

Quick start (pytest collects the TestCase):

    from hicache.testing import CacheMachine
    from hicache.testing.adapters.controller import controller_adapter, setups

    class ControllerMachine(CacheMachine):
        adapter = staticmethod(controller_adapter)
        setups = setups("null")

    TestController = ControllerMachine.TestCase

Another engine implements `CacheUnderTest` and a factory of `EngineConfig` (template.py is a
complete one to copy), then runs `hicache fuzz --adapter module:factory`; in pytest, a
subclass of `CacheMachine` with `adapter = staticmethod(factory)` and `setups` a strategy of
its configurations; under HypoFuzz on every core, `hicache hypofuzz --adapter module:factory`,
or that TestCase in a file of its own: `hicache hypofuzz -- test_my_engine_fuzz.py`.
"""

from hicache.testing.coverage import Coverage
from hicache.testing.factory import EngineConfig, UnsupportedConfig
from hicache.testing.machine import CacheMachine, make_machine
from hicache.testing.protocol import Admission, CacheUnderTest, FaultSchedule, PageChange
from hicache.testing.reference import Mismatch, ReferenceModel

__all__ = [
    "Admission",
    "CacheMachine",
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
