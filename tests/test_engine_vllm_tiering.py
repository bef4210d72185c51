"""vLLM's tiering manager with its file tier (installed unmodified,
hicache/testing/adapters/vllm_tiering.py) judged by the fuzz machine's reference model. CI
does not install vLLM: the tests that drive it skip cleanly; the one that checks what happens
without it runs everywhere.

Run them with vLLM's interpreter: `VENV/bin/python -m pytest tests/test_engine_vllm_tiering.py`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hicache.app.cli import main
from hicache.dataplane.faults import SimulatedCrash
from hicache.testing.adapters.sglang_import import EngineUnavailable
from hicache.testing.adapters.vllm_filetier import open_tiering
from hicache.testing.adapters.vllm_tiering import VLLMTiering, VLLMTieringUnreadPromotion
from hicache.testing.adapters.vllm_tiering_trace import L3_UNBOUNDED
from hicache.testing.factory import EngineConfig, UnsupportedConfig
from hicache.testing.protocol import PageChange
from hicache.testing.runner import arguments, fuzz

ADAPTER = "hicache.testing.adapters.vllm_tiering:vllm_tiering_adapter"
PS = 4
PROMPT = tuple(range(100, 109))  # two whole pages and a tail token


def _engine(kind: type[VLLMTiering] = VLLMTiering, l1: int = 6, l2: int = 4) -> VLLMTiering:
    try:
        return kind(l1, l2, PS)
    except EngineUnavailable as e:
        pytest.skip(f"vLLM is not installed here: {e}")


def test_without_vllm_the_file_tier_says_how_to_install_it(no_vllm: None) -> None:
    with pytest.raises(EngineUnavailable, match="install vLLM as"):
        open_tiering(4, PS)


def test_only_the_three_tier_write_through_shape_with_promotion_is_taken() -> None:
    from hicache.testing.adapters.vllm_tiering import vllm_tiering_adapter

    for config in (
        EngineConfig(PS, {"L1": 8}),
        EngineConfig(PS, {"L1": 8, "L2": 4, "L3": 4}, "write_back"),
        EngineConfig(PS, {"L1": 8, "L2": 4, "L3": 4}, promotion=False),
    ):
        with pytest.raises(UnsupportedConfig):
            vllm_tiering_adapter(config)


def _until_ready(cache: VLLMTiering, rid: int) -> list[PageChange]:
    """Tick, every transfer completing, until request `rid` is ready; the changes seen."""
    seen: list[PageChange] = []
    for _ in range(8):
        if cache.ready(rid):
            break
        for op in cache.pending_ops():
            cache.complete(op)
        cache.tick()
        seen += cache.changes()
    return seen


def _serve_and_forget_upper(cache: VLLMTiering, rid: int) -> None:
    """Serve PROMPT to the end, let every transfer end, then evict L1 and L2."""
    cache.submit(rid, PROMPT)
    for _ in range(8):
        if cache.ready(rid):
            break
        cache.tick()
    assert cache.prefill(rid)
    cache.finish(rid)
    cache.drain()
    cache.evict("L1", 100)
    cache.evict("L2", 100)
    cache.changes()


def test_a_prompt_restored_from_files_is_promoted_then_loaded() -> None:
    cache = _engine()
    try:
        _serve_and_forget_upper(cache, 1)
        got = cache.submit(2, PROMPT)
        assert got.hits == {"L1": 0, "L2": 0, "L3": 8}
        assert not cache.ready(2)  # the file tier's probe answers RETRY first
        seen = _until_ready(cache, 2)
        assert cache.ready(2) and cache.prefill(2)
        assert cache.cached_len(2) == 8
        l2 = [c.state for c in seen if c.tier == "L2" and c.prefix == PROMPT[:4]]
        assert l2[:2] == ["PENDING", "RESIDENT"]  # promoted into L2 before L1 loads it
        assert cache.stats["file_loads_done"] == 1
        assert cache.check() == []
    finally:
        cache.close()


def test_removed_files_make_the_restore_a_miss_and_the_prompt_computed() -> None:
    cache = _engine()
    try:
        _serve_and_forget_upper(cache, 1)
        cache.damage_storage("remove")
        gone = [c for c in cache.changes() if c.tier == "L3"]
        assert {c.state for c in gone} == {"ABSENT"} and len(gone) == 2
        got = cache.submit(2, PROMPT)
        assert got.hits == {"L1": 0, "L2": 0, "L3": 0}
        cache.tick()  # the probe posted at admission answers: no file, a miss
        assert cache.ready(2) and cache.prefill(2) and cache.cached_len(2) == 8
        assert cache.stats["file_loads_done"] == cache.stats["file_loads_failed"] == 0
    finally:
        cache.close()


def test_a_cut_file_reads_short_is_deleted_and_the_restore_fails() -> None:
    cache = _engine()
    try:
        _serve_and_forget_upper(cache, 1)
        cache.damage_storage("truncate")
        cache.submit(2, PROMPT)
        _until_ready(cache, 2)
        assert cache.stats["file_loads_failed"] == 1
        assert not os.path.exists(cache.ft.file(cache.requests[2].keys[0]))  # vLLM deleted it
        assert cache.prefill(2) and cache.check() == []
    finally:
        cache.close()


def test_a_file_a_short_read_deleted_leaves_the_trace_with_its_invalidation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM deletes a block file its read found short: the trace drops the page from L3
    (invalidate_l3), else the next request's compute is judged against an L3 copy the
    engine no longer has (the traced fuzz found it, seed 1)."""
    _engine().close()  # skips without vLLM
    cache = VLLMTiering(6, 4, PS, persistent=False, traced=True)
    try:
        _serve_and_forget_upper(cache, 1)
        cache.damage_storage("truncate")
        cache.submit(2, PROMPT)
        _until_ready(cache, 2)
        assert cache.prefill(2) and cache.stats["file_loads_failed"] == 1
        cache.finish(2)
        lines = cache.traces[-1].lines()
    finally:
        cache.close()
    assert "invalidate_l3" in {json.loads(line)["event"] for line in lines[1:]}
    path = tmp_path / "short.ndjson"
    path.write_text("\n".join(lines) + "\n")
    assert main(["check-trace", str(path)]) == 0, capsys.readouterr()


