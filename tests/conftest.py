"""Shared test setup: Hypothesis profiles and the GPU marker.

Profiles (select with HICACHE_HYPOTHESIS_PROFILE, or CI=true for `ci`):
  dev   default for local runs: 100 examples
  ci    derandomised (Hypothesis' own `ci` settings), loaded when CI=true
  fuzz  long fuzzing: 5,000 examples, no deadline; HICACHE_HYPOTHESIS_PROFILE=fuzz
Every failure prints its seed and a one-line replay command (see `pytest_runtest_makereport`);
Hypothesis also prints the failing example and a `@reproduce_failure` blob.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=100, deadline=None, print_blob=True)
settings.register_profile(
    "fuzz", max_examples=5000, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_profile = os.environ.get("HICACHE_HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
if _profile == "ci":
    settings.register_profile("ci", settings.get_profile("ci"), deadline=None)
settings.load_profile(_profile)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Pick the run's Hypothesis seed ourselves (unless given), so a failure can name it."""
    if _profile != "ci" and config.getoption("hypothesis_seed", None) is None:
        config.option.hypothesis_seed = int.from_bytes(os.urandom(4), "little")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed and hasattr(item, "obj"):
        seed = item.config.getoption("hypothesis_seed", None)
        env = "CI=true" if _profile == "ci" else f"HICACHE_HYPOTHESIS_PROFILE={_profile}"
        replay = (
            f"replay: {env} python -m pytest '{item.nodeid}' -p no:cacheprovider"
            + (f" --hypothesis-seed={seed}" if seed is not None else " (derandomised: same examples every run)")
        )
        report.sections.append(("hicache replay", replay))
