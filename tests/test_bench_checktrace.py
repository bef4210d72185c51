"""`hicache bench checktrace --curve`: events/s per trace length, the ceiling beside it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hicache.bench.checktrace import curve_trace, main


def test_the_curve_reports_each_length_and_tier_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "curve.json"
    argv = ["--curve", "--lengths", "200,400", "--tiers", "small,2000"]
    assert main([*argv, "--cache", str(tmp_path / "cache"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "json-only ev/s" in text and "2,000 pages" in text
    points = json.loads(out.read_text())["points"]
    assert [(p["tiers"], p["events"]) for p in points] == [
        ("small (12/10/14)", 200),
        ("small (12/10/14)", 400),
        ("2,000 pages", 200),
        ("2,000 pages", 400),
    ]
    assert all(0 < p["check_trace"] < p["json_only"] for p in points)


def test_a_curve_trace_is_a_prefix_of_a_longer_one(tmp_path: Path) -> None:
    short = curve_trace(3, 150, None)
    cached = curve_trace(3, 300, None, str(tmp_path))
    assert len(short) == 151 and len(cached) == 301 and cached[:151] == short
    assert curve_trace(3, 300, None, str(tmp_path)) == cached  # read back from the cache
