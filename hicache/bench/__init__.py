"""Benchmarks of hicache's own code, one module each, run as `hicache bench NAME`.

Every benchmark's usage names it `hicache bench NAME` (`BenchParser`), a usage error is one
line with status 2, and one that needs a CUDA device says so in one line and exits
`EXIT_NO_CUDA` (2) where there is none (`no_cuda`). Tables carry a unit in every column
header and a legend line for their abbreviations.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

EXIT_NO_CUDA = 2  # the same status as a usage error: nothing was measured


class BenchParser(argparse.ArgumentParser):
    """argparse for `hicache bench NAME`: usage and errors name the command as it is typed;
    an error is one line on stderr and exit status 2."""

    def __init__(self, name: str, description: str | None) -> None:
        super().__init__(prog=f"hicache bench {name}", description=description)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


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
