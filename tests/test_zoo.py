"""The bug zoo: every mutant of `hicache.testing.mutants` is caught by a stateful machine
alone, naming the check that caught it, within a step budget.

Each mutant runs against its default machine (`hicache.testing.zoo.DEFAULT_MACHINE`: the
product machine, FuzzNull or FuzzCpu, where it catches the mutant on every seed) with one
fixed Hypothesis seed, so CI replays the same run: the seed of 0-4 that caught it soonest in
benchmarks/results/2026-12-03-zoo-l3-restores.md (and, for the mutants added or moved since,
2026-12-04-zoo-fuzzfind.md; the table mutants, 2026-12-04-zoo-tables.md; the liveness ones,
2026-12-04-zoo-liveness.md), which measure all five seeds, misses included (the zoo draws no
constants from the source, so a seed's run does not depend on what ran before). The test
guards against the machines losing a catch; the file stays within a minute on two cores, and
`MAX_STEPS` bounds each run.
"""

from __future__ import annotations

import pytest

from hicache.app import cli
from hicache.testing import mutants, zoo

MAX_STEPS = 2000

# mutant -> (seed, the check that must catch it: a substring of `Failure.check`; " | "
# separates checks that each see the same bug, whichever the run's draws reach first)
EXPECTED: dict[str, tuple[int, str]] = {
    "B01": (4, "I5 publish_order"),
    "B02": (4, "I1 ownership_disjoint"),
    "B03": (1, "I6 page_conservation"),
    "B04": (0, "S7 lock_accounting"),
    "B05": (3, "I4 tier_bytes_equal"),
    "B06": (4, "I2 inflight_source_pinned"),
    "B07": (3, "S6 tier_ancestor_closed"),
    "B07-leaf": (1, "machine FuzzNull.agrees_with_reference: tree audit"),
    "B08": (1, "machine FuzzNull.agrees_with_reference: I3 page_aligned"),
    "B09": (1, "I6 reserve_group_rolled_back"),
    "B10": (0, "I9 group_atomic"),
    "B11": (3, "machine TreeMachine.unlock_unheld"),
    "B12": (1, "contract: TransferError escaped FuzzCpu"),
    "B13": (4, "I4 tier_bytes_equal"),
    "B14": (2, "machine ControllerMachine.l3_serves_what_it_holds"),
    "B15": (1, "I4 tier_bytes_equal"),
    "B16": (1, "I11 l3_write_multiplicity"),
    "B16-ack": (1, "I11 l3_write_multiplicity"),
    "TP-conditional": (0, "contract: CollectiveTimeout escaped FuzzTp"),
    "TP-local-capacity": (4, "I7 rank_agreement"),
    "TP-min-of-maxima": (0, "I9 group_atomic | differential L1 hit length at admission"),
    # ends_on_one_rank (hicache/testing/tpends.py); 2026-12-05-zoo-tp-agreement.md
    "TP-cancel-ended": (0, "C4 landed"),
    "TP-moving-landed": (0, "C4 landed"),
    "F11-no-clamp": (0, "I4 tier_bytes_equal"),
    "L3-no-lock": (0, "machine FuzzCpu.l3_refuses_a_second_opener"),
    "decision-unplanned": (0, "FuzzDsv4.agrees_with_reference: restore choice, decision unplanned"),
    "replay-unrevived": (3, "machine FuzzDsv4._admit: differential L1 hit length at admission"),
    # a rank's own replicated bytes: I8 across ranks, or I4 against the L3 copy (rank 0's)
    "TP-rank-local-bytes": (3, "I8 replicated_bytes_equal | I4 tier_bytes_equal"),
    "T-h2d-unpinned": (0, "S7 lock_accounting"),
    "T-h2d-fail-publishes": (1, "machine FuzzNull.agrees_with_reference: I4 tier_bytes_equal"),
    "T-h2s-keeps-lock": (0, "machine FuzzNull.agrees_with_reference: S7 lock_accounting"),
    "T-s2h-locks-l1": (0, "S7 lock_accounting"),
    # the guards family's seeds: benchmarks/results/2026-12-04-zoo-guards.md
    "guard-chain-head": (2, "machine FuzzNull.illegal_calls"),
    "guard-chain-tail": (2, "machine FuzzNull.illegal_calls"),
    "parent-guard-grandparent": (2, "machine FuzzNull.illegal_calls"),
    "chain-deepest-first": (1, "machine FuzzNull.illegal_calls"),
    "advance-locks-first": (2, "machine FuzzNull.illegal_calls"),
    "tombstone-locked": (0, "machine FuzzDsv4.illegal_calls"),
    "LV-l3-head-only": (1, "machine FuzzNull.agrees_with_reference: backup undelivered"),
    "LV-lru-unsorted": (1, "machine FuzzNull.agrees_with_reference: eviction order"),
    "LV-quarantine-forgets": (1, "machine FuzzNull.agrees_with_reference: quarantine kept"),
    "LV-writeback-parent": (1, "machine FuzzNull.agrees_with_reference: unbacked eviction"),
    "LV-l3-hit-min": (1, "machine FuzzNull.agrees_with_reference: restore skipped"),
    "I1-skip-L2": (1, "machine FuzzNull.checker_sees_what_breaks"),
    "checker-off": (0, "machine FuzzNull.checker_sees_what_breaks"),
    "oracle-pages-count": (0, "machine FuzzNull.self_check: accepted pages-freed"),
    "oracle-two-ids": (2, "machine FuzzNull.self_check: accepted node-second-id"),
    "oracle-no-before": (1, "machine FuzzNull.self_check: accepted before"),
    "oracle-seq-repeat": (0, "machine FuzzNull.self_check: accepted seq-repeated"),
    "walk-no-continuity": (0, "machine FuzzNull.self_check: walked duplicated"),
    # reached by the wider draws only (mutants/reach.py)
    "split-rounds-up": (4, "hit length at admission"),  # any tier's: the split is the tree's
    "l3-any-checksum": (0, "I4 tier_bytes_equal | restored from its damaged L3 copy"),
    "rank-check-local-mode": (0, "CollectiveMismatch"),
    "prefetch-off-ticks-once": (0, "prefetch off"),
    "triton-one-page": (1, "I4 tier_bytes_equal"),
    # layer-wise load-back (spec/restore.md R83): 2026-12-06-layerwise-h100/README.md
    "layer-gate-lets-in": (0, "private tail"),
    # the data plane's routes (mutants/routes.py): 2026-12-07-zoo-routes.md
    "route-mixed-overlap": (1, "I4 tier_bytes_equal"),  # 2026-12-08-zoo-h2d-routes.md
    "route-h2d-staged-overlap": (2, "I4 tier_bytes_equal"),  # caught on 1 seed of 5
    "chunk-one-slot": (1, "assertion workspace.borrow"),  # the index buffers' size contract
    "mapped-l1-from-l2": (3, "I4 tier_bytes_equal"),
    "pitched-short-page": (0, "I4 tier_bytes_equal"),
}


