"""Hardware that never goes quiet during a cancel (spec/faults.md, "Hardware that never goes
quiet"): the cancel's wait is bounded by quiesce_timeout_s, ends in QuiesceTimeout, and
leaves a defined state -- the op still in flight, the controller wedged (all but close
refused), close leaking the op's pages (counted) and parking the data plane, L3 file and
its lock included, until hicache.dataplane.leaks.reclaim() finds the hardware quiet."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="needs torch (the controller): pip install -e '.[data]'")

from hicache.controller.config import CacheConfig
from hicache.controller.controller import CacheController
from hicache.controller.pending import LeakedOp
from hicache.core.tiers import Direction
from hicache.dataplane import leaks
from hicache.dataplane.handles import NullHandle, TransferStatus
from hicache.dataplane.null import NullEngine
from hicache.dataplane.storage_io import StorageMover
from hicache.errors import ConfigError, L3InUse, QuiesceTimeout

PROMPT = list(range(1, 17))  # 4 pages of the tiny geometry's 4 tokens
BOUND_S = 0.05


def test_the_bound_is_a_checked_knob() -> None:
    assert CacheConfig().quiesce_timeout_s == 30.0
    for bad in (0, -1.0, float("inf"), True, "5"):
        with pytest.raises(ConfigError, match="quiesce_timeout_s"):
            CacheConfig(quiesce_timeout_s=bad)  # type: ignore[arg-type]


def test_a_hung_null_transfer_times_out_and_stays_pending() -> None:
    handle = NullHandle(Direction.H2D)
    handle.hang()
    handle.finish(True)  # the hardware never reports its end
    started = time.perf_counter()
    with pytest.raises(QuiesceTimeout, match="H2D cancel"):
        handle.cancel(BOUND_S)
    assert BOUND_S <= time.perf_counter() - started < 1.0
    assert handle.poll() is TransferStatus.PENDING  # its pages are still the hardware's
    handle.unhang()
    handle.cancel(BOUND_S)
    assert handle.status is TransferStatus.CANCELLED


def _restoring(cfg: CacheConfig) -> tuple[CacheController, int]:
    """A controller on the null plane whose request 2 loads PROMPT back from L2: that load's
    op id (pending)."""
    c = CacheController(cfg, engine=NullEngine(cfg.kv, cfg.l1_pages, cfg.l2_pages, cfg.l3_slots))
    c.admit(1, PROMPT)
    c.prefill(1)
    c.finish(1)
    for _ in range(4):  # the backups: D2H, then H2S
        c.tick()
        for handle in c.handles.values():
            assert isinstance(handle, NullHandle)
            handle.finish(True)
    c.evict("L1", cfg.l1_pages)
    c.admit(2, PROMPT + [7])
    (op_id,) = [p.op_id for p in c.pending() if p.direction is Direction.H2D]
    return c, op_id


def test_a_cancel_the_hardware_never_ends_wedges_the_controller_and_close_leaks_it() -> None:
    cfg = CacheConfig(
        device="cpu",
        l1_pages=8,
        l2_pages=8,
        l3_slots=16,
        policy="always",
        quiesce_timeout_s=BOUND_S,
    )
    c, op_id = _restoring(cfg)
    handle = c.handles[op_id]
    assert isinstance(handle, NullHandle)
    handle.hang()
    parked = leaks.parked()
    with pytest.raises(QuiesceTimeout, match=f"op {op_id} \\(H2D\\) cancel"):
        c.finish(2)
    # Defined state: the op is still in flight (its L1 pages private), nothing is poisoned,
    # and every operation but close is refused, naming the op.
    assert op_id in c.cp.ops and c.cp.poisoned is None
    for call in (lambda: c.admit(3, PROMPT), c.tick, lambda: c.finish(2)):
        with pytest.raises(QuiesceTimeout, match="wedged"):
            call()
    started = time.perf_counter()
    c.close()
    assert time.perf_counter() - started < 1.0  # bounded: never waits for the hardware
    pages = int(c.cp.ops[op_id].target_pages.size)
    assert c.leaked == [LeakedOp(op_id, Direction.H2D, "L1", pages)] and pages == 4
    assert c.status()["leaked"] == {"ops": 1, "pages": 4}
    assert leaks.parked() == parked + 1  # the plane stays open: the hardware may write it
    c.close()  # idempotent: the parked plane is not closed under the hardware
    assert leaks.parked() == parked + 1
    handle.unhang()  # the hardware went quiet after all
    assert leaks.reclaim() == parked


def _stall_reads(
    monkeypatch: pytest.MonkeyPatch, started: threading.Event, gate: threading.Event
) -> None:
    """Every L3 read (S2H) blocks in its I/O (`started` set) until `gate` is set: a pread
    that never returns, as on a hung device."""
    move_all = StorageMover._move_all

    def stalled(self: StorageMover, direction: Direction, *args: Any) -> None:
        if direction is Direction.S2H:
            started.set()
            gate.wait()
        move_all(self, direction, *args)

    monkeypatch.setattr(StorageMover, "_move_all", stalled)


def test_an_l3_read_that_never_returns_keeps_the_l3_path_locked_until_reclaimed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the CPU plane with bytes: a promotion's pread hangs. The cancel times out, close
    leaks the op and keeps the L3 file open and locked (a later cache on its path gets
    L3InUse, never a file a stale write may still land in); once the read returns,
    reclaim() closes the plane and the path serves a new cache, which starts empty."""
    started, gate = threading.Event(), threading.Event()
    _stall_reads(monkeypatch, started, gate)
    path = str(tmp_path / "l3.slots")
    cfg = CacheConfig(
        device="cpu",
        l1_pages=8,
        l2_pages=8,
        l3_slots=16,
        l3_path=path,
        io_threads=1,
        quiesce_timeout_s=BOUND_S,
        policy="always",  # the stuck read must be issued, whatever the cost policy would choose
    )
    c = CacheController(cfg)
    parked = leaks.parked()
    try:
        c.admit(1, PROMPT)
        c.prefill(1)
        c.finish(1)
        c.drain()
        c.evict("L1", 8)
        c.evict("L2", 8)
        c.admit(2, PROMPT + [7])
        assert [p.direction for p in c.pending()] == [Direction.S2H]
        assert started.wait(5.0)  # the read is inside its pread: a cancel cannot skip it
        with pytest.raises(QuiesceTimeout, match="S2H"):
            c.finish(2)
        c.close()
        assert [op.direction for op in c.leaked] == [Direction.S2H]
        assert leaks.parked() == parked + 1
        with pytest.raises(L3InUse):
            CacheController(cfg)
    finally:
        gate.set()
    assert leaks.reclaim(timeout_s=5.0) == parked
    again = CacheController(cfg)
    try:
        assert again.admit(3, PROMPT).match.lengths == (0, 0, 0)
    finally:
        again.close()


