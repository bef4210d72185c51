"""When the mover captures and replays its issue graphs (issuegraphs.py), without a GPU: the
bookkeeping around the capture, with the capture itself stood in for. On a GPU,
tests/test_issue_graphs_gpu.py checks the bytes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

import torch

from hicache.core.tiers import Direction
from hicache.dataplane import issuegraphs
from hicache.dataplane.issuegraphs import CAPTURE_AT, GRAPHS_KEPT, GraphKey, IssueGraphs


def key(i: int) -> GraphKey:
    return GraphKey(1000 + i, 2000 + i, 8, 0, 3000 + i, 8)


class FakeGraph:
    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


def enabled(monkeypatch: pytest.MonkeyPatch, fail: bool = False) -> tuple[IssueGraphs, list[str]]:
    """An IssueGraphs that believes it is on a GPU; its capture runs `work` once and returns
    a FakeGraph (or fails, as a refused capture does)."""
    graphs = IssueGraphs(torch.device("cpu"), enabled=True)
    graphs.enabled = True
    calls: list[str] = []

    def capture(work: Callable[[], None]) -> FakeGraph | None:
        calls.append("capture")
        if fail:
            graphs.enabled, graphs.reason = False, "off: a capture failed (test)"
            return None
        graphs.captures += 1
        return FakeGraph()

    monkeypatch.setattr(graphs, "_capture", capture)
    return graphs, calls


def test_off_the_gpu_nothing_is_captured() -> None:
    graphs = IssueGraphs(torch.device("cpu"))
    ran: list[int] = []
    for _ in range(CAPTURE_AT + 2):
        assert not graphs.run(key(0), lambda: ran.append(1))
    assert ran == [] and graphs.status()["reason"] == "off: CPU"  # the caller runs the work


def test_the_first_sight_runs_eagerly_the_second_captures_then_replays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    graphs, calls = enabled(monkeypatch)
    answers = [graphs.run(key(0), lambda: None) for _ in range(5)]
    assert answers == [False] * (CAPTURE_AT - 1) + [True] * (5 - CAPTURE_AT + 1)
    assert calls == ["capture"] and graphs.replays == 5 - CAPTURE_AT + 1
    assert not graphs.run(key(1), lambda: None)  # another key: its own first sight


def test_a_failed_capture_turns_the_graphs_off(monkeypatch: pytest.MonkeyPatch) -> None:
    graphs, calls = enabled(monkeypatch, fail=True)
    answers = [graphs.run(key(0), lambda: None) for _ in range(CAPTURE_AT + 2)]
    assert answers == [False] * (CAPTURE_AT + 2) and calls == ["capture"]
    assert str(graphs.status()["reason"]).startswith("off: a capture failed")


def test_graphs_and_sightings_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    graphs, _ = enabled(monkeypatch)
    for i in range(GRAPHS_KEPT + 3):
        for _ in range(CAPTURE_AT):
            graphs.run(key(i), lambda: None)
    assert 0 < len(graphs._graphs) <= GRAPHS_KEPT and len(graphs._seen) <= GRAPHS_KEPT


def test_the_environment_turns_them_off(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = torch.device("cuda")  # nothing touches the device before the first capture
    assert IssueGraphs(cuda).enabled
    monkeypatch.setenv(issuegraphs.ENV, "0")
    off = IssueGraphs(cuda)
    assert not off.enabled and issuegraphs.ENV in str(off.status()["reason"])
    assert IssueGraphs(cuda, enabled=True).enabled  # an explicit choice wins


# -- replays on CPU: a graph stood in for by its own work, re-run ---------------------------
#
# A captured graph repeats its calls on the same addresses, reading the buffers' contents at
# replay. Re-running the closure captured at the second sight of a key does exactly that on
# CPU (the closure holds the capturing transfer's buffers and shapes, and reads the indices
# from the buffers when re-run), so a key that leaves out something the work depends on
# replays one transfer's calls for another and moves wrong bytes -- which these tests see.


class ClosureGraph:
    def __init__(self, work: Callable[[], None]) -> None:
        self.work = work

    def replay(self) -> None:
        self.work()


def replaying(graphs: IssueGraphs, monkeypatch: pytest.MonkeyPatch) -> None:
    graphs.enabled = True

    def capture(work: Callable[[], None]) -> ClosureGraph:
        graphs.captures += 1
        return ClosureGraph(work)

    monkeypatch.setattr(graphs, "_capture", capture)


def group_rig(name: str, caps: int) -> tuple[Any, Any, Any]:
    from hicache.dataplane.groupgeometry import GroupGeometry
    from hicache.dataplane.grouppools import GroupDevicePool, GroupHostPool
    from hicache.dataplane.grouptransfer import GroupMover
    from hicache.pools import presets

    geometry = GroupGeometry.from_group(presets.group(name))
    pages = {s: caps for s in geometry.sources}
    l1 = GroupDevicePool(geometry, pages, "cpu")
    l1.tensor.copy_(torch.randint(0, 256, l1.tensor.shape, dtype=torch.uint8))
    l2 = GroupHostPool(geometry, pages, pin=False)
    return geometry, GroupMover(l1, l2, "torch"), (l1, l2)


def pages(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.choice(8, size=n, replace=False).astype(np.int64)


@given(
    st.sampled_from(["dsv4-tiny", "mla-tiny"]),
    st.lists(
        st.tuples(st.booleans(), st.sampled_from([(1, 3), (3, 1), (2, 2), (4, 1)]), st.integers()),
        max_size=12,
    ),
)
@settings(max_examples=25, deadline=None)
def test_group_replays_move_each_transfers_own_bytes(
    name: str, transfers: list[tuple[bool, tuple[int, int], int]]
) -> None:
    """Transfers of a few shapes in a loop (pages per allocating pool drawn apart: one total
    split two ways is two shapes), each checked for its bytes; from each shape's second
    sight on its upload and kernels are a replay."""
    from hicache.dataplane.grouppools import group_digest

    geometry, mover, (l1, l2) = group_rig(name, 8)
    with pytest.MonkeyPatch.context() as mp:
        replaying(mover.graphs, mp)
        for d2h, sizes, seed in transfers:
            rng = np.random.default_rng(seed % 2**32)
            n = dict(zip(geometry.sources, sizes, strict=False))
            pick, other = ({s: pages(rng, n[s]) for s in geometry.sources} for _ in range(2))
            if d2h:
                request = {s: (pick[s], other[s]) for s in geometry.sources}
                assert mover.d2h(request).wait().value == "DONE"
                assert group_digest(l1, pick) == group_digest(l2, other)
            else:
                request = {s: (other[s], pick[s]) for s in geometry.sources}
                assert mover.h2d(request).wait().value == "DONE"
                assert group_digest(l2, other) == group_digest(l1, pick)
    replays = sum(c.replays for c in mover.counters.values())
    assert replays == mover.graphs.replays  # every replay counted once, in its direction
    assert mover.buffers_busy == 0


def test_group_d2h_shapes_are_replayed_from_their_second_sight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A D2H's upload and gathers replay from a shape's second sight on; an H2D keeps its
    stages (grouptransfer.py says why), and so does a D2H past `graph_max_bytes`."""
    geometry, mover, _ = group_rig("dsv4-tiny", 8)
    replaying(mover.graphs, monkeypatch)
    request = {
        s: (np.arange(3, dtype=np.int64), np.arange(3, dtype=np.int64)) for s in geometry.sources
    }
    for _ in range(4):
        mover.d2h(request).wait()
        mover.h2d(request).wait()
    assert mover.counters[Direction.D2H].replays == 4 - (CAPTURE_AT - 1)
    assert mover.counters[Direction.H2D].replays == 0
    assert mover.graphs.captures == 1  # one shape
    mover.graph_max_bytes = 0  # past the limit: the per-pool stages, never a replay
    for _ in range(CAPTURE_AT + 1):
        mover.d2h(request).wait()
    assert mover.graphs.captures == 1
    assert mover.counters[Direction.D2H].replays == 4 - (CAPTURE_AT - 1)


