"""CUDA graphs captured while the data plane is busy: the serving benchmark's
`cudaErrorStreamCaptureInvalidated`, provoked on purpose, round after round.

Each round issues D2H and H2D transfers (small runs, staged: pinned workspaces are made and
dropped) and H2S / S2H transfers large enough to keep the L3 I/O threads busy, leaves closed
controllers behind as cyclic garbage (each holds a registered pinned L2 pool: what the benchmark
leaves between configurations), then captures a graph of a new shape. Inside the capture, on
cue, the process does what it may do there on its own: the last reference to a pinned pool is
dropped on the capturing thread and on another thread (an L3 I/O thread, say), so their
finalizers run there, and the collector is let loose (threshold 1 and a few allocations: the
automatic collection a forward's allocations start). Before the capture window each of these
called CUDA inside the capture and invalidated it. Now every graph must replay what eager
execution computes, and every transfer's bytes must arrive.

`test_gpu_model_capture_...` captures through `ModelProducer` in `graphs` mode (a small Qwen3;
needs `transformers`) and uses no API newer than the bug, so it runs against the old code too.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import threading
import weakref
from collections.abc import Callable, Iterator

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

import torch

from hicache.controller.config import CacheConfig
from hicache.controller.controller import CacheController
from hicache.dataplane.engine import TransferEngine, one_pool
from hicache.dataplane.geometry import KVGeometry
from hicache.dataplane.handles import TransferHandle
from hicache.dataplane.pinned import pinned_empty
from hicache.producers.model import ModelProducer, Qwen3Shape
from tests.test_transfer import POISON, done, l1_bytes, l2_bytes, randomize

pytestmark = pytest.mark.gpu

PAGE = 16  # tokens per page
SMALL = 32  # L1 / L2 pages per D2H / H2D region
BIG = 1024  # pages per H2S / S2H: 32 MiB each, so the I/O threads are busy through a capture
GEOMETRY = KVGeometry(layers=4, kv_heads=2, head_dim=32, dtype="fp32", page_size=PAGE)  # 32 KiB
SHAPE = Qwen3Shape(
    hidden=128,
    layers=4,
    heads=4,
    kv_heads=2,
    head_dim=32,
    intermediate=256,
    vocab=512,
    max_positions=4096,
)
NO_COLLECTION = 10**9  # a collector threshold that is never reached


class Traffic:
    """An engine whose four kinds of transfer are in flight while a graph is captured.

    L1 pages  [0, producer)  producer's | D2H sources (SMALL) | H2D targets (SMALL)
    L2 pages  D2H targets (SMALL) | H2D sources (SMALL) | H2S sources (BIG) | S2H targets (BIG)
    L3 slots  S2H sources (BIG, written once) | H2S targets (BIG)
    """

    def __init__(self, producer_pages: int) -> None:
        self.p = producer_pages
        self.engine = TransferEngine(
            one_pool(GEOMETRY),
            self.p + 2 * SMALL,
            2 * SMALL + 2 * BIG,
            2 * BIG,
            device="cuda",
            io_threads=4,
        )
        e = self.engine
        e.dma.direct_min_bytes = 1 << 30  # every run staged: pinned workspaces come and go
        randomize(e.l1.tensor, seed=1)
        randomize(e.l2.tensor, seed=2)
        self.h2s_source = np.arange(2 * SMALL, 2 * SMALL + BIG)
        self.s2h_target = self.h2s_source + BIG
        done(e.h2s(self.h2s_source, np.arange(BIG)))
        self.s2h_bytes = l2_bytes(e, self.h2s_source).clone()
        self.h2s_digests = e.digests("L2", self.h2s_source)
        self._checks: list[Callable[[], None]] = []
        self._handles: list[TransferHandle] = []

    def issue(self, round_: int) -> None:
        """Start one D2H, H2D, H2S and S2H (poisoning their targets first)."""
        e, rng, n = self.engine, np.random.default_rng(round_), 4 + round_ % 8
        d2h_src = self.p + rng.choice(SMALL, n, replace=False)
        d2h_dst = rng.choice(SMALL, n, replace=False)
        h2d_src = SMALL + rng.choice(SMALL, n, replace=False)
        h2d_dst = self.p + SMALL + rng.choice(SMALL, n, replace=False)
        want_d2h, want_h2d = l1_bytes(e, d2h_src), l2_bytes(e, h2d_src)
        e.l2.bytes_view()[torch.from_numpy(d2h_dst)] = POISON
        e.l2.bytes_view()[int(self.s2h_target[0]) : int(self.s2h_target[-1]) + 1].fill_(POISON)
        e.l1.tensor.view(torch.uint8)[:, :, torch.from_numpy(h2d_dst).cuda()] = POISON
        slots = np.arange(BIG, 2 * BIG)
        self._handles = [
            e.d2h(d2h_src, d2h_dst),
            e.h2d(h2d_src, h2d_dst),
            e.h2s(self.h2s_source, slots),
            e.s2h(np.arange(BIG), self.s2h_target),
        ]
        self._checks = [
            lambda: _same(l2_bytes(e, d2h_dst), want_d2h, "D2H"),
            lambda: _same(l1_bytes(e, h2d_dst), want_h2d, "H2D"),
            lambda: _same(l2_bytes(e, self.s2h_target), self.s2h_bytes, "S2H"),
            lambda: _same(e.digests("L3", slots), self.h2s_digests, "H2S (digests)"),
        ]

    def check(self) -> None:
        """Every transfer of the round DONE, with the bytes it was to move."""
        for handle in self._handles:
            done(handle)
        for check in self._checks:
            check()


def _same(got: torch.Tensor | np.ndarray, want: torch.Tensor | np.ndarray, what: str) -> None:
    same = (
        torch.equal(got, want)
        if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)
        else np.array_equal(got, want)
    )
    assert same, f"{what}: bytes differ after a capture during the transfer"


class Disturbance:
    """What the process may do while a graph is captured: prepared by `arm`, done by `fire`."""

    def __init__(self) -> None:
        self.pinned: list[torch.Tensor] = []
        self.dead: list[weakref.ref[CacheController]] = []
        self.fired = 0

    def arm(self) -> None:
        """Two pinned pools (referenced only here) and two closed controllers left as cyclic
        garbage, young: no automatic collection runs until the cue."""
        gc.collect()
        gc.set_threshold(NO_COLLECTION)
        self.pinned = [pinned_empty((1 << 20,), torch.uint8) for _ in range(2)]
        self.dead = [_closed_controller() for _ in range(2)]
        self.fired = 0

    def fire(self) -> None:
        """Inside the capture: drop the pools here and on another thread, let the collector go."""
        self.fired += 1
        self.pinned.pop()  # the last reference: its finalizer runs on this thread, now
        other = threading.Thread(target=self.pinned.pop)
        other.start()
        other.join()
        gc.set_threshold(1)
        junk = [[i] for i in range(64)]  # allocations: automatic collections, if enabled
        gc.set_threshold(NO_COLLECTION)
        del junk

    def fire_if_capturing(self, *_: object) -> None:
        """A forward pre-hook: the model runs eagerly to warm up, and once under capture."""
        if torch.cuda.is_current_stream_capturing():
            self.fire()

    def check(self) -> None:
        """After the capture: it fired once, and the dead controllers were freed (no collection
        runs outside the capture window: the threshold is out of reach)."""
        assert self.fired == 1, f"fired {self.fired} times in one capture"
        assert all(ref() is None for ref in self.dead), "a closed controller was never freed"


def _closed_controller() -> weakref.ref[CacheController]:
    cfg = CacheConfig(
        geometry=GEOMETRY,
        l1_pages=8,
        l2_pages=8,
        l3_slots=8,
        device="cuda",
        backend="torch",
        check_mode="off",
        verify=False,
    )  # torch: no probe to time
    ctl = CacheController(cfg)
    ctl.close()
    return weakref.ref(ctl)  # its backup chain points back to it: only the collector frees it


@pytest.fixture
def collector() -> Iterator[None]:
    """The collector's settings as they were, whatever the test did to them."""
    enabled, threshold = gc.isenabled(), gc.get_threshold()
    yield
    gc.set_threshold(*threshold)
    (gc.enable if enabled else gc.disable)()


