"""The cache controller: the control plane joined to a data plane, a policy and a producer.

    config.py       CacheConfig: every knob, validated at construction (errors name the field)
    metrics.py      counters, per-direction transfer stats, latencies; Prometheus text export
    backup.py       the write-through / write-back backup chain (D2H, then H2S)
    materialize.py  a request's pending restore (S2H -> H2D -> publish), advanced by ticks
    controller.py   CacheController: admit, tick, prefill, finish, evict under pressure, status
"""

from __future__ import annotations
