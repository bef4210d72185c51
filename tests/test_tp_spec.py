"""spec/tp.md against spec/tp.toml and the code (hicache/oracle/speccheck/tp.py), and the cross-rank
invariants spec/invariants.md names (I7, I8, I10, I11: each one's violation test is here).

Each drift test edits a copy (of the page's text, of tp.toml in tmp_path, or of the scanned
sources in memory) and asserts that the check names the difference, not merely that it fails.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import pytest

import hicache.distributed.ledger as ledger
from hicache.core.snapshot import NodeRecord, RankView
from hicache.distributed.points import load_points
from hicache.invariants import RANK_CHECKS, RankCheck, Violation
from hicache.oracle.speccheck import check_spec
from hicache.oracle.speccheck.invariants import registry_checks
from hicache.oracle.speccheck.tp import (
    UNCALLED,
    check_tp,
    collective_calls,
    l3_write_table,
    package_sources,
    points_table,
)
from hicache.spec import SPEC_DIR, TP_TOML, load_toml

TP_MD = (SPEC_DIR / "tp.md").read_text(encoding="utf-8")
TOML_TEXT = TP_TOML.read_text(encoding="utf-8")


def has(problems: list[str], *parts: str) -> bool:
    """Some reported difference mentions every one of `parts`."""
    return any(all(p in line for p in parts) for line in problems)


def replaced(text: str, old: str, new: str) -> str:
    """`text` with its one occurrence of `old` replaced (the test is wrong if there is not one)."""
    assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times"
    return text.replace(old, new)


def toml_copy(tmp_path: Path, old: str = "", new: str = "") -> Path:
    """tp.toml copied to `tmp_path`, with `old` replaced by `new` when given."""
    path = tmp_path / "tp.toml"
    path.write_text(replaced(TOML_TEXT, old, new) if old else TOML_TEXT, encoding="utf-8")
    return path


def point_block(name: str) -> str:
    """The text of one [[point]] row of the shipped tp.toml."""
    m = re.search(rf'\[\[point\]\]\nid = "[^"]+"\nname = "{name}"\n(?:[^\[\n].*\n)*', TOML_TEXT)
    assert m is not None, name
    return m.group(0)


# -- the shipped spec -------------------------------------------------------------------------


def test_shipped_tp_page_matches_the_table_and_the_code() -> None:
    assert check_tp(TP_MD, TP_TOML) == []


def test_the_pages_tables_are_the_rendered_toml() -> None:
    assert points_table(load_points()) in TP_MD
    assert l3_write_table(load_toml(TP_TOML)["l3_write"]) in TP_MD


def test_the_scan_finds_the_agreement_points_collectives() -> None:
    calls, problems = collective_calls(package_sources())
    assert problems == []
    # Agreement makes every collective point (UNCALLED is empty), one method each.
    in_agreement = {c.point for c in calls if c.where.startswith("distributed/agreement.py:")}
    assert in_agreement == {p.name for p in load_points().values() if p.op != "none"} - UNCALLED


def test_spec_check_runs_the_tp_check(tmp_path: Path) -> None:
    spec = tmp_path / "spec"
    shutil.copytree(SPEC_DIR, spec, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    (spec / "tp.md").write_text(
        replaced(TP_MD, "| C3 | `room` |", "| C3 | `rooms` |"), encoding="utf-8"
    )
    assert has(check_spec(spec), "tp.md line", "point `rooms` is not in tp.toml")
    (spec / "tp.md").unlink()
    assert has(check_spec(spec), "tp.md: cannot be read")


# -- the point table and the sections ---------------------------------------------------------


def test_a_payload_changed_in_the_page_is_reported() -> None:
    row = "| 3: the pages this rank reserved"
    md = replaced(TP_MD, row, row.replace("3: the", "5: the"))
    assert has(check_tp(md, TP_TOML), "point `reserve` column 'payload' says '5: the pages")


def test_a_point_removed_from_the_toml_is_reported_in_page_and_code(tmp_path: Path) -> None:
    problems = check_tp(TP_MD, toml_copy(tmp_path, point_block("serve"), ""))
    assert has(problems, "tp.md line", "point `serve` is not in tp.toml")
    assert has(problems, "section C1c `serve` is not a point of tp.toml")
    assert has(problems, "distributed/agreement.py:", "all_reduce_min('serve') names no point")


def test_a_point_added_to_the_toml_needs_a_row_a_section_and_a_call(tmp_path: Path) -> None:
    extra = point_block("serve").replace('"C1c"', '"C1e"').replace('"serve"', '"serve_again"')
    serve = point_block("serve")
    problems = check_tp(TP_MD, toml_copy(tmp_path, serve, serve + "\n" + extra))
    assert has(problems, "point C1e `serve_again` of tp.toml has no row in the point table")
    assert has(problems, "point C1e `serve_again` has no section")
    assert has(problems, "C1e `serve_again` is an all_reduce_min point no code calls")


def test_a_row_moved_or_dropped_is_reported() -> None:
    lines = TP_MD.split("\n")
    c2 = next(i for i, line in enumerate(lines) if line.startswith("| C2 |"))
    moved = "\n".join(lines[:c2] + [lines[c2 + 1], lines[c2]] + lines[c2 + 2 :])
    assert has(check_tp(moved, TP_TOML), "the point table's rows are not in tp.toml's order")
    dropped = "\n".join(lines[:c2] + lines[c2 + 1 :])
    assert has(check_tp(dropped, TP_TOML), "point C2 `reserve` of tp.toml has no row")


def test_a_table_missing_or_twice_is_reported() -> None:
    md = replaced(TP_MD, "| id | name | op | payload | rule |", "| id | name | op | payload |")
    assert has(check_tp(md, TP_TOML), "tp.md: no point table (columns id, name, op, payload, rule)")
    l3 = "| tp_mode | writers | key |\n| --- | --- | --- |\n"
    assert has(check_tp(TP_MD + "\n" + l3, TP_TOML), "a second L3 write table")


def test_a_section_missing_its_heading_or_its_when_is_reported() -> None:
    md = replaced(TP_MD, "### C5 `abort`\n", "### C5 abort\n")
    assert has(check_tp(md, TP_TOML), "point C5 `abort` has no section")
    md = replaced(TP_MD, "When: a request ends or gives its restore up.\n", "")
    assert has(check_tp(md, TP_TOML), "section C5 `abort` does not state tp.toml's when")
    md = replaced(TP_MD, "### C5 `abort`\n", "### C4 `abort`\n")
    assert has(check_tp(md, TP_TOML), "section C4 `abort`, tp.toml's id is C5")


def test_an_unloadable_toml_is_one_line(tmp_path: Path) -> None:
    twice = toml_copy(tmp_path, 'name = "abort"\n', 'name = "abort"\nop = "x"\n')  # a key twice
    problems = check_tp(TP_MD, twice)
    assert len(problems) == 1 and has(problems, "tp.toml: cannot be loaded", "TOMLDecodeError")
    abort = point_block("abort")
    problems = check_tp(TP_MD, toml_copy(tmp_path, abort, abort.replace('"none"', '"broadcast"')))
    assert problems == [
        "tp.toml: cannot be loaded (ConfigError: tp.toml point[7].op: one of "
        "('all_gather', 'all_reduce_min', 'none'), got 'broadcast')"
    ]


# -- the code ---------------------------------------------------------------------------------


def test_an_unknown_point_literal_in_the_code_is_reported() -> None:
    sources = {**package_sources(), "extra.py": "c.all_reduce_min('no_such_point', [1])\n"}
    assert has(check_tp(TP_MD, TP_TOML, sources), "extra.py:1", "names no point of tp.toml")


def test_a_point_called_with_another_op_is_reported() -> None:
    sources = {
        **package_sources(),
        "extra.py": "\n\nc.all_gather(point_name='serve', values=[1])\n",
    }
    assert has(check_tp(TP_MD, TP_TOML, sources), "extra.py:3", "tp.toml's C1c is all_reduce_min")


def test_a_point_no_code_calls_is_reported() -> None:
    sources = {k: v for k, v in package_sources().items() if k != "distributed/agreement.py"}
    problems = check_tp(TP_MD, TP_TOML, sources)
    assert has(problems, "C0 `startup` is an all_gather point no code calls")
    assert has(problems, "C4 `completion` is an all_reduce_min point no code calls")
    assert not has(problems, "`abort`")  # op none: no collective to make


def test_an_uncalled_point_that_code_calls_must_leave_the_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """UNCALLED is empty now; a name listed there that code calls (as agreement.py calls
    check_state) is reported, and so is one that names no point."""
    monkeypatch.setattr("hicache.oracle.speccheck.tp.UNCALLED", frozenset({"check_state", "gone"}))
    problems = check_tp(TP_MD, TP_TOML)
    assert has(problems, "`check_state` is listed in UNCALLED", "take it out")
    assert has(problems, "UNCALLED lists `gone`, which is no point of tp.toml")


def test_torchs_own_collectives_and_unparsable_modules() -> None:
    calls, problems = collective_calls(
        {"a.py": "dist.all_gather(rows, mine, group=g)\n", "b.py": "def all_gather(:\n"}
    )
    assert calls == []
    assert has(problems, "b.py: cannot be parsed")


# -- the L3 write rule ------------------------------------------------------------------------


def test_an_l3_write_cell_changed_in_the_page_is_reported() -> None:
    md = replaced(TP_MD, "| `sharded` | every rank |", "| `sharded` | rank 0 |")
    assert has(check_tp(md, TP_TOML), "L3 write row sharded | rank 0", "differs from tp.toml's")


def test_an_l3_write_rule_the_ledger_does_not_follow_is_reported(tmp_path: Path) -> None:
    toml = toml_copy(tmp_path, 'writers = "every rank"', 'writers = "rank 0"')
    problems = check_tp(TP_MD, toml)
    assert has(problems, "ledger.py: writes_pool('sharded', rank)", "'rank 0'")
    assert has(problems, "L3 write row sharded | every rank", "differs from tp.toml's")


def test_an_l3_write_row_for_an_unknown_mode_or_writer_is_reported(tmp_path: Path) -> None:
    toml = toml_copy(
        tmp_path,
        'tp_mode = "sharded"\nwriters = "every rank"',
        'tp_mode = "striped"\nwriters = "some ranks"',
    )
    problems = check_tp(TP_MD, toml)
    assert has(problems, "[[l3_write]] rows name tp_modes ['replicated', 'striped']")
    assert has(problems, "writers 'some ranks' is not one of")


def test_the_ledger_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger, "writes_pool", lambda tp_mode, rank: True)
    assert has(check_tp(TP_MD, TP_TOML), "writes_pool('replicated', rank)", "'rank 0'")


# -- invariants.md covers the cross-rank checks -----------------------------------------------


def test_the_spec_checks_registry_includes_the_cross_rank_checks() -> None:
    checks = registry_checks(with_ranks=True)
    assert not isinstance(checks, str)
    assert [c.id for c in checks][-4:] == ["I7", "I8", "I10", "I11"] == [c.id for c in RANK_CHECKS]
    plain = registry_checks()
    assert not isinstance(plain, str) and "I7" not in {c.id for c in plain}


def test_a_cross_rank_heading_missing_from_invariants_md_is_reported(tmp_path: Path) -> None:
    spec = tmp_path / "spec"
    shutil.copytree(SPEC_DIR, spec, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    page = spec / "invariants.md"
    page.write_text(
        replaced(
            page.read_text(encoding="utf-8"),
            "### I10 `collective_sequence`\n",
            "### I10 collective sequence\n",
        ),
        encoding="utf-8",
    )
    assert has(check_spec(spec), "no heading for I10 `collective_sequence`")


# -- the cross-rank invariants catch their violations -----------------------------------------

NODE = NodeRecord(
    1, 0, 4, "k1", ("RESIDENT", "RESIDENT", "ABSENT"), (1, 0, 0), (None, None, None), (1, 1, 0)
)
BASE = RankView(
    rank=0,
    size=2,
    nodes=(
        NodeRecord(0, None, 0, "root", ("ABSENT",) * 3, (0, 0, 0), (None, None, None), (0, 0, 0)),
        NODE,
    ),
    requests=((7, 4, (4, 4, 0), 1),),
    ops=(),
    free=(("L1", "", 3), ("L2", "", 7)),
    log_count=2,
    log_digest="ab",
    log_tail=("startup all_gather int64[9]",),
    l3_writes=((5, "kv", 1),),
    replicated=((("L1", 1, "kv"), (11,)),),
    quiescent=True,
    modes=(("kv", "replicated"),),
)


def two_ranks(**rank1: object) -> list[RankView]:
    """Rank 0's BASE and rank 1's copy of it, with `rank1`'s fields changed."""
    return [BASE, dataclasses.replace(BASE, rank=1, **rank1)]  # type: ignore[arg-type]


