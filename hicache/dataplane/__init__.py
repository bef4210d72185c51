"""The data plane: pools that hold bytes and the transfer engine that moves them.

Needs torch (imported by the modules here, never by the control plane). `null.py` is the
byte-free data plane used for model checking and trace replay.
"""

from __future__ import annotations
