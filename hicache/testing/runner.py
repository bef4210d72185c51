"""`hicache fuzz`: run the fuzz machine outside pytest, with a seed, a replay line and a report.

    hicache fuzz --seed S --steps N [--plane null|cpu|cuda] [--adapter module:factory] [--report]
                 [--pools mha|dsv4-tiny|dsv41-tiny] [--tp RANKS]
                 [--progress] [--mutant NAME|list] [--trace FILE] [--no-shrink]
                 [--shrink-seconds S]

The machine runs `N // STEPS_PER_RUN` runs (at least MIN_RUNS: Hypothesis' first run is its
simplest example, the same for every seed) of at most `STEPS_PER_RUN` steps each, drawn from
seed `S` (no example database: the seed alone decides). Output: one summary line (runs,
steps, trace events, seconds, steps/s, transitions/s) and the trace digest, which is the same
for the same seed, plane and adapter. On a failure: the seed, the shrunk step list Hypothesis
printed (with `--no-shrink`, the failing run's steps as found), the error, and a one-line
replay command; exit status 1. A shrink that runs past `--shrink-seconds` (SHRINK_SECONDS;
Hypothesis' own limit, five minutes, outlasts many a CI job) stops there: the failure is
printed as shrunk so far, its replay line and the unshrunk run's (`unshrunk:`, with
`--no-shrink`), never cut off by an outer timeout with nothing said. With `--mutant NAME`
the exit status is about the mutant instead: 0 when it was caught (the run failed, as it
should with the mutant switched on), 1 when it escaped (hicache.testing.zoo for `--mutant`
alone); 2 is a usage error either way.

Without `--adapter` the machine drives the hicache controller, with the two checks of its
own in hicache/testing/machines.py (its invariant checker sees a page put wrong; its L3 file
serves what it holds). `--tp RANKS` (2 or more) drives a tensor-parallel cache instead:
that many controller ranks as threads in lockstep, meeting at the agreement points of
spec/tp.toml, each with its own fault schedule (hicache/testing/adapters/tp.py), the
cross-rank invariants checked after every step; on the cuda plane each rank has its own GPU
when there is one per rank. A rank stuck at a collective is a failure that names the point
and the ranks that did not arrive (CollectiveTimeout). Every control plane a run builds
walks its trace (hicache/core/tracewalk.py; hicache/testing/walking.py): a step the tables'
`transitions` machine does not take from the state the executor traced is a failure
(MachineDisagreement), like an invariant violation.

`--adapter module:factory` drives another engine: `factory(config)` returns a
`CacheUnderTest` for an `EngineConfig` the machine draws (hicache/testing/factory.py: the one
factory protocol, the same `hicache vectors run --adapter` takes; the current directory is
importable); a factory that is not one is a usage error, exit 2. With
HICACHE_HYPOTHESIS_PROFILE=fuzz (the nightly profile of tests/conftest.py) the default
`--steps` is NIGHTLY_STEPS. Progress lines go to stderr when
it is a terminal, or with `--progress`.

Every run of the controller's machines also judges its oracle (hicache/testing/selfcheck.py):
check-trace must accept each engine's trace of the run and reject each of the run's drawn
corruptions of it (an edit of hicache/oracle/checktrace/illegal.py's catalogue); the summary's
`self-check:` line counts them, `--report` per edit. So does a run of an `--adapter` engine
whose `trace()` gives events (the engine adapters' `*_traced_adapter` factories); one that
gives none has nothing judged.

`--trace FILE` writes one trace (spec/trace.md: a header line, then the events) that
`hicache check-trace FILE` replays: the last run's -- on a failure, the failing run as
Hypothesis shrank it, which it runs last. A run whose engine was restarted (a `restart`
step, or a crash) has one trace per engine, each numbered from seq 1; FILE holds the last
engine's, the one the run ended (or failed) in (unless that one traced nothing: then the
one before it): nothing survives a restart (spec/faults.md), so its trace alone builds the
state it ended in. The header comes from the
adapter's `trace_header()` (the controller's: its control plane's header).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from hicache.app.outputs import OUTPUT_FILE
from hicache.app.usage import UsageParser
from hicache.core.trace import NdjsonSink, TraceEvent, TraceHeader
from hicache.errors import ConfigError
from hicache.pools.presets import SINGLE_POOL
from hicache.testing.coverage import Coverage
from hicache.testing.factory import AdapterError
from hicache.testing.seeded import no_source_constants
from hicache.testing.selfcheck import SelfCheckCounts, SelfCheckFailed, with_self_check
from hicache.testing.walking import every_plane_walked

STEPS_PER_RUN = 50
MIN_RUNS = 2  # runs whatever --steps says: the first is the same for every seed (`fuzz`)
DEFAULT_STEPS = 2_000
NIGHTLY_STEPS = 250_000
PROGRESS_EVERY_S = 5.0
SHRINK_SECONDS = 60
"""`--shrink-seconds`' default: how long Hypothesis may shrink a failure (its own limit is five
minutes, past many a CI job's budget); then the failure as shrunk so far is reported."""
SHRINK_STOPPED = "stopped because it is making very slow progress"
"""What Hypothesis prints when its shrink time runs out (its words: no API says it)."""


