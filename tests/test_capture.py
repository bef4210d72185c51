"""The capture window (hicache/dataplane/capture.py), on the CPU: the collector's state, and
finalizers that call CUDA deferred until the window closes -- on any thread, on any exit.

`torch.cuda.cudart` is replaced by a recorder, so a pinned pool's register and unregister are
seen without a GPU (tests/test_capture_gpu.py captures real graphs).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

import torch

from hicache.dataplane import capture
from hicache.dataplane.capture import capture_window, outside_capture
from hicache.dataplane.pinned import pinned_empty
from tests.test_transfer import FakeCudart


class Cycle:
    """Holds a tensor in a reference cycle: only the collector frees it (like a dropped
    `CacheController`, which its backup chain points back to)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.me = self


@pytest.fixture
def cudart(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCudart]:
    fake = FakeCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    was_enabled = gc.isenabled()
    yield fake
    capture.run_deferred()  # nothing queued may leak into the next test
    if was_enabled:
        gc.enable()


def dead_pinned_cycle() -> int:
    """A pinned tensor that only the collector can free now; returns its address."""
    t = pinned_empty((64,), torch.uint8)
    ptr = t.data_ptr()
    Cycle(t)
    return ptr


@pytest.mark.parametrize("enabled", [True, False])
def test_window_disables_the_collector_and_restores_it_even_on_error(enabled: bool) -> None:
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        with pytest.raises(ValueError, match="boom"):
            with capture_window():
                assert not gc.isenabled()
                raise ValueError("boom")
        assert gc.isenabled() is enabled
        with capture_window():
            with capture_window():  # nested: the inner exit leaves the outer's state alone
                pass
            assert not gc.isenabled()
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_window_frees_what_was_already_dead_before_it_opens(cudart: FakeCudart) -> None:
    gc.disable()  # the dead pool must still be there when the window opens
    ptr = dead_pinned_cycle()
    assert cudart.unregistered == []
    with capture_window():
        assert cudart.unregistered == [ptr]  # unregistered outside any capture


@pytest.mark.parametrize("fails", [False, True])
def test_unregister_in_a_window_waits_until_it_closes(cudart: FakeCudart, fails: bool) -> None:
    """A collection inside the window (explicit here; automatic ones are off) runs the pool's
    finalizer: the unregister is queued, and runs on the way out, also when the work raised."""
    try:
        with capture_window():
            ptr = dead_pinned_cycle()
            gc.collect()
            t = pinned_empty((32,), torch.uint8)
            dropped = t.data_ptr()
            del t  # the last reference: the finalizer runs right here
            assert cudart.unregistered == []
            if fails:
                raise RuntimeError("capture failed")
    except RuntimeError:
        assert fails
    assert cudart.unregistered == [ptr, dropped]


def test_unregister_on_another_thread_is_deferred_too(cudart: FakeCudart) -> None:
    """An L3 I/O thread can be the one whose allocation starts a collection."""
    box = [pinned_empty((16,), torch.uint8)]
    ptr = box[0].data_ptr()
    with capture_window():
        worker = threading.Thread(target=box.clear)  # drops the last reference there
        worker.start()
        worker.join()
        assert cudart.unregistered == []
    assert cudart.unregistered == [ptr]


def test_outside_a_window_the_call_runs_at_once() -> None:
    ran: list[str] = []
    outside_capture(lambda: ran.append("now"))
    assert ran == ["now"]
    with capture_window():
        outside_capture(lambda: ran.append("later"))
        with capture_window():
            pass
        assert ran == ["now"]  # the inner window closing does not end the capture
    assert ran == ["now", "later"]


def test_a_failing_deferred_call_leaves_the_rest_queued() -> None:
    ran: list[int] = []

    def fail() -> None:
        raise OSError("context gone")

    with pytest.raises(OSError, match="context gone"):
        with capture_window():
            outside_capture(lambda: ran.append(1))
            outside_capture(fail)
            outside_capture(lambda: ran.append(3))
    assert ran == [1]
    assert capture.run_deferred() == 1 and ran == [1, 3]
