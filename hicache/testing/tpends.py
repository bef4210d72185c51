"""The TP fuzz machine's rule for ends the ranks see apart: an op that ends on one rank only.

The machine's own `complete`, `fail` and `tick` end an op on every rank before a tick, or
fail it on one rank and tick at once, so a tick never saw an op ended on one rank while
another still moved it unless the schedule's DELAY happened to hold it back -- and then
never with a cancel between that tick and the next, nor with a read that stopped part way
on one rank (the null plane's S2H_PARTIAL is a pool group's alone). Both hid bugs:

    after the one-rank end   what a bug there does (spec/tp.md)
    ----------------------   ---------------------------------------------------------
    a tick, the op's cancel  C5: the cancel settles the op from each rank's own handle:
                             the rank that saw it end publishes it, the others release it
    a tick (a read stopped   C4: the ranks keep the fewest nodes any rank landed, and a
    part way on one rank)    rank still moving counts all its nodes landed, then cancels
                             its read and publishes nodes it never wrote

`with_one_rank_ends(base, name)` adds `ends_on_one_rank`: a pending op done, failed (error,
corrupt, unreadable) or stopped part way (`landed` anchor pages) on one rank; then a tick,
the cancel of the request that issued it (`finish`: a request's end cancels its restore), or
a tick and then that cancel. C4's `landed` rule (adapters/tplanded.py) and I7 judge it.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from hicache.testing.draws import l3_prompt
from hicache.testing.machine import FAIL_KINDS, LIVE_MAX, survives_crash

HOWS = ("done", "done", "partial", "partial", *FAIL_KINDS)
"""How the op ends on its one rank: done and a read stopped part way twice as often."""
THEN = ("tick", "cancel", "tick-cancel")
"""What follows the one-rank end: a tick (C4 agrees on it), the op's request's cancel (C5
on a handle no tick saw end), or a tick and then the cancel (C5 on one a tick saw end)."""
SOURCES = ("in flight", "L2", "L3", "L3")
"""Where the op comes from: one already in flight (rare between steps: most rules let their
transfers end), an earlier prompt's load-back from L2, or a fresh two-node prompt's read
from L3 (`restore_from_l3`'s), which may stop between its nodes."""


def with_one_rank_ends(base: type[RuleBasedStateMachine], name: str) -> type[RuleBasedStateMachine]:
    """`base` (a TP machine: its adapter has `end_on_one_rank`) plus `ends_on_one_rank`."""

    class Machine(base):  # type: ignore[valid-type, misc]
        @precondition(lambda self: hasattr(self, "cache"))
        @rule(
            source=st.sampled_from(SOURCES),
            base=st.integers(0, 3),
            pages=st.integers(2, 3),
            pick=st.integers(0, 7),
            rank=st.integers(0, 2),
            how=st.sampled_from(HOWS),
            landed=st.integers(0, 7),
            then=st.sampled_from(THEN),
        )
        @survives_crash
        def ends_on_one_rank(
            self,
            source: str,
            base: int,
            pages: int,
            pick: int,
            rank: int,
            how: str,
            landed: int,
            then: str,
        ) -> None:
            """An op from `source` (newest first, `pick`) ends on one rank alone (`how`),
            then `then` (module docstring)."""
            self._count("ends_on_one_rank")
            while len(self.model.requests) >= LIVE_MAX - 1:  # room for the restore: the oldest ends
                self._end(min(self.model.requests))
            self._restore(source, base, pages, pick)
            ops = self.cache.pending_ops()
            if not ops:
                return
            rid = self.cache.end_on_one_rank(ops[-1 - pick % len(ops)], rank, how, landed)
            if then != "cancel":
                self.cache.tick()
            if then != "tick" and rid is not None and rid in self.model.requests:
                self._end(rid)

        def _restore(self, source: str, base: int, pages: int, pick: int) -> None:
            """Put a restore in flight (`SOURCES`)."""
            if source == "L2" and self.seen:
                tokens = self._earlier(pick)
                self.cache.drain()
                self._give_up_upper_tiers(False)
                self._admit(tokens)
            elif source == "L3":
                ps = self.cache.page_size
                tokens = l3_prompt(base, pages, ps)
                for prompt in (tokens[:ps] + (base,), tokens, tokens, tokens):
                    self.submit(prompt, 2)
                self.cache.drain()
                self._give_up_upper_tiers(True)
                self._admit(tokens)

    Machine.__name__ = Machine.__qualname__ = name
    return Machine


__all__ = ["HOWS", "SOURCES", "THEN", "with_one_rank_ends"]
