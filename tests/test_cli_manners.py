"""Every `hicache` command's manners, found from the parsers themselves so that a new command
or option is held to them without a line added here:

- a usage error is one line on stderr, exit status 2, no traceback (`hicache.app.usage`);
- every option naming a file or directory the command writes is checked while the command
  line is parsed, before any work: given a path that cannot be written, the command exits 2
  at once, naming the option, printing nothing on stdout and creating nothing
  (`hicache.app.outputs`). `hicache demo --json DIR/x.json` into an unwritable directory used to
  serve the whole workload and end in a traceback; `bench control --out` the same.

The parsers are found by running each command of `hicache.app.cli.DELEGATED` (and the built-in
ones) with `argparse.ArgumentParser.parse_args` stopped at its first call: what it would
parse with is the parser the command builds.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hicache.app import cli
from hicache.app.outputs import OutputPath
from hicache.app.usage import EXIT_USAGE, UsageParser

pytest.importorskip("torch", reason="the commands import the data plane")

MODES: dict[tuple[str, ...], list[list[str]]] = {("fuzz",): [[], ["--mutant", "list"]]}
"""Commands with more than one parser, and the words that reach each (`fuzz --mutant` is
the bug zoo's command line)."""

BUILT_IN = [["spec", "check"]]
"""Words that reach the top-level parser, whose subcommands (spec, invariants) are walked."""

PATH_LIKE = re.compile(r"^(out|json|prometheus|trace|trace_out|dir|file|.*_(path|dir|file))$")
"""Option destinations that name a path: each is an output (typed OutputPath) or in INPUTS."""

INPUTS = {
    ("spec", "check", "spec_dir"),
    ("spec", "diagram", "spec_dir"),
    ("spec", "write-diagrams", "spec_dir"),
    ("check-trace", "file"),
    ("vectors", "run", "dir"),
}
"""(command words..., dest) of path options a command reads: checked when read (missing
inputs: `test_usage_errors_are_one_line_and_status_2`)."""


class _Built(Exception):
    """Raised by the first parse_args call: carries the parser a command built."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def _stop(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> argparse.Namespace:
    raise _Built(self)


def built_parser(words: list[str]) -> argparse.ArgumentParser | None:
    """The parser `hicache WORDS` parses its command line with (nothing else runs), or None
    when the command cannot start here (an optional dependency is missing: cli says which)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(argparse.ArgumentParser, "parse_args", _stop)
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                cli.main(words)
        except _Built as built:
            return built.parser
    return None


def walk(
    words: tuple[str, ...], parser: argparse.ArgumentParser
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """(command words, parser) for `parser` and every subcommand under it, but the
    delegated commands' stand-ins (their own parsers are found by running them)."""
    yield words, parser
    delegated = {command[0] for command in cli.DELEGATED}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for word, sub in action.choices.items():
                if words or word not in delegated:
                    yield from walk((*words, word), sub)


def every_parser() -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """(command words, parser) of every command that starts here, delegated and built-in;
    the others in NOT_STARTED."""
    found = []
    for words in cli.DELEGATED:
        for extra in MODES.get(words, [[]]):
            parser = built_parser([*words, *extra])
            if parser is None:
                NOT_STARTED.append([*words, *extra])
            else:
                found.append((words, parser))
    for built_in in BUILT_IN:
        top = built_parser(built_in)
        assert top is not None, "the built-in commands need nothing optional"
        found += list(walk((), top))
    return found


NOT_STARTED: list[list[str]] = []
PARSERS = every_parser()
STARTED = {words for words, _ in PARSERS}


def run(argv: list[str]) -> tuple[int, str, str, float]:
    """`hicache ARGV` in this process: (exit status, stdout, stderr, seconds)."""
    out, err = io.StringIO(), io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli.main(argv)
        except SystemExit as e:  # a delegated command's argparse exits itself
            status = e.code if isinstance(e.code, int) else EXIT_USAGE
    return status, out.getvalue(), err.getvalue(), time.perf_counter() - started


def name(words: tuple[str, ...]) -> str:
    return " ".join(words) or "hicache"


@pytest.mark.parametrize("words, parser", PARSERS, ids=[name(w) for w, _ in PARSERS])
def test_every_parser_says_a_usage_error_in_one_line_with_status_2(
    words: tuple[str, ...], parser: argparse.ArgumentParser, capsys: pytest.CaptureFixture[str]
) -> None:
    """`hicache fuzz --bogus`, `hicache fuzz --mutant list --bogus` and `hicache pools --bogus`
    printed argparse's usage block before the error."""
    assert isinstance(parser, UsageParser), f"{name(words)}: build the parser from UsageParser"
    with pytest.raises(SystemExit) as done:
        parser.parse_args(["--no-such-option"])
    err = capsys.readouterr().err
    assert done.value.code == EXIT_USAGE and err.count("\n") == 1, err
    assert err.startswith(f"{parser.prog}: error: "), err


def outputs() -> list[tuple[tuple[str, ...], argparse.Action]]:
    """(command words, action) of every option or argument typed OutputPath."""
    found = []
    for words, parser in PARSERS:
        for action in parser._actions:
            if isinstance(action.type, OutputPath):
                found.append((words, action))
    return found


def test_every_path_option_is_an_output_or_a_known_input() -> None:
    """An option whose name says it is a path (--out, --json, --trace, --dir, ...) must be
    checked before the work (typed OutputPath), unless the command reads it."""
    unchecked = []
    for words, parser in PARSERS:
        for action in parser._actions:
            if PATH_LIKE.match(action.dest) and not isinstance(action.type, OutputPath):
                if (*words, action.dest) not in INPUTS:
                    unchecked.append(f"{name(words)} {action.dest}")
    assert unchecked == [], "type these with hicache.app.outputs, or list them in INPUTS"
    assert len(outputs()) >= 15  # demo 4, fuzz 1, model-check 1, vectors 1, bench 9


def bad_paths(kind: str, tmp_path: Path) -> list[Path]:
    """Paths an output of `kind` cannot be written at, each for another reason: its
    directory missing, a regular file where a directory must be, a directory where a file
    must be, and (on Linux) a place where not even root can make a file."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    proc = [Path("/proc/hicache-manners")] if sys.platform == "linux" else []
    if kind == "file":
        return [tmp_path / "no" / "x.json", afile / "x.json", tmp_path, *proc]
    if kind == "dir":
        return [afile, afile / "x", *[p / "x" for p in proc]]
    return [tmp_path / "no", afile, *[p.parent for p in proc]]


@pytest.mark.parametrize(
    "words, action",
    outputs(),
    ids=[
        f"{name(w)} {a.option_strings[0] if a.option_strings else a.metavar}" for w, a in outputs()
    ],
)
def test_an_output_that_cannot_be_written_is_refused_before_any_work(
    words: tuple[str, ...], action: argparse.Action, tmp_path: Path
) -> None:
    assert isinstance(action.type, OutputPath)
    option = action.option_strings[0] if action.option_strings else None
    for path in bad_paths(action.type.kind, tmp_path):
        before = sorted(tmp_path.rglob("*"))
        argv = [*words, *([option] if option else []), str(path)]
        status, out, err, seconds = run(argv)
        said = f"argument {option or action.metavar}: {path}: "
        assert (status, out, err.count("\n")) == (EXIT_USAGE, "", 1), (argv, out, err)
        assert said in err and err.endswith("; choose a writable path\n"), err
        assert seconds < 1.0, f"{argv}: {seconds:.2f} s: the work ran first"
        assert sorted(tmp_path.rglob("*")) == before, f"{argv} left files behind"


@pytest.mark.parametrize(
    "argv, says",
    [
        (["demo", "--requests", "x"], "argument --requests: invalid int value"),
        (["demo", "--quiet", "--requests", "1", "--l3-path", "/nonexistent/dir/x"], "--l3-path"),
        (["demo", "--quiet", "--geometry", "nope"], "--geometry: unknown preset"),
        (["demo", "--quiet", "--tp", "2", "--trace", "t.ndjson"], "--tp: --trace records"),
        (["fuzz", "--bogus"], "unrecognized arguments: --bogus"),
        (["fuzz", "--steps", "0"], "--steps must be >= 1"),
        (["fuzz", "--pools", "dsv4-tiny", "--adapter", "a:b"], "leave one out"),
        (["fuzz", "--adapter", "nope"], "--adapter: nope: give module:factory"),
        (["fuzz", "--mutant", "B01", "--steps", "0"], "argument --steps: at least 1"),
        (["fuzz", "--mutant", "B01", "--seed", "-1"], "argument --seed: each >= 0"),
        (["fuzz", "--mutant", "nope"], "no mutant named 'nope'"),
        (["pools", "--bogus"], "unrecognized arguments: --bogus"),
        (["pools", "nope"], "unknown preset 'nope'"),
        (["model-check", "--config", "nope"], "--config: 'nope' is not a configuration"),
        (["model-check", "--config", "tail", "--reduction", "none"], "give --max-depth"),
        (["model-check", "--config", "tail", "--configs", "/nonexistent"], "--configs: cannot"),
        (["check-trace", "/nonexistent"], "/nonexistent: No such file"),
        (["check-trace", "x", "--check-every", "-1"], "argument --check-every"),
        (["vectors", "run", "/nonexistent"], "DIR /nonexistent is not a directory"),
        (["vectors", "generate", "v", "--count", "0"], "--count: at least 1"),
        (["bench", "control", "--tokens", "1"], "--tokens: each size must be at least"),
        (["bench", "storage", "--tokens", "0"], "argument --tokens: at least 1, got 0"),
        (["bench", "storage", "--repeats", "0"], "argument --repeats: at least 1, got 0"),
        (
            ["bench", "storage", "--ceiling-threads", "0"],
            "argument --ceiling-threads: at least 1, got 0",
        ),
        (
            ["bench", "storage", "--direct", "--bytes-per-page", "3080"],
            "argument --direct: --bytes-per-page must be a multiple of 4096",
        ),
        (["bench", "transfer", "--out", "o", "--tokens", "abc"], "argument --tokens: 'abc'"),
        (["bench", "transfer", "--out", "o", "--first-chunk-mib", "1,x"], "'x' in '1,x'"),
        (["bench", "kernels", "--tokens", "0"], "argument --tokens: '0'"),
        (["bench", "vectors", "--count", "0"], "--count and --repeat: at least 1"),
        (["spec", "check", "--spec-dir", "/nonexistent"], "--spec-dir /nonexistent"),
    ],
)
def test_usage_errors_are_one_line_and_status_2(
    argv: list[str], says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A representative bad value, conflict or missing input per command. Before: `demo
    --l3-path /nonexistent/dir/x` exited 1 (a StorageError), `bench transfer --tokens abc`
    and `--first-chunk-mib 1,x` ended in a ValueError traceback, `bench storage --tokens 0`
    blamed 'l3.slots' and `--repeats 0` raised mid-run, `fuzz --mutant B01 --steps 0` ran
    nothing and exited 0, and `fuzz --bogus` and `pools --bogus` printed a usage block."""
    if not any(tuple(argv[:n]) in STARTED for n in (1, 2)):
        pytest.skip(f"hicache {argv[0]} cannot start here (an optional dependency is missing)")
    monkeypatch.chdir(tmp_path)
    status, out, err, _ = run(argv)
    assert (status, err.count("\n")) == (EXIT_USAGE, 1), (argv, out, err)
    assert says in err and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []  # nothing was made


def test_the_parsers_are_found() -> None:
    """The walk reaches every command and both of fuzz's parsers; a command it missed did
    not start only because an optional dependency is missing (it says what to install)."""
    progs = {parser.prog for _, parser in PARSERS}
    assert {"hicache demo", "hicache fuzz", "hicache spec check", "hicache invariants"} <= progs
    # hicache, spec, spec check, spec diagram, spec write-diagrams, invariants
    built_in = 6
    delegated = sum(len(MODES.get(w, [[]])) for w in cli.DELEGATED)
    assert len(PARSERS) + len(NOT_STARTED) == delegated + built_in
    for argv in NOT_STARTED:
        status, _, err, _ = run(argv)
        assert status == EXIT_USAGE and "which is not installed: pip install" in err, err
