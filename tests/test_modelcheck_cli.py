"""`hicache model-check`: exit statuses, the report, the trace it writes, the manifest check."""

from __future__ import annotations

from pathlib import Path

import pytest

from hicache.app import cli
from hicache.oracle.checktrace import check_lines
from hicache.oracle.modelcheck import cli as mc
from hicache.oracle.modelcheck.config import CONFIGS_TOML, get_config
from hicache.spec import LIFECYCLE_TOML

D2H_ISSUE_GUARDS = 'guards = ["L1 == RESIDENT", "parent(L2) == RESIDENT"]'


def mutant_tables(tmp_path: Path) -> Path:
    """spec/lifecycle.toml with d2h_issue's parent(L2) == RESIDENT guard dropped."""
    text = LIFECYCLE_TOML.read_text()
    # Verify the row is spelled as this test expects (else the edit would not land).
    assert text.count(D2H_ISSUE_GUARDS) == 1
    path = tmp_path / "lifecycle.toml"
    path.write_text(
        text.replace(D2H_ISSUE_GUARDS, D2H_ISSUE_GUARDS.replace(', "parent(L2) == RESIDENT"', ""))
    )
    return path


def test_a_clean_config_exits_0_with_counts_and_coverage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["model-check", "--config", "tail"]) == 0
    out = capsys.readouterr().out
    assert "model-check tail: 227 states, 1597 edges, depth 17," in out and "exhaustive" in out
    assert "transitions fired: 23/23 (every one)" in out and "counts match the manifest" in out


def test_counts_that_differ_from_the_manifest_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "configs.toml"
    text = CONFIGS_TOML.read_text()
    assert "states = 227," in text
    manifest.write_text(text.replace("states = 227,", "states = 226,"))
    assert mc.main(["--config", "tail", "--configs", str(manifest)]) == 1
    assert "counts differ from the manifest" in capsys.readouterr().out


def test_a_finding_exits_1_and_writes_a_trace_check_trace_rejects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / "bad.ndjson"
    status = mc.main(
        [
            "--config",
            "pages",
            "--lifecycle",
            str(mutant_tables(tmp_path)),
            "--trace-out",
            str(out_file),
        ]
    )
    out = capsys.readouterr().out
    assert status == 1
    assert (
        "FOUND invariant" in out
        and "S6 tier_ancestor_closed" in out
        and "6. issue D2H nodes 2" in out
    )
    lines = out_file.read_text().splitlines()
    assert '"format":"hicache-trace"' in lines[0]
    assert check_lines(lines).exit_code == 1


def test_without_trace_out_the_trace_is_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert mc.main(["--config", "pages", "--lifecycle", str(mutant_tables(tmp_path))]) == 1
    out = capsys.readouterr().out
    trace = out[out.index("trace:\n") + len("trace:\n") :].splitlines()
    assert check_lines(trace).exit_code == 1


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--config", "nope"],
        ["--config", "tail", "--max-states", "0"],
        ["--config", "tail", "--reduction", "none"],
        ["--config", "tail", "--verify-refusals", "-1"],
    ],
)
def test_usage_errors_exit_2_with_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        status = mc.main(argv)
        raise SystemExit(status)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hicache model-check: error:")


def test_a_malformed_manifest_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = tmp_path / "configs.toml"
    manifest.write_text(
        '[[config]]\nname = "x"\npage_size = 2\ncapacities = [2, 2]\nprompts = [[1, 2]]\n'
        "requests = 1\n"
    )
    assert mc.main(["--config", "x", "--configs", str(manifest)]) == 2
    assert "config x" in capsys.readouterr().err


def test_an_unreduced_search_with_a_bound_stops_early(capsys: pytest.CaptureFixture[str]) -> None:
    assert mc.main(["--config", "tail", "--reduction", "none", "--max-depth", "4"]) == 0
    assert "stopped early" in capsys.readouterr().out


@pytest.mark.parametrize("bound", [1, 10, 100])
def test_max_states_is_the_number_of_states_found(
    bound: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """--max-states 10 used to report 11 states (the bound was checked only between
    expansions), and --max-states 1 called its one state exhaustive."""
    assert mc.main(["--config", "tail", "--max-states", str(bound)]) == 0
    assert f"tail: {bound} states," in (out := capsys.readouterr().out) and "stopped early" in out


def test_a_bound_of_the_whole_space_is_still_exhaustive(capsys: pytest.CaptureFixture[str]) -> None:
    expected = get_config("tail").expected
    assert expected is not None
    whole = expected.states
    assert mc.main(["--config", "tail", "--max-states", str(whole)]) == 0
    assert f"tail: {whole} states," in (out := capsys.readouterr().out) and "exhaustive" in out
    assert mc.main(["--config", "tail", "--max-states", str(whole - 1)]) == 0
    assert "stopped early" in capsys.readouterr().out


@pytest.mark.parametrize("option", ["--lifecycle", "--configs"])
@pytest.mark.parametrize("text", [None, "x = ", "[[config]]\nname = 1\n"])
def test_an_unreadable_file_exits_2_naming_the_option(
    option: str, text: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "f.toml"
    if text is not None:
        path.write_text(text)
    assert mc.main(["--config", "tail", option, str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"hicache model-check: error: {option}")


def test_list_names_every_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert mc.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("tail", "pair", "fork", "pages"))


def test_an_unknown_config_blames_config_and_an_unwritable_trace_out_is_refused_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--config bogus` used to read '--configs: cannot read it: --config: ...'; a --trace-out
    in a missing directory used to end, after the search printed its finding, in a
    FileNotFoundError traceback."""
    assert mc.main(["--config", "bogus"]) == 2
    assert capsys.readouterr().err.startswith(
        "hicache model-check: error: --config: 'bogus' is not"
    )
    out_file = tmp_path / "no" / "bad.ndjson"
    with pytest.raises(SystemExit) as done:
        mc.main(
            [
                "--config",
                "pages",
                "--lifecycle",
                str(mutant_tables(tmp_path)),
                "--trace-out",
                str(out_file),
            ]
        )
    captured = capsys.readouterr()
    assert done.value.code == 2 and "FOUND" not in captured.out
    assert f"argument --trace-out: {out_file}: no directory" in captured.err
