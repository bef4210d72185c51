"""The data plane: pools that hold bytes and the transfer engine that moves them.

Needs torch (imported by the modules here, never by the control plane). `null.py` is the
byte-free data plane used for model checking and trace replay. `capture.py` says what may run
while a CUDA graph is captured in the same process (transfers in flight, I/O threads, finalizers).
"""

from __future__ import annotations
