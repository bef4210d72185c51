"""DataPlane: what the controller needs from a data plane, whichever it holds.

    plane            has_bytes   built by
    ---------------  ---------   -----------------------------------------------------
    TransferEngine   True        the controller, from CacheConfig (engine.py; needs torch)
    GroupTransfer-   True        the controller, from CacheConfig.pools: a pool group's
    Engine                       every pool per call, on anchor pages (groupengine.py)
    NullEngine       False       the caller (null.py): completions are the caller's `finish`

Contract: every transfer method takes validated page arrays (source first, target second)
and returns a `TransferHandle` the caller polls; `l3_path` names the L3 file in errors (the
null plane has none: "<null>"). When `has_bytes` is False the controller neither verifies
restored bytes nor asks for digests or a producer: there are no bytes to compare.
"""

from __future__ import annotations

from typing import Protocol

from hicache.dataplane.handles import TransferHandle
from hicache.pages import Pages


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
