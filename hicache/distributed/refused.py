"""A refused issue's handle (spec/tp.md C2, the deferred reserve): the op this rank took, as
every rank did, but could not start.

Across ranks an issue whose reservation reads only state every rank holds equal is not
agreed at once: each rank takes the op (its id, its target pages, its source locks) whatever
its own issue met, so the ranks' op ids, free counts and locks stay equal, and a rank whose
issue was refused (an injected allocation fault, the data plane's refusal, its L3 file lost)
holds this handle instead of the data plane's. It is FAILED at its first poll, so the next
C4 fails the op on every rank (a rank still moving it cancels first) and every rank
releases alike (R72).
"""

from __future__ import annotations

from hicache.core.tiers import Direction
from hicache.dataplane.handles import ReadyHandle
from hicache.errors import HiCacheError, StorageError


class RefusedIssue(ReadyHandle):
    """An op this rank took and never started: no bytes, FAILED at the first poll with
    `refusal` as its error."""

    def __init__(self, direction: Direction, refusal: HiCacheError) -> None:
        super().__init__(direction, 0, refusal)
        self.refusal = refusal

    @property
    def lost(self) -> bool:
        """The refusal was this rank's L3 file, found lost at issue: C4 then takes L3
        offline on every rank."""
        return isinstance(self.refusal, StorageError)


__all__ = ["RefusedIssue"]
