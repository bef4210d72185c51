"""The mover's streams (streams.py) without a GPU: the shared-streams bookkeeping, and the
CPU plane's "no streams"."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

import torch

from hicache.dataplane import streams
from hicache.dataplane.streams import SHARED_ENV, Streams, shared_triple


def test_shared_triple_makes_three_once_per_key_from_any_thread() -> None:
    made: list[object] = []

    def make() -> object:
        made.append(object())
        return made[-1]

    key = ("test-device", id(made))
    results: list[tuple[object, object, object]] = []
    threads = [
        threading.Thread(target=lambda: results.append(shared_triple(key, make))) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 3 and len(set(map(id, made))) == 3
    assert all(r == tuple(made) for r in results)
    other = shared_triple(("test-device", id(results)), make)  # another device: its own
    assert len(made) == 6 and set(map(id, other)).isdisjoint(map(id, results[0]))
    streams._shared.pop(key)
    streams._shared.pop(("test-device", id(results)))


@pytest.mark.parametrize("shared", [None, False, True])
def test_the_cpu_plane_has_no_streams_shared_or_not(
    shared: bool | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SHARED_ENV, "1")
    s = Streams(torch.device("cpu"), shared=shared)
    assert (s.compute, s.d2h, s.h2d, s.ids()) == (None, None, None, None)
    assert s.current() is None
