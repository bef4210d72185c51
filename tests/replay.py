"""The replay section a failing test's report carries: a command, and why it reproduces.

Why not just a seed: Hypothesis mixes constants from every loaded local module into what it
generates, so `--hypothesis-seed=N` regenerates a failure only when the same test modules are
imported as in the failing run; rerunning one test id imports fewer and may pass. Forcing a
seed also turns Hypothesis' example database off. What does reproduce:

    profile     the replay command reruns the test id and ...
    ---------   -----------------------------------------------------------------------------
    dev, fuzz   replays the failing example first: Hypothesis saved it in the example database
                (`<rootdir>/.hypothesis/examples`, gitignored) when the test failed
    ci          derandomised, so usually the same examples; the CI machine's database is gone,
                so the exact replay is the blob below
    any         `@reproduce_failure(version, blob)` (printed by Hypothesis, repeated here) on
                the test replays the failing example exactly, on any machine, same version
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

BLOB = re.compile(r"@reproduce_failure\([^)]*\)")


@dataclass(frozen=True)
class Failure:
    """What is known about one failed test when its report is made."""

    nodeid: str
    profile: str
    report_text: str  # the failure's full report (Hypothesis' notes included)
    hypothesis_test: bool
    forced_seed: str | None  # --hypothesis-seed, if given (Hypothesis takes any string)
    generated_seed: int | None  # the seed Hypothesis drew for this test, if known
    database: Path | None  # the example database directory, if the profile has one


def replay_lines(failure: Failure) -> list[str]:
    """The `hicache replay` section: the command first, then one line per reason it works."""
    env = "CI=true" if failure.profile == "ci" else f"HICACHE_HYPOTHESIS_PROFILE={failure.profile}"
    command = f"{env} python3 -m pytest {shlex.quote(failure.nodeid)} -p no:cacheprovider"
    if failure.forced_seed is not None:
        command += " " + shlex.quote(f"--hypothesis-seed={failure.forced_seed}")
    lines = [f"replay: {command}"]
    if not failure.hypothesis_test:
        return lines
    if failure.forced_seed is not None:
        lines.append(
            f"  seed {failure.forced_seed} was forced, which turns the example database "
            f"off: the same examples come back only if the same test modules load"
        )
    elif failure.database is not None:
        lines.append(f"  it runs the failing example first: it is saved in {failure.database}")
    elif failure.profile == "ci":
        lines.append(
            "  derandomised: the same examples unless other test modules load; "
            "the blob below is exact"
        )
    blob = BLOB.search(failure.report_text)
    if blob is not None:
        lines.append(f"  exact, on any machine: decorate the test with {blob.group(0)}")
    if failure.generated_seed is not None:
        lines.append(
            f"  seed {failure.generated_seed} (--hypothesis-seed; regenerates the "
            f"failure only if the same test modules load)"
        )
    return lines
