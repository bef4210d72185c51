"""`WithoutTransfers`: the `CacheUnderTest` methods an engine with one tier and no transfers
has nothing to do in (no restores, no backups, no backing store, no fault sites).

An L1-only adapter (lru.py, sglang.py) inherits them and supplies the rest.
"""

from __future__ import annotations

from hicache.core.trace import TraceEvent
from hicache.testing.protocol import FaultSchedule


class WithoutTransfers:
    """No transfer is ever in flight: ticks, completions, failures, aims, drains, fault
    schedules and storage damage change nothing; no trace, no fault fired."""

    def tick(self) -> None: ...

    def has_work(self) -> bool:
        return False

    def pending_ops(self) -> list[int]:
        return []

    def complete(self, op_id: int) -> None: ...

    def fail(self, op_id: int, kind: str) -> None: ...

    def set_faults(self, schedule: FaultSchedule) -> None: ...

    def drain(self) -> None: ...

    def damage_storage(self, how: str) -> None: ...  # no backing store

    def aim(self, action: str, tier: str) -> None: ...  # no transfers

    def cancel_restore(self, request_id: int) -> None: ...  # no restores: always ready

    def ready(self, request_id: int) -> bool:
        return True

    def trace(self) -> list[TraceEvent]:
        return []

    def fault_counts(self) -> dict[str, int]:
        return {}
