"""Shared test setup: Hypothesis profiles, the example database, replay lines, progress lines
and the GPU and torch markers.

Profiles (select with HICACHE_HYPOTHESIS_PROFILE, or CI=true for `ci`):
  dev   default for local runs: 100 examples
  ci    derandomised (Hypothesis' own `ci` settings), loaded when CI=true
  fuzz  long fuzzing: 5,000 examples, no deadline, a progress line per 1,000 examples of a test
Every profile prints Hypothesis' `@reproduce_failure` blob for a failure. dev and fuzz keep
failing examples in Hypothesis' example database at `<rootdir>/.hypothesis/examples`, so
rerunning a failed test id replays its failing example first. Every failure's report ends with
a `hicache replay` section: the command to rerun it and why that reproduces (tests/replay.py).
HICACHE_PROGRESS_EVERY=N writes a progress line per N examples of a test under any profile
(0: none; tests/progress.py).

The trace walk (`plane_walk`): the control plane's own modules run every test twice, its
planes walked and unwalked; the drawn and long runs walked; every other module unwalked, as
users run the reference (WALK_BOTH, WALK_ONLY).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Generator, Iterator, Mapping
from pathlib import Path

import pytest
from hypothesis import HealthCheck, is_hypothesis_test, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from hicache.testing.walking import every_plane_walked
from tests import budgets, progress, replay

pytest_plugins = ["pytester"]

WALKED, UNWALKED = "walked", "unwalked"
"""How a test builds its control planes (`plane_walk`). Walked: every plane the test builds,
directly or deep inside (a controller, an adapter, a demo), walks its trace as it is emitted
(hicache/testing/walking.py, hicache/core/tracewalk.py): a step the tables' `transitions` machine
does not take, or one that breaks its node's walk, fails the test. Unwalked: as a user builds
them (no walk; without a sink of the test's own, no events at all)."""
WALK_BOTH = frozenset(
    {
        "test_control",
        "test_control_fuzz",
        "test_controller",
        "test_controller_order",
        "test_eviction",
        "test_eviction_room",
        "test_execute",
        "test_illegal_calls",
        "test_insert_validates",
        "test_null_plane",
        "test_restore_pins",
        "test_restore_sharing",
        "test_windows",
        "test_write_path_rows",
    }
)
"""The control plane's and controller's own modules: each test runs twice, [walked] and
[unwalked] (a Hypothesis TestCase, which pytest cannot parametrize, walked)."""
WALK_ONLY = frozenset(
    {
        "test_bugclasses",
        "test_controller_fuzz",
        "test_demo",
        "test_faults",
        "test_fuzz_reach",
        "test_group_engine",
        "test_group_engine_controller",
        "test_group_plane",
        "test_group_traces",
        "test_l3_faults",
        "test_liveness",
        "test_modelcheck",
        "test_modelcheck_tp",
        "test_poisoned_plane",
        "test_quiesce_timeout",
        "test_seeded",
        "test_selfcheck",
        "test_testing_coverage",
        "test_testing_faults",
        "test_testing_machine",
        "test_tp",
        "test_tp_cancel",
        "test_tp_fuzz_ends",
        "test_tp_replicated",
        "test_trace_replay",
        "test_upstream_scenarios",
        "test_zoo",
    }
)
"""Walked only: the machine's and the model checker's runs, pool groups, tensor-parallel
ranks, faults and the spec's scenarios -- long or drawn runs through every transition, where
the walk adds checking. Every other module runs unwalked, as users run the reference."""


def plane_walks(module: str) -> tuple[str, ...]:
    """The ways the tests of `module` (its file's stem) build their planes; the first is the
    one a test that cannot be parametrized gets."""
    if module in WALK_BOTH:
        return (WALKED, UNWALKED)
    return (WALKED,) if module in WALK_ONLY else (UNWALKED,)


PROFILE = budgets.profile()
PROGRESS_EVERY_DEFAULT = {"fuzz": 1000}  # profile -> examples per progress line (else none)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Register the profiles with the database under this run's rootdir and load PROFILE
    (before Hypothesis' plugin, whose --hypothesis-profile still wins)."""
    database = DirectoryBasedExampleDatabase(str(config.rootpath / ".hypothesis" / "examples"))
    settings.register_profile(
        "dev", max_examples=100, deadline=None, print_blob=True, database=database
    )
    settings.register_profile(
        "fuzz",
        max_examples=5000,
        deadline=None,
        print_blob=True,
        database=database,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    # Hypothesis' `ci` is derandomised, which implies no database; the blob is the replay.
    settings.register_profile("ci", settings.get_profile("ci"), deadline=None, print_blob=True)
    settings.load_profile(PROFILE)


def progress_every(profile: str, environ: Mapping[str, str]) -> int:
    """Examples per progress line under `profile` (0: none): HICACHE_PROGRESS_EVERY if set,
    else the profile's default."""
    raw = environ.get("HICACHE_PROGRESS_EVERY")
    if raw is None:
        return PROGRESS_EVERY_DEFAULT.get(profile, 0)
    if not raw.isdigit():
        raise pytest.UsageError(
            f"HICACHE_PROGRESS_EVERY={raw!r}: give examples per progress line, an integer >= 0 "
            f"(0: no progress lines)"
        )
    return int(raw)


def _torch_importable() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _cuda_available() -> bool:
    if not _torch_importable():
        return False
    import torch

    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    every = progress_every(PROFILE, os.environ)
    if every > 0:
        for item in items:
            progress.install(item, progress.Progress(config, item.nodeid, every))
    torch_items = [item for item in items if item.get_closest_marker("torch")]
    if torch_items and not _torch_importable():
        skip = pytest.mark.skip(reason="needs torch (the data plane): pip install -e '.[data]'")
        for item in torch_items:
            item.add_marker(skip)
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if gpu_items and not _cuda_available():  # torch is imported only if a GPU test is run
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in gpu_items:
            item.add_marker(skip)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    walks = plane_walks(Path(metafunc.definition.path).stem)
    if len(walks) > 1:
        metafunc.parametrize("plane_walk", walks, indirect=True)


@pytest.fixture(autouse=True)
def plane_walk(request: pytest.FixtureRequest) -> Iterator[str]:
    """Builds every control plane of the test walked or unwalked (WALKED, `plane_walks`)."""
    walk = getattr(request, "param", None) or plane_walks(request.path.stem)[0]
    if walk == WALKED:
        with every_plane_walked():
            yield walk
    else:
        yield walk


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Append the `hicache replay` section to a failed test's report."""
    report = yield
    if report.when != "call" or not report.failed:
        return report
    function = getattr(item, "obj", None)
    forced = item.config.getoption("hypothesis_seed", None)
    database = settings().database  # the loaded profile's
    failure = replay.Failure(
        nodeid=item.nodeid,
        profile=PROFILE,
        report_text=report.longreprtext,
        hypothesis_test=function is not None and is_hypothesis_test(function),
        forced_seed=None if forced is None else str(forced),
        # Hypothesis records the seed it drew on the test function (no public accessor).
        generated_seed=getattr(function, "_hypothesis_internal_use_generated_seed", None),
        database=(
            Path(database.path) if isinstance(database, DirectoryBasedExampleDatabase) else None
        ),
    )
    report.sections.append(("hicache replay", "\n".join(replay.replay_lines(failure))))
    return report


@pytest.fixture
def no_vllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As if vLLM were not installed (even where it is, and was imported already): its
    modules gone, the name unimportable, the adapters' import cache empty."""
    from hicache.testing.adapters import vllm_import

    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.setattr(vllm_import, "_CACHE", {})
    yield
