"""Running the bug zoo: does a stateful machine alone catch a mutant, with which check, and
after how many steps?

    catch(mutant, machine, seeds, max_steps) -> Catch
        for each seed: switch the mutant on, run the Hypothesis state machine `machine`
        (generation only: no shrinking, no example database) until it fails or has run
        `max_steps` rule steps, and record the first failure: the step it happened at
        (counted over every example of that seed, from 1) and the check that raised it.

What names a check (`Failure.check`):

    raised                                        check
    --------------------------------------------  ---------------------------------------
    InvariantViolation (the plane's own checker)  its violations' ids and names, "I5 publish_order"
    AssertionError raised outside hicache/testing "assertion <module>.<function> under
    (the product's assertion of a contract)       <Class>.<method>" (the rule it ran under)
    AssertionError in the machine's module        "machine <Class>.<method>" (its rule or invariant;
    (or a base class's)                           for the product machine's engine checks and
                                                  reference model, ": I3 page_aligned" or
                                                  ": differential <what>" follows)
    any other exception                           "contract: <Type> escaped <Class>.<rule>"
                                                  (the machine allows only documented errors)

A seed's run is repeatable: it runs examples until `max_steps` steps are spent (Hypothesis
ends many examples early), and draws no constants from the repository's source (Hypothesis
otherwise draws some from every module loaded so far, so a seed's steps would depend on the
process history and on any edit to those modules).

A machine is any `RuleBasedStateMachine` subclass; `MACHINES` names the ones this repository
has ("module:Class": the product machine, fuzz-null and fuzz-cpu, and the tests' machines),
and `DEFAULT_MACHINE` says which one each mutant is measured against.
`main(argv)` is the `hicache fuzz --mutant` command line.
"""

from __future__ import annotations

import importlib
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis.errors import HypothesisException
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from hicache.app.usage import UsageParser
from hicache.errors import ConfigError, InvariantViolation
from hicache.testing.mutants import MUTANTS, activate, get
from hicache.testing.reference import Mismatch
from hicache.testing.seeded import no_source_constants
from hicache.testing.selfcheck import SelfCheckFailed

# One annotation that suits every Hypothesis: older releases leave this untyped (a call is
# no-untyped-call), newer ones type its first argument as a machine class only.
_run_state_machine_as_test: Callable[..., None] = run_state_machine_as_test

MACHINES: dict[str, str] = {
    "fuzz-null": "hicache.testing.machines:FuzzNull",
    "fuzz-cpu": "hicache.testing.machines:FuzzCpu",
    "control": "tests.test_control_fuzz:ControlPlaneMachine",
    "controller": "tests.test_controller_fuzz:ControllerMachine",
    "tree": "tests.test_tree_property:TreeMachine",
    "group-table": "tests.test_group_table:GroupTableMachine",
    "fuzz-dsv4": "hicache.testing.machines:FuzzDsv4",
    "fuzz-dsv41": "hicache.testing.machines:FuzzDsv41",
    "fuzz-tp": "hicache.testing.machines:FuzzTp",
    "fuzz-tp-dsv4": "hicache.testing.machines:FuzzTpDsv4",
    "fuzz-cpu-dsv4": "hicache.testing.machines:FuzzCpuDsv4",
    "fuzz-tp-cpu-dsv4": "hicache.testing.machines:FuzzTpCpuDsv4",
}
"""Machine name -> "module:Class": the product machine (hicache/testing/machines.py) on the
null and cpu planes and, with a pool group in every tier, on the null plane (fuzz-dsv4,
fuzz-dsv41) and the CPU plane (fuzz-cpu-dsv4); over 2 and 3 ranks (fuzz-tp*, the last on
the CPU plane: replicated bytes compared), and the tests' older machines (they need a source
checkout on sys.path)."""

