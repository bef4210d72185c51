"""`hicache demo`'s report, sizing, help and progress bar (`hicache/app/demo.py`,
`demo_report.py`, `demo_sizing.py`): a report an engineer reads at a glance -- the
configuration echoed, every term defined in `--help`, shares that add to 100% -- capacities
sized from the workload, and no progress bar in a log file.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from hicache.app import demo
from hicache.app.demo_report import DROP_LABELS, FALLBACK_LABELS, GLOSSARY, percents
from hicache.app.demo_sizing import longest_prompt, size_tiers
from hicache.app.workload import shared_prefix_workload
from hicache.controller.metrics import DROP_REASONS, FALLBACK_REASONS
from hicache.errors import ConfigError

# Small and fast, yet with preemptions, drops and fallbacks to report (see test_serving.py).
TIGHT = [
    "--device",
    "cpu",
    "--l1-pages",
    "40",
    "--l2-pages",
    "8",
    "--l3-slots",
    "8",
    "--requests",
    "40",
]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[str, str]:
    assert demo.main(list(args)) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    """The report and the JSON summary of one TIGHT run (shared: a demo run takes a second)."""
    path = tmp_path_factory.mktemp("demo") / "demo.json"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert demo.main([*TIGHT, "--json", str(path)]) == 0
    return out.getvalue(), json.loads(path.read_text())


@pytest.mark.torch  # runs the demo
def test_report_echoes_the_configuration_and_defines_every_term(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out, _ = run(capsys, *TIGHT, "--seed", "3", "--write-policy", "write_back")
    config = dict(
        re.findall(r"^  (\S+(?: \S+)*?)  +(.+)$", out.split("\n\n")[1], flags=re.MULTILINE)
    )
    assert config["geometry"].startswith("tiny: 2 layers")
    assert config["L1 (device)"] == "40 pages" and config["L2 (host)"] == "8 pages"
    assert config["L3 (file)"] == "8 slots" and config["L3 path"].startswith("a temporary file")
    assert config["write policy"] == "write_back" and config["policy"] == "always"
    assert config["check mode"] == "every" and config["device"] == "cpu"
    assert config["backend"].startswith("auto: gather torch") and config["seed"] == "3"
    # No raw dicts, no terms the glossary does not define.
    assert "{" not in out and "steady" not in out and "no_room" not in out
    assert "policy skips" not in out and "host_pressure" not in out
    labels = re.findall(r"^  (\S+(?: \S+)*?)(?:  +|$)", out, flags=re.MULTILINE)
    undefined = {label for label in labels if label not in GLOSSARY and label != "total"}
    configuration = {
        "geometry",
        "L1 (device)",
        "L2 (host)",
        "L3 (file)",
        "L3 path",
        "write policy",
        "policy",
        "check mode",
        "device",
        "backend",
        "seed",
        "batch size",
    }
    assert undefined <= configuration | {"D2H", "H2D", "H2S", "S2H"}  # those are, by name


@pytest.mark.torch  # runs the demo
def test_always_policy_decisions_say_why_they_recompute(tight: tuple[str, Any]) -> None:
    out, _ = tight
    section = next(s for s in out.split("\n\n") if s.startswith("Decisions by reason"))
    rows = dict(re.findall(r"^  (.+?)  +([\d,]+)$", section, flags=re.MULTILINE))
    assert int(rows["recompute: nothing cached beyond L1"]) > 0
    assert int(rows["total"]) == 42  # 40 requests + 2 preemptions: one decision per admission


@pytest.mark.torch  # runs the demo
def test_token_shares_print_as_exactly_100_percent(tight: tuple[str, Any]) -> None:
    out, _ = tight
    section = next(s for s in out.split("\n\n") if s.startswith("Prompt tokens by source"))
    rows = re.findall(r"^  (.+?)  +([\d,]+)  +([\d.]+)%$", section, flags=re.MULTILINE)
    *parts, total = rows
    assert total[0] == "total" and total[2] == "100.0"
    assert sum(int(n.replace(",", "")) for _, n, _ in parts) == int(total[1].replace(",", ""))
    assert sum(round(float(p) * 10) for _, _, p in parts) == 1000


def test_every_fallback_and_drop_reason_has_a_defined_label() -> None:
    """The report prints every reason the metrics count, so each needs a label the glossary
    defines (a reason added without one made every demo with a drop raise KeyError)."""
    assert set(FALLBACK_LABELS) == set(FALLBACK_REASONS)
    assert set(DROP_LABELS) == set(DROP_REASONS)
    for label in [*FALLBACK_LABELS.values(), *DROP_LABELS.values()]:
        assert label in GLOSSARY, label


def test_percents_add_to_exactly_100() -> None:
    assert percents([1, 1, 1]) == ["33.4%", "33.3%", "33.3%"]
    assert percents([0, 0]) == ["-", "-"]
    shares = percents([7536, 696, 1480, 4992, 1])
    assert sum(round(float(p[:-1]) * 10) for p in shares) == 1000


@pytest.mark.torch  # runs the demo
def test_json_stays_machine_readable(tight: tuple[str, dict[str, Any]]) -> None:
    _, s = tight
    assert s["config"]["l1_pages"] == 40 and s["config"]["sized"] == []
    assert s["decision_reasons"]["recompute: nothing cached beyond L1"] > 0
    assert sum(s["decision_reasons"].values()) == s["admissions"]


@pytest.mark.torch  # runs the demo
def test_the_headline_rate_is_over_the_time_it_names(tight: tuple[str, dict[str, Any]]) -> None:
    """The headline used to give the whole wall time (setup included) beside a rate over the
    serving loop's time alone: 120 requests "in 3.3 s (58.5 requests/s)"."""
    text, s = tight
    head = text.splitlines()[0]
    assert 0 < s["serving_s"] <= s["wall_s"]
    assert s["requests_per_s"] == pytest.approx(s["requests"] / s["serving_s"])
    assert f"served in {s['serving_s']:.1f} s ({s['requests_per_s']:.1f} requests/s)" in head
    assert f"{s['wall_s']:.1f} s with setup" in head


