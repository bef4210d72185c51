"""The core: the control plane, pure Python and numpy (torch is never imported here).

Every page's lifecycle is a state machine read from spec/lifecycle.toml; every transition
goes through the control plane and is checked against the six ownership invariants.

    control.py      ControlPlane: every spec transition (admit, reserve, publish, evict, ...)
    queries.py      the questions the other layers ask the control plane (no state changes)
    execute.py      the transitions applied: tree, page tables and locks moved together
    records.py      a live request, a pending op, and the errors that name them
    tree.py         HiRadixTree: the radix tree of cached prefixes, one value per tier
    treenode.py     one node of it: key, per-tier pages, lock counts
    pages.py        PageTable: one tier's pages (FREE / PRIVATE / TREE) and their owners
    tiers.py        tiers and transfer directions, the vocabulary every layer shares
    lifecycle.py    the lifecycle tables (spec/lifecycle.toml) as data
    pagemachine.py  one logical page's residency as a `transitions` machine
    trace.py        trace events and their sinks (Tracer, ListSink, NdjsonSink)
    tracewalk.py    the walk that judges traced steps against the page machine
    snapshot.py     every record as plain data: what the invariant checks read
    poison.py       what a caller may still do after an InvariantViolation
    diagram.py      Mermaid diagrams generated from the lifecycle tables
"""
