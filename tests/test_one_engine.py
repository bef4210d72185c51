"""A single pool is a group of one: the engine's single-pool path (a typed group of one,
`one_pool(geometry)`: dma.py's chunked, host-staged mover, one L3 file) and its group path
(the same one pool as raw bytes: the group mover, a file per pool) move the same bytes.

The property drives both engines with the same transfers, on the CPU, and holds them equal
byte for byte after every one: the same status, the same bytes in every page of L1 and L2,
and the same digests of every page in L1, L2 and L3.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

import dataclasses

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hicache.core.tiers import Direction, Tier
from hicache.dataplane.engine import TransferEngine, one_pool
from hicache.dataplane.geometry import KVGeometry
from hicache.dataplane.handles import TransferStatus
from hicache.errors import ConfigError

CAPS = {Tier.L1: 12, Tier.L2: 16, Tier.L3: 10}
GEOMETRIES = (
    KVGeometry(layers=2, kv_heads=2, head_dim=16, dtype="fp32", page_size=4),
    KVGeometry(layers=3, kv_heads=1, head_dim=8, dtype="bf16", page_size=2),
)


def both(g: KVGeometry, chunk_pages: int | None, seed: int) -> tuple[TransferEngine, ...]:
    """The fast path and the general path of the same one pool, L1 holding the same bytes:
    the group typed by its geometry, and the same group as raw bytes."""
    typed = one_pool(g)
    fast = TransferEngine(
        typed, *CAPS.values(), device="cpu", backend="torch", io_threads=0, chunk_pages=chunk_pages
    )
    raw = dataclasses.replace(typed, typed=None)
    general = TransferEngine(raw, *CAPS.values(), device="cpu", io_threads=0)
    noise = torch.randint(0, 256, fast.l1_region("kv").shape, dtype=torch.uint8,
                          generator=torch.Generator().manual_seed(seed))  # fmt: skip
    for e in (fast, general):
        e.l1_region("kv").copy_(noise)
    return fast, general


def moves() -> st.SearchStrategy[tuple[Direction, list[int], list[int]]]:
    """One transfer: a direction, its source pages, and as many distinct target pages."""

    def pick(d: Direction) -> st.SearchStrategy[tuple[Direction, list[int], list[int]]]:
        return st.integers(1, 6).flatmap(
            lambda n: st.tuples(
                st.just(d),
                st.lists(st.integers(0, CAPS[d.source] - 1), min_size=n, max_size=n, unique=True),
                st.lists(st.integers(0, CAPS[d.target] - 1), min_size=n, max_size=n, unique=True),
            )
        )

    return st.sampled_from(list(Direction)).flatmap(pick)


def assert_same(fast: TransferEngine, general: TransferEngine) -> None:
    for tier in (Tier.L1, Tier.L2):
        every = np.arange(CAPS[tier], dtype=np.int64)
        a, b = fast.packed(tier, "kv", every), general.packed(tier, "kv", every)
        assert torch.equal(a, b), tier
    for tier in Tier:
        every = np.arange(CAPS[tier], dtype=np.int64)
        assert np.array_equal(fast.digests(tier.value, every), general.digests(tier.value, every))


@settings(max_examples=20, deadline=None)
@given(
    geometry=st.sampled_from(GEOMETRIES),
    chunk_pages=st.sampled_from([None, 1, 2]),
    seed=st.integers(0, 2**16),
    script=st.lists(moves(), min_size=1, max_size=10),
)
def test_the_fast_path_moves_what_the_group_path_moves(
    geometry: KVGeometry,
    chunk_pages: int | None,
    seed: int,
    script: list[tuple[Direction, list[int], list[int]]],
) -> None:
    fast, general = both(geometry, chunk_pages, seed)
    assert fast.one_pool and not general.one_pool
    try:
        assert_same(fast, general)
        written: set[int] = set()  # L3 slots an H2S wrote: only those are read (S2H)
        for direction, source, target in script:
            if direction is Direction.S2H and not written.issuperset(source):
                continue
            written.update(target if direction is Direction.H2S else ())
            src, dst = np.array(source, dtype=np.int64), np.array(target, dtype=np.int64)
            move = direction.value.lower()
            got = [getattr(e, move)(src, dst).wait() for e in (fast, general)]
            assert got[0] is got[1] is TransferStatus.DONE, (direction, got)
            assert_same(fast, general)
    finally:
        fast.close()
        general.close()


def test_each_path_names_what_only_the_other_has() -> None:
    fast, general = both(GEOMETRIES[0], None, 0)
    try:
        with pytest.raises(ConfigError, match="pool group"):
            _ = fast.mover
        with pytest.raises(ConfigError, match="single-pool"):
            _ = general.dma
        assert fast.pools.pools == general.pools.pools and fast.ratios == general.ratios == {
            "kv": 1
        }
    finally:
        fast.close()
        general.close()


def test_the_group_alone_chooses_the_path() -> None:
    """A config's `mha` group and a `-tiny` preset that is the same pool are typed by the
    geometry (the single-pool path); a group of raw bytes is not, and typed rows that do not
    describe the pool's bytes are refused."""
    from hicache.controller.config import CacheConfig
    from hicache.pools.spec import TypedRows

    g = GEOMETRIES[0]
    assert CacheConfig(geometry=g).group == one_pool(g)
    assert CacheConfig(geometry="tiny", pools="mha-tiny").group.typed == g.typed
    assert CacheConfig(geometry="tiny", pools="mla-tiny").group.typed is None
    with pytest.raises(ConfigError, match="typed"):
        dataclasses.replace(one_pool(g), typed=TypedRows(2, 16, "bf16"))  # 256 B rows, not 512
    with pytest.raises(ConfigError, match="group"):
        TransferEngine(g, *CAPS.values(), device="cpu")  # type: ignore[arg-type]