DEFAULT_MACHINE: dict[str, str] = {
    "B01": "control",
    "B02": "control",
    "B03": "fuzz-cpu",
    "B04": "fuzz-null",
    "B05": "fuzz-cpu",
    "B06": "control",
    "B07": "control",
    "B07-leaf": "fuzz-null",
    "B08": "fuzz-null",
    "B09": "group-table",
    "B10": "fuzz-dsv4",
    "B11": "tree",
    "B12": "fuzz-cpu",
    "B13": "controller",
    "B14": "controller",
    "B15": "fuzz-cpu",
    "B16": "fuzz-tp",
    "B16-ack": "fuzz-tp",
    "TP-conditional": "fuzz-tp",
    "TP-local-capacity": "fuzz-tp",
    "TP-min-of-maxima": "fuzz-tp-dsv4",
    # reached by `ends_on_one_rank` (hicache/testing/tpends.py): an op ended on one rank only
    "TP-cancel-ended": "fuzz-tp",
    "TP-moving-landed": "fuzz-tp",
    # the null plane's content tags catch it on seeds 0-4 (steps 103-329); the CPU plane's
    # bytes too, but later (3 of 5 seeds within 2,000 steps once issue 31's rules joined)
    "F11-no-clamp": "fuzz-dsv4",
    "L3-no-lock": "fuzz-cpu",
    "decision-unplanned": "fuzz-dsv4",
    "replay-unrevived": "fuzz-dsv4",
    "TP-rank-local-bytes": "fuzz-tp-cpu-dsv4",
    # wrong lifecycle tables (mutants/tables.py); T-h2d-unpinned and T-s2h-locks-l1 on
    # fuzz-dsv4, which checks after every transition: fuzz-null checks after each step, when
    # most restores have ended (T-h2d-unpinned: 1/5 seeds there)
    "T-h2d-unpinned": "fuzz-dsv4",
    "T-h2d-fail-publishes": "fuzz-null",
    "T-h2s-keeps-lock": "fuzz-null",
    "T-s2h-locks-l1": "fuzz-dsv4",
    "guard-chain-head": "fuzz-null",
    "guard-chain-tail": "fuzz-null",
    "parent-guard-grandparent": "fuzz-null",
    "chain-deepest-first": "fuzz-null",
    "advance-locks-first": "fuzz-null",
    "tombstone-locked": "fuzz-dsv4",
    "LV-l3-head-only": "fuzz-null",
    "LV-lru-unsorted": "fuzz-null",
    "LV-quarantine-forgets": "fuzz-null",
    "LV-writeback-parent": "fuzz-null",
    "LV-l3-hit-min": "fuzz-null",
    "I1-skip-L2": "fuzz-null",
    "checker-off": "fuzz-null",
    "oracle-pages-count": "fuzz-null",
    "oracle-two-ids": "fuzz-null",
    "oracle-no-before": "fuzz-null",
    "oracle-seq-repeat": "fuzz-null",
    "walk-no-continuity": "fuzz-null",
    # reached by the wider draws only (mutants/reach.py)
    "split-rounds-up": "fuzz-null",
    "l3-any-checksum": "fuzz-cpu",
    "rank-check-local-mode": "fuzz-tp",
    "prefetch-off-ticks-once": "fuzz-null",
    "triton-one-page": "fuzz-cpu",
    "layer-gate-lets-in": "fuzz-cpu",
    # the data plane's routes (mutants/routes.py)
    "route-mixed-overlap": "fuzz-cpu",
    "route-h2d-staged-overlap": "fuzz-cpu",
    "chunk-one-slot": "fuzz-cpu",
    "mapped-l1-from-l2": "fuzz-cpu",
    "pitched-short-page": "fuzz-cpu",
}
"""The machine each mutant is measured against: the product machine where it catches the
mutant on every seed of benchmarks/results/2026-12-01-zoo.md, else a test's machine. Why not
the product machine (its catches on seeds 0-4, 2,000 steps, in that file):

    mutant          why a test's machine
    --------------  -------------------------------------------------------------------------
    B01, B07, B11   the controller never relies on the guard: it advances `cached_len` only
                    over a finished restore, issues a backup only below a backed-up parent,
                    and never releases a lock twice (0/5); the control plane's public API
                    allows each, so the control (or tree) machine tries them
    B02, B06        a failed transfer whose L2 source is published, or a split of a node
                    whose load-back is in flight, is reached too rarely (4/5 seeds)
    B13, B14        the cpu-plane machine writes too few multi-run or short L3 extents
                    (1/5 each)
    B09             the group-table machine names the rule it breaks (reserve_group_rolled_back);
                    fuzz-dsv4 also catches it on seeds 0-4 through the controller's per-pool
                    L2/L3 faults (I6 and I9, steps 128-455;
                    benchmarks/results/2026-12-01-zoo.md)
"""

BATCH_SEED = 1_000_003
"""A seed's k-th batch of examples runs with Hypothesis seed `seed + BATCH_SEED * k`."""