def test_a_restarted_engine_serves_the_files_of_the_old_one() -> None:
    """L3 persists (spec/faults.md, "Persistent tiers"): the new engine opens the same
    directory, finds the blocks by their hashes and promotes them, with the same bytes."""
    cache = _engine()
    try:
        _serve_and_forget_upper(cache, 1)
        root = cache.ft.root
        cache.restart()
        assert cache.changes() == [] and cache.ft.root == root
        assert cache.submit(2, PROMPT).hits == {"L1": 0, "L2": 0, "L3": 8}
        _until_ready(cache, 2)
        assert cache.prefill(2) and cache.stats["file_loads_done"] == 1
        assert cache.served_digests(2) == [cache._digest(PROMPT[:4]), cache._digest(PROMPT[:8])]
    finally:
        cache.close()
    assert cache.files is None and not os.path.exists(root)


def test_without_persistence_a_restart_opens_an_empty_directory() -> None:
    cache = _engine()
    cache.close()
    cache = VLLMTiering(6, 4, PS, persistent=False)
    try:
        _serve_and_forget_upper(cache, 1)
        old = cache.ft.root
        cache.restart()
        assert not os.path.exists(old)
        assert cache.submit(2, PROMPT).hits == {"L1": 0, "L2": 0, "L3": 0}
    finally:
        cache.close()


def test_a_few_hundred_fuzz_steps_agree_with_the_reference() -> None:
    _engine().close()  # skips without vLLM
    result = fuzz(arguments(seed=3, steps=300, plane="null", adapter=ADAPTER))
    assert result.ok, result.text
    assert result.steps >= 300


def test_the_traced_fuzz_has_every_trace_judged_by_check_trace() -> None:
    """`vllm_tiering_traced_adapter`: every run's traces are replayed by check-trace (which
    must accept them and reject their corruptions) and counted as coverage."""
    _engine().close()  # skips without vLLM
    traced = ADAPTER.replace("vllm_tiering_adapter", "vllm_tiering_traced_adapter")
    result = fuzz(arguments(seed=1, steps=400, plane="null", adapter=traced))
    assert result.ok, result.text
    judged = result.selfcheck
    assert judged.traces > 0 and judged.events > 0
    assert sum(judged.rejected.values()) == sum(judged.tried.values()) > 0


def test_the_unread_promotion_is_caught_by_the_machine() -> None:
    """The planted bug (a promotion published without its file read) serves a chunk's old
    bytes: the machine's served-bytes check names the page."""
    _engine(VLLMTieringUnreadPromotion).close()
    adapter = "hicache.testing.adapters.vllm_tiering:unread_promotion_adapter"
    result = fuzz(arguments(seed=1, steps=1000, plane="null", adapter=adapter, shrink_seconds=5))
    assert not result.ok
    assert "bytes of page" in result.text


def _traced_engine(kind: type[VLLMTiering], l1: int, l2: int) -> VLLMTiering:
    """`kind`, traced, on a fresh directory (a trace has no restart event)."""
    try:
        engine = kind(l1, l2, PS, persistent=False)
    except EngineUnavailable as e:
        pytest.skip(f"vLLM is not installed here: {e}")
    engine.traced = True
    engine.restart()
    return engine


