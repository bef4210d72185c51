"""SGLang's hierarchical cache (UnifiedRadixCache with HiCache on, installed unmodified:
hicache/testing/adapters/sglang_hicache.py) judged by the fuzz machine's reference model. CI
does not install sglang: the tests that drive it skip cleanly."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from hicache.app.cli import main
from hicache.errors import HiCacheError
from hicache.testing.adapters.sglang_hicache import (
    SGLangHiCache,
    SGLangHiCacheStaleLock,
    hicache_adapter,
)
from hicache.testing.adapters.sglang_hicache_trace import workload
from hicache.testing.adapters.sglang_import import EngineUnavailable
from hicache.testing.factory import EngineConfig, UnsupportedConfig
from hicache.testing.reference import ReferenceModel
from hicache.testing.runner import arguments, fuzz

MODULE = "hicache.testing.adapters.sglang_hicache"
PS = 4
A = tuple(range(100, 113))  # three whole pages and a tail of one token


def _engine(
    write_policy: str = "write_through", kind: type[SGLangHiCache] = SGLangHiCache
) -> SGLangHiCache:
    try:
        return kind(capacity=8, host_ratio=2.0, page_size=PS, write_policy=write_policy)
    except EngineUnavailable as e:
        pytest.skip(f"sglang is not installed here: {e}")


class Driver:
    """The machine's order of calls, by hand, each checked by the reference model."""

    def __init__(self, engine: SGLangHiCache) -> None:
        self.engine = engine
        self.model = ReferenceModel(PS, engine.tiers, tier_closure=engine.tier_closure)

    def sync(self) -> None:
        self.model.apply(self.engine.changes())
        assert self.engine.check() == []
        live = self.engine.live()
        self.model.compare(live, {r: self.engine.cached_len(r) for r in live})

    def submit(self, rid: int, tokens: tuple[int, ...]) -> dict[str, int]:
        self.sync()
        got = self.engine.submit(rid, tokens)
        self.model.admit(rid, tokens, got)
        self.sync()
        return got.hits

    def serve(self, rid: int) -> None:
        self.sync()
        expected = self.model.expected_after_prefill(rid)
        assert self.engine.prefill(rid)
        self.model.apply(self.engine.changes())
        self.model.prefilled(rid, expected, self.engine.cached_len(rid))
        self.sync()

    def finish(self, rid: int) -> None:
        self.engine.finish(rid)
        self.model.finished(rid)
        self.sync()


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_a_prompt_restored_from_l2_waits_for_its_late_load_and_serves_the_same_bytes(
    policy: str,
) -> None:
    d = Driver(_engine(policy))
    assert d.submit(1, A) == {"L1": 0, "L2": 0}
    d.serve(1)
    bytes_served = d.engine.served_digests(1)
    d.finish(1)
    d.engine.drain()  # write-through's backup lands (write-back backs up at eviction)
    d.engine.evict("L1", 100)
    d.sync()
    assert d.model.hits(A) == {"L1": 0, "L2": 12}
    assert d.submit(2, A) == {"L1": 0, "L2": 12}
    # The load-back is a job: until the machine completes it and a tick observes it, the
    # request waits, however often the scheduler ticks.
    (load,) = d.engine.pending_ops()
    for _ in range(3):
        d.engine.tick()
        assert not d.engine.ready(2)
    d.engine.complete(load)
    d.engine.tick()
    assert d.engine.ready(2)
    d.serve(2)
    assert d.engine.cached_len(2) == 12 and d.engine.served_digests(2) == bytes_served


def test_sglangs_sanity_check_runs_after_every_step() -> None:
    """check() reports what sglang's own sanity_check says: a lock released once more than
    it was taken is a finding."""
    e = _engine()
    e.submit(1, A)
    assert e.prefill(1) and e.check() == []
    r = e.requests[1]
    e.cache.dec_lock_ref(r.node, r.lock)
    e.cache.dec_lock_ref(r.node, r.lock)  # released twice: the count goes below zero
    assert any("sanity_check" in f for f in e.check())


def test_hicache_fuzz_drives_sglangs_hicache_through_the_runner() -> None:
    _engine().close()  # skip without sglang
    args = ["fuzz", "--seed", "1", "--steps", "300", "--adapter", f"{MODULE}:hicache_adapter"]
    assert main(args) == 0


def test_the_machine_catches_the_planted_stale_lock() -> None:
    _engine(kind=SGLangHiCacheStaleLock).close()
    args = ["fuzz", "--seed", "1", "--steps", "2000", "--adapter", f"{MODULE}:stale_lock_adapter"]
    assert main(args) == 1


@pytest.mark.parametrize(("policy", "loads"), [("always", 1), ("threshold", 0)])
def test_the_restore_policy_is_sglangs_load_back_threshold(policy: str, loads: int) -> None:
    """A host hit of one page (4 tokens): `always` loads it back, `threshold` (sglang's
    default, 10 tokens) recomputes it; a policy sglang has not is refused."""
    _engine().close()
    config = EngineConfig(PS, {"L1": 8, "L2": 8}, "write_through", policy)
    e = hicache_adapter(config)
    short = A[:5]
    e.submit(1, short)
    assert e.prefill(1)
    e.finish(1)
    e.drain()
    e.evict("L1", 100)
    e.submit(2, short)
    assert e.stats["loads_issued"] == loads
    with pytest.raises(UnsupportedConfig, match="restore policy"):
        hicache_adapter(replace(config, restore_policy="cost"))


