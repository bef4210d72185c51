"""The serving loop (`hicache/app/serving.py`) and the demo on top of it: every request is served,
an L1 deadlock between live requests is broken by preemption, a prompt L1 can never hold is a
ConfigError before anything runs, and the demo ends with verified restores and no invariant
violation. CPU data plane; the GPU test runs the demo on CUDA with the Triton kernels.

A loop that never ends is the failure these tests exist for, so each arms a watchdog that
dumps every thread's stack and exits instead of hanging CI.
"""

from __future__ import annotations

import faulthandler
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

from hicache.app import demo
from hicache.app.serving import ServingLoop
from hicache.app.workload import RequestSpec
from hicache.controller.config import CacheConfig
from hicache.controller.controller import CacheController
from hicache.errors import ConfigError

WATCHDOG_S = 300  # far above any of these tests' run time (seconds) on the 2-core CI machine
PS = 4  # the tiny geometry's page size


@pytest.fixture(autouse=True)
def watchdog() -> Iterator[None]:
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def prompt(first: int, pages: int) -> tuple[int, ...]:
    return tuple(range(first, first + pages * PS))


def test_l1_deadlock_between_live_requests_is_broken_by_preemption() -> None:
    """A's and B's 7-page prefixes sit in a 16-page L1; A' and B' extend them by 6 pages each.
    Admitted together, each locks its prefix (14 pages locked, 2 free) and then needs 6 more
    pages to prefill: neither can, and neither will finish -- this looped forever. The loop
    preempts B' (the newest); A' evicts B's unlocked prefix and runs; B' is admitted again
    and served."""
    ctl = CacheController(CacheConfig(l1_pages=16, l2_pages=64, l3_slots=64, policy="always"))
    try:
        a_prefix, b_prefix = prompt(1000, 7), prompt(2000, 7)
        warm = ServingLoop(ctl, batch_size=1).run(
            [RequestSpec(0, a_prefix + (1,), 1, "warm"), RequestSpec(1, b_prefix + (1,), 1, "warm")]
        )
        assert warm.requests == 2 and warm.preemptions == 0
        ctl.drain()
        assert ctl.cp.tables[0].free_count == 2  # both prefixes in L1, unlocked
        loop = ServingLoop(ctl, batch_size=2)
        report = loop.run(
            [
                RequestSpec(2, a_prefix + prompt(3000, 6), 1, "a"),
                RequestSpec(3, b_prefix + prompt(4000, 6), 1, "b"),
            ]
        )
        assert report.requests == 2 and report.preemptions == 1 and report.admissions == 3
        # B''s first admission is counted as a preemption, and the L1 hit credited to it (its
        # 7-page prefix) is taken back: every admitted prompt token is counted exactly once.
        m = ctl.metrics
        assert (m.preemptions, m.preempted_tokens, m.preempted_hit_tokens["L1"]) == (
            1,
            13 * PS,
            7 * PS,
        )
        shares = m.token_shares()
        assert sum(shares.values()) == m.prompt_tokens and shares["preempted"] == 13 * PS
        assert ctl.cp.checker.violations_found == 0
        assert all(table.count(1) == 0 for table in ctl.cp.tables)  # no private page left
    finally:
        ctl.close()


def test_a_prompt_longer_than_l1_is_a_config_error_before_anything_runs() -> None:
    ctl = CacheController(CacheConfig(l1_pages=16, l2_pages=32, l3_slots=32))
    try:
        too_long = RequestSpec(7, prompt(0, 17), 1, "long")
        with pytest.raises(ConfigError, match=r"request 7 has 68 prompt tokens, 17 pages.*16"):
            ServingLoop(ctl).run([RequestSpec(6, prompt(500, 2), 1, "short"), too_long])
        assert ctl.metrics.prompt_tokens == 0  # nothing was admitted
    finally:
        ctl.close()


def run_demo(tmp_path: Path, *args: str) -> dict[str, object]:
    out = tmp_path / "demo.json"
    assert demo.main(["--quiet", "--json", str(out), *args]) == 0
    summary: dict[str, object] = json.loads(out.read_text())
    return summary


def test_demo_with_a_tight_l1_serves_every_request(tmp_path: Path) -> None:
    """72 L1 pages barely hold the longest prompt (70 pages): live requests collide over L1
    (this configuration looped forever before preemption) and every tier is restored from."""
    s = run_demo(tmp_path, "--requests", "60", "--l1-pages", "72", "--l2-pages", "80")
    hits = s["hit_tokens"]
    assert isinstance(hits, dict) and hits["L2"] > 0 and hits["L3"] > 0
    assert s["requests"] == 60 and s["invariants"] == {
        "run": s["invariants"]["run"],  # type: ignore[index]
        "violations": 0,
    }
    assert isinstance(s["verified_pages"], int) and s["verified_pages"] > 0


def test_demo_says_which_option_to_raise_when_l1_is_too_small(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The needed value and the reason first: `--requests 300` needs 206 L1 pages because
    its longest prompt (an agent conversation grown to 822 tokens) is 206 pages of 4."""
    assert demo.main(["--quiet", "--requests", "300", "--l1-pages", "160"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(
        "hicache demo: --l1-pages: 160 is too small: this workload needs at "
        "least 206 L1 pages, because its longest prompt (request 287, 822 "
        "tokens) is 206 pages of 4 tokens"
    )
    assert "--l1-pages 206 or more" in err[0]


def test_preempted_admissions_are_counted_and_the_token_shares_add_up(tmp_path: Path) -> None:
    """L1 of 40 pages for prompts of up to 34: live requests collide, two admissions are
    preempted. Every admitted prompt token is a hit, recomputed or preempted exactly once (it
    was 3,793 of 3,947 before preemptions were counted), and each admission made one decision."""
    s = run_demo(
        tmp_path,
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
    )
    shares, decisions, preempted = s["token_shares"], s["decisions"], s["preempted_tokens"]
    assert isinstance(shares, dict) and isinstance(decisions, dict)
    assert isinstance(preempted, int) and preempted > 0
    assert (s["requests"], s["preemptions"], s["admissions"]) == (40, 2, 42)
    assert sum(decisions.values()) == 42  # one decision per admission
    assert set(shares) == {"L1", "L2", "L3", "recomputed", "preempted"}
    assert sum(shares.values()) == s["prompt_tokens"] == 3947
    assert shares["preempted"] == preempted


@pytest.mark.gpu
def test_gpu_demo_restores_verified_bytes_through_triton(tmp_path: Path) -> None:
    s = run_demo(
        tmp_path,
        "--device",
        "cuda",
        "--backend",
        "triton",
        "--requests",
        "60",
        "--l1-pages",
        "80",
        "--l2-pages",
        "80",
    )
    hits = s["hit_tokens"]
    assert isinstance(hits, dict) and hits["L2"] > 0 and hits["L3"] > 0
    assert s["invariants"]["violations"] == 0 and s["verified_pages"] > 0  # type: ignore[index, operator]
