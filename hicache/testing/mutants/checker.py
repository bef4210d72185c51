"""The invariant checker's own failure modes: a check that skips a tier, a checker that never runs.

Registered in `hicache.testing.mutants` (its table names each one); `ZOO` lists this
module's mutants in the order `hicache fuzz --mutant list` prints them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from hicache.testing.mutants.base import Mutant, swapped


@contextlib.contextmanager
def _i1_skip_l2() -> Iterator[None]:
    """I1 `ownership_disjoint` checks every tier but L2."""
    from hicache.invariants.registry import CHECKS

    check = next(c for c in CHECKS if c.id == "I1")
    original = check.func

    def skipping(s: Any) -> Any:
        return original(
            dataclasses.replace(s, tiers={k: v for k, v in s.tiers.items() if k != "L2"})
        )

    object.__setattr__(check, "func", skipping)
    try:
        yield
    finally:
        object.__setattr__(check, "func", original)


def _checker_off() -> contextlib.AbstractContextManager[None]:
    """The checker counts transitions but never checks a snapshot, whatever its mode."""
    from hicache.invariants.checker import InvariantChecker

    def after_transition(self: Any, snapshot_fn: Any, context: str) -> None:
        self.transitions += 1

    return swapped(InvariantChecker, "after_transition", after_transition)


ZOO: tuple[Mutant, ...] = (
    Mutant(
        "I1-skip-L2",
        "-",
        "invariants.registry CHECKS[I1]",
        "the I1 ownership_disjoint check skips tier L2",
        _i1_skip_l2,
    ),
    Mutant(
        "checker-off",
        "-",
        "InvariantChecker.after_transition",
        "the invariant checker never runs a check, whatever the check mode",
        _checker_off,
    ),
)