def test_the_host_pools_accounting_is_checked() -> None:
    """check() recounts the host pool: a host slot taken behind the tree's back is a finding."""
    e = _engine()
    e.submit(1, A)
    assert e.prefill(1)
    e.drain()
    assert e.check() == []
    e.cc.mem_pool_host.alloc(PS)  # a page of L2 no node holds
    assert any("host slots" in f for f in e.check())


def test_a_request_waits_for_a_later_load_back_of_its_prompt() -> None:
    """Seed 134 (write-back, L1 7, L2 3): a request admitted before another's load-back of
    its prompt's pages was issued is prefilled while that load is in flight. sglang's match at
    prefill takes the published pages; the request shares the load (not ready until it lands)
    instead of being served pages the reference sees PENDING. Failed before with
    `cached_len after prefill: engine 8, reference 0`."""
    _engine().close()
    args = ["fuzz", "--seed", "134", "--steps", "6000", "--adapter", f"{MODULE}:hicache_adapter"]
    assert main(args) == 0


def test_a_trace_needs_write_through() -> None:
    """Under write-back sglang reclaims host copies in no leaf order: refused before sglang
    is even imported (so this runs without it)."""
    with pytest.raises(HiCacheError, match="a trace needs write_through"):
        SGLangHiCache(write_policy="write_back", traced=True)


def _traced(
    tmp_path: Path, seed: int, settle: bool, kind: type[SGLangHiCache] = SGLangHiCache
) -> Path:
    try:
        # load_back_threshold 0: every host hit is loaded back (the `always` policy)
        cache = kind(5 + seed % 4, 1.5, PS, load_back_threshold=0, traced=True)
    except EngineUnavailable as e:
        pytest.skip(f"sglang is not installed here: {e}")
    try:
        workload(cache, seed, 300, settle)
    except AssertionError:
        if kind is SGLangHiCache:
            raise  # sglang's own accounting: only the planted bug may break it
    path = tmp_path / f"sglang-hicache-{seed}.ndjson"
    path.write_text("\n".join(cache.traces[-1].lines()) + "\n")
    return path


@pytest.mark.parametrize("seed", [3, 6])
def test_check_trace_accepts_what_sglangs_hicache_did(
    tmp_path: Path, seed: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """Transfers settled before each submit and prefill (workload's `settle`): backups,
    load-backs and both tiers' evictions are traced and every event is judged legal."""
    path = _traced(tmp_path, seed, settle=True)
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["capacities"]["L2"] > 0
    names = {json.loads(line)["event"] for line in lines[1:]}
    two_tiers = {"d2h_issue", "d2h_complete", "h2d_issue", "h2d_complete", "evict_l2"}
    assert two_tiers | {"evict_l1", "insert", "discard", "split"} <= names, names
    assert main(["check-trace", str(path)]) == 0, capsys.readouterr()


def test_check_trace_accepts_a_backup_behind_its_parents_in_flight_backup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Findings 7 and 8: sglang backs up (loads back) a new child while its parent's op is in
    flight, one ack per node in issue order: its traces declare L1 and L2 stacked
    (spec/tree.md, "Stacked ops"), and check-trace judges them so. The same trace without
    the declaration is refused at the first such issue (what it was before the knob)."""
    path = _traced(tmp_path, 2, settle=False)
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["stacked_tiers"] == ["L1", "L2"]
    assert main(["check-trace", str(path)]) == 0, capsys.readouterr()
    bare = json.loads(lines[0])
    del bare["stacked_tiers"]
    path.write_text("\n".join([json.dumps(bare), *lines[1:]]) + "\n")
    assert main(["check-trace", str(path)]) == 1
    assert "guard 'parent(L2) == RESIDENT' fails" in capsys.readouterr().out


def test_the_traced_fuzz_has_every_trace_judged_by_check_trace() -> None:
    """`hicache_traced_adapter` under the machine (free timing, aborts with load-backs in
    flight): every run's traces are replayed by check-trace and accepted, their corruptions
    rejected. Failed before the stacked knob (findings 7, 8: a child's op under its parent's)
    and while load-backs were written as the request's op (finding 10: a request that ends
    leaves its load-back to the tree, so end_request met its own op in flight, R40)."""
    _engine()  # skips without sglang
    traced = f"{MODULE}:hicache_traced_adapter"
    result = fuzz(arguments(seed=1, steps=600, adapter=traced))
    assert result.ok, result.text
    judged = result.selfcheck
    assert judged.traces > 0 and judged.events > 0
    assert sum(judged.rejected.values()) == sum(judged.tried.values()) > 0


def test_check_trace_catches_the_planted_stale_lock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SGLangHiCacheStaleLock keeps its lock on the matched prefix: sglang evicts the node
    the request is served from, which check-trace refuses from the trace alone."""
    path = _traced(tmp_path, 1, settle=True, kind=SGLangHiCacheStaleLock)
    assert main(["check-trace", str(path)]) == 1
    assert "guard 'locks(L1) == 0' fails" in capsys.readouterr().out
