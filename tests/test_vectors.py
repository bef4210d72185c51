"""Conformance vectors (spec/vectors.md): generated from the controller, run against it (all
pass), against broken adapters (the case, step and observation named), and against a
directory with a stray, missing or tampered file (each fails the run)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="needs torch (the controller): pip install -e '.[data]'")

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hicache.errors import HiCacheError
from hicache.oracle.vectors import adapters, generate, run
from hicache.oracle.vectors.adapters import controller
from hicache.oracle.vectors.categories import CATEGORIES
from hicache.oracle.vectors.format import MANIFEST, CaseConfig, UnsupportedConfig, sha256_hex
from hicache.testing.adapters.controller import ControllerAdapter
from hicache.testing.protocol import Admission, CacheUnderTest, PageChange


@pytest.fixture(scope="module")
def vectors(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("vectors") / "v"
    assert generate.main([str(directory)]) == 0
    return directory


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six cases of three categories: for the tests about the directory, not the engine."""
    directory = tmp_path_factory.mktemp("small") / "v"
    generate.generate(directory, 2, 0, ["hit_miss", "restore_l2", "drain"])
    return directory


def copy_of(vectors: Path, tmp_path: Path) -> Path:
    target = tmp_path / "v"
    target.mkdir()
    for p in vectors.iterdir():
        (target / p.name).write_bytes(p.read_bytes())
    return target


def failures(directory: Path, factory: run.Factory) -> list[run.Verdict]:
    return [v for v in run.run_dir(directory, factory) if v.status == "FAIL"]


# -- adapters that are wrong in one way, and one that is different but right ------------------


class MisreportedHit(ControllerAdapter):
    """Reports an L1 hit one page short (its cached_len stays right)."""

    def submit(self, request_id: int, tokens: Sequence[int]) -> Admission:
        got = super().submit(request_id, tokens)
        hits = dict(got.hits)
        hits["L1"] = max(0, hits["L1"] - self.page_size)
        return Admission(hits, got.cached_len)


class SilentEviction(ControllerAdapter):
    """Drops L1 pages without reporting it (ForgetfulLRU's bug, in the controller)."""

    def changes(self) -> list[PageChange]:
        return [c for c in super().changes() if not (c.tier == "L1" and c.state == "ABSENT")]


class BypassedWriteBack(ControllerAdapter):
    """Outside pressure straight into the control plane's loop, skipping the write-back hook
    (what the fuzz adapter once did): under write-back an unbacked L1 victim is lost."""

    def evict(self, tier: str, n_pages: int) -> None:
        self.ctl.cp.evict(tier, n_pages)


