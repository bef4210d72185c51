"""The two readings of lifecycle.toml agree on the whole composite graph.

The hand-written composition (`Lifecycle.reachable`, hicache/core/lifecycle.py: rows parsed,
triples searched) and the `transitions` machine (hicache/core/pagemachine.py: the raw rows as one
parallel region per tier, composed by the library) must reach the same triples by the same
edges. The walk compares them step by step on every trace; this compares them everywhere at
once, so an edge no trace has taken yet cannot differ either.
"""

from __future__ import annotations

from hicache.core.lifecycle import Lifecycle, composite_name
from hicache.core.pagemachine import PageMachine


def check_machine(lc: Lifecycle) -> list[str]:
    """One line per edge one reading of `lc` takes and the other does not."""
    machine = PageMachine(lc.tables)  # built anew: `lc` may be an edited copy
    library = {(s, e, d) for s, out in machine.graph().items() for e, d in out}
    by_hand = {(s, t.name, d) for s, out in lc.reachable().items() for t, d in out}
    problems = []
    for only, has, lacks in (
        (library - by_hand, "the transitions machine", "the hand-written composition"),
        (by_hand - library, "the hand-written composition", "the transitions machine"),
    ):
        for s, e, d in sorted(only):
            problems.append(
                f"lifecycle.toml: {has} takes {composite_name(s)} --{e}--> "
                f"{composite_name(d)}, {lacks} does not"
            )
    return problems
