"""The invariant checks a replay runs on the reference, every N events.

`Checks.after(n)` counts `n` more events; once at least `every` have passed since the last
check, it builds the reference's snapshot and runs every check of spec/invariants.md
(`hicache.invariants.check_all`), returning each violation as text ([] when all hold).
`every` 0 never checks.
"""

from __future__ import annotations

from hicache.control import ControlPlane
from hicache.invariants import check_all


class Checks:
    """Runs the invariants on `cp` every `every` events (0: never)."""

    def __init__(self, cp: ControlPlane, every: int) -> None:
        if every < 0:
            raise ValueError(f"check_every: 0 (never) or N >= 1 events, got {every}")
        self.cp, self.every = cp, every
        self.since = 0
        self.runs = 0

    def after(self, n_events: int) -> list[str]:
        if not self.every:
            return []
        self.since += n_events
        if self.since < self.every:
            return []
        self.since = 0
        self.runs += 1
        return [str(v) for v in check_all(self.cp.snapshot())]
