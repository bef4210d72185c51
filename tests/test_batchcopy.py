"""A chunk's DMAs as one batched driver call (hicache/dataplane/batchcopy.py).

On the CPU the batched call is replaced by a recording fake that performs the copies from
the pointers and sizes it is handed, so what the movers pass the driver is checked without
a GPU: every piece's target, source and size, in one call; a driver that answers "not
supported" turns batching off for good and the same bytes still move. On CUDA the real
call moves fragmented pages between the device and pinned memory, and the movers use it.
"""

from __future__ import annotations

import ctypes

import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

import numpy as np
import torch

from hicache.core.tiers import Direction
from hicache.dataplane.batchcopy import BatchedCopies, Piece
from hicache.dataplane.geometry import KVGeometry
from hicache.errors import TransferError


def pieces_of(seed: int, n: int, size: int) -> tuple[torch.Tensor, torch.Tensor, list[Piece]]:
    """`n` pieces of `size` bytes from random rows of a source into random rows of a target."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, 256, (4 * n, size), dtype=torch.uint8, generator=gen)
    dst = torch.zeros((4 * n, size), dtype=torch.uint8)
    a, b = rng.permutation(4 * n)[:n], rng.permutation(4 * n)[:n]
    return src, dst, [(dst[int(j)], src[int(i)]) for i, j in zip(a, b)]


class FakeDriver:
    """Stands in for cuMemcpyBatchAsync: records each call, copies with memmove, or answers
    `answer` (-1: not supported) without copying."""

    def __init__(self, answer: int = 0) -> None:
        self.calls: list[tuple[list[int], list[int], list[int]]] = []
        self.answer = answer

    def __call__(self, dsts: list[int], srcs: list[int], sizes: list[int], stream: int) -> int:
        self.calls.append((dsts, srcs, sizes))
        if self.answer == 0:
            for d, s, n in zip(dsts, srcs, sizes):
                ctypes.memmove(d, s, n)
        return self.answer


def test_cpu_copies_piece_by_piece() -> None:
    _, _, pieces = pieces_of(0, 5, 64)
    copies = BatchedCopies(torch.device("cpu"))
    assert not copies.batched and "CPU" in copies.reason
    assert copies.copy(pieces) == 5
    for target, source in pieces:
        assert torch.equal(target, source)
    assert copies.status()["batched_calls"] == 0


@pytest.mark.parametrize("n", [2, 7, 22])
def test_one_call_carries_every_piece(n: int) -> None:
    _, _, pieces = pieces_of(n, n, 96)
    copies = BatchedCopies(torch.device("cpu"))
    fake = FakeDriver()
    copies._batch = fake
    assert copies.copy(pieces) == 1
    assert len(fake.calls) == 1
    dsts, srcs, sizes = fake.calls[0]
    assert dsts == [t.data_ptr() for t, _ in pieces]
    assert srcs == [s.data_ptr() for _, s in pieces]
    assert sizes == [96] * n
    for target, source in pieces:
        assert torch.equal(target, source)
    assert (copies.batched_calls, copies.batched_pieces) == (1, n)


def test_a_single_piece_goes_as_a_batch_of_one() -> None:
    """Cheaper for the issuing thread than the byte views and `copy_` of the per-piece way;
    nothing at all is a call of nothing."""
    _, _, pieces = pieces_of(1, 1, 32)
    copies = BatchedCopies(torch.device("cpu"))
    fake = FakeDriver()
    copies._batch = fake
    assert copies.copy(pieces) == 1 and len(fake.calls) == 1
    assert fake.calls[0] == ([pieces[0][0].data_ptr()], [pieces[0][1].data_ptr()], [32])
    assert torch.equal(*pieces[0])
    src = torch.arange(64, dtype=torch.uint8)
    dst = torch.zeros(64, dtype=torch.uint8)
    assert copies.copy_runs(dst, src, [(8, 16, 24)]) == 1 and len(fake.calls) == 2
    assert torch.equal(dst[8:32], src[16:40]) and int(dst[:8].sum()) == 0
    assert copies.copy([]) == 0 and copies.copy_runs(dst, src, []) == 0
    assert len(fake.calls) == 2


def test_a_driver_without_batches_turns_batching_off_and_still_copies() -> None:
    _, _, pieces = pieces_of(2, 4, 48)
    copies = BatchedCopies(torch.device("cpu"))
    fake = FakeDriver(answer=-1)
    copies._batch = fake
    assert copies.copy(pieces) == 4  # fell back: one copy each
    assert not copies.batched and "does not support" in copies.reason
    for target, source in pieces:
        assert torch.equal(target, source)
    copies.copy(pieces)
    assert len(fake.calls) == 1  # never asked again


def test_a_first_batch_that_fails_turns_batching_off_and_still_copies() -> None:
    """Bindings of another CUDA major refuse the call's arguments (TypeError) or the driver
    fails it: the first batch falls back for good; after one worked, a failure raises."""
    _, _, pieces = pieces_of(4, 3, 40)
    copies = BatchedCopies(torch.device("cpu"))

    def refuses(dsts: list[int], srcs: list[int], sizes: list[int], stream: int) -> int:
        raise TypeError("Argument 'srcs' is not instance of type list[CUdeviceptr]")

    copies._batch = refuses
    assert copies.copy(pieces) == 3 and not copies.batched
    assert "first batch failed" in copies.reason and "TypeError" in copies.reason
    for target, source in pieces:
        assert torch.equal(target, source)
    worked = BatchedCopies(torch.device("cpu"))
    worked._batch = FakeDriver()
    worked.copy(pieces)

    def fails(dsts: list[int], srcs: list[int], sizes: list[int], stream: int) -> int:
        raise TransferError("cuMemcpyBatchAsync of 3 copies failed: CUresult 700")

    worked._batch = fails
    with pytest.raises(TransferError, match="CUresult 700"):
        worked.copy(pieces)


@pytest.mark.parametrize("batched", [False, True])
def test_runs_copy_byte_spans_between_two_tensors(batched: bool) -> None:
    """`copy_runs`: byte spans of a typed tensor (bf16 here) by base address and offset when
    batched, by byte views otherwise -- the same bytes either way; a span past either end is
    refused before anything is copied."""
    gen = torch.Generator().manual_seed(9)
    source = torch.randn((12, 4, 8), generator=gen).to(torch.bfloat16)  # 64 B a row
    target = torch.zeros((16, 4, 8), dtype=torch.bfloat16)
    copies = BatchedCopies(torch.device("cpu"))
    fake = FakeDriver()
    if batched:
        copies._batch = fake
    runs = [(3 * 64, 0, 2 * 64), (10 * 64, 5 * 64, 64), (0, 11 * 64, 64)]
    extra_t, extra_s = torch.zeros(7, dtype=torch.uint8), torch.arange(7, dtype=torch.uint8)
    calls = copies.copy_runs(target, source, runs, [(extra_t, extra_s)])
    assert calls == (1 if batched else 4) and len(fake.calls) == int(batched)
    assert torch.equal(target[3:5], source[0:2]) and torch.equal(target[10], source[5])
    assert torch.equal(target[0], source[11]) and torch.equal(extra_t, extra_s)
    assert not target[5:10].any() and not target[11:].any()  # nothing else written
    with pytest.raises(AssertionError):
        copies.copy_runs(target, source, [(15 * 64, 0, 2 * 64), (0, 0, 64)])  # past the end
    assert len(fake.calls) == int(batched)


@pytest.mark.parametrize("batched", [False, True])
def test_spans_copy_between_pairs_of_tensors(batched: bool) -> None:
    """`copy_spans`: each span between its own two tensors (a group's L2 regions and its
    workspace), by address when batched -- the same bytes either way; a span past either end
    is refused before anything is copied."""
    regions = [torch.arange(64, dtype=torch.uint8) + 64 * i for i in range(2)]
    packed = torch.zeros(96, dtype=torch.uint8)
    copies = BatchedCopies(torch.device("cpu"))
    fake = FakeDriver()
    if batched:
        copies._batch = fake
    spans = [
        (packed, 0, regions[0], 16, 32),
        (packed, 40, regions[1], 0, 8),
        (packed, 48, regions[0], 60, 4),
    ]
    assert copies.copy_spans(spans) == (1 if batched else 3) and len(fake.calls) == int(batched)
    assert torch.equal(packed[0:32], regions[0][16:48]) and torch.equal(
        packed[40:48], regions[1][0:8]
    )
    assert torch.equal(packed[48:52], regions[0][60:64])
    assert not packed[32:40].any() and not packed[52:].any()  # nothing else written
    with pytest.raises(AssertionError):
        copies.copy_spans([(packed, 90, regions[0], 0, 8)])  # past the target's end
    assert len(fake.calls) == int(batched)


def test_batching_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HICACHE_BATCHED_COPIES", "0")
    assert "off" in BatchedCopies(torch.device("cuda")).reason
    assert "off" in BatchedCopies(torch.device("cuda"), enabled=False).reason


@pytest.mark.parametrize("pools", ["mha", "mla-tiny"])
def test_movers_hand_each_chunk_to_one_batch(pools: str) -> None:
    """Both byte paths give the batch every DMA of a chunk (a stage) and move the bytes it
    copies: fragmented L2 pages out and back, digests equal."""
    from hicache.dataplane.engine import TransferEngine, one_pool
    from hicache.pools.presets import group

    g = KVGeometry(layers=2, kv_heads=2, head_dim=16, dtype="fp32", page_size=4)
    layout = one_pool(g) if pools == "mha" else group(pools)
    with TransferEngine(layout, 16, 24, 4, device="cpu", io_threads=0) as engine:
        fake = FakeDriver()
        if engine.one_pool:
            engine.dma.direct_min_bytes = 0  # every run a DMA, none staged
            copies = engine.dma.copies
        else:
            copies = engine.mover.copies
        copies._batch = fake
        engine.l1_region(engine.pools.pools[0].name).random_(0, 256)
        l1 = np.arange(2, 8, dtype=np.int64)
        l2 = np.array([20, 3, 11, 7, 0, 15], dtype=np.int64)  # six runs of one page
        assert engine.d2h(l1, l2).wait().name == "DONE"
        assert len(fake.calls) >= 1 and sum(len(c[0]) for c in fake.calls) >= 6
        back = np.arange(9, 15, dtype=np.int64)
        assert engine.h2d(l2, back).wait().name == "DONE"
        assert np.array_equal(engine.digests("L1", l1), engine.digests("L1", back))
        assert np.array_equal(engine.digests("L1", l1), engine.digests("L2", l2))


# -- GPU ------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("to_host", [True, False])
def test_gpu_batched_call_moves_fragmented_pages(to_host: bool) -> None:
    copies = BatchedCopies(torch.device("cuda"))
    if not copies.batched:
        pytest.skip(copies.reason)
    dev = torch.randint(0, 256, (64, 1 << 16), dtype=torch.uint8, device="cuda")
    host = torch.zeros((64, 1 << 16), dtype=torch.uint8).pin_memory()
    rng = np.random.default_rng(5)
    a, b = rng.permutation(64)[:22].tolist(), rng.permutation(64)[:22].tolist()
    if to_host:
        pieces = [(host[j], dev[i]) for i, j in zip(a, b)]
    else:
        host.random_(0, 256)
        pieces = [(dev[j], host[i]) for i, j in zip(a, b)]
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    with torch.cuda.stream(stream):
        assert copies.copy(pieces) == 1
    stream.synchronize()
    for target, source in pieces:
        assert torch.equal(target.cpu(), source.cpu())
    with pytest.raises(AssertionError):  # a strided piece is refused before the driver
        copies.copy([(host[0, ::2], dev[0, ::2]), (host[1], dev[1])])


@pytest.mark.gpu
def test_gpu_fragmented_transfer_goes_as_one_batch_per_chunk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hicache.dataplane.engine import TransferEngine, one_pool

    monkeypatch.setenv("HICACHE_MAPPED_D2H", "0")  # the DMA route: neither mapped nor pitched
    monkeypatch.setenv("HICACHE_PITCHED_DMA", "0")
    g = KVGeometry(layers=4, kv_heads=8, head_dim=128, dtype="bf16", page_size=16)
    with TransferEngine(one_pool(g), 40, 64, 4, device="cuda", backend="triton") as engine:
        if not engine.dma.copies.batched:
            pytest.skip(engine.dma.copies.reason)
        engine.l1.tensor.view(torch.uint8).random_(0, 256)
        l1 = np.arange(10, 20, dtype=np.int64)
        l2 = np.array([60, 3, 17, 40, 8, 33, 51, 0, 26, 12], dtype=np.int64)  # ten runs
        assert engine.d2h(l1, l2).wait().name == "DONE"
        assert engine.dma.copies.batched_calls == 1
        assert engine.dma.copies.batched_pieces == 10
        assert engine.dma.counters[Direction.D2H].mapped == 0
        back = np.arange(20, 30, dtype=np.int64)
        assert engine.h2d(l2, back).wait().name == "DONE"
        assert np.array_equal(engine.digests("L1", l1), engine.digests("L1", back))