def _settled_trace(tmp_path: Path, kind: type[VLLMTiering], seed: int) -> Path:
    """`kind`'s trace of the settled workload (vllm_trace.workload, L1 and L2 emptied now
    and then so that the file tier serves), one engine on a fresh directory."""
    from hicache.testing.adapters.vllm_trace import workload

    engine = _traced_engine(kind, 8, 24)
    workload(engine, seed, 400, settle=True, checked=kind is VLLMTiering, flush_l2=True)
    path = tmp_path / f"vllm-tiering-{seed}.ndjson"
    path.write_text("\n".join(engine.traces[-1].lines()) + "\n")
    engine.close()
    return path


@pytest.mark.parametrize("seed", [1, 2, 32])
def test_check_trace_accepts_the_tiering_managers_settled_trace(
    tmp_path: Path, seed: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seed 32: a load of a page-aligned prompt's last page, which L1 held at issue (left
    out of the h2d), ends after L1's copy was evicted; the load's copy is published then
    (vllm_views._trace_end: an h2d of its own). Before, cached_len named a page the trace
    never put back in L1 (check-trace: 'are not RESIDENT in L1 yet')."""
    path = _settled_trace(tmp_path, VLLMTiering, seed)
    names = {json.loads(line)["event"] for line in path.read_text().splitlines()[1:]}
    wanted = {"h2s_issue", "h2s_complete", "s2h_issue", "s2h_complete", "evict_l2"}
    assert wanted <= names, names
    assert json.loads(path.read_text().splitlines()[0])["capacities"]["L3"] == L3_UNBOUNDED
    assert main(["check-trace", str(path)]) == 0, capsys.readouterr()


@pytest.mark.parametrize("seed", [15, 16])
def test_check_trace_accepts_a_raw_trace_whose_l3_orphan_keeps_its_ancestors(
    tmp_path: Path, seed: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """The raw workload (every fault, L2 of 3-8 pages), as benchmarks/engine_vllm_tiering.py
    --traces writes it: a block file whose parent's file is gone (L3 hash-keyed) keeps its
    ancestors' nodes in the reference, so `compute` of such a page names its node. Before,
    the tiering writer counted only the files themselves (check-trace: 'node: the trace has
    none, the reference one')."""
    from hicache.testing.adapters.vllm_trace import workload

    engine = _traced_engine(VLLMTiering, 8, 3 + seed % 6)
    workload(engine, seed, 400)
    path = tmp_path / f"vllm-tiering-raw-{seed}.ndjson"
    path.write_text("\n".join(engine.traces[-1].lines()) + "\n")
    engine.close()
    assert main(["check-trace", str(path)]) == 0, capsys.readouterr()


def test_a_promotion_ends_in_the_trace_when_vllm_polls_it_not_when_it_is_played(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Raw seed 34: a promotion the adapter played is taken off vLLM's books only at the
    tier's next poll (once a step), so a request admitted in the same step sees the chunk
    still being written (HIT_PENDING, no L2 hit). The trace's s2h_complete -- the spec's
    completion observed -- belongs at that poll; it is written at the play, and check-trace
    refuses the admission: 'detail.hit: the trace has [8,8,16], the reference [8,12,16]'."""
    from hicache.testing.adapters.vllm_trace import workload

    engine = _traced_engine(VLLMTiering, 8, 3 + 34 % 6)
    workload(engine, 34, 400)
    path = tmp_path / "vllm-tiering-raw-34.ndjson"
    path.write_text("\n".join(engine.traces[-1].lines()) + "\n")
    engine.close()
    assert main(["check-trace", str(path)]) == 0, capsys.readouterr()


def test_a_file_store_ends_in_the_trace_when_its_files_are_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file store played after the step's once-a-step poll ran (here: a waiting
    request's `ready`, a lookup) stays on vLLM's books until the next poll, but its block
    files are there: the next admission's file tier finds them (L3 hit 8). Its h2s_complete
    belongs to the play, not to the poll (check-trace: 'detail.hit: the trace has [8,8,8],
    the reference [8,8,0]'; the traced fuzz, seed 3, once every file job ended at the poll)."""
    cache = _traced_engine(VLLMTiering, 6, 4)
    try:
        cache.submit(1, PROMPT)
        _until_ready(cache, 1)
        assert cache.prefill(1)
        for op in cache.pending_ops():
            cache.complete(op)  # the GPU->CPU store: its cascade is a file store job
        cache.tick()
        (store,) = [op for op, f in cache.file_ops.items() if f.kind == "store"]
        cache.submit(2, tuple(range(500, 509)))
        cache.tick()  # the file tier's probe answers: request 2 is a miss, computed
        cache.complete(store)
        assert cache.ready(2)  # a lookup: this step's poll, before the store is played
        cache.tick()  # the store's files are written; vLLM does not poll again this step
        assert cache.submit(3, PROMPT).hits["L3"] == 8
        lines = cache.traces[-1].lines()
    finally:
        cache.close()
    path = tmp_path / "store.ndjson"
    path.write_text("\n".join(lines) + "\n")
    assert main(["check-trace", str(path)]) == 0, capsys.readouterr()


def _promote(cache: VLLMTiering, rid: int) -> int:
    """Submit PROMPT (its blocks only in files) and tick until vLLM submits its promotion:
    the promotion's op id."""
    cache.submit(rid, PROMPT)
    for _ in range(4):
        loads = [op for op, f in cache.file_ops.items() if f.kind == "load"]
        if loads:
            return loads[0]
        cache.tick()
    raise AssertionError("no promotion was submitted")


def test_a_promotion_played_before_a_crash_leaves_nothing_to_the_next_engines_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A promotion's read ran, the process died before vLLM polled the job (an aimed
    "crash"), and the next engine's promotion with the same job id failed without reading.
    The count of blocks the first read read outlived its engine: the second promotion was
    traced s2h_complete, vLLM freed its chunks (complete_write(False)) and then stored
    them again from L1 -- a d2h_issue on pages the trace held in L2 (check-trace: 'L2 is
    RESIDENT'; the traced fuzz, seed 1, engine 3, once the ends moved to vLLM's poll)."""
    cache = _traced_engine(VLLMTiering, 6, 4)
    try:
        _serve_and_forget_upper(cache, 1)
        op = _promote(cache, 2)
        cache.file_ops[op].aimed = "crash"
        cache.complete(op)
        with pytest.raises(SimulatedCrash):
            cache.tick()  # the read ran; vLLM never polled the job
        cache.restart()
        _serve_and_forget_upper(cache, 3)
        op = _promote(cache, 4)
        cache.fail(op, "error")  # reported failed, no block read
        cache.tick()
        _until_ready(cache, 4)
        assert cache.prefill(4)
        cache.finish(4)
        cache.drain()
        lines = cache.traces[-1].lines()
    finally:
        cache.close()
    s2h = [e for e in (json.loads(line)["event"] for line in lines[1:]) if e.startswith("s2h")]
    assert s2h[:4] == ["s2h_issue"] * 2 + ["s2h_fail"] * 2, s2h  # the failed promotion
    path = tmp_path / "crash.ndjson"
    path.write_text("\n".join(lines) + "\n")
    assert main(["check-trace", str(path)]) == 0, capsys.readouterr()


def test_a_promotion_into_a_full_cpu_tier_traces_what_it_evicted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A promotion's chunk is allocated with the CPU tier's prepare_write, which evicts when
    the tier is full; the tiering manager drops that answer. Before the adapter reported
    it, the trace lacked those evict_l2 and check-trace refused the promotion ('L2: wanted
    2 pages, 0 free'; raw trace seed 16)."""
    engine = _traced_engine(VLLMTiering, 6, 2)
    other = tuple(range(500, 509))
    for rid, tokens in ((1, PROMPT), (2, other), (3, PROMPT)):  # B's store evicts A's
        engine.submit(rid, tokens)  # chunks from L2; A is then promoted out of its files
        _until_ready(engine, rid)
        assert engine.prefill(rid)
        engine.finish(rid)
        engine.drain()
        engine.evict("L1", 6)
    assert engine.stats["l2_evicted_by_promotion"] == 2
    lines = engine.traces[-1].lines()
    path = tmp_path / "promotion.ndjson"
    path.write_text("\n".join(lines) + "\n")
    events = [json.loads(line)["event"] for line in lines[1:]]
    assert events.count("evict_l2") == 4 and "s2h_complete" in events, events
    assert main(["check-trace", str(path)]) == 0, capsys.readouterr()


def test_check_trace_catches_the_unread_promotion_from_the_trace_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The planted bug's promotions read nothing, so the trace ends them s2h_fail (the
    writer counts the blocks the tier's read task read); vLLM publishes the chunks anyway
    and loads them into L1: an h2d from an L2 the reference does not hold."""
    path = _settled_trace(tmp_path, VLLMTieringUnreadPromotion, 1)
    assert main(["check-trace", str(path)]) == 1
    assert "'h2d_issue' on tier L1 from L3: guard 'L2 == RESIDENT' fails" in capsys.readouterr().out


def test_a_file_rewritten_under_the_tier_is_served_and_the_machine_says_so() -> None:
    """vLLM's file tier has no checksum: with `corrupt_reads`, a "corrupt" read rewrites
    the block file before the tier reads it, and the bytes served differ (repro C)."""
    _engine().close()
    adapter = "hicache.testing.adapters.vllm_tiering:corrupt_reads_adapter"
    result = fuzz(arguments(seed=1, steps=2000, plane="null", adapter=adapter, shrink_seconds=5))
    assert not result.ok
    assert "bytes of page" in result.text
