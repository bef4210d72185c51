"""Layer-wise load-back (spec/restore.md, "Layer-wise load-back", R82-R84) on the CPU.

The data plane: an H2D lands layer by layer, a layer when its reader waits for it (CPU: the
copy runs then), every layer's bytes those of L2; a failed one lands only its first layers.
The controller: a landing restore is `ready`, its prefill computes on the landing prefix and
uses that KV only when the H2D ended DONE -- a failed one's KV is thrown away, and what
reaches the tree is what recomputation writes (the synthetic producer's `compute_kv` comes
out wrong, in every byte, for a layer it read before that layer landed right)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

import torch

from hicache.controller import ahead as ahead_module
from hicache.controller.config import CacheConfig
from hicache.controller.controller import CacheController
from hicache.core.tiers import Tier
from hicache.dataplane.faults import FaultInjector, FaultSite
from hicache.dataplane.geometry import preset
from hicache.dataplane.handles import TransferStatus
from hicache.dataplane.layerwise import MAX_RUNS, LayerwiseMover, runs_of
from hicache.dataplane.pools import DevicePool, HostPool
from hicache.errors import OutOfPages
from hicache.producers import SyntheticProducer

PS = 4  # the tiny geometry's page size
PROMPT = tuple(range(100, 124))  # 6 pages
TAIL = (7, 7, 7, 7)


def pools() -> tuple[DevicePool, HostPool]:
    g = preset("tiny")
    l1, l2 = DevicePool(g, 16, torch.device("cpu")), HostPool(g, 16, pin=False)
    l2.tensor.copy_(torch.randn(l2.tensor.shape))
    l1.tensor.fill_(0.0)
    return l1, l2


def ids(*pages: int) -> np.ndarray:
    return np.array(pages, dtype=np.int64)


def test_runs_are_consecutive_in_both_tiers() -> None:
    assert runs_of(ids(3, 4, 5, 9), ids(0, 1, 2, 3)) == [(3, 0, 3), (9, 3, 1)]
    assert runs_of(ids(3, 4, 5), ids(0, 2, 3)) == [(3, 0, 1), (4, 2, 2)]
    assert runs_of(ids(), ids()) == []


def test_a_layer_lands_when_its_reader_waits_for_it() -> None:
    l1, l2 = pools()
    mover = LayerwiseMover(l1, l2, faults=None)
    src, dst = ids(2, 3, 7), ids(5, 6, 1)
    handle = mover.issue(src, dst, None)
    assert handle is not None and handle.gate is not None
    want = l2.tensor[src].transpose(0, 1)  # [K/V, page, layer, ...] as L1 holds each layer
    for layer in range(handle.gate.layers):
        assert not l1.tensor[:, layer, dst].any(), f"layer {layer} landed before its wait"
        handle.gate.wait(layer)
        assert torch.equal(l1.tensor[:, layer, dst], want[:, :, layer])
    assert handle.gate.landed_layers == handle.gate.layers
    assert handle.poll() is TransferStatus.DONE
    assert mover.counters.done == 1 and not mover.in_flight


def test_pages_in_any_order_land_where_they_belong() -> None:
    l1, l2 = pools()
    mover = LayerwiseMover(l1, l2, faults=None)
    src, dst = ids(*range(12)), ids(*range(15, 3, -1))  # 12 runs of one page: staged on a GPU
    handle = mover.issue(src, dst, None)
    assert handle is not None and handle.poll() is TransferStatus.DONE
    assert torch.equal(l1.tensor[:, :, dst], l2.tensor[src].permute(1, 2, 0, 3, 4, 5))


def test_layers_nobody_waited_for_land_at_the_end() -> None:
    l1, l2 = pools()
    mover = LayerwiseMover(l1, l2, faults=None)
    handle = mover.issue(ids(0, 1), ids(4, 5), None)
    assert handle is not None and handle.poll() is TransferStatus.DONE
    assert torch.equal(l1.tensor[:, :, [4, 5]], l2.tensor[[0, 1]].permute(1, 2, 0, 3, 4, 5))


def test_a_failed_load_back_lands_only_its_first_layers() -> None:
    l1, l2 = pools()
    faults = FaultInjector().once(FaultSite.H2D_COMPLETE)
    mover = LayerwiseMover(l1, l2, faults=faults)
    handle = mover.issue(ids(0, 1), ids(4, 5), None)
    assert handle is not None and handle.wait(1.0) is TransferStatus.FAILED
    torn = l1.geometry.layers // 2
    landed = l2.tensor[[0, 1]].permute(1, 2, 0, 3, 4, 5)[:, :torn]
    assert torch.equal(l1.tensor[:, :torn, [4, 5]], landed)
    assert not l1.tensor[:, torn:, [4, 5]].any()
    assert mover.counters.failed == 1


def test_a_cancelled_load_back_lands_nothing_more() -> None:
    l1, l2 = pools()
    mover = LayerwiseMover(l1, l2, faults=None)
    handle = mover.issue(ids(0), ids(4), None)
    assert handle is not None and handle.gate is not None
    handle.gate.wait(0)
    handle.cancel()
    assert handle.status is TransferStatus.CANCELLED
    assert l1.tensor[:, 0, 4].any() and not l1.tensor[:, 1:, 4].any()


def test_too_many_runs_go_the_usual_way() -> None:
    l1, l2 = pools()
    mover = LayerwiseMover(l1, l2, faults=None)
    scattered = ids(*range(0, 2 * (MAX_RUNS + 1), 2))
    assert mover.issue(scattered, ids(*range(MAX_RUNS + 1)), None) is None


# -- the controller --------------------------------------------------------------------------


def make(faults: FaultInjector | None = None, **kw: object) -> CacheController:
    # The CPU plane: there a layer lands when its reader waits (deterministic, any machine).
    cfg = CacheConfig(
        **{
            "l1_pages": 16,
            "l2_pages": 32,
            "l3_slots": 64,
            "policy": "always",
            "device": "cpu",
            **kw,
        }  # type: ignore[arg-type]
    )
    return CacheController(cfg, faults=faults)


def cached_in_l2(c: CacheController) -> None:
    """PROMPT served, backed up, and then only in L2 and L3."""
    c.admit(1, PROMPT)
    c.prefill(1)
    c.finish(1)
    c.drain()
    c.cp.evict("L1", 10_000)
    # What the freed pages held is not what a load-back lands there: a reader that reads a
    # layer before it landed must not find the right bytes by chance.
    c.transfer_engine.l1_arena.fill_(0.25)


def tree_pages_hold_what_recompute_writes(c: CacheController, tokens: tuple[int, ...]) -> None:
    """Every L1 page of `tokens`' cached prefix holds the producer's expected bytes."""
    node = c.cp.prefix_node(2)
    pages = c.cp.prefix_pages(node, Tier.L1)
    assert c.producer is not None and len(pages)
    want = c.producer.expected(tokens, 0, len(pages) * PS)
    assert want is not None
    index = torch.as_tensor(np.asarray(pages))
    held = c.transfer_engine.l1_arena[:, :, index].permute(2, 0, 1, 3, 4, 5).contiguous()
    assert torch.equal(held.view(torch.uint8), want.contiguous().view(torch.uint8))


def test_a_landing_restore_is_ready_and_its_prefill_computes_on_it() -> None:
    c = make(layerwise=True)
    cached_in_l2(c)
    mat = c.admit(2, PROMPT + TAIL)
    assert not mat.done and c.ready(2)  # landing: ready before its H2D ended
    assert c.prefill(2) == 4  # only the new page is computed
    assert c.metrics.layerwise_prefills == 1 and c.metrics.ahead_discarded == 0
    assert c.metrics.hit_tokens["L2"] == 24 and c.metrics.verified_pages == 6
    tree_pages_hold_what_recompute_writes(c, PROMPT + TAIL)
    c.finish(2)
    c.drain()
    assert not c.cp.ops and c.cp.checker.violations_found == 0
    c.close()


def test_the_prefill_queues_its_computation_ahead_without_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The controller asks `compute_kv` not to wait (`wait=False`): its own settling runs on
    the host while the device computes (controller/ahead.py); the bytes are the same."""
    c = make(layerwise=True)
    cached_in_l2(c)
    assert c.producer is not None
    real, asked = c.producer.compute_kv, []  # type: ignore[attr-defined]

    def recording(*args: object, **kwargs: bool) -> object:
        asked.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(c.producer, "compute_kv", recording)
    c.admit(2, PROMPT + TAIL)
    assert c.prefill(2) == 4 and asked == [{"wait": False}]
    tree_pages_hold_what_recompute_writes(c, PROMPT + TAIL)
    c.close()


