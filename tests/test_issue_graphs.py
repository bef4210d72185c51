"""When the mover captures and replays its issue graphs (issuegraphs.py), without a GPU: the
bookkeeping around the capture, with the capture itself stood in for. On a GPU,
tests/test_issue_graphs_gpu.py checks the bytes."""

from __future__ import annotations

from collections.abc import Callable

import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

import torch

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
