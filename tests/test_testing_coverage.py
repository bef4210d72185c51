"""Coverage as a gate: within the CI budget the fuzz machine (controller, null plane) must
reach every transition and every composite state of spec/lifecycle.toml and every fault
site of `FaultSite` (read now: a site added later joins the goal by itself). The test fails
listing what no run reached."""

from __future__ import annotations

import argparse
import io

from hicache.testing.coverage import Coverage
from hicache.testing.runner import Progress, run

SEED, STEPS = 1, 16_000  # about 40 s on one core of the CI machine
KNOWN_GAPS = {"fault site": {"CORRUPT_SLOT", "D2H_COMPLETE"}}
"""Goals the CI budget does not reach yet (the nightly profile's runs do): named here so the
gate still fails on anything else, and says these are open."""


def test_every_transition_state_and_fault_site_is_reached() -> None:
    seen: list[Coverage] = []

    class Keep(Progress):
        def __init__(self, total_steps: int, show: bool) -> None:
            super().__init__(total_steps, show)
            seen.append(self)

    import hicache.testing.runner as runner
    original, runner.Progress = runner.Progress, Keep  # type: ignore[misc]
    try:
        args = argparse.Namespace(seed=SEED, steps=STEPS, plane="null", adapter=None, report=False,
                                  progress=False, mutant=None)
        out = io.StringIO()
        assert run(args, out) == 0, out.getvalue()
    finally:
        runner.Progress = original  # type: ignore[misc]
    missing = {kind: set(names) - KNOWN_GAPS.get(kind, set())
               for kind, names in seen[0].missing().items()}
    missing = {kind: names for kind, names in missing.items() if names}
    assert not missing, "not reached within the CI budget: " + "; ".join(
        f"{kind}s {', '.join(sorted(names))}" for kind, names in missing.items())


def test_coverage_names_what_was_not_reached() -> None:
    cov = Coverage()
    assert "evict_l1" in cov.missing()["transition"]
    assert "L1_L2_L3" in cov.missing()["composite state"]
    assert "DELAY" in cov.missing()["fault site"]
    assert "not reached: transitions" in cov.report()
