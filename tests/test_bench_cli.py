"""`hicache bench NAME`: usage names the command as typed, a bench that needs CUDA exits 2
with one line where there is none, tables carry units and a legend, and the invariants
benchmark states its `--pages` rule with the exact minimum that works."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

import torch

from hicache.app import cli
from hicache.bench import invariants
from hicache.bench.invariants import min_pages_per_tier, synthetic_snapshot
from hicache.errors import ConfigError

BENCHES = sorted(words[1] for words in cli.DELEGATED if words[0] == "bench")
NEEDS_CUDA = ("kernels", "recompute", "serving", "transfer")


@pytest.mark.parametrize("name", BENCHES)
def test_usage_names_the_command_as_typed(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    module = importlib.import_module(f"hicache.bench.{name}")
    with pytest.raises(SystemExit) as done:
        module.main(["--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: hicache bench {name} ")


@pytest.mark.parametrize("name", BENCHES)
def test_a_usage_error_is_one_line_naming_the_command(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    module = importlib.import_module(f"hicache.bench.{name}")
    with pytest.raises(SystemExit) as done:
        module.main(["--no-such-option"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hicache bench {name}: error: ") and err.count("\n") == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the exit without CUDA")
@pytest.mark.parametrize("name", NEEDS_CUDA)
def test_a_bench_that_needs_cuda_exits_2_with_one_line(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """recompute exited 0 here while kernels and serving exited 2; now all say so alike."""
    assert cli.main(["bench", name, "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(f"hicache bench {name}: no CUDA device here")
    assert "nothing was measured" in captured.err
    assert list(tmp_path.iterdir()) == []


def test_invariants_pages_error_states_the_rule_and_the_minimum_that_works(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It said '64 holds fewer than 4 nodes of 16 pages; use at least 86' without saying
    why 86: 4 nodes x 16 pages must fit in 3/4 of the tier. 85 fails, 86 runs."""
    assert min_pages_per_tier() == 86
    with pytest.raises(SystemExit) as done:
        invariants.main(["--pages", "85", "--repeats", "1"])
    assert done.value.code == 2
    assert capsys.readouterr().err == (
        "hicache bench invariants: error: --pages: 85 pages per tier is too few: the synthetic "
        "tree needs at least 4 nodes of 16 pages within 3/4 of each tier (the rest holds "
        "in-flight transfers and a request's pages), so at least 86 pages per tier\n"
    )
    assert invariants.main(["--pages", "86", "--repeats", "1"]) == 0
    with pytest.raises(ConfigError, match="so at least 86 pages per tier"):
        synthetic_snapshot(85)
    for node_pages in (1, 4, 16, 33):  # the stated minimum is exact for any node size
        least = min_pages_per_tier(node_pages)
        synthetic_snapshot(least, node_pages=node_pages)
        with pytest.raises(ConfigError, match=f"so at least {least} pages"):
            synthetic_snapshot(least - 1, node_pages=node_pages)


def header_and_legend(out: str, first_column: str) -> tuple[list[str], str]:
    """The header cells of the table whose header starts with `first_column`, and the legend."""
    lines = out.splitlines()
    header = next(line for line in lines if line.split()[:1] == [first_column])
    legend = next(line for line in lines if line.startswith("legend: "))
    return re.split(r"\s{2,}", header.strip()), legend


def test_invariants_table_has_units_and_a_legend(capsys: pytest.CaptureFixture[str]) -> None:
    assert invariants.main(["--pages", "100", "--repeats", "1"]) == 0
    header, legend = header_and_legend(capsys.readouterr().out, "pages/tier")
    assert all(cell.endswith(("µs", "ns/page")) for cell in header[2:])
    assert "ns/page:" in legend and "cpu:" in legend


def test_control_table_has_units_and_a_legend(capsys: pytest.CaptureFixture[str]) -> None:
    from hicache.bench import control

    assert (
        control.main(["--tokens", "32", "--background", "2", "--repeats", "1", "--page-size", "4"])
        == 0
    )
    header, legend = header_and_legend(capsys.readouterr().out, "tokens")
    assert header == ["tokens", "pages", "match hit µs", "match miss µs", "insert µs"]
    assert "µs = microseconds" in legend


