"""Walking every control plane a stretch of code builds: the test suite's and `hicache fuzz`'s
switch, kept out of the core.

A control plane walks its trace (hicache/core/tracewalk.py: each event judged by the tables'
`transitions` machine as it is emitted) when its builder asks, `ControlPlane(..., walk=True)`;
by default it does not (no sink: no events are built). Code whose planes are built deep inside
-- a controller, an adapter, the demo, the fuzz machine's runs -- is walked from outside:

    with every_plane_walked():
        ...  # every ControlPlane built here without `walk=` walks

`hicache fuzz` runs inside it (hicache/testing/runner.py); the test suite opens it for the
tests tests/conftest.py runs walked (`plane_walk`). It holds for this process, every thread;
a plane built in another process does not walk.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from hicache.core.control import ControlPlane
from hicache.core.tracewalk import WalkSink


@contextlib.contextmanager
def every_plane_walked() -> Iterator[None]:
    """While open, `ControlPlane`'s `walk` defaults to True (`ControlPlane.walk_default`; a
    caller that passes `walk` still decides). Nests; on exit the default is the one it found."""
    found = ControlPlane.walk_default
    ControlPlane.walk_default = True
    try:
        yield
    finally:
        ControlPlane.walk_default = found


def walks(cp: ControlPlane) -> bool:
    """Whether `cp`'s trace is walked."""
    return isinstance(cp.tracer.sink, WalkSink)
