"""Data planes a controller closed while hardware still touched some of their transfers.

A cancel waits for the hardware to go quiet (spec/lifecycle.md, the quiesce rule); a DMA or
an I/O that never reports its end makes that wait endless. The controller bounds it
(`quiesce_timeout_s`, spec/faults.md, "Hardware that never goes quiet"): past it, `close`
cannot free those transfers' pages -- the hardware may still write them -- so it *parks* the
data plane here instead of closing it. A parked plane keeps its memory and its L3 file open
(the file's lock too: its path is refused, `L3InUse`, to every later cache) until `reclaim`
finds each of its transfers quiet and closes it, or the process ends.

    park(plane, handles)    keep `plane` open, with the transfers that never went quiet
    parked()                how many planes are parked
    reclaim(timeout_s)      cancel each parked transfer again (at most timeout_s each);
                            close every plane all of whose transfers are quiet now
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from hicache.dataplane.handles import TransferHandle, cancel_within
from hicache.dataplane.plane import DataPlane

__all__ = ["park", "parked", "reclaim"]


@dataclass
class _Parked:
    plane: DataPlane
    handles: list[TransferHandle]


_LOCK = threading.Lock()
_PARKED: list[_Parked] = []  # process-wide: nothing frees a parked plane but reclaim


def park(plane: DataPlane, handles: list[TransferHandle]) -> None:
    """Keep `plane` open (memory, L3 file and its lock) while `handles` may still run."""
    with _LOCK:
        _PARKED.append(_Parked(plane, list(handles)))


def parked() -> int:
    """How many data planes are parked (closed controllers' planes not yet reclaimed)."""
    with _LOCK:
        return len(_PARKED)


def reclaim(timeout_s: float = 0.0) -> int:
    """Cancel every parked transfer again, waiting at most `timeout_s` seconds for each, and
    close each plane none of whose transfers still runs. Returns how many stay parked."""
    with _LOCK:
        for entry in list(_PARKED):
            entry.handles = [h for h in entry.handles if not cancel_within(h, timeout_s)]
            if not entry.handles:
                entry.plane.close()
                _PARKED.remove(entry)
        return len(_PARKED)