class LastTrace:
    """What `--trace FILE` writes (module docstring): after every run (`keep`), the events
    of its last engine and the header of the adapter that run built (`factory`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.adapter: Any = None  # the adapter the current run built
        self.header: TraceHeader | None = None
        self.events: list[TraceEvent] = []
        self.engines = 0  # engines of the kept run that traced something
        self.judged: list[str] = []  # the lines of the trace a failed self-check judged

    def factory(self, make: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """`make`, remembering each adapter it builds (its header is read in `keep`)."""

        def build(setup: Any) -> Any:
            self.adapter = make(setup)
            return self.adapter

        return build

    def keep(self, events: list[TraceEvent]) -> None:
        """One run's trace, every engine's in order (each from seq 1): keep the last's."""
        starts = [i for i, e in enumerate(events) if e.seq == 1] or [0]
        self.events, self.engines = events[starts[-1] :], len(starts)
        own = getattr(self.adapter, "trace_header", None)
        self.header = own() if callable(own) else None

    def write(self) -> str:
        """Write the kept trace to `path`; the line that says what was written. ConfigError
        (nothing written) when the adapter gives no header."""
        if self.judged:  # the trace the self-check failed on, as check-trace read it
            with open(self.path, "w") as f:
                f.writelines(line + "\n" for line in self.judged)
            return (
                f"trace: {self.path} (the {len(self.judged) - 1} events of the engine's trace "
                "the self-check failed on, unedited: `hicache check-trace` it)"
            )
        if self.header is None:
            raise ConfigError(
                "--trace",
                "the adapter has no trace_header(); a trace needs its "
                "header (spec/trace.md): add one, or leave --trace out",
            )
        with open(self.path, "w") as f:
            sink = NdjsonSink(f, self.header)
            for e in self.events:
                sink.emit(e)
        restarted = f", engine {self.engines} of the run" if self.engines > 1 else ""
        return f"trace: {self.path} ({len(self.events)} events of the last run{restarted})"


class Progress(Coverage):
    """Coverage that writes a progress line to stderr at most every PROGRESS_EVERY_S, and
    hands each run's trace to `last_trace` (`--trace`) when one is set."""

    def __init__(self, total_steps: int, show: bool) -> None:
        super().__init__()
        self.total_steps, self.show = total_steps, show
        self.last_trace: LastTrace | None = None
        self.started = self.last = time.monotonic()

    def add(self, events: Any, fired: Any) -> None:
        if self.last_trace is not None:
            events = list(events)
            self.last_trace.keep(events)
        super().add(events, fired)
        now = time.monotonic()
        if self.show and now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            # Past the budget, Hypothesis is shrinking a failure (up to its own 5 minutes).
            doing = " (shrinking a failure)" if self.steps > self.total_steps else ""
            print(
                f"fuzz: {self.steps}/{self.total_steps} steps, {self.runs} runs, "
                f"{now - self.started:.0f} s{doing}",
                file=sys.stderr,
                flush=True,
            )


def _adapter(spec: str, plane: str) -> tuple[Any, Any]:
    """(factory, configurations to draw) for `--adapter module:factory`: the factory protocol
    of hicache/testing/factory.py, the configurations of every shape the factory takes.
    AdapterError (a usage error) when it is not such a factory."""
    from hicache.testing.draws import configs
    from hicache.testing.factory import build, load_factory, shapes_taken

    factory = load_factory(spec)
    shapes = shapes_taken(factory, spec, plane)
    return (lambda config: build(factory, config, spec)), configs(shapes)