def test_help_shows_defaults_and_the_glossary(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        demo.main(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "requests in the workload (default: 120)" in text
    assert "(default: always)" in text and "(default: None)" not in text
    for term, meaning in GLOSSARY.items():
        assert f"{term}: {' '.join(meaning.split())}" in text


def test_defaults_are_sized_from_the_workload() -> None:
    """--requests 300 needs 206 L1 pages for its longest prompt; the old fixed default (160)
    refused it. Sized: longest + 3 mean prompts in L1, half again in L2, every page in L3."""
    workload = shared_prefix_workload(300, seed=0)
    longest = longest_prompt(workload, 4)
    assert (longest.request_id, longest.tokens, longest.pages) == (287, 822, 206)
    mean_pages = math.ceil(sum(len(r.tokens) for r in workload) / (4 * 300))
    sizes = size_tiers(workload, 4, 4)
    assert sizes.l1_pages == 206 + 3 * mean_pages and sizes.l2_pages == sizes.l1_pages * 3 // 2
    assert sizes.sized == {"l1_pages", "l2_pages", "l3_slots"}
    given = size_tiers(workload, 4, 4, l1_pages=206, l3_slots=64)
    assert (given.l1_pages, given.l2_pages, given.l3_slots) == (206, 309, 64)
    assert given.sized == {"l2_pages"}
    with pytest.raises(ConfigError, match="205 is too small: this workload needs at least 206"):
        size_tiers(workload, 4, 4, l1_pages=205)


@pytest.mark.torch  # runs the demo
def test_300_requests_run_with_the_default_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "demo.json"
    report, _ = run(
        capsys, "--device", "cpu", "--requests", "300", "--check-mode", "off", "--json", str(out)
    )
    config = json.loads(out.read_text())["config"]
    assert config["l1_pages"] >= 206
    assert set(config["sized"]) == {"l1_pages", "l2_pages", "l3_slots"}
    assert f"{config['l1_pages']} pages (sized from the workload)" in report


@pytest.mark.torch  # runs the demo
def test_no_progress_bar_unless_stderr_is_a_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, err = run(capsys, *TIGHT, "--check-mode", "off")  # captured stderr: not a terminal
    assert err == ""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    _, err = run(capsys, *TIGHT, "--check-mode", "off")
    assert err.endswith("] 40/40 requests\n")


@pytest.mark.parametrize("option", ["--json", "--prometheus"])
def test_an_output_path_that_cannot_be_written_is_refused_before_the_run(
    option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--json /nonexistent/x.json` used to serve every request, print the report and then
    end in a FileNotFoundError traceback; a directory, in IsADirectoryError. (Every command's
    output options: tests/test_cli_manners.py.)"""
    for path, says in [
        (tmp_path / "no" / "x.json", f"no directory {tmp_path / 'no'}"),
        (tmp_path, "is a directory"),
    ]:
        with pytest.raises(SystemExit) as done:
            demo.main(["--quiet", "--requests", "1", option, str(path)])
        assert done.value.code == 2
        err = capsys.readouterr()
        assert f"argument {option}: {path}: {says}; choose a writable path" in err.err
        assert "served" not in err.out  # nothing ran
    assert not (tmp_path / "no").exists()


def test_more_tp_ranks_than_one_host_has_gpus_are_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--tp 32` used to start 32 rank processes (about 5 GiB) and print nothing."""
    with pytest.raises(SystemExit) as exit_:
        demo.main(["--quiet", "--tp", str(demo.TP_MAX + 1)])
    assert exit_.value.code == 2
    assert f"ranks in 1..{demo.TP_MAX}" in capsys.readouterr().err
