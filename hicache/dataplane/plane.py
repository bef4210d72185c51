"""DataPlane: what the controller needs from a data plane, whichever it holds.

    plane            has_bytes   built by
    ---------------  ---------   -----------------------------------------------------
    TransferEngine   True        the controller, from CacheConfig (engine.py; needs torch):
                                 a pool group's every pool per call, on anchor pages; a
                                 single pool is the group of one (its fast path)
    NullEngine       False       the caller (null.py): completions are the caller's `finish`

Contract: every transfer method takes validated page arrays (source first, target second)
and returns a `TransferHandle` the caller polls; `l3_path` names the L3 file in errors (the
null plane has none: "<null>"). When `has_bytes` is False the controller neither verifies
restored bytes nor asks for a producer: there are no bytes to compare. A byte-free plane that
keeps content tags instead (`TaggedPlane`: the NullEngine, dataplane/tags.py) is told each
compute and gives the tags as its digests, so the invariants that compare content still run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from hicache.core.pages import Pages
from hicache.dataplane.handles import TransferHandle


class DataPlane(Protocol):
    @property
    def has_bytes(self) -> bool: ...

    @property
    def l3_path(self) -> str: ...

    def d2h(self, l1_pages: Pages, l2_pages: Pages) -> TransferHandle: ...

    def h2d(self, l2_pages: Pages, l1_pages: Pages) -> TransferHandle: ...

    def h2s(self, l2_pages: Pages, slots: Pages) -> TransferHandle: ...

    def s2h(self, slots: Pages, l2_pages: Pages) -> TransferHandle: ...

    def corrupt_slot(self, slot: int) -> None: ...

    def status(self) -> dict[str, object]: ...

    def close(self) -> None: ...


@runtime_checkable
class TaggedPlane(Protocol):
    """A byte-free plane that keeps a content tag per page in place of its bytes."""

    def computed(self, tokens: Sequence[int], start: int, end: int, l1_pages: Pages) -> None:
        """Tokens `[start, end)` of `tokens` (page-aligned) were computed into `l1_pages`."""

    def digests(self, tier: str, pages: Pages) -> npt.NDArray[np.uint64]:
        """One uint64 per page of `tier`: equal exactly when the content is."""
