"""The transfer benchmarks' timing loop (hicache/bench/timing.py): paths timed round-robin,
each round starting one path further on, so no path owns a place in the round."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

import torch

from hicache.bench.timing import Poll, Settings, e2e_ms_interleaved
from hicache.dataplane.geometry import preset


@pytest.mark.parametrize(("paths", "rounds"), [(3, 6), (4, 9), (1, 2)])
def test_every_path_runs_at_every_place_of_the_round_alike(paths: int, rounds: int) -> None:
    ran: list[str] = []

    def start_of(name: str) -> Callable[[], Poll]:
        def start() -> Poll:
            ran.append(name)
            return lambda: True

        return start

    names = [f"p{k}" for k in range(paths)]
    s = Settings(preset("qwen3-8b"), "qwen3-8b", (16,), rounds - 1, 1, torch.device("cpu"), True)
    medians = e2e_ms_interleaved({n: start_of(n) for n in names}, s)
    assert sorted(medians) == names
    assert len(ran) == paths * rounds
    each_round = [ran[k * paths : (k + 1) * paths] for k in range(rounds)]
    assert all(sorted(r) == names for r in each_round), "one run of every path per round"
    whole = rounds - rounds % paths  # over whole turns of the rotation: every place alike
    turns = Counter((n, r.index(n)) for r in each_round[:whole] for n in names)
    assert set(turns.values()) == {whole // paths}, turns