class ServedBytes(ControllerAdapter):
    """Reports a digest per served page: the same for the same prefix (`drift` 0), or one
    that changes every time a page is served (`drift` 1: bytes that are not what was cached)."""

    drift = 0

    def served_digests(self, request_id: int) -> list[int] | None:
        self.served = getattr(self, "served", 0) + self.drift
        tokens, ps = self.tokens[request_id], self.page_size
        return [
            hash(tokens[: (i + 1) * ps]) + self.served
            for i in range(self.cached_len(request_id) // ps)
        ]


class DriftingBytes(ServedBytes):
    drift = 1


class OwnOpIds(ControllerAdapter):
    """Correct, with op ids of its own (1000 + hicache's) and its own refusal classes: the
    spec leaves both free, so every case still passes."""

    def pending_ops(self) -> list[int]:
        return [op + 1000 for op in super().pending_ops()]

    def complete(self, op_id: int) -> None:
        super().complete(op_id - 1000)

    def fail(self, op_id: int, kind: str, landed: int = 0) -> None:
        super().fail(op_id - 1000, kind, landed)

    def finish(self, request_id: int) -> None:
        try:
            super().finish(request_id)
        except HiCacheError as e:
            raise NotLive(str(e)) from None


class NotLive(HiCacheError):
    """Another engine's name for finishing a request that is not live."""


def wrapped(cls: type[ControllerAdapter]) -> run.Factory:
    def factory(config: CaseConfig) -> ControllerAdapter:
        return cls(controller(config).setup)

    return factory


def misreporting(config: CaseConfig) -> CacheUnderTest:
    """`--adapter tests.test_vectors:misreporting` for the command-line test."""
    return wrapped(MisreportedHit)(config)


# -- tests ------------------------------------------------------------------------------------


def test_generate_writes_every_category_and_a_manifest_listing_each_file(vectors: Path) -> None:
    manifest = json.loads((vectors / MANIFEST).read_bytes())
    assert manifest["counts"] == {c: generate.DEFAULT_COUNT for c in CATEGORIES}
    assert manifest["total"] == len(CATEGORIES) * generate.DEFAULT_COUNT
    files = sorted(p.name for p in vectors.iterdir() if p.name != MANIFEST)
    assert sorted(c["file"] for c in manifest["cases"]) == files
    for c in manifest["cases"]:
        assert sha256_hex((vectors / c["file"]).read_bytes()) == c["sha256"]


def test_generation_is_deterministic(vectors: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    assert generate.main([str(again)]) == 0
    assert {p.name: p.read_bytes() for p in again.iterdir()} == {
        p.name: p.read_bytes() for p in vectors.iterdir()
    }


def test_the_controller_passes_every_case(
    vectors: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run.main([str(vectors)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert (
        sum(line.startswith("PASS ") for line in lines) == len(CATEGORIES) * generate.DEFAULT_COUNT
    )
    assert f"({len(CATEGORIES) * generate.DEFAULT_COUNT} passed, 0 failed, 0 skipped)" in out


def test_cases_exercise_what_their_category_names(vectors: Path) -> None:
    """The scripts reach their subject: refusals, a crash, every failing transfer kind, a
    restore through L2 and L3, a prefill refused for room."""
    steps = {p.stem: json.loads(p.read_bytes())["steps"] for p in vectors.glob("*-000.json")}
    assert sum(s["expect"]["refused"] is not None for s in steps["refused-000"]) >= 9
    assert any(s["expect"]["crashed"] for s in steps["crash-000"])
    for category in ("fail_d2h", "fail_h2s", "fail_h2d", "fail_s2h"):
        assert any(s["op"] == "fail" for s in steps[f"{category}-000"])
    assert any(
        s["op"] == "prefill" and s["expect"]["result"] is False for s in steps["eviction_l1-000"]
    )
    for category in ("l1_hit_miss", "l1_sharing", "l1_eviction", "l1_refused"):
        assert all(s["expect"]["pending_ops"] == 0 for s in steps[f"{category}-000"])
    l3_hits = [
        s["expect"]["result"]["hits"]
        for s in steps["restore_l3-000"]
        if s["op"] == "submit" and s["request"] == 2
    ]
    assert l3_hits and l3_hits[0]["L3"] > 0 and l3_hits[0]["L2"] == 0


def test_a_misreported_hit_fails_naming_the_case_step_and_observation(vectors: Path) -> None:
    bad = failures(vectors, wrapped(MisreportedHit))
    assert bad, "a misreported hit passed every case"
    first = next(v for v in bad if v.name == "hit_miss-000.json")
    assert "step " in first.detail and "(submit request 2" in first.detail
    assert "result.hits.L1: expected " in first.detail and ", got " in first.detail


def test_an_unreported_eviction_fails_on_the_page_changes(vectors: Path) -> None:
    bad = failures(vectors, wrapped(SilentEviction))
    assert any(v.name.startswith("eviction_l1") and "changes.L1" in v.detail for v in bad), bad


def test_outside_pressure_that_skips_write_back_fails(vectors: Path) -> None:
    """Skipping the hook loses an unbacked L1 victim under write_back; under the write-through
    policies it loses the victim's count (`write_through_unbacked_eviction`), which the
    adapter's liveness probes find (`unbacked eviction`, spec/eviction.md), and every
    eviction's (`evicted_pages`: the probes' `counter evicted`)."""
    bad = failures(vectors, wrapped(BypassedWriteBack))
    policy = {
        v.name: json.loads((vectors / v.name).read_text())["config"]["write_policy"] for v in bad
    }
    assert "write_back" in policy.values(), [(v.name, v.detail) for v in bad]
    uncounted = [v for v in bad if policy[v.name] != "write_back"]
    assert all(
        "unbacked eviction" in v.detail or "counter evicted" in v.detail for v in uncounted
    ), uncounted


def test_a_one_tier_lru_runs_the_l1_cases_and_differs_where_the_spec_fixes_eviction(
    vectors: Path,
) -> None:
    """The plain LRU cache passes what any prefix cache does (hits, sharing), skips the
    three-tier cases, and fails L1 eviction: it frees pages one at a time where the spec frees
    a node's whole value (eviction.md), so the node's last page is not reported gone."""
    verdicts = {v.name: v for v in run.run_dir(vectors, adapters.lru)}
    assert all(v.status == "SKIP" for name, v in verdicts.items() if not name.startswith("l1_"))
    assert all(
        verdicts[f"l1_{c}-00{i}.json"].status == "PASS"
        for c in ("hit_miss", "sharing")
        for i in (0, 1)
    )
    eviction = verdicts["l1_eviction-000.json"]
    assert (
        eviction.status == "FAIL"
        and "(prefill request 3): changes.L1: 6 expected, 5 got" in eviction.detail
    )


def test_the_forgetful_lru_fails_l1_eviction_with_every_eviction_missing(vectors: Path) -> None:
    bad = {v.name: v for v in failures(vectors, adapters.forgetful)}
    assert (
        'changes.L1: 6 expected, 3 got; expected but missing [["ABSENT"'
        in bad["l1_eviction-000.json"].detail
    )


def test_served_bytes_must_be_the_same_each_time_a_prefix_is_served(small: Path) -> None:
    assert failures(small, wrapped(ServedBytes)) == []
    bad = {v.name: v.detail for v in failures(small, wrapped(DriftingBytes))}
    assert (
        "(prefill request 2): digest of served page 0 of request 2: expected "
        in bad["hit_miss-000.json"]
    )


def test_comparison_is_of_json_values_where_true_is_not_1() -> None:
    assert (
        run.first_difference({"result": True}, {"result": 1}, "x")
        == "x.result: expected true, got 1"
    )
    assert run.first_difference([["RESIDENT", [1, 2]]], [["RESIDENT", [1, 2]]], "changes") is None


def test_op_ids_and_refusal_classes_of_its_own_still_pass(vectors: Path) -> None:
    assert failures(vectors, wrapped(OwnOpIds)) == []


def test_the_command_line_names_the_failure_and_exits_1(
    small: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run.main([str(small), "--adapter", "tests.test_vectors:misreporting", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "FAIL hit_miss-000.json: step " in out and "PASS " not in out


def test_a_file_the_manifest_does_not_list_fails_the_run(
    small: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = copy_of(small, tmp_path)
    (directory / "stray.json").write_text("{}")
    assert run.main([str(directory), "--quiet"]) == 1
    assert "FAIL stray.json: in DIR but not in the manifest" in capsys.readouterr().out


def test_a_listed_file_that_is_missing_fails_the_run(small: Path, tmp_path: Path) -> None:
    directory = copy_of(small, tmp_path)
    (directory / "drain-001.json").unlink()
    bad = failures(directory, controller)
    assert [v.name for v in bad] == ["drain-001.json"] and "unreadable" in bad[0].detail


def test_a_tampered_case_fails_on_its_sha(small: Path, tmp_path: Path) -> None:
    directory = copy_of(small, tmp_path)
    path = directory / "restore_l2-000.json"
    path.write_bytes(path.read_bytes().replace(b'"pending_ops":1', b'"pending_ops":2', 1))
    bad = failures(directory, controller)
    assert [v.name for v in bad] == ["restore_l2-000.json"] and "sha256" in bad[0].detail


def rewrite(directory: Path, name: str, case: dict[str, Any]) -> None:
    """Write `case` as `name` and its sha256 into the manifest (a tamperer who knows the format)."""
    data = json.dumps(case).encode()
    (directory / name).write_bytes(data)
    manifest = json.loads((directory / MANIFEST).read_bytes())
    next(c for c in manifest["cases"] if c["file"] == name)["sha256"] = sha256_hex(data)
    (directory / MANIFEST).write_text(json.dumps(manifest))


def test_a_tampered_expectation_with_a_matching_sha_fails_at_its_step(
    small: Path, tmp_path: Path
) -> None:
    directory = copy_of(small, tmp_path)
    name = "restore_l2-000.json"
    case = json.loads((directory / name).read_bytes())
    at = next(i for i, s in enumerate(case["steps"]) if s["expect"]["pending_ops"] == 1)
    case["steps"][at]["expect"]["pending_ops"] = 2
    rewrite(directory, name, case)
    bad = failures(directory, controller)
    assert [v.name for v in bad] == [name]
    assert (
        bad[0].detail.startswith(f"step {at} (")
        and "pending_ops: expected 2, got 1" in bad[0].detail
    )


def test_a_malformed_case_fails_with_the_field_named(small: Path, tmp_path: Path) -> None:
    directory = copy_of(small, tmp_path)
    name = "hit_miss-001.json"
    case = json.loads((directory / name).read_bytes())
    del case["steps"][0]["request"]
    rewrite(directory, name, case)
    bad = failures(directory, controller)
    assert [v.name for v in bad] == [name] and "submit needs 'request'" in bad[0].detail


@pytest.mark.parametrize(
    "field, value, named",
    [
        ("capacities", {"L1": 8, "L3": 8}, "tiers L1 alone or L1, L2 and L3"),
        ("write_policy", "write_sometimes", "config.write_policy: one of"),
        ("restore_policy", "maybe", "config.restore_policy: one of"),
    ],
)
def test_a_configuration_the_spec_does_not_allow_fails(
    small: Path, tmp_path: Path, field: str, value: object, named: str
) -> None:
    directory = copy_of(small, tmp_path)
    name = "hit_miss-001.json"
    case = json.loads((directory / name).read_bytes())
    case["config"][field] = value
    rewrite(directory, name, case)
    bad = failures(directory, controller)
    assert [v.name for v in bad] == [name] and named in bad[0].detail, [
        (v.name, v.detail) for v in bad
    ]


def nothing(config: CaseConfig) -> ControllerAdapter:
    raise UnsupportedConfig("this engine has one tier")


def test_an_adapter_that_supports_nothing_skips_every_case_and_fails(
    small: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert {v.status for v in run.run_dir(small, nothing)} == {"SKIP"}
    assert run.main([str(small), "--adapter", "tests.test_vectors:nothing", "--quiet"]) == 1
    assert "no case ran (every one skipped)" in capsys.readouterr().out


def exit_status(main: Callable[[list[str]], int], argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's way out for a usage error
        return e.code if isinstance(e.code, int) else -1


def test_usage_errors_exit_2(
    small: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert exit_status(run.main, [str(tmp_path)]) == 2  # no manifest
    assert exit_status(run.main, [str(small), "--adapter", "hicache.oracle.vectors.adapters"]) == 2
    assert exit_status(run.main, [str(small), "--adapter", "no_such_module:x"]) == 2
    assert exit_status(generate.main, [str(small)]) == 2  # not empty
    err = capsys.readouterr().err
    assert (
        "cannot read the manifest" in err
        and "give module:factory" in err
        and "not an empty directory" in err
    )


def test_a_dir_that_cannot_be_made_is_a_usage_error_and_the_usage_puts_dir_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`generate /proc/x` used to end in a FileNotFoundError traceback; the usage line put DIR
    after `--category NAME [NAME ...]`, which reads it as one more name."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert exit_status(generate.main, [str(blocker / "sub")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hicache vectors generate: error: argument DIR: {blocker / 'sub'}: ")
    assert f"{blocker} is not a directory" in err
    assert exit_status(generate.main, ["--help"]) == 0
    assert "generate DIR [--count N]" in capsys.readouterr().out


def test_the_bench_reports_each_rate_against_the_ceiling(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from hicache.bench import vectors as bench

    assert bench.main(["--count", "1", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert f"{len(CATEGORIES)} cases" in out and "ceiling: read + sha256 + parse" in out
    assert out.count("of the ceiling)") == 2


def test_a_case_asking_for_more_pages_than_a_tier_holds_is_refused_by_the_reader() -> None:
    """A case edited to 10**8 pages per tier used to take 46 s and 6.4 GB to run (10**12: no
    end); the reader refuses it as it refuses the case's other bad fields."""
    from hicache.core.tiers import MAX_PAGES
    from hicache.oracle.vectors.format import VectorFormatError, case_json, parse_case

    ok = CaseConfig(page_size=2, capacities={"L1": 4, "L2": 4, "L3": 4})
    raw = json.loads(case_json("c", "abort", 0, ok, [], {"live": [], "tiers": {}, "usage": {}}))
    parse_case(json.dumps(raw).encode(), "c.json")  # the unedited case reads
    raw["config"]["capacities"]["L2"] = MAX_PAGES + 1
    with pytest.raises(VectorFormatError, match=f"capacities.L2: an integer in 1..{MAX_PAGES}"):
        parse_case(json.dumps(raw).encode(), "c.json")


def test_a_page_table_larger_than_max_pages_is_a_config_error() -> None:
    from hicache.core.pages import PageTable
    from hicache.core.tiers import MAX_PAGES
    from hicache.errors import ConfigError

    assert PageTable("L1", MAX_PAGES).capacity == MAX_PAGES
    with pytest.raises(ConfigError, match="L1.capacity_pages"):
        PageTable("L1", MAX_PAGES + 1)
