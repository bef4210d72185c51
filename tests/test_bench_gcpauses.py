"""`GcPauses` (hicache/bench/gcpauses.py): the collector's pauses inside a timed region, and
the serving bench's rows that carry them."""

from __future__ import annotations

import gc
import json
import threading
from typing import Any

import pytest

from hicache.bench.gcpauses import GcPauses


def test_it_counts_each_collection_by_generation_and_only_inside() -> None:
    gc.collect()
    with GcPauses() as pauses:
        gc.collect(0)
        gc.collect(2)
        gc.collect(2)
    assert pauses.collections == [1, 0, 2]
    assert pauses.seconds > 0
    gc.collect()  # after the exit: not heard
    assert pauses.collections == [1, 0, 2]
    assert pauses.record() == {"gc_ms": pauses.seconds * 1e3, "gc_collections": [1, 0, 2]}


def test_it_hears_another_threads_collections_and_leaves_no_listener() -> None:
    listeners = list(gc.callbacks)
    with GcPauses() as pauses:
        worker = threading.Thread(target=gc.collect, args=(1,))
        worker.start()
        worker.join()
    assert pauses.collections == [0, 1, 0]
    assert gc.callbacks == listeners


def test_a_listener_is_removed_when_the_region_raises() -> None:
    listeners = list(gc.callbacks)
    with pytest.raises(ZeroDivisionError), GcPauses():
        _ = 1 / 0
    assert gc.callbacks == listeners


def test_the_latency_rows_carry_each_timed_samples_pauses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A paced CPU run of the latency experiment: every row has one pause figure per timed
    sample, and a collection forced inside every prefill shows in all of them."""
    pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")
    from hicache.bench import serving
    from hicache.dataplane.geometry import preset as geometry_preset
    from hicache.producers import PacedProducer, SyntheticProducer

    inner = SyntheticProducer(geometry_preset("tiny"), device="cpu")
    producer = PacedProducer(inner, 0.0, 0.0)
    subject = serving.Subject(producer, serving.PACED_VOCAB, "cpu", "paced")
    real = producer.produce

    def collecting(*args: object) -> float:
        gc.collect(2)  # a full collection inside every timed prefill
        return real(*args)  # type: ignore[arg-type]

    real_kv = producer.compute_kv

    def collecting_kv(*args: object, **kwargs: bool) -> object:
        gc.collect(2)  # ... and inside every layer-wise one
        return real_kv(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(producer, "produce", collecting)
    monkeypatch.setattr(producer, "compute_kv", collecting_kv)
    rows = serving.latency(subject, [40], repeats=2, warmup=1)
    assert [row["path"] for row in rows] == list(serving.PATHS)
    for row in rows:
        assert len(row["gc_ms"]) == 2 and all(ms > 0 for ms in row["gc_ms"]), row
    run = {"preset": "tiny", "mode": "paced", "latency": rows}
    md = serving.report_md({"device": "cpu", "torch": "-", "runs": [run]})
    n = 2 * len(serving.PATHS)
    assert f"paused {n} of {n} timed samples" in md


def test_frozen_freezes_the_heap_for_the_block_and_gives_it_back() -> None:
    from hicache.bench.gcpauses import frozen

    before = gc.get_freeze_count()
    kept = [object() for _ in range(1000)]
    with frozen():
        assert gc.get_freeze_count() >= before + len(kept)
    assert gc.get_freeze_count() == before
    with pytest.raises(ZeroDivisionError), frozen():
        _ = 1 / 0
    assert gc.get_freeze_count() == before


def test_the_bench_freezes_only_when_asked(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """`--gc-freeze`: the experiments run on a frozen heap, the result and its report say so,
    and the heap is given back afterwards; without it nothing is frozen."""
    pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")
    from hicache.bench import serving

    seen: list[int] = []

    def latency(*args: object) -> list[dict[str, Any]]:
        seen.append(gc.get_freeze_count())
        return []

    monkeypatch.setattr(serving, "latency", latency)
    monkeypatch.setattr(serving, "report_md", lambda result: json.dumps(result))
    before = gc.get_freeze_count()
    for flag, out in (([], tmp_path / "a"), (["--gc-freeze"], tmp_path / "b")):
        argv = ["--out", str(out), "--paced", "1", "0", "--no-stress", *flag]
        assert serving.main(argv) == 0
        result = json.loads((out / "serving.json").read_text())
        assert result["gc_freeze"] == bool(flag)
    assert seen[0] == before and seen[1] > before
    assert gc.get_freeze_count() == before
