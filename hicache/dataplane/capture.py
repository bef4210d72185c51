"""The capture window: what may run in this process while a CUDA graph is being captured.

A capture records the work queued on one stream instead of running it. While it is open, CUDA
refuses the calls it cannot record -- allocating or freeing device or pinned memory, page-locking
or unlocking host memory (`cudaHostRegister` / `cudaHostUnregister`), querying or synchronizing
events, streams or the device. A refused call returns `cudaErrorStreamCaptureUnsupported` and
*invalidates the capture*: its next launch, or its end, fails with
`cudaErrorStreamCaptureInvalidated`, far from the call that broke it. In torch's default
capture mode ("global") such a call from *any* thread of the process does this; in
"thread_local" mode only the capturing thread's own calls are checked.

What may run during a capture (the contract the data plane keeps):

    who                  may                                  may not
    -------------------  -----------------------------------  ----------------------------------
    capturing thread     the captured work                    issue or poll transfers (events)
    L3 I/O threads       pwrite / preadv / crc32 on L2 pages  (they make no CUDA call at all)
    DMA already queued   keep running on the mover's streams  -
    garbage collector    -                                    run: `capture_window` collects
                                                              before the capture, then disables
                                                              the collector until it ends
    finalizers that      go through `outside_capture`: run    call CUDA directly
    call CUDA            now, or queued until the window
                         closes (pinned.py's unregister)

So transfers may stay in flight across a capture: their device work is already queued, and the
only thread that issues or polls them is the one capturing (the data plane is single-threaded).

Why the collector is the danger: any pinned pool that sits in a reference cycle is unregistered
whenever a full collection next runs (a closed `CacheController` was in two such cycles; it no
longer is, but a caller's own objects may be) -- and a model's forward allocates enough Python
objects to start one in the middle of a capture (torch no longer collects before a capture unless
TORCH_CUDAGRAPH_GC=1 asks it to). The unregister's status was ignored, so the first sign was the
invalidated capture. That is how the serving benchmark, which drops a controller per configuration
and captures a graph per new prefill shape, failed: always at the same point of a run (the
collector's schedule), but at different shapes for different models.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

import torch

T = TypeVar("T")

# Why thread-local: other threads' calls (a profiler, torch's pinned-memory background thread)
# cannot reach the captured stream, and in "global" mode any of them would invalidate it. Not
# "relaxed": the capturing thread stays checked, so a wrong call in the captured work (one whose
# effect a replay would not repeat) fails at the call instead of being baked into the graph.
CAPTURE_ERROR_MODE = "thread_local"

_lock = threading.Lock()  # guards the two below: finalizers may run on any thread
_windows_open = 0
_deferred: list[Callable[[], object]] = []


def capture_active() -> bool:
    """Is a capture window open (on any thread), or is this thread's current stream capturing
    (a capture made without `capture_window`)?"""
    if _windows_open:
        return True
    initialized = torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
    return bool(initialized) and torch.cuda.is_current_stream_capturing()


def outside_capture(call: Callable[[], object]) -> None:
    """Run `call` now, or -- while a capture is active -- queue it to run when the capture
    window closes. For finalizers that call CUDA; safe from any thread."""
    with _lock:  # checked and queued under the lock the closing window drains under
        if _windows_open:
            _deferred.append(call)
            return
    if capture_active():  # someone else's capture on this thread: the next window drains it
        with _lock:
            _deferred.append(call)
        return
    call()


def run_deferred() -> int:
    """Run what `outside_capture` queued, oldest first, unless a capture is still active.
    Returns how many ran. A call that raises propagates; the ones after it stay queued."""
    if capture_active():
        return 0
    ran = 0
    while True:
        with _lock:
            if not _deferred:
                return ran
            call = _deferred.pop(0)
        call()
        ran += 1


@contextlib.contextmanager
def capture_window(*, collect: bool = True) -> Iterator[None]:
    """The block in which a graph is captured: garbage collected first (so what was already
    dead is freed outside the capture), the collector disabled throughout, finalizers that
    call CUDA deferred; on the way out -- normal or not -- the collector's state is restored
    and the deferred calls run. Windows nest (only the outermost restores and drains).
    `collect=False` skips the first collection (a full one costs milliseconds in a large
    process): for a capture of a few calls that make no Python garbage (issuegraphs.py),
    where holding the collector is enough."""
    global _windows_open
    run_deferred()
    was_enabled = gc.isenabled()
    if collect:
        gc.collect()
    gc.disable()
    with _lock:
        _windows_open += 1
    try:
        yield
    finally:
        with _lock:
            _windows_open -= 1
        if was_enabled:
            gc.enable()
        run_deferred()


def capture(graph: torch.cuda.CUDAGraph, work: Callable[[], T]) -> T:
    """Capture `work()` into `graph` inside a `capture_window`, in `CAPTURE_ERROR_MODE`.
    Returns what `work` returned (tensors in the graph's memory pool)."""
    with capture_window(), torch.cuda.graph(graph, capture_error_mode=CAPTURE_ERROR_MODE):
        return work()
