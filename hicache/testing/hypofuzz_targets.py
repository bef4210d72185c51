"""HypoFuzz targets: hicache's fuzz machines as the TestCases that `hypothesis fuzz` collects.

HypoFuzz (`pip install hypofuzz`, or the `fuzz` extra; its own licence, see the README's
"Fuzzing on many cores") fuzzes Hypothesis tests coverage-guided, one worker process per core,
sharing one example database. It finds its targets by pytest collection (a
`RuleBasedStateMachine`'s `.TestCase` is one), so this file is what it is pointed at:
`hicache hypofuzz` does that (hicache/testing/hypofuzz_command.py), or by hand

    hypothesis fuzz --no-dashboard -n 16 -- "$(python -m hicache.testing.hypofuzz_targets)" -k Null

    target              machine (hicache/testing/machines.py unless said)
    ------------------  ------------------------------------------------------------------
    TestFuzzNull        FuzzNull: the controller on the null plane
    TestFuzzCpu         FuzzCpu: the CPU data plane, a real L3 file (needs torch)
    TestFuzzDsv4        FuzzDsv4: the dsv4-tiny pool group on the null plane
    TestFuzzDsv41       FuzzDsv41: the dsv41-tiny pool group on the null plane
    TestFuzzCpuDsv4     FuzzCpuDsv4: dsv4-tiny on the CPU plane (needs torch)
    TestFuzzTp          FuzzTp: 2 and 3 simulated ranks on the null plane
    TestFuzzTpDsv4      FuzzTpDsv4: ranks of dsv4-tiny
    TestFuzzTemplate    an outside engine's adapter: the template's (hicache.testing.template)
                        through the factory protocol, as `hicache fuzz --adapter` drives it
    TestFuzzAdapter     only with HICACHE_HYPOFUZZ_ADAPTER=module:factory: that engine, the same
                        way (`hicache hypofuzz --adapter module:factory`)

An outside engine may instead be its own file of targets, as it is its own pytest test:

    # test_my_engine_fuzz.py
    from hypothesis import strategies as st
    from hicache.testing import CacheMachine, EngineConfig

    class MyEngineMachine(CacheMachine):
        adapter = staticmethod(my_factory)            # EngineConfig -> a CacheUnderTest
        setups = st.just(EngineConfig(4, {"L1": 16, "L2": 32}))

    TestMyEngine = MyEngineMachine.TestCase
    for i in range(1, 16):  # one Test name per worker (below)
        globals()[f"TestMyEngine_{i}"] = type(f"TestMyEngine_{i}", (TestMyEngine,), {})

    hicache hypofuzz -n 16 -- test_my_engine_fuzz.py       # or: hypothesis fuzz -- test_...

HypoFuzz 25.11.1 gives worker i (of n) only the targets collected from the i-th on (its
`FuzzWorkerHub._rebalance`), so a worker beyond the number of targets fuzzes nothing: with one
target, `-n 16` fuzzes on one core. HICACHE_HYPOFUZZ_REPLICAS=R (`hicache hypofuzz` sets it to
its worker count) adds R - 1 copies of every target (TestFuzzNull_1, ...): the same machine, so
the same database key, one corpus shared by every worker through the database, as HypoFuzz
means to run one test on several workers.

Every target here counts its steps and failing runs into HICACHE_HYPOFUZZ_STATS=DIR
(hicache/testing/fuzzstats.py; `hicache hypofuzz --stats DIR`), and with
HICACHE_HYPOFUZZ_MUTANT=NAME every worker runs with the bug zoo's mutant NAME switched on
(hicache.testing.mutants), to measure what HypoFuzz finds. Under plain pytest each target is
a short test (PYTEST_EXAMPLES runs); HypoFuzz ignores that budget and runs it forever.
HypoFuzz fuzzes only tests whose database is the default one, so no setting here names one.
"""

from __future__ import annotations

import contextlib
import os
import sys
import unittest

from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine

from hicache.testing.fuzzstats import with_step_counts

ADAPTER_ENV = "HICACHE_HYPOFUZZ_ADAPTER"
"""`module:factory` of an outside engine, fuzzed as TestFuzzAdapter."""
MUTANT_ENV = "HICACHE_HYPOFUZZ_MUTANT"
"""A bug-zoo mutant switched on in every process that imports this module."""
PLANE_ENV = "HICACHE_HYPOFUZZ_PLANE"
"""The plane TestFuzzAdapter's configurations are drawn for (default "null")."""
REPLICAS_ENV = "HICACHE_HYPOFUZZ_REPLICAS"
"""Copies of every target (default 1): TestFuzzNull, TestFuzzNull_1, ... (module docstring)."""
TEMPLATE = "hicache.testing.template:factory"
STEPS_PER_RUN = 50  # as `hicache fuzz` (hicache/testing/runner.py)
PYTEST_EXAMPLES = 3


