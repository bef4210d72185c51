"""The `hicache` command line.

    hicache spec check [--spec-dir DIR]             drift check; OK + counts, or each difference
    hicache spec diagram [--which NAME] [--spec-dir DIR]   print Mermaid diagrams
    hicache spec write-diagrams [--spec-dir DIR]    refresh the generated blocks in lifecycle.md
    hicache invariants                              the registered checks: id, name, one line
    hicache bench NAME [ARGS...]                    delegated: hicache.bench.NAME.main(ARGS)
    hicache check-trace FILE [ARGS...]              hicache.oracle.checktrace.command.main
    hicache demo [ARGS...]                          delegated: hicache.app.demo.main(ARGS)
    hicache fuzz [ARGS...]                          delegated: hicache.testing.runner.main(ARGS)
    hicache hypofuzz [ARGS...]                      delegated: hicache.testing.hypofuzz_command
    hicache vectors generate|run [ARGS...]          hicache.oracle.vectors.generate/run.main
    hicache model-check [ARGS...]                   hicache.oracle.modelcheck.cli.main(ARGS)
    hicache pools [PRESET]                          delegated: hicache.pools.command.main(ARGS)
    hicache --version                               the installed package's version

Exit status: 0 success, 1 the spec has drifted, 2 a usage or input error (one line on stderr
naming the option), 130 interrupted (Ctrl-C; one line on stderr), 141 stdout was closed early
(`hicache invariants | head -1`; nothing on stderr, as a Unix tool cut off by SIGPIPE).
Delegated commands live in `DELEGATED`; their modules are imported only when run, so
`hicache spec check` needs neither torch nor the data plane.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from hicache.app.extras import install_hint, is_optional
from hicache.app.usage import EXIT_USAGE, UsageParser
from hicache.core.diagram import DIAGRAMS, all_diagrams, diagram, replace_blocks
from hicache.core.lifecycle import Lifecycle
from hicache.errors import HiCacheError, SpecError
from hicache.oracle.speccheck import PROPERTIES, check_spec, registry_checks, spec_counts
from hicache.oracle.speccheck.rulenumbers import defined_rules
from hicache.spec import SPEC_DIR, load_toml

DELEGATED: dict[tuple[str, ...], str] = {
    ("bench", "control"): "hicache.bench.control",
    ("bench", "invariants"): "hicache.bench.invariants",
    ("bench", "kernels"): "hicache.bench.kernels",
    ("bench", "storage"): "hicache.bench.storage",
    ("bench", "transfer"): "hicache.bench.transfer",
    ("bench", "recompute"): "hicache.bench.recompute",
    ("bench", "serving"): "hicache.bench.serving",
    ("bench", "checktrace"): "hicache.bench.checktrace",
    ("check-trace",): "hicache.oracle.checktrace.command",
    ("bench", "vectors"): "hicache.bench.vectors",
    ("demo",): "hicache.app.demo",
    ("fuzz",): "hicache.testing.runner",
    ("hypofuzz",): "hicache.testing.hypofuzz_command",
    ("vectors", "generate"): "hicache.oracle.vectors.generate",
    ("vectors", "run"): "hicache.oracle.vectors.run",
    ("model-check",): "hicache.oracle.modelcheck.cli",
    ("pools",): "hicache.pools.command",
}
"""Command words -> module whose `main(argv: list[str]) -> int | None` runs the command.
One word (`("demo",)`) makes a top-level command; two make a subcommand of the first."""

SUMMARIES: dict[tuple[str, ...], str] = {
    ("bench",): "benchmarks of hicache's own code (`hicache bench NAME --help` for each)",
    ("bench", "control"): "time the radix tree's match and insert on the CPU",
    ("bench", "invariants"): "time the invariant checks on synthetic snapshots of N pages",
    ("bench", "kernels"): "gather/scatter GB/s against a device copy (needs CUDA)",
    ("bench", "storage"): "L3 file write/read GB/s against raw pwrite/preadv",
    ("bench", "transfer"): "L1<->L2 DMA, L3 and kernels in one report (needs CUDA; --quick on CPU)",
    ("bench", "recompute"): "prefill latency of the model producer (needs CUDA)",
    ("bench", "serving"): "restore vs recompute through the controller (needs CUDA)",
    (
        "bench",
        "checktrace",
    ): "check-trace events/s: every check, every N events, none, JSON parsing alone",
    (
        "check-trace",
    ): "judge a trace (FILE or -) against the reference: exit 0 valid, 1 violation, 2 malformed",
    ("bench", "vectors"): "conformance vectors per second through the controller adapter",
    ("demo",): "serve a shared-prefix workload through L1/L2/L3 and report what happened",
    (
        "fuzz",
    ): "fuzz the controller (or an adapter) against the spec: --seed --steps --plane --report",
    (
        "hypofuzz",
    ): "the fuzz machines under HypoFuzz on every core (the fuzz extra): -n --seconds --stats",
    ("vectors",): "conformance vectors: write them, or check an engine's adapter against them",
    ("vectors", "generate"): "write conformance cases and their manifest into DIR (--count --seed)",
    (
        "vectors",
        "run",
    ): "drive an adapter (--adapter module:Name) through DIR's cases; exit 1 on a failure",
    (
        "model-check",
    ): "explore every reachable control-plane state of a small config: --config NAME",
    ("pools",): "the pool-group presets of spec/pools.toml, or one preset's table",
}
"""Command words -> the one line `--help` shows for them (a command without one shows its
module's name)."""

EXIT_DRIFT = 1
EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130: what a shell reports for a command ended by Ctrl-C
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # 141: a tool cut off by `| head` (SIGPIPE)


class UsageError(HiCacheError):
    """A command-line option or argument is wrong; the message names it."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status (the console script exits with it).

    Ctrl-C ends any command with one line on stderr and status 130; a reader that closes
    stdout early (`| head`) ends it quietly with status 141, as Unix tools do."""
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        status = _dispatch(words)
        sys.stdout.flush()  # a reader gone away shows here, not at interpreter exit
        return status
    except KeyboardInterrupt:
        print(f"{_command_name(words)}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_BROKEN_PIPE


def _dispatch(words: list[str]) -> int:
    try:
        delegated = _delegated(words)
        if delegated is not None:
            return _run_module(*delegated)
        try:
            args = build_parser().parse_args(words)
        except SystemExit as e:  # argparse's own exit: --help (0) or a usage error (2)
            return e.code if isinstance(e.code, int) else EXIT_USAGE
        handler: Callable[[argparse.Namespace], int] = args.handler
        return handler(args)
    except HiCacheError as e:
        print(f"hicache: error: {e}", file=sys.stderr)
        return EXIT_USAGE


def _command_name(words: list[str]) -> str:
    """`hicache` and the command words, as messages name the command (`hicache demo`)."""
    for n in (2, 1):
        if tuple(words[:n]) in DELEGATED:
            return " ".join(["hicache", *words[:n]])
    command = [w for w in words[:1] if not w.startswith("-")]
    return " ".join(["hicache", *command])


def _discard_stdout() -> None:
    """Point stdout at /dev/null: Python flushes it again at exit, and that flush would raise
    BrokenPipeError once more (the recipe of the Python docs' note on SIGPIPE)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):
        return  # not a real file (a test's capture): nothing is flushed to a pipe at exit
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def _version() -> str:
    try:
        return importlib.metadata.version("hicache")
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown: the package is not installed; `pip install -e .`)"


def build_parser() -> argparse.ArgumentParser:
    parser = UsageParser(prog="hicache", description="Executable spec of a hierarchical KV cache.")
    parser.add_argument("--version", action="version", version=f"hicache {_version()}")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=UsageParser
    )
    spec = commands.add_parser("spec", help="check the spec, print or refresh its diagrams")
    spec_commands = spec.add_subparsers(
        dest="spec_command", required=True, metavar="ACTION", parser_class=UsageParser
    )
    check = spec_commands.add_parser(
        "check", help="fail on any drift between tables, prose, diagrams and code"
    )
    check.set_defaults(handler=_spec_check)
    show = spec_commands.add_parser("diagram", help="print Mermaid stateDiagram-v2 text")
    show.add_argument(
        "--which", choices=(*DIAGRAMS, "all"), default="all", help="which diagram (default: all)"
    )
    show.set_defaults(handler=_spec_diagram)
    write = spec_commands.add_parser(
        "write-diagrams", help="rewrite the generated blocks in lifecycle.md"
    )
    write.set_defaults(handler=_spec_write_diagrams)
    for sub in (check, show, write):
        sub.add_argument(
            "--spec-dir",
            type=Path,
            default=SPEC_DIR,
            metavar="DIR",
            help="spec directory to use (default: the installed spec)",
        )
    inv = commands.add_parser(
        "invariants", help="list the registered invariant and structural checks"
    )
    inv.set_defaults(handler=_invariants)
    _add_delegated(commands)
    return parser


def _delegated(words: list[str]) -> tuple[str, list[str]] | None:
    """(module, its argv) when `words` start with a DELEGATED command, else None.

    Dispatched before argparse so that every remaining word, options included, reaches the
    module untouched (argparse would claim a leading `-x` as its own)."""
    for n in (2, 1):
        module = DELEGATED.get(tuple(words[:n])) if len(words) >= n else None
        if module is not None:
            return module, words[n:]
    return None


def _add_delegated(commands: argparse._SubParsersAction[UsageParser]) -> None:
    """One parser per delegated command, for `--help` and usage errors only (`_delegated`
    runs the command before argparse sees it)."""
    groups: dict[str, list[tuple[str, ...]]] = {}
    for words in DELEGATED:
        if len(words) == 1:
            _add_passthrough(commands, words)
        else:
            groups.setdefault(words[0], []).append(words)
    for group, members in groups.items():
        cmd = commands.add_parser(
            group, help=SUMMARIES.get((group,), group), description=SUMMARIES.get((group,))
        )
        names = cmd.add_subparsers(
            dest="name", required=True, metavar="NAME", parser_class=UsageParser
        )
        for words in sorted(members):
            _add_passthrough(names, words)


def _add_passthrough(
    commands: argparse._SubParsersAction[UsageParser], words: tuple[str, ...]
) -> None:
    module = DELEGATED[words]
    cmd = commands.add_parser(words[-1], help=SUMMARIES.get(words, f"run {module}"), add_help=False)
    cmd.add_argument("args", nargs="*", help=f"passed to {module}.main ({words[-1]} --help)")
    cmd.set_defaults(handler=_not_dispatched)


# -- handlers -----------------------------------------------------------------------------------


def _spec_dir(args: argparse.Namespace) -> Path:
    spec_dir: Path = args.spec_dir
    if not (spec_dir / "lifecycle.toml").is_file():
        raise UsageError(f"--spec-dir {spec_dir}: no lifecycle.toml there")
    return spec_dir


def _lifecycle(spec_dir: Path) -> Lifecycle:
    try:
        return Lifecycle(load_toml(spec_dir / "lifecycle.toml"))
    except (ValueError, KeyError, TypeError) as e:
        raise SpecError(
            f"{spec_dir / 'lifecycle.toml'}: cannot be loaded ({type(e).__name__}: {e})"
        ) from e


def _spec_check(args: argparse.Namespace) -> int:
    spec_dir = _spec_dir(args)
    problems = check_spec(spec_dir)
    if problems:
        for line in problems:
            print(line)
        print(f"{len(problems)} difference(s) in {spec_dir}", file=sys.stderr)
        return EXIT_DRIFT
    lc = _lifecycle(spec_dir)
    counts = spec_counts(lc)
    checks = registry_checks()  # importable: check_spec found no difference, so it was read
    n_checks = 0 if isinstance(checks, str) else len(checks)
    rules, _ = defined_rules((spec_dir / "SUMMARY.md").read_text(encoding="utf-8"))
    print(
        f"OK: {len(lc.ownership_states)} ownership states, "
        f"{sum(len(s) for s in lc.states.values())} residency states, "
        f"{counts['TRANSITIONS']} transitions, {counts['COMPOSITE_STATES']} composite states, "
        f"{counts['COMPOSITE_EDGES']} composite edges, {len(DIAGRAMS)} diagrams, "
        f"{n_checks} invariant checks, {len(PROPERTIES)} table properties proven, "
        f"{len(rules)} rules numbered and cited by code"
    )
    return 0


def _spec_diagram(args: argparse.Namespace) -> int:
    lc = _lifecycle(_spec_dir(args))
    if args.which != "all":
        print(diagram(lc, args.which), end="")
        return 0
    texts = [f"%% {name}\n{text}" for name, text in all_diagrams(lc).items()]
    print("\n".join(texts), end="")
    return 0


def _spec_write_diagrams(args: argparse.Namespace) -> int:
    spec_dir = _spec_dir(args)
    path = spec_dir / "lifecycle.md"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise UsageError(
            f"--spec-dir {spec_dir}: cannot read lifecycle.md ({e.strerror or e})"
        ) from e
    new_text, changed = replace_blocks(text, all_diagrams(_lifecycle(spec_dir)))
    if changed:
        try:
            path.write_text(new_text, encoding="utf-8")
        except OSError as e:
            raise UsageError(
                f"--spec-dir {spec_dir}: cannot write lifecycle.md ({e.strerror or e})"
            ) from e
        print(f"rewrote {', '.join(changed)} in {path}")
    else:
        print(f"{path}: every diagram is current")
    return 0


def _invariants(args: argparse.Namespace) -> int:
    checks = registry_checks()
    if isinstance(checks, str):
        raise UsageError(checks)
    width = max(len(c.name) for c in checks)
    for c in checks:
        print(f"{c.id:<3} {c.name:<{width}}  {c.summary}")
    return 0


def _not_dispatched(args: argparse.Namespace) -> int:
    # Delegated commands are dispatched by `_delegated` before parsing; argparse only gets
    # here for a command word it accepted but that no DELEGATED key matches.
    raise UsageError(f"{args.command}: no such command in DELEGATED")


def _run_module(module: str, argv: list[str]) -> int:
    """Import `module` now (heavy modules stay unloaded for other commands) and run its main."""
    try:
        entry = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if is_optional(e.name):
            raise UsageError(install_hint(module, str(e.name))) from e
        raise UsageError(f"{module} cannot be imported: no module named {e.name!r}") from e
    run = getattr(entry, "main", None)
    if not callable(run):
        raise UsageError(f"{module} has no main(argv) function")
    try:
        status = run(argv)
    except ModuleNotFoundError as e:  # a command importing an optional dependency lazily
        if not is_optional(e.name):
            raise
        raise UsageError(install_hint(module, str(e.name))) from e
    return int(status or 0)
