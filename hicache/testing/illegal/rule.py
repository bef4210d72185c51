"""The fuzz machine's rule that makes the catalogue's illegal calls (issue 31, item 2).

`with_illegal_calls(base, name)` adds the rule `illegal_calls` to a machine whose adapter
offers `control_planes()` (the controller's adapter: its plane; the TP adapter: every
rank's). One step takes one plane (`pick`, modulo their number), builds one call of every
kind its state offers (`calls`, the same `pick` choosing each kind's candidate), and holds
each to the spec: refused with the typed error its kind names, nothing changed (`refusal`).
A failure names the kind and the call. The calls are made between the machine's steps, while
the engine waits, and they are refused, so the cache, the reference model and every later
step see nothing of them.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from hicache.testing.coverage import Coverage
from hicache.testing.illegal import calls, refusal

PICK_MAX = 63
"""`pick` is drawn from 0..PICK_MAX: each kind takes its `pick % count`-th candidate."""
QUIET_STEPS = 2
"""Steps after an `illegal_calls` step before the next may run. Without a pause the rule
(always enabled) took 704 of 1,571 steps of `hicache fuzz --seed 1`, crowding out the steps
that make the states it reads; with 2 it takes about one step in seven (263 of 1,897), and
chains whose head may be issued and whose tail may not -- a state few steps offer -- are
still met on seeds 0-4 within 2,000 steps (4 did not: guard-chain-head escaped seed 0)."""


def _planes(machine: Any) -> list[Any]:
    offer = getattr(getattr(machine, "cache", None), "control_planes", None)
    return list(offer()) if callable(offer) else []


def with_illegal_calls(
    base: type[RuleBasedStateMachine], name: str, coverage: Coverage | None = None
) -> type[RuleBasedStateMachine]:
    """`base` plus `illegal_calls` (module docstring), for an adapter with `control_planes`;
    `coverage`, when given, counts the calls refused by kind (`Coverage.refused`)."""

    class Machine(base):  # type: ignore[valid-type, misc]
        @precondition(
            lambda self: hasattr(self, "cache") and self.steps >= getattr(self, "illegal_next", 0)
        )
        @rule(pick=st.integers(0, PICK_MAX))
        def illegal_calls(self, pick: int) -> None:
            """Every illegal call the state offers on one control plane is refused, typed,
            with nothing changed (hicache/testing/illegal/__init__.py's catalogue)."""
            self.illegal_next = self.steps + QUIET_STEPS
            planes = _planes(self)
            if not planes:
                return
            self._count("illegal_calls")
            cp = planes[pick % len(planes)]
            before = cp.state_key()  # still the state after each call refused as it must be
            for call in calls(cp, pick):
                found = refusal(cp, call, before)
                # Verify the spec's refusal: its typed error, and the plane as it was.
                assert found is None, f"illegal call not refused as the spec says: {found}"
                if coverage is not None:
                    coverage.refused[call.kind] += 1

    Machine.__name__ = Machine.__qualname__ = name
    return Machine
