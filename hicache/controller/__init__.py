"""The cache controller: the control plane joined to a data plane, a policy and a producer.

One room per concept; every room asks the control plane's queries and changes state only
through its transitions (no room reads a node's state, value or lock):

    controller.py   CacheController, the facade: admit, tick, ready, wait, prefill, finish,
                    drain, close, status; routes each observed completion to the rooms below
    restore.py      restore staging: pins, parts, stages, sharing another request's load-back
    materialize.py  a request's pending restore (plain data) and the planner of its parts
    eviction.py     eviction under pressure (through ControlPlane.evict) and write-back
    backup.py       the backup planner: which chains to copy down a tier, when (write policy)
    l3health.py     bad L3 slots (quarantine, invalidate) and a lost L3 file (offline)
    crashsite.py    the controller's own fault sites: a failed reservation, a crash before
                    publication (spec/faults.md)
    planes.py       the data plane to drive (given, or built) and what comes with bytes
    replicas.py     across ranks, a replicated pool's one L3 copy: rank 0's file shared
                    (C6a), its checksums handed on as each backup is published (C6b)
    pending.py      the transfers in flight as a driver sees them (direction, request, stage)
    verify.py       restored bytes compared with recomputation (RestoreMismatch)
    metrics.py      counters, per-direction transfer stats; Prometheus text export
    config.py       CacheConfig: every knob, validated at construction (errors name the field)
    digests.py      page digests for invariant I4, cached per page generation
"""

from __future__ import annotations
