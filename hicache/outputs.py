"""Output files a command writes after its work: checked before the work starts.

    unwritable(path) -> str | None    why a file could not be written at `path`, or None

A command that serves, searches or fuzzes for minutes and only then opens its report file
would lose the work to a typo; each checks its output options first and refuses with exit
status 2, creating nothing.
"""

from __future__ import annotations

import os


def unwritable(path: str | os.PathLike[str]) -> str | None:
    """Why a file could not be written at `path` (its directory missing or not writable, or
    `path` a directory), or None; creates nothing."""
    path = os.fspath(path)
    if os.path.isdir(path):
        return "is a directory"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"no directory {folder}"
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        return "not writable"
    return None


__all__ = ["unwritable"]