def replicas(case: type[unittest.TestCase], name: str, count: int) -> None:
    """`count - 1` copies of `case` in this module, `name`_1 ... (module docstring): the same
    machine, so the same database key and one corpus, under other pytest node ids."""
    for i in range(1, count):
        copy = type(f"{name}_{i}", (case,), {"__module__": __name__})
        globals()[copy.__name__] = copy


def as_target(machine: type[RuleBasedStateMachine], name: str) -> type[unittest.TestCase]:
    """`machine`'s TestCase, its steps counted (fuzzstats), its class named `name` (the
    database key of a machine built at run time is its name: each target its own corpus)."""
    counted = with_step_counts(machine, name)
    counted.TestCase.settings = settings(
        max_examples=PYTEST_EXAMPLES,
        stateful_step_count=STEPS_PER_RUN,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    case: type[unittest.TestCase] = counted.TestCase
    return case


def adapter_machine(spec: str, plane: str, name: str) -> type[RuleBasedStateMachine]:
    """The machine `hicache fuzz --adapter SPEC` runs: the factory protocol's engine over the
    configurations of every shape it takes, its trace (if any) judged by check-trace."""
    from hicache.testing.draws import configs
    from hicache.testing.factory import build, load_factory, shapes_taken
    from hicache.testing.machine import make_machine
    from hicache.testing.selfcheck import with_self_check

    factory = load_factory(spec)
    strategy = configs(shapes_taken(factory, spec, plane))
    machine = make_machine(lambda config: build(factory, config, spec), strategy, name=name)
    return with_self_check(machine, strategy, None, name)


def _mutant(name: str | None) -> contextlib.ExitStack:
    """The mutant `name` switched on until the process ends (nothing when None)."""
    stack = contextlib.ExitStack()
    if name:
        from hicache.testing import mutants

        stack.enter_context(mutants.activate(name))
    return stack


_MUTANT = _mutant(os.environ.get(MUTANT_ENV))


def _machines() -> dict[str, type[RuleBasedStateMachine]]:
    from hicache.testing import machines as m

    return {
        "FuzzNull": m.FuzzNull,
        "FuzzCpu": m.FuzzCpu,
        "FuzzDsv4": m.FuzzDsv4,
        "FuzzDsv41": m.FuzzDsv41,
        "FuzzCpuDsv4": m.FuzzCpuDsv4,
        "FuzzTp": m.FuzzTp,
        "FuzzTpDsv4": m.FuzzTpDsv4,
    }


_ms = _machines()
TestFuzzNull = as_target(_ms["FuzzNull"], "FuzzNull")
TestFuzzCpu = as_target(_ms["FuzzCpu"], "FuzzCpu")
TestFuzzDsv4 = as_target(_ms["FuzzDsv4"], "FuzzDsv4")
TestFuzzDsv41 = as_target(_ms["FuzzDsv41"], "FuzzDsv41")
TestFuzzCpuDsv4 = as_target(_ms["FuzzCpuDsv4"], "FuzzCpuDsv4")
TestFuzzTp = as_target(_ms["FuzzTp"], "FuzzTp")
TestFuzzTpDsv4 = as_target(_ms["FuzzTpDsv4"], "FuzzTpDsv4")
TestFuzzTemplate = as_target(adapter_machine(TEMPLATE, "null", "FuzzTemplate"), "FuzzTemplate")

if os.environ.get(ADAPTER_ENV):
    TestFuzzAdapter = as_target(
        adapter_machine(os.environ[ADAPTER_ENV], os.environ.get(PLANE_ENV, "null"), "FuzzAdapter"),
        "FuzzAdapter",
    )


def _replicate(count: int) -> None:
    for name, case in list(globals().items()):
        if name.startswith("TestFuzz"):
            replicas(case, name, count)


_replicate(int(os.environ.get(REPLICAS_ENV) or 1))


def main() -> None:
    """Print this file's path: what `hypothesis fuzz -- PATH` is given."""
    print(os.path.abspath(__file__))


if __name__ == "__main__":
    main()
    sys.exit(0)