def test_gpu_model_capture_survives_transfers_and_dying_pinned_pools(collector: None) -> None:
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("the model producer needs transformers")
    rounds = 10  # more than GRAPHS_MAX: old graphs are dropped while new ones are captured
    graphs = ModelProducer(SHAPE, "cuda", torch.float32, mode="graphs", page_size=PAGE)
    eager = ModelProducer(SHAPE, "cuda", torch.float32, mode="eager", page_size=PAGE)
    assert graphs.geometry == GEOMETRY
    traffic, disturbance = Traffic(rounds + 1), Disturbance()
    graphs.model.register_forward_pre_hook(disturbance.fire_if_capturing)
    tokens = torch.randint(
        0, SHAPE.vocab, (PAGE * (rounds + 1),), generator=torch.Generator().manual_seed(5)
    ).tolist()
    l1, eager_l1 = traffic.engine.l1.tensor, torch.zeros_like(traffic.engine.l1.tensor)
    try:
        for r in range(rounds):  # page r: tokens [16r, 16r + 16) after pages 0..r-1
            span, prefix, new = (PAGE * r, PAGE * (r + 1)), np.arange(r), np.array([r])
            traffic.issue(r)
            disturbance.arm()
            graphs.produce(tokens, *span, l1, prefix, new)  # captures this shape, then replays
            disturbance.check()
            eager.produce(tokens, *span, eager_l1, prefix, new)
            torch.testing.assert_close(l1[:, :, r], eager_l1[:, :, r], rtol=1e-4, atol=1e-4)
            traffic.check()
        graphs.produce(
            tokens,
            PAGE * (rounds - 1),
            PAGE * rounds,
            l1,
            np.arange(rounds - 1),
            np.array([rounds]),
        )  # the last shape again: a replay, no capture
        assert torch.equal(l1[:, :, rounds], l1[:, :, rounds - 1])
    finally:
        traffic.engine.close()