def test_storage_tables_have_units_and_explain_c_f_and_extents(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from hicache.bench import storage

    assert storage.main(["--tokens", "32", "--bytes-per-page", "4096", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "{" not in out  # the configuration is a line, not a JSON dump
    header, legend = header_and_legend(out, "pages")
    assert "ext c/f" not in out and header[1] == "extents c/f"
    assert all("GB/s" in cell for cell in header[2:])
    terms = ("c = consecutive", "f = fragmented", "extents = ", "raw = ", "ceiling = ", "x ceil = ")
    for term in terms:
        assert term in legend
    cpu_header = next(line for line in out.splitlines() if "CPU ms" in line and "pages" in line)
    assert all(cell.endswith("CPU ms") for cell in re.split(r"\s{2,}", cpu_header.strip())[1:])


def test_kernels_table_has_units_and_a_legend() -> None:
    from hicache.bench.kernels import format_table

    row = {
        "GBps_rw": 900.0,
        "of_ceiling": 0.5,
        "GBps_rw_queued": 1200.0,
        "of_ceiling_queued": 0.6,
        "correct": True,
    }
    result = {
        "device": "cpu",
        "ceiling": {"GBps_rw": 1800.0, "GBps_rw_queued": 2000.0},
        "cases": [
            {"tokens": 350, "pages": 22, "gather": {"torch": row}, "scatter": {"torch": row}}
        ],
    }
    header, legend = header_and_legend(format_table(result), "tokens")
    assert header == [
        "tokens",
        "pages",
        "direction",
        "variant",
        "GB/s synced",
        "% ceiling",
        "GB/s queued",
        "% ceiling",
        "bytes ok",
    ]
    assert "synced:" in legend and "queued:" in legend and "bytes ok:" in legend


def test_serving_paced_runs_without_cuda_and_tables_name_the_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--paced` needs no GPU: the synthetic producer at a launch-bound pace, one latency
    length, no stress. Both tables' rows name the preset and the mode; the JSON keeps each
    path's warm-up choices apart from the timed ones."""
    import json

    from hicache.bench import serving

    out = tmp_path / "out"
    argv = ["--out", str(out), "--paced", "5", "0", "--lengths", "40", "--repeats", "1"]
    assert serving.main([*argv, "--no-stress"]) == 0
    table = (out / "serving.md").read_text()
    assert "| preset | mode | tokens |" in table
    assert "| tiny | paced 5 ms + 0 us/token | 40 |" in table
    result = json.loads((out / "serving.json").read_text())
    (run,) = result["runs"]
    assert (run["preset"], run["mode"]) == ("tiny", "paced 5 ms + 0 us/token")
    rows = {row["path"]: row for row in run["latency"]}
    assert sorted(rows) == sorted(serving.PATHS)
    assert all(len(r["warmup_choices"]) == serving.WARMUP_ROUNDS for r in rows.values())
    assert all(len(r["samples_ms"]) == 1 for r in rows.values())
    # Which streams a row's restore ran on is recorded where there are streams: none on CPU.
    assert all(r["producer_streams"] is None for r in rows.values())
    layerwise = [r["layerwise_mover"] for r in rows.values() if r["layerwise_mover"]]
    assert layerwise and all(m["streams"] is None for m in layerwise)
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:  # --mode picks model modes; --paced runs none
        serving.main([*argv, "--mode", "eager"])
    assert done.value.code == 2
    assert "--paced runs no model" in capsys.readouterr().err


def test_serving_io_threads_reach_every_controller(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--io-threads N` is every controller's L3 I/O thread count (an L3 restore's S2H runs
    on them); the JSON and the table say it; fewer than one is refused."""
    import json

    from hicache.bench import serving
    from hicache.controller.controller import CacheController as real

    made: list[int] = []

    def recording(cfg: Any, producer: Any) -> Any:
        made.append(cfg.io_threads)
        return real(cfg, producer)

    monkeypatch.setattr(serving, "CacheController", recording)
    out = tmp_path / "out"
    argv = ["--out", str(out), "--lengths", "40", "--repeats", "1", "--warmup", "0"]
    assert serving.main([*argv, "--paced", "1", "0", "--no-stress", "--io-threads", "2"]) == 0
    assert made and set(made) == {2}, made
    assert json.loads((out / "serving.json").read_text())["io_threads"] == 2
    assert "2 L3 I/O threads" in (out / "serving.md").read_text()
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        serving.main([*argv, "--paced", "1", "0", "--io-threads", "0"])
    assert done.value.code == 2
    assert "--io-threads: 1 to 64, got 0" in capsys.readouterr().err


def test_serving_paced_cached_names_the_tail_pace_and_needs_paced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--paced-cached US` charges a tail prefill US per cached token (the eager producer's
    cost of building the cached prefix); the mode says so. Without `--paced` it is refused."""
    import json

    from hicache.bench import serving

    out = tmp_path / "out"
    argv = ["--out", str(out), "--lengths", "40", "--repeats", "1", "--warmup", "0"]
    assert serving.main([*argv, "--paced", "1", "0", "--paced-cached", "2", "--no-stress"]) == 0
    (run,) = json.loads((out / "serving.json").read_text())["runs"]
    assert run["mode"] == "paced 1 ms + 0 us/token + 2 us/cached token"
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        serving.main([*argv, "--paced-cached", "2"])
    assert done.value.code == 2
    assert "--paced-cached paces the synthetic producer" in capsys.readouterr().err
