"""The data plane: pools that hold bytes and the transfer engine that moves them.

The real plane (`engine.py`, its two byte paths in `bytepaths.py` and the movers they hold)
needs torch. These do not, so a
controller on the null plane never imports it:

    plane.py     DataPlane, what the controller needs from any plane
    null.py      NullEngine (completions are the caller's `finish`), ScriptedEngine
    handles.py   transfer handles and their status table; DelayedHandle (observed late)
    faults.py    fault sites (the registry), schedules, faults aimed at one op
    aimed.py     issuing one transfer with the fault aimed at it
    anchormap.py anchor pages -> each pool's pages, checked (AnchorMap)

`capture.py` says what may run while a CUDA graph is captured in the same process (transfers
in flight, I/O threads, finalizers).
"""

from __future__ import annotations