STEPS_PER_EXAMPLE: dict[str, int] = {
    "fuzz-null": 50,
    "fuzz-cpu": 50,
    "control": 50,
    "controller": 30,
    "tree": 50,
}
"""Rule steps per Hypothesis example, per machine (a machine not listed: 50)."""


@dataclass(frozen=True)
class Failure:
    """How one seed's run ended: at rule step `step` (counted from 1 over all its examples),
    caught by `check`, with the exception's first line."""

    seed: int
    step: int
    check: str
    message: str


@dataclass
class Catch:
    """One mutant against one machine over some seeds: the failures (one per seed that
    caught it) and the seeds that ran `max_steps` steps without a failure."""

    mutant: str
    machine: str
    max_steps: int
    failures: list[Failure] = field(default_factory=list)
    missed: list[int] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def caught(self) -> bool:
        """Every seed caught it."""
        return not self.missed and bool(self.failures)

    @property
    def median_steps(self) -> float | None:
        return statistics.median(f.step for f in self.failures) if self.failures else None

    @property
    def checks(self) -> list[str]:
        """The checks that caught it, most frequent first."""
        names = [f.check for f in self.failures]
        return sorted(set(names), key=lambda c: (-names.count(c), c))


class _BudgetSpent(Exception):
    """Raised after the last step of the budget: ends the seed's run (never a verdict)."""


class _Tally:
    """Steps run so far for one seed (at most `budget`), and the first failure seen."""

    def __init__(self, budget: int) -> None:
        self.steps = 0
        self.budget = budget
        self.first: tuple[int, BaseException] | None = None

    def fail(self, step: int, error: BaseException | None) -> None:
        """Record `error` at `step` unless a failure was recorded already, or it is one of
        Hypothesis' own control-flow exceptions (end of data, a rejected example)."""
        if self.first is None and _verdict(error):
            self.first = (step, error)  # type: ignore[assignment]


def _verdict(error: BaseException | None) -> bool:
    """Whether `error` is the machine's verdict rather than Hypothesis' control flow."""
    return isinstance(error, Exception) and not isinstance(
        error, (HypothesisException, _BudgetSpent)
    )


def _counted(machine: type[RuleBasedStateMachine], tally: _Tally) -> type[RuleBasedStateMachine]:
    """A subclass of `machine` that counts rule steps and records the first exception
    (Hypothesis checks the invariants once after setup and once after every step, and
    tears the machine down in a `finally`, where the exception in flight is visible)."""

    class Counted(machine):  # type: ignore[valid-type, misc]
        def __init__(self) -> None:
            super().__init__()
            self._zoo_started = False

        def check_invariants(self, *args: Any, **kwargs: Any) -> None:
            if self._zoo_started:
                tally.steps += 1
            self._zoo_started = True
            try:
                super().check_invariants(*args, **kwargs)
            except Exception as e:
                tally.fail(tally.steps, e)
                raise
            if tally.steps >= tally.budget:
                raise _BudgetSpent(f"{tally.steps} steps run")

        def teardown(self) -> None:
            tally.fail(tally.steps + 1, sys.exc_info()[1])
            try:
                super().teardown()
            except Exception as e:
                tally.fail(tally.steps, e)
                raise

    Counted.__name__ = Counted.__qualname__ = machine.__name__
    return Counted


