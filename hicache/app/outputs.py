"""What a command writes, checked before its work starts.

    OutputPath(kind)                  argparse `type=` of an option naming what a command writes:
        OUTPUT_FILE                   a file made or replaced (its directory must exist)
        OUTPUT_DIR                    a directory written into, made with its parents if missing
        WORK_DIR                      an existing directory a command makes its files in
    unwritable(path) -> str | None    why a file could not be written at `path`, or None
    unwritable_dir(path, create) -> str | None   the same for a directory

A command that serves, searches or fuzzes for minutes and only then opens its report file
would lose the work to a typo. Every option that names a file or directory a command writes
is declared with one of the types above, so argparse checks it while it parses the command
line: before any work, as a one-line usage error with exit status 2 that names the option
(`hicache.app.usage.UsageParser`), creating nothing. tests/test_cli_manners.py finds these
options in every command's parser and holds each to that.

A path is tried, not looked up: `os.access` answers yes to root for a read-only directory's
permissions and for /proc or /sys, where no file can be made. A new file is created
(exclusively, so nothing is replaced) and removed again; an existing regular file is opened
for appending and closed, writing nothing; a directory gets a temporary directory made and
removed in it. Something that exists and is not a regular file (a FIFO, a device,
/dev/stdout) is judged by its permissions alone: opening a FIFO for writing could block.
"""

from __future__ import annotations

import argparse
import os
import stat
import tempfile
from typing import Literal

Kind = Literal["file", "dir", "existing dir"]


def unwritable(path: str | os.PathLike[str]) -> str | None:
    """Why a file could not be written at `path` (its directory missing, nothing can be
    created there, the file not writable, or `path` a directory), or None; leaves nothing
    behind (module docstring: how it is tried)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        return "is a directory"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return (
            f"{folder} is not a directory" if os.path.exists(folder) else f"no directory {folder}"
        )
    if os.path.lexists(path) and not os.path.exists(path):
        return unwritable(os.path.realpath(path))  # a dangling symlink: writing makes its target
    if os.path.exists(path):
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None if os.access(path, os.W_OK) else "not writable"
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
        except OSError as e:
            return f"cannot be opened for writing ({e.strerror or e})"
        return None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        return f"no file can be created in {folder} ({e.strerror or e})"
    os.close(fd)
    os.unlink(path)
    return None


def unwritable_dir(path: str | os.PathLike[str], create: bool) -> str | None:
    """Why files could not be made in directory `path`, or None; leaves nothing behind.
    With `create`, a missing `path` is fine when its nearest existing ancestor is a directory
    one can be made in (the command makes it, parents included); without, it must exist."""
    path = os.path.abspath(os.fspath(path))
    where = path
    if not os.path.exists(where):
        if not create:
            return "no such directory"
        while not os.path.exists(where):  # ends: "/" exists
            where = os.path.dirname(where)
    if not os.path.isdir(where):
        return "is not a directory" if where == path else f"{where} is not a directory"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".hicache-probe-", dir=where))
    except OSError as e:
        return f"nothing can be made in {where} ({e.strerror or e})"
    return None


class OutputPath:
    """The argparse `type=` of an option naming what a command writes, of `kind` (module
    docstring): the value unchanged, or ArgumentTypeError saying why it cannot be written
    there and what to do (argparse prefixes the option's name)."""

    def __init__(self, kind: Kind) -> None:
        self.kind = kind

    def __call__(self, text: str) -> str:
        if self.kind == "file":
            problem = unwritable(text)
        else:
            problem = unwritable_dir(text, create=self.kind == "dir")
        if problem is not None:
            raise argparse.ArgumentTypeError(f"{text}: {problem}; choose a writable path")
        return text

    def __repr__(self) -> str:
        return f"OutputPath({self.kind!r})"


OUTPUT_FILE = OutputPath("file")
OUTPUT_DIR = OutputPath("dir")
WORK_DIR = OutputPath("existing dir")

__all__ = [
    "OUTPUT_DIR",
    "OUTPUT_FILE",
    "WORK_DIR",
    "OutputPath",
    "unwritable",
    "unwritable_dir",
]