def test_an_l3_restore_lands_its_last_step_layer_by_layer() -> None:
    """The promoted part's H2D is the restore's one op once its S2H is done: landing."""
    c = make(layerwise=True)
    cached_in_l2(c)
    c.cp.evict("L2", 10_000)  # only in L3 now
    mat = c.admit(2, PROMPT + TAIL)
    while not c.ready(2):
        c.wait(2)
        c.tick()
    assert mat.s2h_done and not mat.done  # ready while the H2D lands
    assert c.prefill(2) == 4
    assert c.metrics.layerwise_prefills == 1 and c.metrics.hit_tokens["L3"] == 24
    tree_pages_hold_what_recompute_writes(c, PROMPT + TAIL)
    c.close()


def test_without_layerwise_the_restore_waits_for_its_end() -> None:
    c = make()
    cached_in_l2(c)
    mat = c.admit(2, PROMPT + TAIL)
    assert mat.ops and not c.ready(2)
    c.close()


def test_a_failed_landing_restore_throws_its_kv_away() -> None:
    faults = FaultInjector()
    c = make(faults, layerwise=True)
    cached_in_l2(c)
    faults.once(FaultSite.H2D_COMPLETE)  # drawn at issue: half the layers never land
    c.admit(2, PROMPT + TAIL)
    assert c.ready(2)
    assert c.prefill(2) == 28  # nothing restored: everything recomputed
    assert c.metrics.ahead_discarded == 1 and c.metrics.layerwise_prefills == 0
    assert c.metrics.fallbacks["transfer_failed"] == 1
    tree_pages_hold_what_recompute_writes(c, PROMPT + TAIL)
    c.finish(2)
    c.close()