def test_every_mutant_has_an_expectation_and_a_machine() -> None:
    assert set(EXPECTED) == set(mutants.MUTANTS) == set(zoo.DEFAULT_MACHINE)


def _needs_torch(name: str) -> bool:
    return zoo.DEFAULT_MACHINE[name] in (
        "controller",
        "fuzz-cpu",
        "fuzz-cpu-dsv4",
        "fuzz-tp-cpu-dsv4",
    )


def _has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _skip_without_torch(name: str) -> None:
    if _needs_torch(name):
        pytest.importorskip("torch", reason="the controller machine needs the data plane")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_machine_alone_catches_the_mutant(name: str) -> None:
    """Caught on the mutant's seed; should that seed miss (after a change to a machine), on
    the next of seeds 0-4 that catches it."""
    _skip_without_torch(name)
    seed, check = EXPECTED[name]
    tried: list[int] = []
    for s in [seed] + [x for x in range(5) if x != seed]:
        tried.append(s)
        result = zoo.catch_default(name, [s], MAX_STEPS)
        if result.caught:
            break
    assert result.caught, f"{name} escaped its machine for {MAX_STEPS} steps (seeds {tried})"
    failure = result.failures[0]
    assert any(c in failure.check for c in check.split(" | ")), (
        f"{name} was caught by {failure.check!r}, not {check!r}"
    )
    assert 0 < failure.step <= MAX_STEPS


def test_the_cpu_plane_catches_a_stopped_s2h_published_past_its_clamp_by_its_bytes() -> None:
    """F11-no-clamp's default machine is fuzz-dsv4 (the null plane: I4 through its content
    tags, spec/faults.md); the CPU plane's real bytes catch it too (seed 0), by I4 over the
    bytes or by the restore's verification of them (RestoreMismatch), whichever the run's
    draws reach first (I4 when measured before the fuzz drew page placements)."""
    pytest.importorskip("torch", reason="the CPU plane moves bytes with torch")
    result = zoo.catch("F11-no-clamp", zoo.load_machine("fuzz-cpu-dsv4"), [0], MAX_STEPS)
    assert result.caught, "F11-no-clamp escaped fuzz-cpu-dsv4 on seed 0"
    check = result.failures[0].check
    assert "I4 tier_bytes_equal" in check or "RestoreMismatch" in check, check


def test_each_mutant_is_switched_off_after_its_block() -> None:
    """Leaving `activate` restores the real functions: the clean machine passes again."""
    from hicache.core.control import ControlPlane
    from hicache.invariants.registry import CHECKS

    originals = (dict(vars(ControlPlane)), tuple(c.func for c in CHECKS))
    for name in mutants.MUTANTS:
        if _needs_torch(name) and not _has_torch():
            continue
        with mutants.activate(name):
            pass
    assert (dict(vars(ControlPlane)), tuple(c.func for c in CHECKS)) == originals
    steps, error = zoo.run_seed(zoo.load_machine("control"), 0, 100)
    assert error is None and steps >= 100, f"the clean machine failed: {error!r}"


def test_an_unknown_mutant_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(Exception, match="B06"):
        mutants.activate("no-such-mutant")


