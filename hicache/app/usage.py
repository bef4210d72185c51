"""The command-line manners every `hicache` command shares.

    UsageParser    argparse whose every error is one line on stderr and exit status 2
    EXIT_USAGE     2: a usage or input error (a bad option value, a conflict, a path that
                   cannot be read or written); 1 stays for "the run found a failure"

Each command builds its parser from `UsageParser` (`hicache bench NAME`'s `BenchParser`
adds its name to the usage line), so `hicache demo --requests x` and `hicache pools --bogus`
fail alike: `PROG: error: argument --requests: ...`, naming the option, no usage block and
no traceback. Options naming what a command writes take a type of `hicache.app.outputs`, which
argparse checks with the rest of the command line, before any work.
tests/test_cli_manners.py holds every command to both.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

EXIT_USAGE = 2


class UsageParser(argparse.ArgumentParser):
    """argparse, but an error is one line (`PROG: error: MESSAGE`, no usage block) on stderr
    and exit status EXIT_USAGE; `--help` is argparse's own."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


__all__ = ["EXIT_USAGE", "UsageParser"]