def rank_check(cid: str) -> RankCheck:
    return next(c for c in RANK_CHECKS if c.id == cid)


def only(found: list[Violation], cid: str) -> Violation:
    assert [v.invariant for v in found] == [cid], found
    return found[0]


def test_every_rank_check_has_a_violation_test() -> None:
    """spec/invariants.md names `test_<name>_violation` for each cross-rank check: it is here."""
    assert [c.name for c in RANK_CHECKS if f"test_{c.name}_violation" not in globals()] == []


def test_equal_ranks_break_no_cross_rank_check() -> None:
    views = two_ranks(l3_writes=((5, "kv", 0),))  # replicated: rank 0 writes, rank 1 acks
    assert [v for c in RANK_CHECKS for v in c(views)] == []


def test_rank_agreement_violation() -> None:
    check = rank_check("I7")
    locked_twice = dataclasses.replace(NODE, locks=(2, 0, 0))
    v = only(check(two_ranks(nodes=(BASE.nodes[0], locked_twice))), "I7")
    assert "rank 1's tree differs from rank 0's at node 1" in v.message and v.nodes == (1,)
    v = only(check(two_ranks(requests=((7, 8, (4, 4, 0), 1),))), "I7")
    assert "rank 1's requests differ" in v.message
    planned = ((5, (((), (), (1, 2)), (), (), (False, False, False, True, False), 0), ()),)
    v = only(check(two_ranks(restores=planned)), "I7")  # a restore's plan on rank 1 only
    assert "rank 1's restores differ" in v.message
    only(check(two_ranks(free=(("L1", "", 2), ("L2", "", 7)))), "I7")


def test_replicated_bytes_equal_violation() -> None:
    check = rank_check("I8")
    v = only(check(two_ranks(replicated=((("L1", 1, "kv"), (12,)),))), "I8")
    assert "replicated pool 'kv'" in v.message and v.tier == "L1"
    assert check(two_ranks(replicated=())) == []  # a page rank 1 does not hold: nothing to compare


def test_collective_sequence_violation() -> None:
    v = only(rank_check("I10")(two_ranks(log_count=3, log_digest="cd")), "I10")
    assert "rank 1 made 3 collectives, rank 0 2" in v.message


def test_l3_write_multiplicity_violation() -> None:
    check = rank_check("I11")
    v = only(check(two_ranks()), "I11")  # both ranks wrote the replicated pool
    assert "written by rank(s) [0, 1]" in v.message and "rank 0 only" in v.message
    sharded = (("kv", "sharded"),)
    views = [
        dataclasses.replace(BASE, modes=sharded),
        dataclasses.replace(BASE, rank=1, modes=sharded, l3_writes=((5, "kv", 0),)),
    ]
    assert "the rule: every rank" in only(check(views), "I11").message
    assert check(two_ranks(quiescent=False)) == []  # checked after drain only
