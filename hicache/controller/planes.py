"""Choosing the controller's data plane, and what comes with bytes.

    engine given        has_bytes   the controller gets
    ------------------  ---------   ------------------------------------------------------
    none                True        a TransferEngine built from CacheConfig, a producer
                                    (SyntheticProducer unless given), a verifier (verify on)
    a TransferEngine    True        the same, on that engine
    a NullEngine, ...   False       no producer, no verifier, no digests; torch never imported

Contract: `choose_plane` raises ConfigError, nothing built, for a plane with bytes that is
not a TransferEngine (the verifier and producer read its L1 pool) and for a producer given
with a byte-free plane (it would never run). torch is imported only on the byte paths.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from hicache.controller.config import CacheConfig
from hicache.controller.verify import RestoreVerifier
from hicache.dataplane.faults import FaultInjector
from hicache.dataplane.plane import DataPlane
from hicache.errors import ConfigError

if TYPE_CHECKING:  # torch-heavy: imported only when a plane with bytes is built
    from hicache.dataplane.engine import TransferEngine
    from hicache.producers import KVProducer


class Plane(NamedTuple):
    engine: DataPlane
    pools: TransferEngine | None  # the same engine when it has bytes, else None
    producer: KVProducer | None
    verifier: RestoreVerifier | None


def choose_plane(config: CacheConfig, engine: DataPlane | None, producer: KVProducer | None,
                 faults: FaultInjector | None) -> Plane:
    """The data plane to drive and what comes with its bytes (see the module table)."""
    if engine is not None and not engine.has_bytes:
        if producer is not None:
            raise ConfigError("producer", "the data plane holds no bytes (has_bytes is False), "
                              "so a producer would never run; pass none")
        return Plane(engine, None, None, None)
    from hicache.dataplane.engine import TransferEngine  # torch-heavy; only with bytes
    from hicache.producers import SyntheticProducer

    if engine is None:
        engine = TransferEngine(
            config.kv, config.l1_pages, config.l2_pages, config.l3_slots, device=config.device,
            l3_path=config.l3_path, backend=config.backend, io_threads=config.io_threads,
            faults=faults, l3_overwrite=config.l3_overwrite,
        )
    elif not isinstance(engine, TransferEngine):
        raise ConfigError("engine", "a plane with bytes must be a TransferEngine (the verifier "
                          "and producer read its L1 pool); pass a NullEngine or none")
    producer = producer or SyntheticProducer(config.kv, device=engine.device)
    verifier = RestoreVerifier(producer, engine.l1.tensor) if config.verify else None
    return Plane(engine, engine, producer, verifier)