def _mutant(name: str | None) -> contextlib.AbstractContextManager[Any]:
    if name is None:
        return contextlib.nullcontext()
    try:
        mutants = importlib.import_module("hicache.testing.mutants")
    except ImportError:
        raise SystemExit(
            "hicache fuzz: --mutant: this build has no bug zoo (hicache.testing.mutants)"
        ) from None
    return mutants.activate(name)  # type: ignore[no-any-return]


def _ranks(args: argparse.Namespace) -> int:
    """`--tp`: the simulated ranks (1 for a Namespace built without it, as API callers do)."""
    return int(getattr(args, "tp", 1))


def replay_command(args: argparse.Namespace) -> str:
    words = [
        "hicache",
        "fuzz",
        "--seed",
        str(args.seed),
        "--steps",
        str(args.steps),
        "--plane",
        args.plane,
    ]
    if args.adapter:
        words += ["--adapter", args.adapter]
    if getattr(args, "pools", SINGLE_POOL) != SINGLE_POOL:
        words += ["--pools", args.pools]
    if _ranks(args) > 1:
        words += ["--tp", str(args.tp)]
    if args.mutant:
        words += ["--mutant", args.mutant]
    if getattr(args, "trace", None):
        words += ["--trace", args.trace]
    if getattr(args, "no_shrink", False):
        words += ["--no-shrink"]
    elif getattr(args, "shrink_seconds", SHRINK_SECONDS) != SHRINK_SECONDS:
        words += ["--shrink-seconds", str(args.shrink_seconds)]
    return shlex.join(words)


@dataclass(frozen=True)
class FuzzResult:
    """What one `hicache fuzz` run did: `ok` (no failure), its `runs`, `steps` and trace
    `events` (counted as Hypothesis ran them, shrinking included), `seconds` (wall, the
    machine's runs only), the trace `digest` (the same for the same seed, plane and adapter),
    `text`: what `hicache fuzz` prints (the summary, or the failure with its replay line), and
    `selfcheck`: what check-trace judged (hicache/testing/selfcheck.py: the traces and events
    it replayed, the corruptions of them it was given and rejected, per edit)."""

    ok: bool
    runs: int
    steps: int
    events: int
    seconds: float
    digest: str
    text: str
    selfcheck: SelfCheckCounts = field(default_factory=SelfCheckCounts)

    @property
    def status(self) -> int:
        """`hicache fuzz`'s exit status: 0, or 1 on a failure."""
        return 0 if self.ok else 1


def arguments(**given: Any) -> argparse.Namespace:
    """`hicache fuzz`'s arguments with its defaults, `given` (by option name: seed=3,
    steps=500, plane="cpu", tp=2, ...) replacing them: what a script passes to `fuzz`."""
    args = parser().parse_args([])
    unknown = set(given) - set(vars(args))
    if unknown:
        raise ConfigError(
            "fuzz", f"no option {sorted(unknown)}; the options are {sorted(vars(args))}"
        )
    vars(args).update(given)
    return args


