"""spec/config.md's knob table is a checked copy of `CacheConfig` (`hicache spec check`): each
kind of drift between the table and the code is reported, and the code refuses what the
table says is not legal."""

from __future__ import annotations

import pytest

from hicache.controller.config import CHOICES, CacheConfig
from hicache.errors import ConfigError
from hicache.oracle.speccheck.config import check_config
from hicache.spec import SPEC_DIR

TABLE = (SPEC_DIR / "config.md").read_text(encoding="utf-8")


def edited(old: str, new: str) -> list[str]:
    """check_config over the table with the one occurrence of `old` replaced by `new`."""
    assert TABLE.count(old) == 1, old
    return check_config(TABLE.replace(old, new))


def has(problems: list[str], *parts: str) -> bool:
    return any(all(p in line for p in parts) for line in problems)


def test_the_shipped_table_is_the_code() -> None:
    assert check_config(TABLE) == []


def test_a_default_that_differs_is_reported() -> None:
    problems = edited("| `l1_pages` | `64` |", "| `l1_pages` | `32` |")
    assert has(problems, "l1_pages default '32'", "is '64'"), problems


def test_a_missing_or_extra_knob_is_reported() -> None:
    row = next(line for line in TABLE.splitlines() if line.startswith("| `verify` |"))
    assert has(edited(row + "\n", ""), "CacheConfig.verify has no row")
    extra = row.replace("`verify`", "`verify_twice`")
    assert has(edited(row + "\n", row + "\n" + extra + "\n"), "verify_twice is not a field")


def test_legal_values_are_probed_on_the_reference() -> None:
    """A range the code does not enforce, a list that is not the code's, a value the code
    refuses: each is reported."""
    assert has(
        edited("| `l2_pages` | `128` | integer ≥ 1 |", "| `l2_pages` | `128` | integer ≥ 2 |"),
        "1 is not legal but accepted",
    )
    problems = edited("one of: cost, always, never, threshold", "one of: cost, always, never")
    assert has(problems, "policy", "the code's list is cost, always, never, threshold"), problems
    assert has(
        edited(
            "| `rank_check_every` | `0` | integer ≥ 0 |",
            "| `rank_check_every` | `0` | integer ≥ -1 |",
        ),
        "-1 is legal but refused",
    )


@pytest.mark.parametrize("knob", ["promotion", "prefetch", "verify", "l3_overwrite"])
def test_a_boolean_knob_refuses_what_is_not_a_boolean(knob: str) -> None:
    """The table says `True or False`; before, CacheConfig took any value for promotion,
    prefetch and verify ("no" read as true)."""
    with pytest.raises(ConfigError) as e:
        CacheConfig(**{knob: "no"})  # type: ignore[arg-type]
    assert e.value.field == knob


def test_every_listed_knob_is_a_one_of_row() -> None:
    for knob, values in CHOICES.items():
        assert f"| `{knob}` |" in TABLE and f"one of: {', '.join(values)}" in TABLE, knob