def test_gpu_capture_helper_survives_transfers_and_dying_pinned_pools(collector: None) -> None:
    # Imported here, not above: the model test must run against code older than this module.
    capture = importlib.import_module("hicache.dataplane.capture")
    traffic, disturbance = Traffic(1), Disturbance()
    gen = torch.Generator(device="cuda").manual_seed(3)
    x, w1, w2 = (
        torch.randn(shape, device="cuda", generator=gen)
        for shape in ((64, 256), (256, 512), (512, 128))
    )
    ran_capturing: list[bool] = []

    def work() -> torch.Tensor:
        hidden = torch.relu(x @ w1)
        disturbance.fire()
        capture.outside_capture(
            lambda: ran_capturing.append(torch.cuda.is_current_stream_capturing())
        )
        return hidden @ w2

    _ = torch.relu(x @ w1) @ w2  # warm-up: libraries' lazy setup happens outside the capture
    try:
        for r in range(6):
            traffic.issue(r)
            disturbance.arm()
            graph = torch.cuda.CUDAGraph()
            y = capture.capture(graph, work)
            disturbance.check()
            assert ran_capturing == [False] * (r + 1), "a deferred call ran inside the capture"
            x.normal_(generator=gen)
            graph.replay()
            torch.testing.assert_close(y, torch.relu(x @ w1) @ w2, rtol=1e-4, atol=1e-4)
            traffic.check()
    finally:
        traffic.engine.close()
