"""Layer-wise load-back on a GPU (spec/restore.md, "Layer-wise load-back", R82-R84).

The copies are held back behind a long kernel on the caller's stream (the H2D waits for it,
B05), and the reader runs on another stream: a reader that did not wait on the gate would
read the target pages before anything landed. Each test fills those pages with poison first.
The caller is a stream of its own, not the legacy default stream, which every other blocking
stream waits for: a held default stream would hold the reader too, and hide a missing wait.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

import torch

from hicache.controller.config import CacheConfig
from hicache.controller.controller import CacheController
from hicache.core.tiers import Tier
from hicache.dataplane.geometry import KVGeometry
from hicache.dataplane.layerwise import LayerwiseMover
from hicache.dataplane.pools import DevicePool, HostPool
from tests.cuda_streams import HOLD_CYCLES, caller_stream  # noqa: F401  (autouse)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

GEOMETRY = KVGeometry(layers=4, kv_heads=2, head_dim=32, dtype="fp32", page_size=16)


def hold_caller() -> None:
    """Keep the caller's stream busy, so an H2D issued now starts only after it (B05)."""
    torch.cuda._sleep(HOLD_CYCLES)  # type: ignore[no-untyped-call]


def mover() -> tuple[DevicePool, HostPool, LayerwiseMover]:
    dev = torch.device("cuda")
    l1, l2 = DevicePool(GEOMETRY, 32, dev), HostPool(GEOMETRY, 32, pin=True)
    l2.tensor.copy_(torch.randn(l2.tensor.shape))
    l1.tensor.fill_(float("nan"))
    m = LayerwiseMover(l1, l2, faults=None)
    if m._copy2d is None:
        pytest.skip(m.reason)
    return l1, l2, m


@pytest.mark.parametrize(
    "targets",
    [[20, 21, 22, 5, 6, 7], list(range(31, 19, -1))],
    ids=["direct", "staged"],  # L1 pages in 2 runs; 12 pages in reverse: one run each
)
def test_gpu_a_reader_on_another_stream_sees_each_layer_landed(targets: list[int]) -> None:
    l1, l2, m = mover()
    dst = np.array(targets, dtype=np.int64)
    src = np.arange(3, 3 + dst.size, dtype=np.int64)
    reader = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    reader.wait_stream(torch.cuda.current_stream())  # after the poison, not after the hold
    hold_caller()
    handle = m.issue(src, dst, None)
    assert handle is not None and handle.gate is not None
    seen = []
    with torch.cuda.stream(reader):
        for layer in range(GEOMETRY.layers):
            handle.gate.wait(layer)
            seen.append(l1.tensor[:, layer, torch.as_tensor(dst, device="cuda")].clone())
    torch.cuda.synchronize()
    want = l2.tensor[torch.as_tensor(src)].permute(1, 2, 0, 3, 4, 5)  # [K/V, layer, page, ...]
    for layer, got in enumerate(seen):
        assert torch.equal(got.cpu(), want[:, layer]), f"layer {layer} read before it landed"
    assert handle.wait(5.0).final and m.counters.done == 1
    assert m.staged == (dst.size == 12)


def streams_overlap() -> bool:
    """Whether a kernel on one stream runs while another stream is held (not so where every
    stream shares one hardware queue, e.g. CUDA_DEVICE_MAX_CONNECTIONS=1)."""
    other = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    other.wait_stream(torch.cuda.current_stream())
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    held, ran = (torch.cuda.Event(enable_timing=True) for _ in range(2))  # type: ignore[no-untyped-call]
    x = torch.ones(1, device="cuda")
    x.add_(1)  # loaded now: a kernel's first launch (lazy module loading) waits for the device
    torch.cuda.synchronize()
    start.record()
    hold_caller()
    held.record()
    with torch.cuda.stream(other):
        x.add_(1)
        ran.record(other)
    torch.cuda.synchronize()
    return bool(start.elapsed_time(ran) < start.elapsed_time(held) / 2)


def test_gpu_without_the_wait_the_reader_sees_poison() -> None:
    """The test above can fail: the same reader without `gate.wait` reads before the copies
    (where streams run side by side at all: else no test can see a missing wait)."""
    if not streams_overlap():
        pytest.skip("this GPU runs one stream at a time: a missing wait cannot show")
    l1, _, m = mover()
    src, dst = np.arange(0, 4, dtype=np.int64), np.arange(10, 14, dtype=np.int64)
    l1.tensor[:, 0, 10:14].clone()  # the copy kernel loaded now (a first launch waits for all)
    torch.cuda.synchronize()
    reader = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    reader.wait_stream(torch.cuda.current_stream())  # after the poison, not after the hold
    hold_caller()
    handle = m.issue(src, dst, None)
    with torch.cuda.stream(reader):
        early = l1.tensor[:, 0, 10:14].clone()
    torch.cuda.synchronize()
    assert torch.isnan(early).all()
    assert handle is not None and handle.wait(5.0).final