def fuzz(args: argparse.Namespace) -> FuzzResult:
    """Run the machine as `args` say (`arguments` builds them); what it did (FuzzResult)."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    from hicache.testing.machine import make_machine

    # Typed alike for every Hypothesis: older releases leave it untyped (no-untyped-call).
    run_machine: Callable[..., None] = run_state_machine_as_test

    out = io.StringIO()
    trace_path: str | None = getattr(args, "trace", None)
    last = LastTrace(trace_path) if trace_path else None
    coverage = Progress(args.steps, args.progress or sys.stderr.isatty())
    coverage.last_trace = last
    pools = getattr(args, "pools", SINGLE_POOL)
    if _ranks(args) > 1:  # simulated ranks in lockstep: the TP machine
        from hicache.testing.adapters.tp import tp_adapter
        from hicache.testing.machines import tp_machine

        machine = tp_machine(
            pools,
            sizes=(args.tp,),
            coverage=coverage,
            name="FuzzTp",
            plane=args.plane,
            adapter=tp_adapter if last is None else last.factory(tp_adapter),
        )
    elif args.adapter is None:  # the controller: its machine has two checks of its own
        from hicache.testing.adapters.controller import controller_adapter
        from hicache.testing.machines import controller_machine

        adapter = controller_adapter if last is None else last.factory(controller_adapter)
        machine = controller_machine(args.plane, coverage, adapter=adapter, pools=pools)
    else:
        factory, strategy = _adapter(args.adapter, args.plane)
        factory = factory if last is None else last.factory(factory)
        machine = make_machine(factory, strategy, coverage=coverage, name="CacheMachine")
        # An engine that traces (trace() not []) has its traces judged as the controller's.
        machine = with_self_check(machine, strategy, coverage.selfcheck, "CacheMachine")
    dropped: list[BaseException] = []
    machine = _keeping_dropped(machine, dropped)
    machine._hypothesis_internal_use_seed = args.seed  # what @seed sets
    # Hypothesis' first example is its simplest, the same for every seed: a second run at
    # least, so that the seed decides something however few the steps.
    runs = max(MIN_RUNS, args.steps // STEPS_PER_RUN)
    config = settings(
        max_examples=runs,
        stateful_step_count=min(args.steps, STEPS_PER_RUN),
        deadline=None,
        database=None,
        derandomize=False,
        print_blob=True,
        report_multiple_bugs=False,
        phases=[Phase.generate]
        if getattr(args, "no_shrink", False)
        else [Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    started = time.perf_counter()
    ok = True
    shrink_s = int(getattr(args, "shrink_seconds", SHRINK_SECONDS))
    with _mutant(args.mutant), _shrink_budget(shrink_s):
        try:
            captured = io.StringIO()
            # A seed's steps depend on the seed alone, in any process (seeded.py).
            with contextlib.redirect_stdout(captured), no_source_constants():
                run_machine(machine, settings=config)
        except AdapterError:
            raise  # not a factory of the protocol: a usage error, not the engine's failure
        except Exception as failure:  # any escape is the finding to report
            if last is not None and isinstance(failure, SelfCheckFailed):
                last.judged = failure.trace
            _report_failure(out, args, failure, captured.getvalue())
            ok = False
        else:
            ok = _report_dropped(out, args, dropped, captured.getvalue())
    seconds = time.perf_counter() - started
    if ok:
        ranks = f", {args.tp} ranks" if _ranks(args) > 1 else ""
        print(
            f"fuzz: seed {args.seed}, plane {args.plane}{ranks}: {coverage.runs} runs, "
            f"{coverage.steps} steps, {coverage.events} trace events in {seconds:.1f} s "
            f"({coverage.steps / seconds:.0f} steps/s, {coverage.events / seconds:.0f} "
            f"transitions/s)",
            file=out,
        )
        print(f"trace digest: {coverage.digest}", file=out)
        print(coverage.selfcheck.summary(), file=out)
        if args.report:
            print(coverage.report(), file=out)
    if last is not None:
        print(last.write(), file=out)
    return FuzzResult(
        ok,
        coverage.runs,
        coverage.steps,
        coverage.events,
        seconds,
        coverage.digest,
        out.getvalue(),
        coverage.selfcheck,
    )


def run(args: argparse.Namespace, out: io.TextIOBase | Any = None) -> int:
    """Run the machine as `args` say; print the summary (or the failure) to `out`; the exit
    status (FuzzResult.status)."""
    result = fuzz(args)
    print(result.text, end="", file=out or sys.stdout)
    return result.status


@contextlib.contextmanager
def _shrink_budget(seconds: int) -> Iterator[None]:
    """Hypothesis' shrink time limit set to `seconds` inside the block (its module constant,
    left monkeypatchable for this: hypothesis.internal.conjecture.engine)."""
    from hypothesis.internal.conjecture import engine

    was = engine.MAX_SHRINKING_SECONDS
    engine.MAX_SHRINKING_SECONDS = seconds
    try:
        yield
    finally:
        engine.MAX_SHRINKING_SECONDS = was


def _keeping_dropped(machine: Any, dropped: list[BaseException]) -> Any:
    """`machine` whose teardown keeps, in `dropped`, what it raises at the end of a run
    Hypothesis ended for its draws (StopTest): Hypothesis drops such a run, failure and all,
    so a check made at teardown (the self-check, the engine's close) would go unreported."""
    from hypothesis.errors import StopTest

    class Kept(machine):  # type: ignore[misc]
        def teardown(self) -> None:
            ending = sys.exc_info()[1]
            try:
                super().teardown()
            except Exception as failed:
                if isinstance(ending, StopTest):
                    dropped.append(failed)
                raise

    Kept.__name__ = Kept.__qualname__ = machine.__name__
    return Kept


def _report_dropped(
    out: Any, args: argparse.Namespace, dropped: list[BaseException], printed: str
) -> bool:
    """Whether no failure was dropped (`_keeping_dropped`); else the first is reported here,
    unshrunk (the seed's replay line runs it again)."""
    if not dropped:
        return True
    print(
        f"a run Hypothesis ended for its draws failed at its teardown ({len(dropped)} such): "
        "Hypothesis drops such a run, so it is not shrunk",
        file=out,
    )
    _report_failure(out, args, dropped[0], printed)
    return False


def _report_failure(
    out: Any, args: argparse.Namespace, failure: BaseException, printed: str
) -> None:
    ranks = f", {args.tp} ranks" if _ranks(args) > 1 else ""
    print(f"fuzz: FAILED with seed {args.seed} on the {args.plane} plane{ranks}", file=out)
    # Hypothesis prints warnings (a slow shrink) and may attach the steps as notes instead
    # of printing them: keep both.
    notes = [n for n in getattr(failure, "__notes__", []) if n.strip() and n.strip() not in printed]
    steps = "\n".join([printed.strip()] * bool(printed.strip()) + notes)
    stopped = SHRINK_STOPPED in steps
    if stopped:  # its warning (about five minutes) replaced by what happened
        steps = "\n".join(line for line in steps.splitlines() if not _hypothesis_warning(line))
        seconds = getattr(args, "shrink_seconds", SHRINK_SECONDS)
        print(
            f"shrinking stopped: its budget (--shrink-seconds {seconds}) ran out; the failure "
            "as shrunk so far",
            file=out,
        )
    print("steps:" if getattr(args, "no_shrink", False) else "shrunk steps:", file=out)
    for line in steps.splitlines():
        print(f"  {line}", file=out)
    print(f"error: {type(failure).__name__}: {failure}", file=out)
    print(f"replay: {replay_command(args)}", file=out)
    if stopped:
        unshrunk = arguments(**{**vars(args), "no_shrink": True})
        print(f"unshrunk: {replay_command(unshrunk)}", file=out)


def _hypothesis_warning(line: str) -> bool:
    """A line of Hypothesis' slow-shrink warning (SHRINK_STOPPED), or a blank one."""
    return not line.strip() or any(
        w in line for w in ("WARNING: Hypothesis", "progress.  When", "PLEASE REPORT", "provide a")
    )


def parser() -> argparse.ArgumentParser:
    nightly = os.environ.get("HICACHE_HYPOTHESIS_PROFILE") == "fuzz"
    p = UsageParser(prog="hicache fuzz", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument(
        "--seed", type=int, default=0, help="the seed (same seed: same runs, same trace)"
    )
    p.add_argument(
        "--steps",
        type=int,
        default=NIGHTLY_STEPS if nightly else DEFAULT_STEPS,
        help=f"the step budget: N // {STEPS_PER_RUN} runs (at least {MIN_RUNS}) of at most "
        f"{STEPS_PER_RUN} steps; a run may end sooner, and the summary counts the "
        "steps run",
    )
    p.add_argument("--plane", choices=("null", "cpu", "cuda"), default="null")
    p.add_argument("--adapter", metavar="MODULE:FACTORY", help="another engine's adapter factory")
    p.add_argument(
        "--pools",
        default=SINGLE_POOL,
        metavar="PRESET",
        help=(
            "the tiers' pool group preset of spec/pools.toml whose anchor pages are the machine's "
            "4 tokens: mha, or a -tiny one (dsv4-tiny, dsv41-tiny, mla-tiny, ...)"
        ),
    )
    p.add_argument(
        "--tp",
        type=int,
        default=1,
        metavar="RANKS",
        help=(
            "a tensor-parallel cache of RANKS simulated ranks (2 or more; 1: one cache), each "
            "with its own faults, the cross-rank invariants checked after every step"
        ),
    )
    p.add_argument(
        "--report", action="store_true", help="per-transition, per-state, per-site counts"
    )
    p.add_argument(
        "--progress", action="store_true", help="progress lines on stderr even when not a terminal"
    )
    p.add_argument(
        "--no-shrink",
        action="store_true",
        help="report a failing run as found, without shrinking it (faster: a catch-or-not "
        "check; the replay line finds the same run)",
    )
    p.add_argument(
        "--shrink-seconds",
        type=int,
        default=SHRINK_SECONDS,
        metavar="S",
        help="stop shrinking a failure after S seconds and report it as shrunk so far, with "
        "its replay line and the unshrunk run's (--no-shrink)",
    )
    p.add_argument(
        "--trace",
        type=OUTPUT_FILE,
        metavar="FILE",
        help=(
            f"write one run's trace (a run: up to {STEPS_PER_RUN} steps) to FILE, header first, "
            "for `hicache check-trace`: on a failure the failing run as Hypothesis shrank it (the "
            "one to debug), else the last run; of a run that restarted its engine, the last "
            "engine's (nothing survives a restart)"
        ),
    )
    p.add_argument(
        "--mutant",
        metavar="NAME",
        help="run the bug zoo instead: a mutant's name, 'list' or 'all' "
        "(see hicache.testing.zoo: --seed may repeat, --machine picks the "
        "machine); with --plane, --pools, --tp or --adapter, this run with "
        "the mutant switched on (a failure's replay line). With --mutant the exit "
        "status says whether the mutant was caught: 0 caught (on every seed, of every "
        "mutant for 'all'), 1 it escaped",
    )
    return p


RUN_ONLY = (
    "--plane",
    "--adapter",
    "--pools",
    "--tp",
    "--report",
    "--progress",
    "--trace",
    "--no-shrink",
    "--shrink-seconds",
)
"""Options only a machine run has: with `--mutant` and one of them, the run goes on with the
mutant switched on (what a failure's replay line asks for), not to the bug zoo."""


def main(argv: Sequence[str]) -> int:
    with every_plane_walked():  # every step of every run through the tables' machine
        return _main(argv)


def _main(argv: Sequence[str]) -> int:
    mutant = any(a == "--mutant" or a.startswith("--mutant=") for a in argv)
    if mutant and not any(a.split("=")[0] in RUN_ONLY for a in argv):
        # The bug zoo has its own options (repeated --seed, --machine) and exit statuses.
        from hicache.testing import zoo

        return zoo.main(list(argv))
    args = parser().parse_args(list(argv))
    if args.steps < 1:
        print("hicache fuzz: --steps must be >= 1", file=sys.stderr)
        return 2
    if args.seed < 0:  # Python's random seeds by |seed|: -1 would replay seed 1
        print("hicache fuzz: --seed must be >= 0", file=sys.stderr)
        return 2
    if args.plane == "cuda" and not _cuda():
        print("hicache fuzz: --plane cuda needs a CUDA device", file=sys.stderr)
        return 2
    if args.pools != SINGLE_POOL and args.adapter:
        print(
            "hicache fuzz: --pools sets the hicache controller's pool group; another "
            "engine's adapter (--adapter) draws its own setup: leave one out",
            file=sys.stderr,
        )
        return 2
    if args.tp < 1 or (args.tp > 1 and args.adapter):
        print(
            "hicache fuzz: --tp needs RANKS >= 1, and drives the hicache controller's ranks "
            "(not an --adapter's engine)",
            file=sys.stderr,
        )
        return 2
    if args.pools != SINGLE_POOL:
        from hicache.testing.adapters.controller import check_preset

        try:
            check_preset(args.pools)  # before any run: a preset the machine cannot draw
        except ConfigError as e:
            print(f"hicache fuzz: {e}", file=sys.stderr)
            return 2
    try:
        status = run(args)
    except ConfigError as e:
        print(f"hicache fuzz: {e}", file=sys.stderr)
        return 2
    if args.mutant is None:
        return status
    caught = status == 1  # the run failed: the machine caught the mutant (zoo.main's meaning)
    print(f"mutant {args.mutant}: {'caught' if caught else 'NOT caught: it escaped'}")
    return 0 if caught else 1


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())
