"""hicache.testing: stateful fuzzing of a KV cache against the spec, importable by any project.

    module          what
    --------------  ----------------------------------------------------------------------
    protocol        `CacheUnderTest`: what an engine implements to be driven
    reference       the reference model the engine's outputs are compared with
    machine         `make_machine(adapter, setups)`: the Hypothesis RuleBasedStateMachine
    coverage        transitions, composite states and fault sites reached
    runner          `hicache fuzz`: seeds, replay, reports, outside pytest
    adapters/       the controller (null, cpu, cuda planes) and a plain LRU cache

Quick start (pytest collects the TestCase):

    from hicache.testing import make_machine
    from hicache.testing.adapters.controller import controller_adapter, setups
    TestController = make_machine(controller_adapter, setups("null")).TestCase

Another engine implements `CacheUnderTest` (see adapters/lru.py for a minimal one) and passes
its own factory and a strategy of its configurations.
"""

from hicache.testing.coverage import Coverage
from hicache.testing.machine import make_machine
from hicache.testing.protocol import Admission, CacheUnderTest, FaultSchedule, PageChange
from hicache.testing.reference import Mismatch, ReferenceModel

__all__ = [
    "Admission",
    "CacheUnderTest",
    "Coverage",
    "FaultSchedule",
    "Mismatch",
    "PageChange",
    "ReferenceModel",
    "make_machine",
]
