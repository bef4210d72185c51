"""spec/pools.md against spec/pools.toml: the drift check finds each kind of difference, and
`hicache pools` prints the tables pools.md is checked against."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hicache.app.cli import main
from hicache.oracle.speccheck import check_spec
from hicache.oracle.speccheck.pools import check_pools, preset_table
from hicache.pools import group, names
from hicache.spec import SPEC_DIR


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    """A private copy of the shipped spec's pool files."""
    for name in ("pools.md", "pools.toml"):
        shutil.copy(SPEC_DIR / name, tmp_path / name)
    return tmp_path


def edit(path: Path, old: str, new: str) -> None:
    """Replace the one occurrence of `old` in `path` (the test is wrong if there is not one)."""
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times in {path.name}"
    path.write_text(text.replace(old, new), encoding="utf-8")


def problems(spec: Path) -> list[str]:
    return check_pools((spec / "pools.md").read_text(encoding="utf-8"), spec / "pools.toml")


def test_shipped_tables_agree_and_are_the_rendered_ones() -> None:
    md = (SPEC_DIR / "pools.md").read_text(encoding="utf-8")
    assert check_pools(md, SPEC_DIR / "pools.toml") == []
    for name in names():
        assert f"### Preset `{name}`\n" in md
        assert preset_table(group(name)) in md


def test_changed_cell_in_markdown_is_caught(spec: Path) -> None:
    edit(
        spec / "pools.md",
        "| `c128` | `sidecar` | `kv` | `ALL_PAGES` | 0 | 256 | 31 | 1 | 1,728 |",
        "| `c128` | `sidecar` | `kv` | `ALL_PAGES` | 0 | 256 | 31 | 1 | 1,729 |",
    )
    found = problems(spec)
    assert len(found) == 1
    assert (
        "preset `dsv4` pool `c128` column 'row_bytes' says '1,729', pools.toml says '1,728'"
        in found[0]
    )


def test_changed_value_in_toml_is_caught(spec: Path) -> None:
    edit(
        spec / "pools.toml",
        'row_bytes = 149_760\ntp_mode = "replicated"\nbackupable = true\n'
        'guesses = ["window_pages", "page_size"]',
        'row_bytes = 149_761\ntp_mode = "replicated"\nbackupable = true\n'
        'guesses = ["window_pages", "page_size"]',
    )
    assert any("preset `dsv4` pool `swa` column 'row_bytes'" in p for p in problems(spec))


def test_a_dropped_guess_mark_is_caught(spec: Path) -> None:
    edit(
        spec / "pools.md",
        "| `c4` | `sidecar` | `kv` | `ALL_PAGES` | 0 | 256 | 30? | 1 | 55,296? |",
        "| `c4` | `sidecar` | `kv` | `ALL_PAGES` | 0 | 256 | 30? | 1 | 55,296 |",
    )
    assert any(
        "pool `c4` column 'row_bytes' says '55,296', pools.toml says '55,296?'" in p
        for p in problems(spec)
    )


def test_missing_extra_and_headless_tables_are_caught(spec: Path) -> None:
    edit(spec / "pools.md", "### Preset `mla-tiny`", "### Preset `mla-small`")
    found = problems(spec)
    assert any("preset `mla-tiny` of pools.toml has no table" in p for p in found)
    assert any("preset `mla-small` is not in pools.toml" in p for p in found)
    md = (spec / "pools.md").read_text(encoding="utf-8")
    table = preset_table(group("mha"))
    (spec / "pools.md").write_text(table + "\n" + md, encoding="utf-8")
    assert any("under no `### Preset` heading" in p for p in problems(spec))


def test_missing_row_is_caught(spec: Path) -> None:
    edit(
        spec / "pools.md",
        "| `c4_indexer_state` | `state` | `swa` | `TRAILING_PAGES` | 1? | 256? |"
        " 30 | 1 | 16,384 | `replicated`? | true | `deepseek_v4_c4_indexer_state` |\n",
        "",
    )
    assert any("preset `dsv4` has 6 pool rows, pools.toml 7" in p for p in problems(spec))


def test_toml_breaking_a_group_rule_is_reported_not_raised(spec: Path) -> None:
    edit(
        spec / "pools.toml",
        '[[presets.dsv4.pools]]\nname = "c4_state"\nrole = "state"\nindices_from = "swa"',
        '[[presets.dsv4.pools]]\nname = "c4_state"\nrole = "state"\nindices_from = "kv"',
    )
    found = problems(spec)
    assert len(found) == 1 and "presets.dsv4.c4_state.indices_from" in found[0]


def test_spec_check_runs_the_pool_check(spec: Path, tmp_path: Path) -> None:
    full = tmp_path / "full"
    shutil.copytree(SPEC_DIR, full, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    edit(
        full / "pools.md",
        "| `kv` | `anchor` | - | `ALL_PAGES` | 0 | 16 | 36 |",
        "| `kv` | `anchor` | - | `ALL_PAGES` | 0 | 16 | 32 |",
    )
    assert [p for p in check_spec(full) if "pools.md" in p] == [
        p for p in check_spec(full) if "column 'layers'" in p
    ]
    assert any("preset `mha` pool `kv` column 'layers'" in p for p in check_spec(full))


def test_cli_lists_presets_and_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pools"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()] == list(names())
    assert main(["pools", "dsv4-tiny"]) == 0
    assert preset_table(group("dsv4-tiny")) in capsys.readouterr().out


def test_cli_unknown_preset_names_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pools", "dsv5"]) == 2
    err = capsys.readouterr().err
    assert "unknown preset 'dsv5'" in err and "dsv41-tiny" in err
