"""Building a controller's parts: one function, the parts in the order each needs the last.

    build_parts(config, producer, ...)   the rank's agreement (C0 first), the control plane,
                                         the data plane (given its page tables), and every
                                         room the facade routes to

Contract: every part is given the objects it calls, never a callback into the controller,
and no part refers back to one built after it: the parts form no reference cycle, so a
closed, dropped controller frees its data plane's pools (GPU and pinned memory) at once,
without the garbage collector (`CacheController.close` still cuts the control plane's own
tree cycle). The two calls that go against that order take their callee per call instead:
the evictor's write-back (`back_up`, `Transfers.back_up_now`) and the stager's issues
(`issue`, `Transfers.issue`). Raises what `Agreement.startup` and `choose_plane` raise
(ConfigError), and what sharing a replicated pool's L3 copy raises -- the data plane is then
closed again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hicache.choices import LoadBackOverlap
from hicache.controller.backup import BackupPlanner
from hicache.controller.config import CacheConfig
from hicache.controller.crashsite import ControllerFaults
from hicache.controller.digests import CachedDigests
from hicache.controller.eviction import Evictor
from hicache.controller.l3health import L3Health
from hicache.controller.metrics import Metrics
from hicache.controller.planes import Plane, choose_plane
from hicache.controller.ranks import RankAgreement
from hicache.controller.replicas import ReplicatedL3
from hicache.controller.restore import RestoreStager
from hicache.controller.transfers import Rooms, Transfers
from hicache.core.control import ControlPlane
from hicache.core.trace import Tracer
from hicache.dataplane.faults import FaultInjector
from hicache.dataplane.plane import DataPlane, TaggedPlane
from hicache.distributed.agreement import Agreement
from hicache.distributed.collectives import Collectives
from hicache.distributed.ledger import L3Writes
from hicache.policy import CostModel, DecisionLog, Policy, make_policy
from hicache.pools.spec import PoolGroup

if TYPE_CHECKING:  # torch-heavy: imported only when a plane with bytes is built
    from hicache.producers import KVProducer

__all__ = ["Parts", "build_parts"]


@dataclass(frozen=True)
class Parts:
    """A controller's parts, in the order they are built (each needs only those above it)."""

    agree: Agreement  # this rank's collectives and agreement points (spec/tp.md)
    group: PoolGroup  # the pools; a single-pool plane's is mha's
    l3_writes: L3Writes  # what this rank wrote to L3 (I11)
    cp: ControlPlane
    plane: Plane  # the data plane and what comes with its bytes (planes.py), built for cp
    replicas: ReplicatedL3  # across ranks, rank 0's L3 copy of a replicated pool (C6a/C6b)
    tagged: TaggedPlane | None  # a byte-free plane whose content tags I4 reads
    model: CostModel
    policy: Policy
    decisions: DecisionLog
    metrics: Metrics
    backups: BackupPlanner  # the write policy's backup planner
    l3: L3Health  # L3 faults: bad slots, a lost file
    hooks: ControllerFaults  # the controller's own fault sites; dead once crashed or wedged
    evictor: Evictor  # eviction and the write-back it triggers
    ranks: RankAgreement  # C1a-C1c, C3
    stager: RestoreStager  # restore staging
    transfers: Transfers  # issue, conclude (C4), settle


def build_parts(
    config: CacheConfig,
    producer: KVProducer | None = None,
    *,
    faults: FaultInjector | None = None,
    tracer: Tracer | None = None,
    engine: DataPlane | None = None,
    collectives: Collectives | None = None,
) -> Parts:
    """The parts of a `CacheController` over `config` (its constructor's arguments, which say
    what each means). The ranks agree on the configuration first (C0), before anything is
    built."""
    agree = Agreement(collectives)
    agree.startup(config.fingerprint())
    group = config.group  # the pools, a group of one for mha: every part is built from it
    l3_writes = L3Writes(agree.rank)
    cp = ControlPlane(
        config.kv.page_size,
        (config.l1_pages, config.l2_pages, config.l3_slots),
        check_mode=config.check_mode,
        tracer=tracer,
        pools=group,
        pool_capacities=config.pool_capacities,
        hit_policy=config.hit_policy,
    )
    # The plane is built once, given the control plane's anchor -> pool pages mapping.
    plane = choose_plane(config, engine, producer, faults, cp.tables)
    # Across ranks, rank 0's L3 copy of each replicated pool is the only one (C6a, C6b).
    replicas = ReplicatedL3(cp, agree, group, plane.byte_plane)
    if replicas.pools:
        try:
            replicas.share()
        except BaseException:
            plane.engine.close()
            raise
    tagged: TaggedPlane | None = None
    if plane.byte_plane is not None:
        cp.digests = CachedDigests(plane.byte_plane.digests, cp.tables)
    elif plane.tagged is not None and not agree.tp:
        # Content tags stand in for bytes (dataplane/tags.py), so I4 runs here too. Not
        # across ranks: a replicated pool's L3 copy is rank 0's, which no other rank's
        # tags see (its I4 stays vacuous, as on any byte-free plane).
        tagged = plane.tagged
        cp.digests = CachedDigests(plane.tagged.digests, cp.tables)
    # Restores land under their prefill where they land layer by layer (R82: one rank, a
    # single pool): the cost model prices them so (spec/policies.md, "Pricing").
    model = CostModel(
        layerwise=config.layerwise and not agree.tp and config.group.typed is not None
    )
    policy = make_policy(config.policy, model)
    metrics = Metrics()
    # Across ranks a window may be freed on one rank only: chains are planned without
    # windows (the same on every rank) and a freed window refuses its rank's issue (C2).
    windows = not agree.tp
    backups = BackupPlanner(cp, config.write_policy, windows=windows)
    l3 = L3Health(cp, metrics)
    hooks = ControllerFaults(faults, config.quiesce_timeout_s, agree.c)
    evictor = Evictor(cp, metrics, config.write_policy, windows=windows)
    stager = RestoreStager(
        cp,
        metrics,
        l3,
        plane.verifier,
        config.promotion,
        share=config.load_back_overlap is LoadBackOverlap.SHARE,
    )
    rooms = Rooms(hooks, l3, evictor, backups, replicas, l3_writes, metrics, model, stager.settled)
    return Parts(
        agree=agree,
        plane=plane,
        group=group,
        l3_writes=l3_writes,
        cp=cp,
        replicas=replicas,
        tagged=tagged,
        model=model,
        policy=policy,
        decisions=DecisionLog(),
        metrics=metrics,
        backups=backups,
        l3=l3,
        hooks=hooks,
        evictor=evictor,
        ranks=RankAgreement(cp, agree, config.kv, policy, model, evictor, l3),
        stager=stager,
        transfers=Transfers(cp, plane.engine, agree, group, config.page_bytes(), rooms),
    )
