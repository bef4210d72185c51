"""When the control plane runs the checks: the `check_mode` setting.

    check_mode    checks run after ...                       cost
    ------------  -----------------------------------------  -----------------------------
    "off"         never                                      nothing (no snapshot is built)
    "every"       every transition                           one snapshot + all checks each
    "periodic N"  every N-th transition (N >= 1): N, 2N, ..  1/N of "every"

A violation raises `InvariantViolation` carrying every violation found and the transition
that preceded it, so a fuzzer's failure names the first step that broke an invariant
("every") or a window of at most N steps ("periodic N").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hicache.core.snapshot import Snapshot
from hicache.errors import ConfigError, InvariantViolation
from hicache.invariants.registry import CHECKS, Check, check_all

OFF, EVERY, PERIODIC = "off", "every", "periodic"


@dataclass(frozen=True)
class CheckMode:
    """A parsed `check_mode`: `kind` is "off", "every" or "periodic"; `period` >= 1 (1 unless
    periodic)."""

    kind: str
    period: int = 1

    @classmethod
    def parse(cls, text: str) -> CheckMode:
        """ "off", "every" or "periodic N" (N a positive integer); ConfigError otherwise."""
        words = text.split()
        if words == [OFF] or words == [EVERY]:
            return cls(words[0])
        if len(words) == 2 and words[0] == PERIODIC and words[1].isdigit() and int(words[1]) >= 1:
            return cls(PERIODIC, int(words[1]))
        raise ConfigError(
            "check_mode", f"{text!r} is not one of 'off', 'every', 'periodic N' (N >= 1)"
        )

    def due(self, transition: int) -> bool:
        """Whether the checks run after the `transition`-th transition (counted from 1)."""
        if self.kind == OFF:
            return False
        return transition % self.period == 0

    def __str__(self) -> str:
        return f"{PERIODIC} {self.period}" if self.kind == PERIODIC else self.kind


def parse_check_mode(text: str) -> CheckMode:
    """`CheckMode.parse`, as a function."""
    return CheckMode.parse(text)


class InvariantChecker:
    """Runs the checks after transitions, as often as its mode says.

    Counters (never reset): `transitions` seen, `checks_run` (snapshots checked) and
    `violations_found` (summed over every snapshot checked).
    """

    def __init__(self, mode: CheckMode | str, checks: tuple[Check, ...] = CHECKS) -> None:
        self.mode = mode if isinstance(mode, CheckMode) else CheckMode.parse(mode)
        self.checks = checks
        self.transitions = 0
        self.checks_run = 0
        self.violations_found = 0

    def after_transition(
        self, snapshot_fn: Callable[[], Snapshot], context: str | Callable[[], str]
    ) -> None:
        """Count one transition; when due, build the snapshot and check it. Raises
        `InvariantViolation(violations, context)` if any check fails. `context` may be a
        function giving the text: called only then (a plane names every transition, and most
        are never checked)."""
        self.transitions += 1
        if not self.mode.due(self.transitions):
            return
        violations = check_all(snapshot_fn(), self.checks)
        self.checks_run += 1
        self.violations_found += len(violations)
        if violations:
            raise InvariantViolation(
                tuple(violations), context if isinstance(context, str) else context()
            )