def test_group_d2h_replays_tell_one_total_split_two_ways_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Four pages split 1 + 3 or 3 + 1 over the two allocating pools: the same operand count,
    the same buffers, other launches -- a key without each pool's share would replay one
    split's gathers for the other."""
    from hicache.dataplane.grouppools import group_digest

    geometry, mover, (l1, l2) = group_rig("dsv4-tiny", 8)
    replaying(mover.graphs, monkeypatch)
    rng = np.random.default_rng(3)
    for sizes in [(1, 3), (1, 3), (3, 1), (3, 1), (1, 3), (3, 1)]:
        n = dict(zip(geometry.sources, sizes, strict=True))
        src = {s: pages(rng, n[s]) for s in geometry.sources}
        dst = {s: pages(rng, n[s]) for s in geometry.sources}
        l2.tensor.fill_(0xA5)
        assert mover.d2h({s: (src[s], dst[s]) for s in geometry.sources}).wait().value == "DONE"
        assert group_digest(l1, src) == group_digest(l2, dst), sizes
    assert mover.counters[Direction.D2H].replays >= 3, mover.graphs.status()


def test_single_pool_replays_move_each_transfers_own_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hicache.dataplane.dma import DeviceHostMover
    from hicache.dataplane.geometry import KVGeometry
    from hicache.dataplane.pools import DevicePool, HostPool, page_digest
    from hicache.kernels import KernelSet

    g = KVGeometry(layers=2, kv_heads=1, head_dim=8, dtype="bf16", page_size=4)
    l1 = DevicePool(g, 32, "cpu")
    l1.tensor.view(torch.uint8).random_(0, 256)
    l2 = HostPool(g, 32, pin=False)
    mover = DeviceHostMover(l1, l2, KernelSet.create(l1.tensor, "torch"))
    replaying(mover.graphs, monkeypatch)
    rng = np.random.default_rng(1)
    for n in (3, 5, 3, 3, 5, 3, 2, 5):
        src = rng.choice(32, size=n, replace=False).astype(np.int64)
        dst = np.arange(n, dtype=np.int64) + int(rng.integers(0, 32 - n))  # one run: one chunk
        assert mover.d2h(src, dst).wait().value == "DONE"
        assert np.array_equal(page_digest(l1, src), page_digest(l2, dst))
    assert mover.graphs.captures >= 2 and mover.graphs.replays >= 2, mover.graphs.status()
