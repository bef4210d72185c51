"""`hicache check-trace FILE`: judge a trace against the reference (spec/trace.md).

    hicache check-trace FILE|- [--check-every N] [--full-checks] [--quiet]

Reads the trace from FILE (`-`: stdin), streamed, and prints the verdict's report on stdout:
one line `OK: ...` for a valid trace (exit 0), the first bad event with why, the transitions
enabled then and the state before it for a violation (exit 1), or one line naming the line
and what is wrong for malformed input (exit 2), or, for a trace whose header declares
`duplicate_copies`, one line saying where a second L1 copy of a page a load-back is filling
stops the judging, every event before it valid (exit 3). The invariants are checked after every call
(the run of events one reference call emits, applied atomically) on what it touched (which
finds what checking the whole state finds); `--check-every N` checks the whole state at the
first call boundary after every N events instead (0: never), `--full-checks` the whole state
after every call; `--quiet` prints nothing (the exit status alone). A usage error (an
unreadable FILE, a bad option) is one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import IO

from hicache.app.usage import UsageParser
from hicache.oracle.checktrace.replay import check_lines
from hicache.oracle.checktrace.verdict import MALFORMED


def _every(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of events, >= 0 (0: never)")
    return int(text)


def main(argv: Sequence[str] | None = None) -> int:
    p = UsageParser(
        prog="hicache check-trace", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    p.add_argument("file", metavar="FILE", help="the trace (NDJSON, header first); - for stdin")
    p.add_argument(
        "--check-every",
        type=_every,
        default=1,
        metavar="N",
        help="1 (default): the invariants after every call, on what it touched; "
        "N > 1: on the whole state at the first call boundary after each N events; 0: never",
    )
    p.add_argument(
        "--full-checks",
        action="store_true",
        help="with --check-every 1: check the whole state after every call (slower)",
    )
    p.add_argument("--quiet", action="store_true", help="print nothing; the exit status says it")
    args = p.parse_args(argv)
    stream: IO[str]
    if args.file == "-":
        stream = sys.stdin
    else:
        try:
            stream = open(args.file, encoding="utf-8")
        except OSError as e:
            print(f"hicache check-trace: error: {args.file}: {e.strerror or e}", file=sys.stderr)
            return MALFORMED
    try:
        verdict = check_lines(stream, check_every=args.check_every, full_checks=args.full_checks)
    except UnicodeDecodeError as e:
        verdict = None
        print(
            f"hicache check-trace: error: {args.file}: not UTF-8 text ({e.reason})", file=sys.stderr
        )
    finally:
        if stream is not sys.stdin:
            stream.close()
    if verdict is None:
        return MALFORMED
    if not args.quiet:
        print(verdict.message)
    return verdict.exit_code