def test_fuzz_mutant_list_names_every_mutant(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["fuzz", "--mutant", "list"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()] == list(mutants.MUTANTS)


def test_fuzz_mutant_exits_0_when_caught_naming_the_check(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A zoo run tests the machine: catching the mutant is its success. It used to exit 1
    when caught and 0 when the mutant escaped, the reverse of what a CI step needs."""
    assert cli.main(["fuzz", "--mutant", "checker-off", "--seed", "0", "--steps", "500"]) == 0
    out = capsys.readouterr().out
    assert "checker-off: caught by machine FuzzNull.checker_sees_what_breaks" in out


def test_fuzz_mutant_exits_1_when_it_escapes(capsys: pytest.CaptureFixture[str]) -> None:
    """B09 on the single-pool product machine escapes on every seed, whatever Hypothesis
    draws (it breaks a pool group's rollback; the machine has no group): exit 1, a line per
    seed. It used to exit 0 exactly when the mutant escaped. (B01 was the example until the
    machine's illegal calls and its check-trace self-check both caught it.)"""
    argv = ["fuzz", "--mutant", "B09", "--machine", "fuzz-null", "--steps", "100"]
    assert cli.main([*argv, "--seed", "0", "--seed", "1"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"B09: NOT caught by FuzzNull in 100 steps (seed {s})" for s in (0, 1)]


@pytest.mark.parametrize(
    "caught, missed, status",
    [([3], [], 0), ([], [0], 1), ([3], [0], 1), ([], [], 1)],
)
def test_fuzz_mutant_exits_0_only_when_every_seed_caught_it(
    caught: list[int],
    missed: list[int],
    status: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The verdict over seeds, on scripted runs (which seed catches a mutant within a budget
    depends on Hypothesis' release): 0 only when every seed caught it, a line per seed."""

    def scripted(name: str, seeds: list[int], steps: int, machine: str | None) -> zoo.Catch:
        failures = [zoo.Failure(seed, 62, "I5 ordering", "boom") for seed in caught]
        return zoo.Catch(name, "ControlPlaneMachine", steps, failures, list(missed))

    monkeypatch.setattr(zoo, "catch_default", scripted)
    seeds = [arg for seed in caught + missed for arg in ("--seed", str(seed))]
    assert cli.main(["fuzz", "--mutant", "B07", "--steps", "100", *seeds]) == status
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(": ")[1].split(" by ")[0] for line in lines] == (
        ["caught"] * len(caught) + ["NOT caught"] * len(missed)
    ), lines


@pytest.mark.parametrize("mutant, status", [("checker-off", 0), ("B09", 1)])
def test_fuzz_with_a_mutant_and_run_options_exits_0_when_caught(
    mutant: str, status: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--mutant` beside a run option (`--plane`: a failure's replay line) runs the product
    machine with the mutant on; its status says the same as the zoo's: checker-off fails the
    run (caught, 0), B09 never does (a pool group's rollback: the single pool has none,
    escaped, 1). B01 escaped here too until the machine's illegal calls and its check-trace
    self-check (selfcheck.py) both caught it."""
    argv = ["fuzz", "--mutant", mutant, "--plane", "null", "--seed", "0", "--steps", "50"]
    assert cli.main(argv) == status
    out = capsys.readouterr().out
    assert out.endswith(f"mutant {mutant}: caught\n" if status == 0 else "it escaped\n"), out
    assert ("fuzz: FAILED" in out) == (status == 0)


def test_a_seed_runs_its_whole_step_budget() -> None:
    """Hypothesis ends examples before `steps_per_example` steps, often: a seed that catches
    nothing has still run every step of its budget (one batch of 300 / 50 examples runs
    fewer)."""
    for name in ("control", "fuzz-null"):
        steps, error = zoo.run_seed(zoo.load_machine(name), 0, 300)
        assert error is None and steps == 300, f"{name}: {steps} steps, {error!r}"


def test_the_product_machine_needs_no_source_checkout() -> None:
    for name in ("fuzz-null", "fuzz-cpu"):
        assert zoo.MACHINES[name].startswith("hicache.testing.machines:")
    assert zoo.load_machine("fuzz-null").__name__ == "FuzzNull"


def test_the_product_machine_names_the_engine_check_that_failed() -> None:
    """An engine check's failure, reported through the machine's invariant, names its ids
    ("I1 ownership_disjoint"), not just the invariant. B08 is caught so on some of seeds 0-4
    (which ones moves with the machine's draws: seed 3 was, until issue 31's walk
    corruptions joined the run's draws; there the controller's own check raised first)."""
    through = "machine FuzzNull.agrees_with_reference:"
    seen = []
    for seed in range(5):
        result = zoo.catch_default("B08", [seed], MAX_STEPS)
        assert result.caught, f"B08 escaped seed {seed}"
        seen.append(result.failures[0].check)
        if seen[-1].startswith(through):
            assert seen[-1].startswith(f"{through} I3 page_aligned"), seen[-1]
            return
    raise AssertionError(f"B08 never caught through the machine's check on seeds 0-4: {seen}")
