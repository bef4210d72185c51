"""benchmarks/null_plane.py: the controller run and the `--fuzz` run each print JSON lines
with their counts and rates (the figures themselves live in benchmarks/results/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def bench(*args: str) -> list[dict[str, object]]:
    # The repository first, then whatever the caller's path held (on a machine where the
    # dependencies come through PYTHONPATH, replacing it would lose them).
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "null_plane.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_fuzz_mode_times_the_machine_with_and_without_checks() -> None:
    rows = bench("--fuzz", "--seeds", "1", "2", "--steps", "150")
    assert [r["seed"] for r in rows] == [1, 2]
    for r in rows:
        assert r["mode"] == "fuzz" and r["same_trace"] is True  # checks change no step drawn
        assert isinstance(r["steps"], int) and r["steps"] > 0
        assert isinstance(r["transitions"], int) and r["transitions"] > 0
        for key in ("cpu_steps_per_s", "cpu_transitions_per_s", "transitions_per_s_checks_off"):
            rate = r[key]
            assert isinstance(rate, int) and rate > 0, (key, r)
        ratio = r["checks_ratio"]
        assert isinstance(ratio, float) and ratio > 0


def test_controller_mode_counts_checked_transitions() -> None:
    (row,) = bench("--requests", "20", "--tiers", "12", "16", "24")
    assert row["check_mode"] == "every" and row["checks_run"] == row["transitions"]
    assert isinstance(row["transitions"], int) and row["transitions"] > 0
