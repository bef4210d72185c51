"""Streams hicache owns: each lent to one owner at a time, never handed to anyone else.

`torch.cuda.Stream()` takes the next stream of a pool (32 per device and priority) round
robin: the 33rd call in a process gets the first call's CUDA stream again. Two owners of one
stream run their work in the order it was enqueued, whatever events they wait on: a
layer-wise restore whose H2D stream is the model's forward stream loads every layer before the
forward starts. A serving run that built a mover per row (three streams each) did exactly
that; its 3,500-token layer-wise L2 restore took 32.3-40.3 ms (Qwen3-8B, graphs, one H100);
on streams from here the same runs took 23.6-23.8 ms (benchmarks/results/
2026-12-06-session20-h100). Hardware queues were not it: 32 of them
(CUDA_DEVICE_MAX_CONNECTIONS=32) lost the same way.

    lend(owner, device)   a stream no other owner holds: one given back by an owner that is
                          gone, or a new one (cudaStreamCreateWithFlags, non-blocking like
                          torch's: it never waits on the legacy default stream), wrapped as a
                          torch.cuda.ExternalStream. It is given back when `owner` is
                          garbage, never destroyed: work an old owner left queued only delays
                          the next owner, where destroying could free a stream torch still
                          names. At most as many streams as owners ever alive at once.
    release(owner)        its streams back now (a closed mover), not when it is garbage
    how()                 how streams are made here, for a mover's status
    Lender                the bookkeeping, apart from CUDA (tests run it on the CPU)

Without cuda.bindings the streams are torch's pool streams, as before (`how()` says so): they
can be shared with any other pool user of the process.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import torch

from hicache.errors import TransferError

_S = TypeVar("_S")


class Lender(Generic[_S]):
    """Streams (anything `make(device index)` returns) lent to one owner at a time: a stream
    given back when its owner is garbage goes to the next owner, else `make` makes one."""

    def __init__(self, make: Callable[[int], _S]) -> None:
        self.make = make
        self._free: dict[int, list[_S]] = {}  # by device index: streams given back
        self._lent: weakref.WeakKeyDictionary[object, list[weakref.finalize[Any, Any]]] = (
            weakref.WeakKeyDictionary()
        )  # an owner's give-backs, to run early (`release`)
        self._lock = threading.Lock()
        self.made = 0

    def lend(self, owner: object, index: int) -> _S:
        """A stream of device `index` no other live owner holds, until `owner` is garbage
        (`owner` must take weak references: any plain class instance)."""
        with self._lock:
            free = self._free.get(index)
            stream = free.pop() if free else None
        if stream is None:
            stream = self.make(index)
            with self._lock:
                self.made += 1
        back = weakref.finalize(owner, self._give_back, index, stream)
        with self._lock:
            self._lent.setdefault(owner, []).append(back)
        return stream

    def release(self, owner: object) -> None:
        """Give `owner`'s streams back now, not when it is garbage (a closed mover: it issues
        nothing more). Idempotent: each stream goes back once."""
        with self._lock:
            backs = self._lent.pop(owner, [])
        for back in backs:
            back()  # a finalize runs at most once: the owner's death later does nothing

    def _give_back(self, index: int, stream: _S) -> None:
        with self._lock:
            self._free.setdefault(index, []).append(stream)

    def idle(self, index: int) -> int:
        """How many streams of device `index` wait for their next owner."""
        with self._lock:
            return len(self._free.get(index, ()))


@functools.cache
def _runtime_create() -> tuple[Callable[[int], int] | None, str]:
    """cuda.bindings' cudaStreamCreateWithFlags (non-blocking) on a device index, or why not
    (looked up on first use: importing hicache imports no CUDA library)."""
    try:
        from cuda.bindings import runtime  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None, "torch's pool (cuda.bindings is not installed): may be shared"
    flags = int(getattr(runtime, "cudaStreamNonBlocking", 1))

    def create(index: int) -> int:
        with torch.cuda.device(index):  # the runtime makes the stream on the current device
            err, stream = runtime.cudaStreamCreateWithFlags(flags)
        if int(err) != 0:
            raise TransferError(
                f"cudaStreamCreateWithFlags on cuda:{index} failed ({err}): the device is out of "
                "resources or in error; close movers that are no longer used, or restart"
            )
        return int(stream)

    return create, "own: cudaStreamCreateWithFlags, one owner at a time (cuda.bindings)"


def how() -> str:
    """How `lend` makes streams in this process, for a mover's status."""
    return _runtime_create()[1]


def _external(index: int) -> torch.cuda.Stream:
    create = _runtime_create()[0]
    assert create is not None, "lend makes external streams only with cuda.bindings"
    handle, device = create(index), torch.device("cuda", index)
    return torch.cuda.ExternalStream(handle, device=device)  # type: ignore[no-untyped-call]


LENDER = Lender(_external)


def lend(owner: object, device: torch.device) -> torch.cuda.Stream:
    """A CUDA stream on `device` that no other owner holds until `owner` is garbage (module
    docstring; a layer-wise H2D's stream is one, R86); without cuda.bindings, torch's next
    pool stream."""
    assert device.type == "cuda", f"streams are CUDA's, got {device}"
    index = torch.cuda.current_device() if device.index is None else device.index
    if _runtime_create()[0] is None:
        return torch.cuda.Stream(torch.device("cuda", index))  # type: ignore[no-untyped-call]
    return LENDER.lend(owner, index)


def release(owner: object) -> None:
    """Give back now every stream `lend` lent `owner` (nothing without cuda.bindings)."""
    LENDER.release(owner)
