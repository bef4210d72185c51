"""`hicache bench serving`'s stress experiment (hicache/bench/serving.py) on the CPU: rounds
with the path order rotated, and the median round reported with every round's rate."""

from __future__ import annotations

import statistics
from typing import Any

import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

from hicache.bench import serving
from hicache.dataplane.geometry import preset as geometry_preset
from hicache.errors import ConfigError
from hicache.producers import PacedProducer, SyntheticProducer


def _subject() -> serving.Subject:
    inner = SyntheticProducer(geometry_preset("tiny"), device="cpu")
    return serving.Subject(PacedProducer(inner, 0.0, 0.0), serving.PACED_VOCAB, "cpu", "paced")


def test_stress_rotates_the_order_and_reports_each_paths_median_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    order: list[str] = []
    rates = iter([5.0, 1.0, 9.0, 4.0, 7.0, 2.0, 3.0, 8.0, 6.0] * 2)

    def run(subject: Any, path: str, *args: Any) -> dict[str, Any]:
        order.append(path)
        return {"path": path, "requests_per_s": next(rates), "hit_tokens": {}, "call": len(order)}

    monkeypatch.setattr(serving, "_stress_run", run)
    rows = serving.stress(_subject(), n_prefixes=2, prefix_len=40, n_requests=4, rounds=3)
    n = len(serving.PATHS)
    assert [order[r * n] for r in range(3)] == list(serving.PATHS[:3]), "a round starts later"
    assert all(sorted(order[r * n : (r + 1) * n]) == sorted(serving.PATHS) for r in range(3))
    assert [row["path"] for row in rows] == list(serving.PATHS)
    for row in rows:
        rounds = row["rounds_requests_per_s"]
        assert len(rounds) == 3
        assert row["requests_per_s"] == statistics.median(rounds)
        assert order[row["call"] - 1] == row["path"], "the median round's own row"


def test_stress_refuses_no_rounds_and_the_cli_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    with pytest.raises(ConfigError, match="rounds"):
        serving.stress(_subject(), rounds=0)
    with pytest.raises(SystemExit) as done:
        serving.main(["--out", str(tmp_path), "--paced", "1", "0", "--stress-rounds", "0"])
    assert done.value.code == 2
    assert "--stress-rounds: >= 1, got 0" in capsys.readouterr().err


def test_the_stress_table_names_its_rounds() -> None:
    rows = [
        {"path": p, "requests_per_s": 10.0, "decisions": {"recompute": 80}} for p in serving.PATHS
    ]
    result = {"device": "cpu", "torch": "x", "stress_rounds": 3}
    result["runs"] = [{"preset": "tiny", "mode": "paced", "latency": [], "stress": rows}]
    md = serving.report_md(result)
    assert "batch 1; the median of 3 rounds)" in md
    assert "| tiny | paced | 10.00 | 10.00 (1.00x) | 10.00 (1.00x) | 10.00 | 1.000 |" in md
