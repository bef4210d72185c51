"""What a mutant is, and how one swaps a broken function in: the zoo's two building blocks."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

Patch = Callable[[], contextlib.AbstractContextManager[None]]


@dataclass(frozen=True)
class Mutant:
    """One broken variant: its name, the bug class it belongs to ("-" for the checker's own
    failure modes), the function it patches, a one-line description and the patch."""

    name: str
    bug_class: str
    target: str
    description: str
    patch: Patch


@contextlib.contextmanager
def swapped(owner: Any, attr: str, replacement: Any) -> Iterator[None]:
    """`owner.attr` is `replacement` inside the block, the original again after it."""
    original = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
    setattr(owner, attr, replacement)
    try:
        yield
    finally:
        setattr(owner, attr, original)