def test_a_write_back_backup_that_never_lands_wedges_the_controller_not_hangs_it() -> None:
    """Write-back backs an L1 victim up and waits for it; a D2H the hardware never ends made
    that wait endless (an unbounded `wait()`): now it ends at quiesce_timeout_s, wedged."""
    cfg = CacheConfig(
        device="cpu",
        l1_pages=8,
        l2_pages=8,
        l3_slots=16,
        write_policy="write_back",
        quiesce_timeout_s=BOUND_S,
    )
    engine = NullEngine(cfg.kv, 8, 8, 16)
    c = CacheController(cfg, engine=engine)
    c.admit(1, PROMPT)
    c.prefill(1)
    c.finish(1)
    engine.hang_issued.add(Direction.D2H)
    parked = leaks.parked()
    started = time.perf_counter()
    with pytest.raises(QuiesceTimeout, match="write-back wait"):
        c.evict("L1", 8)  # the victim's backup first, then the eviction
    assert time.perf_counter() - started < 1.0
    with pytest.raises(QuiesceTimeout, match="wedged"):
        c.admit(2, PROMPT)
    c.close()
    assert [op.direction for op in c.leaked] == [Direction.D2H]
    for handle in engine.handles:
        handle.unhang()
    assert leaks.reclaim() == parked


@pytest.mark.gpu
def test_a_cuda_cancel_waits_for_the_device_at_most_the_bound() -> None:
    """The CUDA side of the bound (`event_passed`, which polls the event): an event behind a
    kernel still running is not passed within a short bound -- the wait returns False at the
    bound instead of blocking -- and is passed once the device gets there (no bound)."""
    import torch

    from hicache.dataplane.handles import event_passed

    cuda: Any = torch.cuda  # untyped in torch's stubs
    stream = cuda.Stream()
    with cuda.stream(stream):
        cuda._sleep(2_000_000_000)  # about a second of device time: busy hardware
        busy = cuda.Event()
        busy.record(stream)
    started = time.perf_counter()
    assert not event_passed(busy, BOUND_S)  # R79: the wait gives up at the bound
    assert BOUND_S <= time.perf_counter() - started < 0.5
    assert event_passed(busy, None) and busy.query()
    done = cuda.Event()
    done.record(stream)
    assert event_passed(done, BOUND_S)  # quiet hardware: passed within the bound
