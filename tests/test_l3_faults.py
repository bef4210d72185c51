"""The L3 medium failing under a running cache: corrupt, truncated, removed or replaced. Each
is a miss that drops the L3 copy (never served, never read again), and the cache keeps
serving from L1 and L2 (spec/lifecycle.md, "L3 faults")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

from hicache.controller.config import CacheConfig
from hicache.controller.controller import CacheController
from hicache.core.lifecycle import ABSENT, RESIDENT
from hicache.dataplane.faults import FaultInjector, FaultSite
from hicache.invariants.registry import check_all
from tests.test_controller import assert_clean, push_out_of, serve

A = tuple(range(100, 124))  # 6 pages of the tiny geometry
B = tuple(range(200, 224))


def make(faults: FaultInjector | None = None, **kw: object) -> CacheController:
    cfg = CacheConfig(
        **{  # type: ignore[arg-type]
            "policy": "always",
            "backend": "torch",
            "device": "cpu",
            "l1_pages": 16,
            "l2_pages": 32,
            "l3_slots": 64,
            **kw,
        }
    )
    return CacheController(cfg, faults=faults)


def l3_only(c: CacheController, tokens: tuple[int, ...]) -> None:
    serve(c, 100 + len(c.cp.tree), tokens)
    push_out_of(c, "12")
    assert c.cp.tree.match(tokens, split=False, touch=False).lengths == (0, 0, 24)


def test_a_truncated_l3_file_is_a_miss_once_then_dropped() -> None:
    """Before: every later request planned an L3 restore, paid the I/O, failed and recomputed,
    forever (only a checksum mismatch invalidated; a read past the end did not)."""
    c = make()
    l3_only(c, A)
    os.ftruncate(c.transfer_engine.l3.fd, 0)  # the file is cut under the running cache
    assert serve(c, 1, A) == 24  # the restore fails: everything is recomputed
    assert c.metrics.fallbacks["transfer_failed"] == 1
    # The read node's copy is gone, not kept (5 pages: the match split A at its last page);
    # the healthy copy of the page below it was evicted first, so L3 keeps no gap.
    assert c.metrics.l3_invalidated_pages["unreadable"] == 5
    assert c.metrics.l3_invalidated_pages["below_bad_slot"] == 1
    # Request 1's recomputed pages are backed up again into fresh slots, and served from there.
    c.drain()
    c.cp.evict("L1", 1000)
    c.cp.evict("L2", 1000)
    failed = c.metrics.directions["S2H"].failed
    assert serve(c, 2, A) == 4
    assert c.metrics.directions["S2H"].failed == failed and c.metrics.hit_tokens["L3"] == 20
    assert_clean(c)
    c.close()


def test_a_corrupt_slot_is_a_miss_under_every_check() -> None:
    """Before: with check_mode `every` the CORRUPT_SLOT fault made I4 raise at the H2S
    completion (the medium changed the bytes), instead of the documented miss."""
    faults = FaultInjector().once(FaultSite.CORRUPT_SLOT)
    c = make(faults, check_mode="every")
    l3_only(c, A)
    assert serve(c, 1, A) == 24
    assert c.metrics.l3_invalidated_pages["corrupt"] > 0
    assert all(n.state[2] != RESIDENT for n in c.cp.tree.nodes())
    assert check_all(c.cp.snapshot()) == []
    assert_clean(c)
    c.close()


@pytest.mark.parametrize("how", ["unlink", "replace"])
def test_a_removed_l3_file_takes_l3_offline_and_l1_l2_keep_serving(
    tmp_path: Path, how: str
) -> None:
    """Before: StorageError escaped `admit` (the request stayed live) and every later tick
    that wanted an H2S raised, so the serving loop could not make progress."""
    path = tmp_path / "cache.l3"
    c = make(l3_path=str(path))
    l3_only(c, A)
    os.unlink(path)
    if how == "replace":
        path.write_bytes(b"someone else's file")
    assert serve(c, 1, A) == 24  # L3 is gone: recomputed, not raised
    assert not c.l3_online and "offline" in str(c.status()["l3"])
    assert c.metrics.fallbacks["l3_offline"] == 1
    assert all(n.state[2] == ABSENT for n in c.cp.tree.nodes())  # every L3 copy dropped
    assert c.metrics.l3_invalidated_pages["l3_offline"] == 6
    serve(c, 2, B)  # backups to L2 land; those to L3 are dropped and counted
    c.drain()
    assert c.metrics.dropped_tokens["l3_offline"] == 48  # A (recomputed by request 1) and B
    assert c.cp.tree.match(B, split=False, touch=False).lengths == (24, 24, 0)
    c.cp.evict("L1", 1000)
    assert serve(c, 3, B) == 4  # L2 still serves: 20 tokens restored
    assert_clean(c)
    c.close()
    if how == "replace":
        assert path.read_bytes() == b"someone else's file"  # never written through the path
