"""Benchmarks of hicache's own code, one module each, run as `hicache bench NAME`.

Every benchmark's usage names it `hicache bench NAME` (`BenchParser`), a usage error is one
line with status 2 (an output path that cannot be written among them, before anything is
measured: `hicache.app.outputs`), and one that needs a CUDA device says so in one line and exits
`EXIT_NO_CUDA` (2) where there is none (`no_cuda`). Tables carry a unit in every column
header and a legend line for their abbreviations.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hicache.app.usage import EXIT_USAGE, UsageParser

EXIT_NO_CUDA = EXIT_USAGE  # the same status as a usage error: nothing was measured


class BenchParser(UsageParser):
    """argparse for `hicache bench NAME`: usage and errors name the command as it is typed;
    an error is one line on stderr and exit status 2 (UsageParser)."""

    def __init__(self, name: str, description: str | None) -> None:
        super().__init__(prog=f"hicache bench {name}", description=description)


def counts(text: str) -> tuple[int, ...]:
    """The argparse `type=` of a comma-separated list of whole numbers, each >= 1 (`--tokens
    350,1000`; empty: none); ArgumentTypeError naming the first that is not."""
    values = []
    for word in text.split(",") if text else ():
        if not word.strip().isdigit() or int(word) < 1:
            where = f" in {text!r}" if "," in text else ""
            raise argparse.ArgumentTypeError(
                f"{word.strip()!r}{where}: give whole numbers >= 1, comma-separated"
            )
        values.append(int(word))
    return tuple(values)


def columns(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 0) -> list[str]:
    """`header` and `rows` as aligned text lines: the first `left` columns left-aligned (names),
    the rest right-aligned (numbers), two spaces between columns."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(
            f"{c:<{w}}" if i < left else f"{c:>{w}}" for i, (c, w) in enumerate(zip(r, widths))
        ).rstrip()
        for r in [header, *rows]
    ]


def no_cuda(name: str, hint: str = "run it on a machine with a GPU") -> int:
    """Say on one line that `hicache bench NAME` measured nothing for want of a CUDA device,
    and what to do (`hint`); returns the exit status, EXIT_NO_CUDA."""
    print(
        f"hicache bench {name}: no CUDA device here, and this benchmark measures one, so "
        f"nothing was measured; {hint}",
        file=sys.stderr,
    )
    return EXIT_NO_CUDA
