"""Choosing the controller's data plane, and what comes with bytes.

    engine given        has_bytes   the controller gets
    ------------------  ---------   ------------------------------------------------------
    none                True        a TransferEngine built once from CacheConfig's group
                                    (`config.group`: for `pools = mha` the geometry's typed
                                    group of one), with the control plane's anchor -> pool
                                    pages mapping (`tables`); a producer
                                    (SyntheticProducer, GroupSyntheticProducer for a group,
                                    unless given) and a RestoreVerifier (verify on)
    a TransferEngine    True        the same, on that engine (one built before its control
                                    plane takes the mapping here)
    a NullEngine, ...   False       no producer, no verifier; torch never imported. Its
                                    content tags (a TaggedPlane: the NullEngine) as digests;
                                    one that reports per-pool landings (`bind_pools`) gets
                                    the backed-up pools of the group

Contract: `choose_plane` raises ConfigError, nothing built, for a plane with bytes that is
not a TransferEngine (the verifier and producer read its L1 pools; `byte_engine`), for a
producer given with a byte-free plane (it would never run), and for a pool group's plane
given a producer that is not a GroupSyntheticProducer. torch is imported only on the byte
paths. `mha` moves its bytes on the engine's single-pool path, as it always did.
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
    from hicache.dataplane.engine import PoolPages, TransferEngine
    from hicache.pools.spec import PoolGroup
    from hicache.producers import KVProducer


class Plane(NamedTuple):
    engine: DataPlane
    byte_plane: TransferEngine | None  # `engine` when it has bytes
    producer: KVProducer | None
    verifier: RestoreVerifier | None
    tagged: TaggedPlane | None = None  # `engine` when it has no bytes but content tags


def choose_plane(
    config: CacheConfig,
    engine: DataPlane | None,
    producer: KVProducer | None,
    faults: FaultInjector | None,
    tables: Sequence[object] | None = None,
) -> Plane:
    """The data plane to drive and what comes with its bytes (see the module table).
    `tables`: the control plane's page table per tier (TIERS order), whose answer maps a
    group's anchor pages to its pools' pages; None builds a group engine without one (it
    refuses transfers)."""
    group = config.group
    if engine is not None and not engine.has_bytes:
        if producer is not None:
            raise ConfigError(
                "producer",
                "the data plane holds no bytes (has_bytes is False), "
                "so a producer would never run; pass none",
            )
        bind_pools = getattr(engine, "bind_pools", None)
        if bind_pools is not None:  # per-pool landings: the backed-up pools, the anchor
            kept = group.backed_up()
            bind_pools({p.name: kept.ratio(p.name) for p in kept.pools}, kept.anchor.name)
        return Plane(engine, None, None, None, engine if isinstance(engine, TaggedPlane) else None)
    from hicache.dataplane.engine import TransferEngine, byte_engine  # torch-heavy: bytes
    from hicache.producers import GroupSyntheticProducer, SyntheticProducer

    if engine is None:
        engine = TransferEngine(
            group,
            config.l1_pages,
            config.l2_pages,
            config.l3_slots,
            pool_pages=None if tables is None else tier_pool_pages(group, tables),
            device=config.device,
            l3_path=config.l3_path,
            backend=config.backend,
            io_threads=config.io_threads,
            faults=faults,
            l3_overwrite=config.l3_overwrite,
            pool_capacities=config.pool_capacities,
            layerwise=config.layerwise,
            transfer_route=config.transfer_route,
            chunk_pages=config.chunk_pages,
        )
    else:
        engine = byte_engine(engine)
        if tables is not None:
            engine.bind(tier_pool_pages(engine.group, tables))  # built before its control plane
    if engine.one_pool:
        made = producer or SyntheticProducer(config.kv, device=engine.device)
    elif producer is None or isinstance(producer, GroupSyntheticProducer):
        made = producer or GroupSyntheticProducer(engine, config.kv)
    else:
        raise ConfigError(
            "producer",
            "a pool group's plane writes every pool: pass a "
            "GroupSyntheticProducer of its engine, or none",
        )
    verifier = RestoreVerifier(made, engine) if config.verify else None
    return Plane(engine, engine, made, verifier)


def tier_pool_pages(group: PoolGroup, tables: Sequence[object]) -> PoolPages:
    """`pool_pages(tier, anchor_pages)` over the control plane's tables: each tier's
    `TierPools.pool_pages`. Tables without it (single-pool page tables) serve only a group
    whose allocating pools all have the anchor's page size: each side pool then mirrors the
    anchor's free list, page for page (the answer a TierPools of ratio 1 whose pools were
    reserved in step would give). ConfigError otherwise."""
    from hicache.core.tiers import TIERS

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
