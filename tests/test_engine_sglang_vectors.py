"""SGLang's RadixCache (hicache/testing/adapters/sglang.py) run through the L1-only
conformance vectors (spec/vectors.md) with `hicache.oracle.vectors.adapters:sglang`. CI does not
install sglang: the tests that drive it skip cleanly; those about the factory without it run
everywhere. The results: benchmarks/results/2026-12-01-engine-sglang.md, "Conformance
vectors"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hicache.errors import HiCacheError
from hicache.oracle.vectors.adapters import controller, sglang
from hicache.oracle.vectors.drive import Driver
from hicache.oracle.vectors.format import Case, CaseConfig, UnsupportedConfig
from hicache.oracle.vectors.generate import generate
from hicache.oracle.vectors.run import run_case, run_dir
from hicache.testing.adapters.sglang import SGLangRadixCache
from hicache.testing.adapters.sglang_import import EngineUnavailable
from tests.test_engine_sglang import no_sglang  # noqa: F401  (a fixture)

L1_CATEGORIES = ("l1_hit_miss", "l1_sharing", "l1_eviction", "l1_refused")
PS = 4


def _engine(config: CaseConfig) -> SGLangRadixCache:
    try:
        return sglang(config)
    except EngineUnavailable as e:
        pytest.skip(f"sglang is not installed here: {e}")


def _needs_sglang() -> None:
    _engine(CaseConfig(PS, {"L1": 4})).close()


def test_the_factory_skips_cases_with_lower_tiers_without_importing_sglang(no_sglang: None) -> None:
    with pytest.raises(UnsupportedConfig, match="one tier"):
        sglang(CaseConfig(PS, {"L1": 8, "L2": 8, "L3": 8}))


def test_without_sglang_the_factory_says_how_to_install_it(no_sglang: None) -> None:
    with pytest.raises(EngineUnavailable, match="install it as hicache/testing/adapters/sglang.py"):
        sglang(CaseConfig(PS, {"L1": 4}))


def test_the_l1_vectors_all_pass(tmp_path: Path) -> None:
    """Every L1 case passes. `refused` failed on a KeyError before the adapter refused
    unknown requests; `eviction` failed where hicache's controller evicted before refusing a
    prefill for room, which sglang never does -- the controller now refuses first."""
    _needs_sglang()
    generate(tmp_path, 2, 0, L1_CATEGORIES)
    verdicts = {v.name: v for v in run_dir(tmp_path, sglang)}
    failed = {n: v.detail for n, v in verdicts.items() if v.status != "PASS"}
    assert verdicts and failed == {}, failed


class EvictsBeforeRefusing(SGLangRadixCache):
    """The adapter changed on purpose to do what hicache's controller once did: evict every
    unlocked leaf it can, then refuse when that was not enough."""

    def _make_room(self, short: int) -> bool:
        if short > int(self.tree.evictable_size()):
            self._evict(int(self.tree.evictable_size()))
            return False
        return super()._make_room(short)


def _minimal_case() -> Case:
    """The former divergence cut down by hand (L1 5 pages): request 1 leaves one unlocked
    page, request 2 holds the other four, request 3 needs two. Recorded with hicache's
    controller."""
    config = CaseConfig(PS, {"L1": 5})
    a, b, c = list(range(100, 105)), list(range(200, 213)), list(range(300, 305))
    ops: list[dict[str, Any]] = [
        {"op": "submit", "request": 1, "tokens": a},
        {"op": "prefill", "request": 1},
        {"op": "finish", "request": 1},
        {"op": "submit", "request": 2, "tokens": b},
        {"op": "prefill", "request": 2},
        {"op": "submit", "request": 3, "tokens": c},
        {"op": "prefill", "request": 3},
    ]
    recorder = Driver(controller(config), config)
    steps = [{**op, "expect": json.loads(json.dumps(recorder.step(op)))} for op in ops]
    return Case("minimal", "l1_eviction", config, steps, json.loads(json.dumps(recorder.final())))


def test_a_refused_prefill_evicts_nothing_and_an_engine_that_evicts_fails() -> None:
    _needs_sglang()
    case = _minimal_case()
    # Verify the spec's answer: refused, and request 1's page still cached.
    assert case.steps[-1]["expect"]["result"] is False
    assert case.steps[-1]["expect"]["changes"] == {}
    assert run_case(case, sglang, "minimal").status == "PASS"

    def evicting(config: CaseConfig) -> SGLangRadixCache:
        return EvictsBeforeRefusing(
            capacity=config.capacities["L1"], page_size=config.page_size, input_limit=True
        )

    got = run_case(case, evicting, "minimal")
    assert (got.status, got.detail) == (
        "FAIL",
        "step 6 (prefill request 3): changes.L1: expected null, "
        'got [["ABSENT", [100, 101, 102, 103]]]',
    )


def test_calls_for_a_request_that_is_not_live_are_refused_and_change_nothing() -> None:
    engine = _engine(CaseConfig(PS, {"L1": 4}))
    for call in (engine.prefill, engine.finish, engine.cached_len):
        with pytest.raises(HiCacheError, match="request 99 is not live"):
            call(99)
    assert engine.live() == set() and engine.changes() == [] and engine.check() == []


def test_a_prompt_over_sglangs_input_limit_is_refused_at_admission() -> None:
    """max_req_input_len = pool tokens - 6 (16 here: 10): 10 tokens are refused, 9 admitted;
    the spec would admit both (each needs 3 of L1's 4 pages)."""
    engine = _engine(CaseConfig(PS, {"L1": 4}))
    with pytest.raises(HiCacheError, match=r"input length \(10 tokens\) exceeds .* \(10 tokens"):
        engine.submit(1, list(range(10)))
    assert engine.live() == set()
    engine.submit(2, list(range(9)))
    assert engine.live() == {2} and engine.prefill(2)
