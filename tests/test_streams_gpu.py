"""The mover's streams (streams.py) on a GPU: what reusing events and remembering the caller's
stream must not change.

`current()` names the caller's stream as it is now (after any switch: a transfer that waited
on a stale one would race the caller, B05); a wait enqueued on a relay or `wait_for` event
keeps waiting for that record after the event is recorded again; timing events come back
and are reused, and the transfers that reuse them still report their service time.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

import torch

from hicache.dataplane.dma import DeviceHostMover
from hicache.dataplane.geometry import KVGeometry
from hicache.dataplane.ownstreams import LENDER, how
from hicache.dataplane.pools import DevicePool, HostPool, page_digest
from hicache.dataplane.streams import KNOWN_STREAMS, Streams
from hicache.kernels import KernelSet
from tests.cuda_streams import HOLD_CYCLES, caller_stream  # noqa: F401  (autouse)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

GEOMETRY = KVGeometry(layers=4, kv_heads=2, head_dim=32, dtype="bf16", page_size=16)


def new_stream() -> torch.cuda.Stream:
    return torch.cuda.Stream()  # type: ignore[no-untyped-call]


def test_gpu_current_follows_every_switch_of_the_callers_stream() -> None:
    s = Streams(torch.device("cuda", torch.cuda.current_device()))
    outer = torch.cuda.current_stream()
    assert s.current() == outer
    for _ in range(KNOWN_STREAMS + 3):  # more streams than it remembers: still right
        side = new_stream()
        with torch.cuda.stream(side):
            got = s.current()
            assert got is not None and got.cuda_stream == side.cuda_stream
        assert s.current() == torch.cuda.current_stream() == outer
    unindexed = Streams(torch.device("cuda"))  # "cuda": the current device's stream
    assert unindexed.current() == outer


@pytest.mark.parametrize("how", ["relay", "wait_for"])
def test_gpu_a_wait_keeps_its_record_when_the_event_is_recorded_again(how: str) -> None:
    """Stream `a` sleeps, then writes 1; `b` waits for `a` through the reused event, which is
    then recorded again on an idle stream; `b`'s read must still see `a`'s write."""
    s = Streams(torch.device("cuda", torch.cuda.current_device()))
    a, b, idle = new_stream(), new_stream(), new_stream()
    flag = torch.zeros(1, device="cuda")
    seen = torch.full((1,), -1.0, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(a):
        torch.cuda._sleep(HOLD_CYCLES)  # type: ignore[no-untyped-call]
        flag.fill_(1.0)
    if how == "relay":
        s.wait(b, s.relay(a, 0))
        s.relay(idle, 0)  # the same event, recorded where nothing is queued
    else:
        s.wait_for(b, a)
        s.wait_for(b, idle)  # the same event again
    with torch.cuda.stream(b):
        seen.copy_(flag)
    torch.cuda.synchronize()
    assert float(seen) == 1.0, "the wait followed the later record: b ran before a's write"


def test_gpu_timing_events_are_reused_and_still_time_each_transfer() -> None:
    l1 = DevicePool(GEOMETRY, 32, "cuda")
    l1.tensor.view(torch.uint8).random_(0, 256)
    l2 = HostPool(GEOMETRY, 32, pin=True)
    m = DeviceHostMover(l1, l2, KernelSet.create(l1.tensor, "auto"))
    made = 0
    original = m._streams._event

    def counted(*, timing: bool) -> torch.cuda.Event:
        nonlocal made
        made += timing
        return original(timing=timing)

    m._streams._event = counted  # type: ignore[method-assign]
    rng = np.random.default_rng(0)
    for k in range(12):
        src = rng.choice(32, size=6, replace=False).astype(np.int64)
        dst = np.arange(6 * (k % 4), 6 * (k % 4) + 6, dtype=np.int64)
        handle = m.d2h(src, dst)
        assert handle.wait().value == "DONE"
        assert handle.timings.service_s > 0, "a reused event still times its transfer"
        assert np.array_equal(page_digest(l1, src), page_digest(l2, dst))
    assert made <= 2, f"{made} timing events made for 12 transfers one after another"


def test_gpu_ids_name_the_three_streams() -> None:
    """`ids()` (a run's record of which streams a mover used) names the three streams."""
    s = Streams(torch.device("cuda", torch.cuda.current_device()))
    ids = s.ids()
    assert ids is not None and s.compute is not None and s.d2h is not None and s.h2d is not None
    assert ids == {"compute": s.compute.stream_id, "d2h": s.d2h.stream_id, "h2d": s.h2d.stream_id}
    assert len(set(ids.values())) == 3


def test_gpu_a_movers_streams_are_never_another_owners() -> None:
    """Twenty movers' streams (60, past torch's pool of 32 per device) and 64 pool streams
    drawn after them: no CUDA stream twice. torch's pool hands its streams out round robin,
    and a layer-wise restore whose H2D stream was the forward's lost all its overlap. A gone
    mover's three come back and go to the next mover."""
    if not how().startswith("own"):
        pytest.skip(f"streams here: {how()}")
    device = torch.device("cuda", torch.cuda.current_device())
    owners = [Streams(device) for _ in range(20)]
    mine = [x.cuda_stream for s in owners for x in (s.compute, s.d2h, s.h2d) if x is not None]
    pool = {new_stream().cuda_stream for _ in range(64)}
    assert len(mine) == 60 and len(set(mine)) == 60
    assert pool.isdisjoint(mine), "a mover's stream is also a pool stream someone else holds"
    index = device.index
    assert index is not None
    gc.collect()  # other tests' movers gone before the count, not during it
    idle = LENDER.idle(index)
    first = owners[0]
    gone = {x.cuda_stream for x in (first.compute, first.d2h, first.h2d) if x is not None}
    del owners[0], first
    gc.collect()
    assert LENDER.idle(index) == idle + 3
    again = Streams(device)
    ids = again.ids()
    assert ids is not None and len(set(ids.values())) == 3
    assert {x.cuda_stream for x in (again.compute, again.d2h, again.h2d) if x is not None} == gone
    flag = torch.zeros(1, device=device)  # a lent stream runs work like any other
    with torch.cuda.stream(again.h2d):
        flag.fill_(1.0)
    torch.cuda.synchronize()
    assert float(flag) == 1.0
