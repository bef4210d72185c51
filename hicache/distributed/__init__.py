"""Tensor parallelism: the ranks of one cache, and where they agree (spec/tp.md, spec/tp.toml).

    points.py       the agreement points of spec/tp.toml (C0-C9), loaded once
    collectives.py  the `Collectives` protocol, its log, its errors, `Alone` (one rank)
    simulated.py    `ThreadGroup`: ranks as threads of one process, in lockstep (fuzz, tests)
    torchdist.py    `TorchCollectives`: ranks as processes over torch.distributed (gloo)
    agreement.py    the controller's side: one method per point
    ledger.py       which rank writes a pool to L3 (the rule), and what each rank wrote
    rankview.py     a rank's view, for the cross-rank invariants (invariants/ranks.py)
    cluster.py      `SimulatedCluster`: N controllers over one ThreadGroup
    processes.py    real processes: spawn N ranks on gloo, run one script on each

The control plane imports none of this; the controller takes a `Collectives` and calls
`Agreement` at each point (one rank: `Alone`, the same code).
"""