def test_gpu_a_landing_restore_prefills_on_its_layers() -> None:
    cfg = CacheConfig(
        geometry=GEOMETRY,
        l1_pages=32,
        l2_pages=32,
        l3_slots=32,
        device="cuda",
        policy="always",
        layerwise=True,
    )
    c = CacheController(cfg)
    prompt = tuple(range(100, 164))  # 4 pages
    c.admit(1, prompt)
    c.prefill(1)
    c.finish(1)
    c.drain()
    c.cp.evict("L1", 10_000)
    c.transfer_engine.l1_arena.fill_(float("nan"))
    hold_caller()
    tokens = prompt + tuple(range(16))
    mat = c.admit(2, tokens)
    assert not mat.done and c.ready(2)
    assert c.prefill(2) == 16
    assert torch.cuda.current_stream().query(), "prefill returns with the KV written"
    assert c.metrics.layerwise_prefills == 1 and c.metrics.verified_pages == 4
    pages = c.cp.prefix_pages(c.cp.prefix_node(2), Tier.L1)
    assert c.producer is not None
    want = c.producer.expected(tokens, 0, len(pages) * 16)
    assert want is not None
    held = c.transfer_engine.l1_arena[:, :, torch.as_tensor(np.asarray(pages), device="cuda")]
    assert torch.equal(held.permute(2, 0, 1, 3, 4, 5).contiguous(), want)
    c.close()


@pytest.mark.parametrize(("mode", "gate_layers"), [("eager", 1), ("graphs", 1), ("graphs", 3)])
def test_gpu_model_computes_on_a_landing_prefix(mode: str, gate_layers: int) -> None:
    """A small Qwen3's `compute_kv` on a prefix landing layer by layer behind a held caller
    equals `produce` on the landed prefix (eager: each layer filled after its wait; graphs:
    the graph gathers each layer after waiting on its external event -- or, with
    `gate_layers` 3, on the event of its group's last layer: groups {0, 1, 2} and {3})."""
    pytest.importorskip("transformers")
    from hicache.producers.model import ModelProducer, Qwen3Shape

    shape = Qwen3Shape(128, 4, 4, 2, 32, 256, 512, max_positions=4096)
    model = ModelProducer(
        shape, "cuda", torch.float32, mode=mode, page_size=16, gate_layers=gate_layers
    )
    assert model.geometry == GEOMETRY
    l1, l2, m = mover()
    tokens = list(range(1, 81))  # 5 pages: a 4-page prefix and one new page
    prefix_pages = torch.tensor([0, 1, 2, 3], device="cuda")
    model.produce(tokens, 0, 64, l1.tensor, torch.tensor([], dtype=torch.int64), prefix_pages)
    model.produce(tokens, 64, 80, l1.tensor, prefix_pages, torch.tensor([4], device="cuda"))
    want = l1.tensor[:, :, 4].clone()  # one page: [K/V, layer, 16 tokens, heads, dim]
    l2.tensor[8:12] = l1.tensor[:, :, 0:4].permute(2, 0, 1, 3, 4, 5).cpu()
    landing = np.array([16, 17, 18, 19], dtype=np.int64)
    for attempt in range(2):  # graphs: the first captures, the second replays the capture
        l1.tensor[:, :, 16:20] = float("nan")
        hold_caller()
        handle = m.issue(np.arange(8, 12, dtype=np.int64), landing, None)
        assert handle is not None and handle.gate is not None
        kv, seconds = model.compute_kv(
            tokens, 64, 80, l1.tensor, torch.as_tensor(landing, device="cuda"), handle.gate
        )
        assert handle.wait(5.0).final and seconds > 0
        # Equal up to rounding: the filled buffers and a gathered view may pick other kernels.
        torch.testing.assert_close(kv, want, rtol=1e-4, atol=1e-4, msg=f"attempt {attempt}")


@pytest.mark.parametrize("mode", ["eager", "graphs"])
def test_gpu_model_compute_kv_not_waited_for_returns_before_the_device(mode: str) -> None:
    """`wait=False` (what the controller asks): `compute_kv` returns while the caller's stream
    is still held -- nothing on the way waits for the device, the page list given on the host
    (numpy, as the controller gives it) included -- and the KV is right in the stream's
    order. Graphs: the second call (the first captures, and a capture synchronises)."""
    pytest.importorskip("transformers")
    from hicache.producers.model import ModelProducer, Qwen3Shape

    shape = Qwen3Shape(128, 4, 4, 2, 32, 256, 512, max_positions=4096)
    model = ModelProducer(shape, "cuda", torch.float32, mode=mode, page_size=16)
    l1, l2, m = mover()
    tokens = list(range(1, 81))
    prefix_pages = torch.tensor([0, 1, 2, 3], device="cuda")
    model.produce(tokens, 0, 64, l1.tensor, torch.tensor([], dtype=torch.int64), prefix_pages)
    model.produce(tokens, 64, 80, l1.tensor, prefix_pages, torch.tensor([4], device="cuda"))
    want = l1.tensor[:, :, 4].clone()
    l2.tensor[8:12] = l1.tensor[:, :, 0:4].permute(2, 0, 1, 3, 4, 5).cpu()
    landing = np.array([16, 17, 18, 19], dtype=np.int64)
    busy = []
    for attempt in range(2):
        l1.tensor[:, :, 16:20] = float("nan")
        hold_caller()
        handle = m.issue(np.arange(8, 12, dtype=np.int64), landing, None)
        assert handle is not None and handle.gate is not None
        kv, _ = model.compute_kv(tokens, 64, 80, l1.tensor, landing, handle.gate, wait=False)
        busy.append(not torch.cuda.current_stream().query())
        torch.cuda.current_stream().synchronize()
        assert handle.wait(5.0).final
        torch.testing.assert_close(kv, want, rtol=1e-4, atol=1e-4, msg=f"attempt {attempt}")
    assert busy[-1], "compute_kv(wait=False) waited for the device"
