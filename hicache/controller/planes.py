"""Choosing the controller's data plane, and what comes with bytes.

    engine given        has_bytes   the controller gets
    ------------------  ---------   ------------------------------------------------------
    none                True        a TransferEngine built from CacheConfig, a producer
                                    (SyntheticProducer unless given), a verifier (verify on)
    a TransferEngine    True        the same, on that engine
    none, a group       True        a GroupTransferEngine for `CacheConfig.pools` (a preset
    (`pools` != mha)                other than mha), a GroupSyntheticProducer, a
                                    GroupRestoreVerifier; `bind_group` later hands it the
                                    control plane's anchor -> pool pages mapping
    a GroupTransfer-    True        the same, on that engine
    Engine
    a NullEngine, ...   False       no producer, no verifier; torch never imported. Its
                                    content tags (a TaggedPlane: the NullEngine) as digests

Contract: `choose_plane` raises ConfigError, nothing built, for a plane with bytes that is
not a TransferEngine or GroupTransferEngine (the verifier and producer read its L1 pool),
for a producer given with a byte-free plane (it would never run), and for a group plane
given a producer that is not a GroupSyntheticProducer. torch is imported only on the byte
paths. `mha` builds exactly the single-pool TransferEngine it always did.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from hicache.controller.config import CacheConfig
from hicache.controller.verify import RestoreVerifier
from hicache.dataplane.faults import FaultInjector
from hicache.dataplane.plane import DataPlane, TaggedPlane
from hicache.errors import ConfigError

if TYPE_CHECKING:  # torch-heavy: imported only when a plane with bytes is built
    from hicache.dataplane.engine import TransferEngine
    from hicache.dataplane.groupengine import GroupTransferEngine, PoolPages
    from hicache.pools.spec import PoolGroup
    from hicache.producers import KVProducer


class Plane(NamedTuple):
    engine: DataPlane
    byte_plane: TransferEngine | GroupTransferEngine | None  # `engine` when it has bytes
    producer: KVProducer | None
    verifier: RestoreVerifier | None
    tagged: TaggedPlane | None = None  # `engine` when it has no bytes but content tags


def choose_plane(
    config: CacheConfig,
    engine: DataPlane | None,
    producer: KVProducer | None,
    faults: FaultInjector | None,
) -> Plane:
    """The data plane to drive and what comes with its bytes (see the module table)."""
    if engine is not None and not engine.has_bytes:
        if producer is not None:
            raise ConfigError(
                "producer",
                "the data plane holds no bytes (has_bytes is False), "
                "so a producer would never run; pass none",
            )
        return Plane(engine, None, None, None, engine if isinstance(engine, TaggedPlane) else None)
    from hicache.dataplane.engine import TransferEngine  # torch-heavy; only with bytes
    from hicache.dataplane.groupengine import GroupTransferEngine
    from hicache.producers import SyntheticProducer

    group = config.group
    if isinstance(engine, GroupTransferEngine) or (engine is None and group is not None):
        return _group_plane(config, engine, producer, faults)
    if engine is None:
        engine = TransferEngine(
            config.kv,
            config.l1_pages,
            config.l2_pages,
            config.l3_slots,
            device=config.device,
            l3_path=config.l3_path,
            backend=config.backend,
            io_threads=config.io_threads,
            faults=faults,
            l3_overwrite=config.l3_overwrite,
        )
    elif not isinstance(engine, TransferEngine):
        raise ConfigError(
            "engine",
            "a plane with bytes must be a TransferEngine or a "
            "GroupTransferEngine (the verifier and producer read its L1 pool); "
            "pass a NullEngine or none",
        )
    producer = producer or SyntheticProducer(config.kv, device=engine.device)
    verifier = RestoreVerifier(producer, engine.l1.tensor) if config.verify else None
    return Plane(engine, engine, producer, verifier)


def _group_plane(
    config: CacheConfig,
    engine: DataPlane | None,
    producer: KVProducer | None,
    faults: FaultInjector | None,
) -> Plane:
    """A pool group's plane: `engine` (a GroupTransferEngine) or one built for
    `config.pools`, with a group producer and verifier."""
    from hicache.controller.verify import GroupRestoreVerifier
    from hicache.dataplane.groupengine import GroupTransferEngine
    from hicache.producers import GroupSyntheticProducer

    if producer is not None and not isinstance(producer, GroupSyntheticProducer):
        raise ConfigError(
            "producer",
            "a pool group's plane writes every pool: pass a "
            "GroupSyntheticProducer of its engine, or none",
        )
    if engine is None:
        group = config.group
        assert group is not None, "only a group config builds a group plane"
        engine = GroupTransferEngine(
            group,
            config.l1_pages,
            config.l2_pages,
            config.l3_slots,
            device=config.device,
            backend=config.backend,
            io_threads=config.io_threads,
            faults=faults,
            pool_capacities=config.pool_capacities,
        )
    assert isinstance(engine, GroupTransferEngine)
    made = producer or GroupSyntheticProducer(engine, config.kv)
    verifier = GroupRestoreVerifier(made, engine) if config.verify else None
    return Plane(engine, engine, made, verifier)


def bind_group(plane: Plane, tables: Sequence[object], group: PoolGroup) -> None:
    """Hand a group plane the control plane's mapping (`tables`: its page table per tier, in
    TIERS order); a byte-free plane that reports per-pool landings (`bind_pools`) the
    backed-up pools of `group` (the single pool's group too) with their pages per anchor
    page, and its anchor; nothing for any other plane."""
    if plane.byte_plane is None:
        bind_pools = getattr(plane.engine, "bind_pools", None)
        if bind_pools is not None:
            kept = group.backed_up()
            bind_pools({p.name: kept.ratio(p.name) for p in kept.pools}, kept.anchor.name)
        return
    from hicache.dataplane.groupengine import GroupTransferEngine  # torch is in: a byte plane

    if isinstance(plane.byte_plane, GroupTransferEngine):
        plane.byte_plane.bind(tier_pool_pages(plane.byte_plane.group, tables))


def tier_pool_pages(group: PoolGroup, tables: Sequence[object]) -> PoolPages:
    """`pool_pages(tier, anchor_pages)` over the control plane's tables: each tier's
    `TierPools.pool_pages`. Tables without it (single-pool page tables) serve only a group
    whose allocating pools all have the anchor's page size: each side pool then mirrors the
    anchor's free list, page for page (the answer a TierPools of ratio 1 whose pools were
    reserved in step would give). ConfigError otherwise."""
    from hicache.tiers import TIERS

    by_tier = {str(t): table for t, table in zip(TIERS, tables)}
    if all(hasattr(t, "pool_pages") for t in tables):
        return lambda tier, pages: by_tier[tier].pool_pages(pages)  # type: ignore[attr-defined]
    ratios = {p.name: group.ratio(p.name) for p in group.allocating}
    if any(r != 1 for r in ratios.values()):
        raise ConfigError(
            "pools",
            f"{group.name}'s side pools have {ratios} pages per anchor "
            "page: the control plane must keep a TierPools per tier",
        )
    return lambda tier, pages: {name: pages for name in ratios}