def test_kv_computed_before_a_layer_landed_would_be_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: a gate that lets its reader in before the layer landed (a
    planted bug: `wait` returns at once, the layers land only at the end) gives the new
    page's KV computed on stale layers, and the op still ends DONE, every restored page
    right -- the tree then holds a page recomputation would not write."""

    def lets_in(gate: object, layer: int) -> None:
        pass

    monkeypatch.setattr("hicache.dataplane.layerwise._PerLayerGate.wait", lets_in)
    c = make(layerwise=True)
    cached_in_l2(c)
    c.admit(2, PROMPT + TAIL)
    c.prefill(2)
    assert c.metrics.layerwise_prefills == 1
    with pytest.raises(AssertionError):
        tree_pages_hold_what_recompute_writes(c, PROMPT + TAIL)
    c.close()


class Ended:
    """A handle's end, as `take` reads it."""

    def __init__(self, status: TransferStatus) -> None:
        self.status = status


@pytest.mark.parametrize("status", [TransferStatus.FAILED, TransferStatus.CANCELLED])
def test_kv_of_a_load_back_that_did_not_end_done_is_never_taken(status: TransferStatus) -> None:
    prefix = ids(3, 4)
    kv = object()
    done = ahead_module.Ahead(8, 12, prefix, kv, Ended(TransferStatus.DONE))  # type: ignore[arg-type]
    assert ahead_module.take(done, 8, 12, prefix) is kv
    assert ahead_module.take(done, 4, 12, prefix) is None  # another range
    assert ahead_module.take(done, 8, 12, ids(3, 5)) is None  # other pages
    ended = ahead_module.Ahead(8, 12, prefix, kv, Ended(status))  # type: ignore[arg-type]
    assert ahead_module.take(ended, 8, 12, prefix) is None


def test_a_prefill_refused_for_room_changes_nothing() -> None:
    c = make(layerwise=True, l1_pages=7)
    cached_in_l2(c)
    c.admit(2, PROMPT + TAIL)  # 6 pages land, 1 to compute: L1 has 7
    c.admit(3, (900, 901, 902, 903))  # holds the seventh page (not prefilled yet)
    c.prefill(3)
    assert c.ready(2)
    ops, free = dict(c.cp.ops), c.cp.free_pages(Tier.L1)
    with pytest.raises(OutOfPages):
        c.prefill(2)
    # Refused before the op's end was applied: still in flight, nothing evicted or computed.
    assert c.cp.ops == ops and c.cp.free_pages(Tier.L1) == free and not c.restores[2].done
    assert c.metrics.layerwise_prefills == 0
    c.close()


def test_a_delayed_end_is_waited_for() -> None:
    faults = FaultInjector(delay_polls=3)
    c = make(faults, layerwise=True)
    cached_in_l2(c)
    faults.once(FaultSite.DELAY)
    c.admit(2, PROMPT + TAIL)
    assert c.ready(2) and c.prefill(2) == 4
    assert c.metrics.layerwise_prefills == 1
    c.close()


def test_synthetic_compute_kv_is_wrong_where_the_prefix_was() -> None:
    """A layer read before it landed gives that layer's KV sign-flipped (a model's output on
    a wrong prefix is wrong): what makes the controller's rule observable on a CPU."""
    g = preset("tiny")
    producer = SyntheticProducer(g)
    l1 = torch.zeros((2, g.layers, 8, g.page_size, g.kv_heads, g.head_dim))
    tokens = tuple(range(12))
    prefix = ids(0, 1)
    producer.produce(tokens, 0, 8, l1, ids(), prefix)

    class Gate:
        layers = g.layers
        landed_layers = 0

        def wait(self, layer: int) -> None:
            pass

    right, _ = producer.compute_kv(tokens, 8, 12, l1, prefix, Gate())
    want = producer.expected(tokens, 8, 12)
    assert torch.equal(right.reshape(2, g.layers, 1, PS, g.kv_heads, g.head_dim)[:, :, 0], want[0])
    l1[:, 1, 1] = 0.5  # layer 1 of the second prefix page: not what landed from L2
    wrong, _ = producer.compute_kv(tokens, 8, 12, l1, prefix, Gate())
    assert torch.equal(wrong[:, 0], right[:, 0])
    assert torch.equal(wrong[:, 1], -right[:, 1])
