"""Tensor parallelism: the ranks of one cache, and where they agree (spec/tp.md, spec/tp.toml).

    points.py       the agreement points of spec/tp.toml (C0-C9), loaded once
    collectives.py  the `Collectives` protocol, its log, its errors, `Alone` (one rank)
    simulated.py    `ThreadGroup`: ranks as threads of one process, in lockstep (fuzz, tests)
    wire.py         what the process transports share: the header row, the arrival board,
                    `ProcessCollectives` (counters, `_exchange` over a transport's `_meet`)
    torchdist.py    `TorchCollectives`: ranks as processes over torch.distributed (gloo)
    shm.py          `SharedMemoryCollectives`: the processes of one host over one shared
                    block (x86-64), several times cheaper per collective than gloo
    agreement.py    the controller's side: one method per point
    ledger.py       which rank writes a pool to L3 (the rule), and what each rank wrote
                    (`AckedWrite`: an H2S a rank acks without writing, C6b)
    refused.py      `RefusedIssue`: an op a rank took and could not start (C2 deferred to C4)
    rankview.py     a rank's view, for the cross-rank invariants (invariants/ranks.py)
    cluster.py      `SimulatedCluster`: N controllers over one ThreadGroup
    devices.py      `rank_device`: each rank its own GPU when there is one per rank
    processes.py    real processes: spawn N ranks (transport gloo or shm), run one script on
                    each, re-raise the root cause (`RankError`, the rank's own error its cause)

The control plane imports none of this; the controller takes a `Collectives` and calls
`Agreement` at each point (one rank: `Alone`, the same code).
"""