def run_seed(
    machine: type[RuleBasedStateMachine], seed: int, max_steps: int, steps_per_example: int = 50
) -> tuple[int, BaseException | None]:
    """Run `machine` with Hypothesis seed `seed` for `max_steps` rule steps or until it fails;
    the steps run and the first exception (None when none was raised).

    Hypothesis ends an example after at most `steps_per_example` steps, often sooner, so one
    batch of max_steps / steps_per_example examples runs fewer steps than the budget (2,000
    asked, ~1,400-1,700 run). Batches run until the budget is spent: the first with `seed`
    (so a seed's early steps stay as they were), the k-th with `seed + BATCH_SEED * k`."""
    tally = _Tally(max_steps)
    factory: Any = _counted(machine, tally)
    for batch in range(max_steps):
        if tally.first is not None or tally.steps >= max_steps:
            break
        factory._hypothesis_internal_use_seed = seed + BATCH_SEED * batch
        _run_batch(
            factory, tally, -(-(max_steps - tally.steps) // steps_per_example), steps_per_example
        )
    if tally.first is None:
        return tally.steps, None
    return tally.first


def _run_batch(factory: Any, tally: _Tally, examples: int, steps_per_example: int) -> None:
    """One Hypothesis run of `examples` examples (generation only), its verdict in `tally`."""
    config = settings(
        max_examples=examples,
        stateful_step_count=steps_per_example,
        deadline=None,
        phases=[Phase.generate],
        database=None,
        derandomize=False,
        print_blob=False,
        report_multiple_bugs=False,
        verbosity=Verbosity.quiet,
        suppress_health_check=list(HealthCheck),
    )
    try:
        with no_source_constants():
            _run_state_machine_as_test(factory, settings=config)
    except Exception as e:  # the machine's verdict (recorded as it was raised, see _counted)
        if tally.first is None and tally.steps >= tally.budget:
            return  # the budget is spent (_BudgetSpent, maybe wrapped by Hypothesis)
        if tally.first is None and not _verdict(e):
            raise  # Hypothesis itself gave up (a health check): not a verdict on the mutant
        tally.fail(tally.steps + 1, e)


def name_check(error: BaseException, machine: type[RuleBasedStateMachine]) -> str:
    """The check that raised `error` (see the module docstring's table)."""
    if isinstance(error, InvariantViolation):
        seen: list[str] = []
        for v in error.violations:
            label = f"{getattr(v, 'invariant', '?')} {getattr(v, 'name', type(v).__name__)}"
            if label not in seen:
                seen.append(label)
        return ", ".join(seen)
    frames = traceback.extract_tb(error.__traceback__)
    files = _machine_files(machine)
    mine = [f for f in frames if f.filename in files]
    where = f"{machine.__name__}.{mine[-1].name}" if mine else machine.__name__
    if type(error) is AssertionError and frames and _product(frames[-1].filename, files):
        last = frames[-1]  # the product's own assertion (a contract), under the machine
        return f"assertion {Path(last.filename).stem}.{last.name} under {where}"
    if isinstance(error, AssertionError) and mine:
        return f"machine {where}" + _what_failed(error)
    return f"contract: {type(error).__name__} escaped {where}"


_TESTING = str(Path(__file__).resolve().parent)
"""hicache/testing: an assertion raised below it is a machine's or its helpers' check."""


def _product(filename: str, machine_files: set[str]) -> bool:
    """Is `filename` the product's code: neither the machine's files nor hicache/testing?"""
    return filename not in machine_files and not filename.startswith(_TESTING)


def _what_failed(error: AssertionError) -> str:
    """For the product machine's two verdicts, what failed: the engine's own checks (their
    ids and names, "I1 ownership_disjoint") or the reference model's (`Mismatch.what`)."""
    if isinstance(error, Mismatch):
        return f": differential {error.what}"
    if isinstance(error, SelfCheckFailed):
        return f": {error.what}"  # the self-check's: check-trace judged ("accepted before")
    lines = str(error).splitlines()
    if lines and lines[0].startswith("engine checks failed"):
        labels = [" ".join(line.split()[:2]).rstrip(":") for line in lines[1:] if line.strip()]
        return ": " + ", ".join(dict.fromkeys(labels))
    return ""


def _machine_files(machine: type[RuleBasedStateMachine]) -> set[str]:
    """The source files of `machine` and of its bases up to `RuleBasedStateMachine` (a
    product machine is built in hicache/testing/machine.py and extended elsewhere)."""
    files = set()
    for cls in machine.__mro__:
        if cls is RuleBasedStateMachine or not issubclass(cls, RuleBasedStateMachine):
            continue
        path = getattr(sys.modules.get(cls.__module__), "__file__", None)
        if path is not None:
            files.add(path)
    return files


def catch(
    mutant: str,
    machine: type[RuleBasedStateMachine],
    seeds: Sequence[int],
    max_steps: int,
    steps_per_example: int = 50,
) -> Catch:
    """Run `machine` with `mutant` switched on, once per seed, each for at most `max_steps`
    rule steps; which seeds caught it, where, and by which check."""
    result = Catch(get(mutant).name, machine.__name__, max_steps)
    started = time.perf_counter()
    for seed in seeds:
        with activate(mutant):
            steps, error = run_seed(machine, seed, max_steps, steps_per_example)
        if error is None:
            result.missed.append(seed)
        else:
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            result.failures.append(Failure(seed, steps, name_check(error, machine), first[:200]))
    result.seconds = time.perf_counter() - started
    return result


def load_machine(name: str) -> type[RuleBasedStateMachine]:
    """The machine `name` ("control", or "module:Class"). ConfigError saying what to do when
    it cannot be imported."""
    spec = MACHINES.get(name, name)
    module_name, _, cls_name = spec.partition(":")
    if (
        module_name.startswith("tests.")
        and Path("tests", "__init__.py").is_file()
        and os.getcwd() not in sys.path
    ):
        sys.path.insert(0, os.getcwd())  # a source checkout's machines, from its root
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(
            "machine",
            f"cannot load {spec!r} ({e}); the tests' machines need a "
            "source checkout: run from the repository root",
        ) from e
    if not (isinstance(cls, type) and issubclass(cls, RuleBasedStateMachine)):
        raise ConfigError("machine", f"{spec!r} is not a RuleBasedStateMachine subclass")
    return cls


def catch_default(
    mutant: str, seeds: Sequence[int], max_steps: int, machine: str | None = None
) -> Catch:
    """`catch` against the mutant's default machine (or `machine`)."""
    name = machine or DEFAULT_MACHINE[get(mutant).name]
    return catch(mutant, load_machine(name), seeds, max_steps, STEPS_PER_EXAMPLE.get(name, 50))


EXIT_CAUGHT, EXIT_ESCAPED = 0, 1
"""`hicache fuzz --mutant`'s exit status: the machine caught the mutant (on every seed; for
`all`, every mutant), or it escaped (a seed ran its steps without a failure). A zoo run is a
test of the machine, so catching is its success."""


def main(argv: Sequence[str] | None = None) -> int:
    """`hicache fuzz --mutant NAME|list|all [--seed S ...] [--steps N] [--machine M]`.

    `list` prints every mutant and exits 0. A NAME runs against its machine (or `--machine`)
    and prints, per seed, the check that caught it or that it was not caught: exit 0 when
    every seed caught it, 1 when it escaped on any seed (the fuzz found nothing: for a mutant,
    that is the machine's failure). `all` runs the whole zoo and prints a Markdown table
    (steps to catch, median over the seeds); exit 0 when every mutant was caught on every
    seed, 1 otherwise. A usage error is one line, exit status 2."""
    parser = UsageParser(prog="hicache fuzz", description=main.__doc__)
    parser.add_argument("--mutant", required=True, help="a mutant's name, 'list' or 'all'")
    parser.add_argument("--seed", type=int, action="append", help="Hypothesis seed (repeat)")
    parser.add_argument("--steps", type=int, default=2000, help="rule steps per seed, at most")
    parser.add_argument("--machine", help=f"one of {', '.join(MACHINES)} or module:Class")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"argument --steps: at least 1, got {args.steps}")
    if any(seed < 0 for seed in args.seed or ()):  # random seeds by |seed|: -1 replays 1
        parser.error(f"argument --seed: each >= 0, got {min(args.seed)}")
    if args.mutant == "list":
        for m, description in MUTANTS.items():
            print(f"{m:12} {get(m).bug_class:4} {DEFAULT_MACHINE[m]:11} {description}")
        return 0
    seeds = args.seed or [0]
    if args.mutant == "all":
        results = [catch_default(m, seeds, args.steps, args.machine) for m in MUTANTS]
        print(table(results))
        return EXIT_CAUGHT if all(r.caught for r in results) else EXIT_ESCAPED
    result = catch_default(args.mutant, seeds, args.steps, args.machine)
    for f in result.failures:
        print(f"{result.mutant}: caught by {f.check} at step {f.step} (seed {f.seed}): {f.message}")
    for seed in result.missed:
        print(
            f"{result.mutant}: NOT caught by {result.machine} in {args.steps} steps (seed {seed})"
        )
    return EXIT_CAUGHT if result.caught else EXIT_ESCAPED


def table(results: Sequence[Catch]) -> str:
    """A Markdown table of zoo results: one row per mutant."""
    rows = [
        "| mutant | class | machine | caught | steps to catch (median) | per seed | "
        "check | seconds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        steps = {f.seed: str(f.step) for f in r.failures} | {seed: "miss" for seed in r.missed}
        per_seed = ", ".join(steps[seed] for seed in sorted(steps))
        median = "-" if r.median_steps is None else f"{r.median_steps:g}"
        rows.append(
            f"| {r.mutant} | {get(r.mutant).bug_class} | {r.machine} | "
            f"{len(r.failures)}/{len(r.failures) + len(r.missed)} | {median} | {per_seed} | "
            f"{'; '.join(r.checks)} | {r.seconds:.1f} |"
        )
    return "\n".join(rows)
