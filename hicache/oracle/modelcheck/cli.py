"""`hicache model-check`: explore a configuration exhaustively and say what was found.

    hicache model-check --config NAME [--trace-out FILE] [--lifecycle FILE]
                        [--reduction symmetric|canonical|none] [--max-states N] [--max-depth N]
                        [--verify-refusals N] [--configs FILE]
    hicache model-check --list

A configuration with `ranks` > 1 runs the TP model (tpsearch.py, tpcli.py): --max-states
applies; --reduction, --max-depth and --verify-refusals are the one-plane search's own.

Exit status: 0 the search was exhaustive, found nothing and (with the shipped tables) gave the
manifest's counts; 1 a finding (its shortest path as a trace: to --trace-out FILE, or printed
after the report), or counts that differ from the manifest; 2 a usage error (one line).
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from hicache.app.outputs import OUTPUT_FILE
from hicache.app.usage import EXIT_USAGE, UsageParser
from hicache.core.lifecycle import Lifecycle, load_lifecycle
from hicache.errors import ConfigError, HiCacheError
from hicache.oracle.modelcheck.config import CONFIGS_TOML, ModelConfig, get_config, load_configs
from hicache.oracle.modelcheck.counterexample import write_trace
from hicache.oracle.modelcheck.coverage import composite_edges, graph_edges, spec_transitions
from hicache.oracle.modelcheck.search import REDUCTIONS, VERIFY_REFUSALS, Result, explore
from hicache.oracle.modelcheck.tpcli import compare_counts, ending, run_tp

EXIT_OK, EXIT_FOUND = 0, 1
SHOW_UNSEEN = 20  # composite edges not taken are listed up to this many (else only counted)


def _parser() -> argparse.ArgumentParser:
    p = UsageParser(
        prog="hicache model-check",
        description="Explore every reachable state of the "
        "control plane for a small configuration (hicache/oracle/modelcheck/configs.toml).",
    )
    p.add_argument("--config", help="configuration name (--list shows them)")
    p.add_argument(
        "--list", action="store_true", help="list the configurations and their expected counts"
    )
    p.add_argument(
        "--configs",
        type=Path,
        default=CONFIGS_TOML,
        help="manifest file (default: the shipped one)",
    )
    p.add_argument(
        "--lifecycle", type=Path, help="lifecycle tables to check instead of spec/lifecycle.toml"
    )
    p.add_argument(
        "--trace-out", type=OUTPUT_FILE, help="write a finding's trace here (default: print it)"
    )
    p.add_argument(
        "--reduction",
        choices=REDUCTIONS,
        default="symmetric",
        help="state key (default: symmetric)",
    )
    p.add_argument(
        "--max-states",
        type=_positive,
        help="keep at most N states: a new one beyond them ends the search (stopped early)",
        metavar="N",
    )
    p.add_argument(
        "--max-depth", type=_positive, metavar="N", help="stop at this BFS depth (not exhaustive)"
    )
    p.add_argument(
        "--verify-refusals",
        type=_non_negative,
        default=VERIFY_REFUSALS,
        metavar="N",
        help=(
            "check that every N-th refused call changed nothing "
            f"(0: never; default {VERIFY_REFUSALS})"
        ),
    )
    return p


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def _non_negative(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (0: never)")
    return int(text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.list:
            for cfg in _read("--configs", lambda: load_configs(args.configs)).values():
                print(_describe(cfg))
            return EXIT_OK
        if args.config is None:
            parser.error("--config NAME is required (or --list)")
        if args.reduction == "none" and args.max_depth is None and args.max_states is None:
            parser.error(
                "--reduction none never ends on its own (ids and LRU ticks grow without "
                "bound): give --max-depth or --max-states"
            )
        cfg = _read("--configs", lambda: get_config(args.config, args.configs))
        lifecycle = (
            None
            if args.lifecycle is None
            else _read("--lifecycle", lambda: load_lifecycle(args.lifecycle))
        )
    except HiCacheError as e:
        print(f"hicache model-check: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if cfg.ranks > 1:  # the TP model: simulated ranks, C2, C4 and C5 across them
        if args.max_depth is not None or args.reduction != "symmetric" or args.trace_out:
            parser.error(
                f"{cfg.name} has {cfg.ranks} ranks (the TP model): it takes --max-states and "
                "--lifecycle; --max-depth, --reduction and --trace-out are the one-plane "
                "search's"
            )
        return run_tp(cfg, lifecycle, args.max_states)
    res = explore(
        cfg,
        lifecycle=lifecycle,
        reduction=args.reduction,
        max_states=args.max_states,
        max_depth=args.max_depth,
        verify_refusals=args.verify_refusals,
    )
    print(summary(res))
    if res.finding is not None:
        trace_out = None if args.trace_out is None else Path(args.trace_out)
        return _report_finding(res, lifecycle, trace_out)
    print(coverage_line(res, lifecycle or load_lifecycle()))
    return _compare(res, shipped=lifecycle is None and args.reduction == "symmetric")


T = TypeVar("T")


def _read(option: str, load: Callable[[], T]) -> T:
    """`load()`, with an unreadable or malformed file (not found, not TOML, a table missing a
    key) as a ConfigError naming `option`."""
    try:
        return load()
    except ConfigError as e:
        if e.field.startswith("--"):
            raise  # an option's own error (--config: not a configuration), not the file's
        raise ConfigError(option, f"cannot read it: {e}") from None
    except KeyError as e:
        raise ConfigError(option, f"cannot read it: a table lacks the key {e}") from None
    except (OSError, ValueError, TypeError) as e:  # tomllib's errors are ValueErrors
        raise ConfigError(option, f"cannot read it: {e}") from None


def summary(res: Result) -> str:
    """One line: the counts, the time, states/s and how the search ended."""
    how = ending(res.exhaustive, None if res.finding is None else res.finding.kind)
    return (
        f"model-check {res.config.name}: {res.states} states, {res.edges} edges, depth "
        f"{res.depth}, {res.seconds:.2f} s, {res.states_per_s:,.0f} states/s, {res.refusals} "
        f"refusals ({res.refusals_verified} verified unchanged); {how}"
    )


def coverage_line(res: Result, lc: Lifecycle) -> str:
    """Which spec transitions the search fired, and which it did not."""
    names = spec_transitions(lc)
    missing = [n for n in names if n not in res.fired]
    graph = graph_edges(lc)
    unseen = sorted(graph - composite_edges(lc, res.steps))
    return (
        f"transitions fired: {len(names) - len(missing)}/{len(names)}"
        + (f" (not fired: {', '.join(missing)})" if missing else " (every one)")
        + f"; composite edges taken: {len(graph) - len(unseen)}/{len(graph)}"
        + (
            f" (not taken: {', '.join(f'{b} --{t}--> {a}' for b, t, a in unseen)})"
            if 0 < len(unseen) <= SHOW_UNSEEN
            else " (every one)"
            if not unseen
            else ""
        )
    )


def _describe(cfg: ModelConfig) -> str:
    exp = cfg.expected
    counts = (
        "no expected counts"
        if exp is None
        else f"{exp.states} states, {exp.edges} edges, depth {exp.depth}"
    )
    return (
        f"{cfg.name:8s} page_size {cfg.page_size}, capacities {list(cfg.capacities)}, "
        + (f"{cfg.ranks} ranks, " if cfg.ranks > 1 else "")
        + f"{cfg.requests} request(s), prompts {[list(p) for p in cfg.prompts]}; {counts}"
        f"{'; in CI' if cfg.ci else ''}"
    )


def _report_finding(res: Result, lifecycle: Lifecycle | None, trace_out: Path | None) -> int:
    f = res.finding
    assert f is not None  # Verify: called only with a finding.
    print(f"finding ({f.kind}): {f.message}")
    print(f"shortest path ({len(f.path)} actions):")
    for i, a in enumerate(f.path, 1):
        print(f"  {i:3d}. {a}")
    buf = io.StringIO()
    ended = write_trace(res.config, f, buf, lifecycle)
    print(f"replayed: {ended}")
    if trace_out is not None:
        trace_out.write_text(buf.getvalue())
        print(
            f"trace: {trace_out} ({buf.getvalue().count(chr(10))} lines; "
            f"`hicache check-trace {trace_out}`)"
        )
    else:
        print("trace:")
        sys.stdout.write(buf.getvalue())
    return EXIT_FOUND


def _compare(res: Result, shipped: bool) -> int:
    """Exit status of a clean search: 1 when counts differ from the manifest (shipped tables,
    full reduction, exhaustive search only: other searches have no expected counts)."""
    got = (res.states, res.edges, res.depth)
    return compare_counts(res.config, got, res.exhaustive and shipped)
