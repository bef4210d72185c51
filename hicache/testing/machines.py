"""The hicache controller's fuzz machine: the generic machine plus two checks of its own.

    name                          what it is
    ----------------------------  ----------------------------------------------------------
    controller_machine(plane)     `make_machine(controller_adapter, setups(plane))`
                                  (hicache/testing/machine.py) plus the two invariants below:
                                  what `hicache fuzz` runs when no `--adapter` is given
    FuzzNull                      on the null plane (no bytes, no torch work): the bug zoo's
                                  machine for the control plane's mutants
    FuzzCpu                       on the CPU data plane with a real L3 file: the byte mutants
    FuzzDsv4, FuzzDsv41           on the null plane with the dsv4-tiny / dsv41-tiny pool group
                                  in every tier, per-pool reservation faults in L2 and L3,
                                  every check after every transition: B10's machine
    FuzzCpuDsv4                   the same group on the CPU plane: every pool's bytes moved,
                                  restores verified pool by pool
    FuzzTp, FuzzTpDsv4            tp_machine: 2 and 3 simulated ranks, per-rank faults, on the
                                  null plane (single pool; dsv4-tiny)
    FuzzTpCpuDsv4                 2 ranks of dsv4-tiny on the CPU plane: rank 0's L3 copy of
                                  the replicated pools read by both, I8 over real bytes

Every one of them also makes illegal calls on the control plane (`illegal_calls`,
hicache/testing/illegal/): each refused with its typed error, nothing changed.

They need no source checkout, unlike the tests' older machines. The three invariants are
about the controller's internals, so they live here rather than in the engine-neutral machine
(as invariants, they draw nothing: adding one leaves every seed's steps as they were).

`checker_sees_what_breaks`: the invariant checker the controller runs is under test too.
Every CANARY_EVERY steps, on a copy of the live snapshot with one page of a tier (in turn)
put on the free list while a node holds it, the checker must raise I1 `ownership_disjoint` for that
tier; with one free page made PRIVATE (leaked), I6 `page_conservation`. Where the controller checks
every transition (the cpu plane), every transition must have been checked. Without it, a
checker that goes quiet is never noticed: a correct controller breaks nothing for it to see.
`l3_serves_what_it_holds` (planes with bytes): unless the L3 file may have been damaged (a
CORRUPT_SLOT fault fired, or the machine damaged the file), every slot the tree holds passes
its checksum and no read failed one. Without it, a short write taken as complete (B14) is
masked: the checksum turns the half-written slot into a miss, and the prompt is recomputed.
`l3_refuses_a_second_opener` (a plane with an L3 path; every OPENER_EVERY steps): a second
controller opened on the live controller's configuration -- its `l3_path` -- must be refused
with `L3InUse` (spec/l3.md, rule 8), the file left as it was. Without it, a second opener that
takes the file over silently (the outside fuzzer's find, issue 30) shows only as the checksum
failures it causes later, if a restore happens to read L3 then.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from hypothesis.stateful import RuleBasedStateMachine, invariant

from hicache.core.pages import FREE, PRIVATE
from hicache.core.snapshot import UNSERVABLE, Snapshot
from hicache.core.tiers import TIERS
from hicache.dataplane.faults import FaultSite
from hicache.errors import InvariantViolation, L3InUse
from hicache.invariants.checker import InvariantChecker
from hicache.pools.presets import SINGLE_POOL, group
from hicache.pools.tierpools import window_pools
from hicache.testing.adapters.controller import PAGE_TOKENS, controller_adapter, setups
from hicache.testing.coverage import Coverage
from hicache.testing.draws import PREFIX_PAGES, SUFFIX_PAGES_MAX
from hicache.testing.illegal.rule import with_illegal_calls
from hicache.testing.machine import (
    AIMS,
    GROUP_AIMS,
    LIVE_MAX,
    AdapterFactory,
    make_machine,
    survives_crash,
)
from hicache.testing.selfcheck import SelfCheckCounts, with_self_check
from hicache.testing.tamper import tamper_hows, with_tamper_rule
from hicache.testing.tpends import with_one_rank_ends

EVERY = "every"  # the check mode that checks after every transition
CANARY_EVERY = 4
"""Steps between two canaries of `checker_sees_what_breaks` (one tier each, in turn): a canary
tests the checker's code, not the cache's state, so it need not run after every step (it
cost more than the cache's own checks)."""


OPENER_EVERY = 8
"""Steps between two tries of `l3_refuses_a_second_opener` (each builds a whole controller)."""


def second_opener(ctl: Any) -> str | None:
    """Open a second controller on `ctl`'s configuration while `ctl` lives. None when it is
    refused with `L3InUse`, or when `ctl` has no L3 path (a byte-free plane, a group's
    temporary files); else what went wrong (the second was closed again)."""
    from hicache.controller.controller import CacheController

    path = ctl.config.l3_path
    if path is None or not ctl.engine.has_bytes:
        return None
    try:
        other = CacheController(ctl.config)
    except L3InUse:
        return None
    other.close()
    return f"a second controller opened {path}, which a live controller holds"


def _owned(s: Snapshot, tier: str, page: int, owner: int) -> Snapshot:
    """A copy of `s` in which `page` of `tier` has owner code `owner`."""
    codes = s.tiers[tier].owner.copy()
    codes[page] = owner
    return replace(s, tiers={**s.tiers, tier: replace(s.tiers[tier], owner=codes)})


def _reported(checker: InvariantChecker, s: Snapshot, check_id: str) -> set[tuple[Any, Any]]:
    """(invariant, tier) of each violation a fresh checker of mode `every`, running the
    controller's check `check_id`, raises for snapshot `s` (empty when it raises nothing)."""
    fresh = InvariantChecker(EVERY, tuple(c for c in checker.checks if c.id == check_id))
    try:
        fresh.after_transition(lambda: s, "zoo canary")
    except InvariantViolation as e:
        return {(getattr(v, "invariant", None), getattr(v, "tier", None)) for v in e.violations}
    return set()


def _with_controller_checks(
    base: type[RuleBasedStateMachine], name: str
) -> type[RuleBasedStateMachine]:
    """`base` plus the invariants `checker_sees_what_breaks`, `l3_serves_what_it_holds` and
    `l3_refuses_a_second_opener` (module docstring)."""

    class Machine(base):  # type: ignore[valid-type, misc]
        @invariant()
        def checker_sees_what_breaks(self) -> None:
            cache = getattr(self, "cache", None)
            if cache is None:
                return
            cp = cache.ctl.cp
            checker: InvariantChecker = cp.checker
            if checker.mode.kind == EVERY:
                # Verify every transition the controller made was checked (mode `every`).
                assert checker.checks_run == checker.transitions, (
                    f"{checker.transitions} transitions but {checker.checks_run} checked "
                    "(mode every)"
                )
            self.canary_step: int = getattr(self, "canary_step", -1) + 1
            if self.canary_step % CANARY_EVERY:
                return
            s = cp.snapshot()
            tier = TIERS[self.canary_step // CANARY_EVERY % len(TIERS)].value
            held = [v for n in s.nodes if (v := n.values.get(tier)) is not None and v.size]
            if held:
                # Verify the checker reports a page a node holds that is also on the free list.
                found = _reported(checker, _owned(s, tier, int(held[0][0]), FREE), "I1")
                assert ("I1", tier) in found, (
                    f"the checker misses a {tier} page in a node value and FREE"
                )
            free = np.flatnonzero(s.tiers[tier].owner == FREE)
            if free.size:
                # Verify the checker reports a page nobody holds that is not on the free list.
                found = _reported(checker, _owned(s, tier, int(free[0]), PRIVATE), "I6")
                assert ("I6", tier) in found, f"the checker misses a leaked PRIVATE page of {tier}"

        @invariant()
        def l3_serves_what_it_holds(self) -> None:
            cache = getattr(self, "cache", None)
            if cache is None or not cache.ctl.engine.has_bytes:
                return
            # `damaged`: the machine cut or removed the file of the cache as now opened. Across
            # ranks, a byte flipped by any rank may lie in the one copy every rank reads.
            injectors = getattr(cache, "rank_faults", [cache.faults])
            tampered = getattr(self, "tampered", False)  # another writer changed slots
            if (
                self.damaged
                or tampered
                or any(f.fired.get(FaultSite.CORRUPT_SLOT, 0) for f in injectors)
            ):
                return
            for ctl in getattr(cache, "rank_controllers", [cache.ctl]):
                self._l3_serves(ctl)

        @invariant()
        def l3_refuses_a_second_opener(self) -> None:
            cache = getattr(self, "cache", None)
            if cache is None or getattr(self, "damaged", False):
                return  # a removed file's path is free again: a second opener may create it
            self.opener_step: int = getattr(self, "opener_step", -1) + 1
            if self.opener_step % OPENER_EVERY:
                return
            for ctl in getattr(cache, "rank_controllers", [cache.ctl]):
                found = second_opener(ctl)
                # Verify a second controller on a live controller's L3 path was refused.
                assert found is None, found

        def _l3_serves(self, ctl: Any) -> None:
            plane = ctl.byte_plane
            # Verify no read of an undamaged L3 file failed its checksum.
            assert plane.corrupt_reads == 0, (
                f"{plane.corrupt_reads} corrupt read(s) of an L3 file nothing damaged"
            )
            held = [v for n in ctl.cp.tree.nodes() if (v := n.value[2]) is not None and v.size]
            if held:
                digests = plane.digests("L3", np.concatenate(held))
                # Verify every slot the tree holds is servable (its checksum holds).
                assert not (digests == UNSERVABLE).any(), (
                    "an L3 slot the tree holds fails its checksum"
                )

    Machine.__name__ = Machine.__qualname__ = name
    return Machine


def _counts(coverage: Coverage | None) -> SelfCheckCounts | None:
    return None if coverage is None else coverage.selfcheck


def controller_machine(
    plane: str,
    coverage: Coverage | None = None,
    name: str = "CacheMachine",
    adapter: AdapterFactory = controller_adapter,
    pools: str = SINGLE_POOL,
) -> type[RuleBasedStateMachine]:
    """The controller's machine on `plane` ("null", "cpu" or "cuda"), `coverage` (when
    given) collecting every run's trace and fault counts; `adapter` builds each run's
    controller adapter (`controller_adapter`, or a wrapper that keeps it: `hicache fuzz --trace`);
    `pools` the tiers' pool group preset (a group: the null plane only)."""
    aims = AIMS if pools == SINGLE_POOL else GROUP_AIMS  # a group's S2H may stop part way
    drawn = setups(plane, pools=pools)
    base = make_machine(adapter, drawn, coverage=coverage, name=name, aims=aims)
    checked = _with_controller_checks(base, name)
    # Illegal calls on the control plane, each refused with nothing changed (issue 31, 2).
    checked = with_illegal_calls(checked, name, coverage)
    # The oracle judged: check-trace replays every run's trace, rejects its corruptions.
    checked = with_self_check(checked, drawn, _counts(coverage), name)
    # Issue 31: another writer damages the L3 file (hicache/testing/tamper.py).
    checked = with_tamper_rule(checked, name, tamper_hows(plane, pools))
    if pools == SINGLE_POOL or not window_pools(group(pools)):
        return checked
    return _with_window_rule(checked, name)


LONGEST_TOKENS = (PREFIX_PAGES + SUFFIX_PAGES_MAX + 1) * PAGE_TOKENS
"""The longest prompt the machine draws (its tail page too): what `setups` sizes L1 and its
windows to hold."""


def through_prompt(through: tuple[int, ...], extra: int) -> tuple[int, ...]:
    """A prompt through a node whose window was freed: `through` and `extra` more tokens, cut
    to LONGEST_TOKENS. Uncut, a prompt admitted so was the next one's `through` when its
    node was picked again, a page longer each time, until L1 refused it (RequestTooLarge)."""
    return (through + tuple(range(extra)))[:LONGEST_TOKENS]


def _with_window_rule(base: type[RuleBasedStateMachine], name: str) -> type[RuleBasedStateMachine]:
    """`base` plus `free_window`, for a group whose L1 frees windows: without it a window is
    freed only when the make-room runs short of them, and a hit over a freed window -- where
    each hit policy clips, replays and revives -- came too seldom for the fuzz to notice a
    replay that never revived (issue 30: caught on 3 of seeds 0-4 in 2,000 steps)."""
    from hypothesis import strategies as st
    from hypothesis.stateful import precondition, rule

    def freeable(self: Any) -> bool:
        """Whether some node's window could be freed now (and a request admitted after)."""
        cache = getattr(self, "cache", None)
        if cache is None or len(self.model.requests) >= LIVE_MAX:
            return False
        return bool(cache.ctl.cp.windows.candidates(cache.ctl.cp.tree.nodes()))

    class Machine(base):  # type: ignore[valid-type, misc]
        @precondition(freeable)
        @rule(pick=st.integers(0, 7), tail=st.integers(0, 3))
        @survives_crash
        def free_window(self, pick: int, tail: int) -> None:
            """A node's L1 window is freed (one the make-room could pick), then a prompt
            through it is served: its L1 hit ends before the freed window (`all_pools`) or
            replays it (`anchor_recompute_swa`), and after prefill the window before
            `cached_len` is whole again (the reference checks both)."""
            self._count("free_window")
            self._sync()
            through = self.cache.free_window(pick)
            self._sync()
            if through is not None:
                self._serve(self._admit(through_prompt(through, tail + 1)), finish=True)

    Machine.__name__ = Machine.__qualname__ = name
    return Machine


def tp_machine(
    pools: str = SINGLE_POOL,
    sizes: tuple[int, ...] = (2, 3),
    coverage: Coverage | None = None,
    name: str = "FuzzTp",
    plane: str = "null",
    adapter: AdapterFactory | None = None,
) -> type[RuleBasedStateMachine]:
    """The controller's machine over a tensor-parallel cache of `sizes` simulated ranks
    (hicache/testing/adapters/tp.py; the null plane, or the CPU or CUDA plane: each rank's
    bytes, a replicated pool's L3 copy rank 0's), with the controller machine's checks
    (the checker's canary on rank 0, the L3 check on every rank) and, for a group with a
    trailing pool, a rule that frees one node's window on one rank alone. `adapter` builds
    each run's TP adapter (`tp_adapter`, or a wrapper that keeps it: `hicache fuzz --trace`)."""
    from hypothesis import strategies as st
    from hypothesis.stateful import precondition, rule

    from hicache.testing.adapters.tp import tp_adapter, tp_setups

    # Issue 31: ranks that differ where a rank may, rank_check_every drawn (tp_setups).
    strategy = tp_setups(plane, pools, sizes)
    aims = AIMS if pools == SINGLE_POOL else GROUP_AIMS
    base = _with_controller_checks(
        make_machine(
            adapter or tp_adapter,
            strategy,
            coverage=coverage,
            name=name,
            aims=aims,
            # A call that raises on every rank ends the ranks' ThreadGroup (its collective
            # numbers no longer agree), so the TP cache is not sent refused calls: each rank
            # is a controller, whose refusals the one-rank machines check.
            refusals=False,
        ),
        name,
    )
    # Illegal calls on one rank's control plane at a time: refused there, nothing changed,
    # no collective made (issue 31, 2).
    base = with_illegal_calls(base, name, coverage)
    # The oracle judged: check-trace replays every rank's trace, rejects its corruptions.
    base = with_self_check(base, strategy, _counts(coverage), name)
    # Ends the ranks see apart: an op done or failed on one rank only, then a tick or a cancel.
    base = with_one_rank_ends(base, name)

    class Checked(base):  # type: ignore[valid-type, misc]
        @precondition(lambda self: hasattr(self, "cache"))
        @rule()
        def check_ranks(self) -> None:
            """Every rank runs the ranks' own cross-rank check (C7-C9, over the collectives)."""
            self._count("check_ranks")
            self.cache.check_ranks()

        @precondition(lambda self: hasattr(self, "cache") and len(self.model.requests) < LIVE_MAX)
        @rule(base=st.integers(0, 3), tier=st.integers(1, 2), held=st.integers(1, 3))
        @survives_crash
        def refused_on_one_rank(self, base: int, tier: int, held: int) -> None:
            """`held` prompts served to the end and their transfers settled (the lower tiers
            hold evictable nodes), then one rank alone refuses the next reservation into L2
            or L3 (as if full) and one more prompt is served: the ranks must abort that
            transfer together (C2, the group's minimum; or, deferred, C4 fails the op the
            refused rank took all the same), whatever the refused rank could have freed by
            itself (F15; the rank-local capacity mutant)."""
            self._count("refused_on_one_rank")
            ps = self.cache.page_size
            for k in range(held + 1):
                if len(self.model.requests) >= LIVE_MAX:
                    return
                if k == held:
                    self.cache.aim("refuse", self.cache.tiers[tier % len(self.cache.tiers)])
                start = 7000 + 400 * base + 100 * k
                self._serve(self._admit(tuple(range(start, start + 2 * ps)) + (k,)), finish=True)
                if k < held:
                    self.cache.drain()

    if pools == SINGLE_POOL or not window_pools(group(pools)):
        Checked.__name__ = Checked.__qualname__ = name
        return Checked

    class Machine(Checked):
        @precondition(lambda self: hasattr(self, "cache"))
        @rule(rank=st.integers(0, 2), pick=st.integers(0, 7))
        def free_window(self, rank: int, pick: int) -> None:
            """One rank alone frees a node's sliding window (its SWA memory is its own)."""
            self._count("free_window")
            self.cache.free_window(rank, pick)

        @precondition(lambda self: hasattr(self, "cache") and len(self.model.requests) < LIVE_MAX)
        @rule(
            base=st.integers(0, 3),
            pages=st.integers(2, 4),
            cut=st.integers(1, 3),
            pick=st.integers(0, 7),
            extra=st.integers(0, 3),
        )
        @survives_crash
        def windows_apart(self, base: int, pages: int, cut: int, pick: int, extra: int) -> None:
            """A parent and a child node (a prompt of `pages` pages served after its first
            `cut`), then two ranks free the parent's window and the child's, then a request
            asks for the path through both: the ranks' own largest hits differ where the
            other's window is freed (the least of them is legal on one rank only)."""
            self._count("windows_apart")
            ps = self.cache.page_size
            tokens = tuple(range(9000 + 100 * base, 9000 + 100 * base + pages * ps))
            for prompt in (tokens[: min(cut, pages - 1) * ps] + (0,), tokens + (0,)):
                if len(self.model.requests) < LIVE_MAX:
                    self._serve(self._admit(prompt), finish=True)
            through = self.cache.free_windows_apart(pick)
            if through is not None and len(self.model.requests) < LIVE_MAX:
                self._serve(self._admit(through_prompt(through, extra + 1)), finish=True)

    Machine.__name__ = Machine.__qualname__ = name
    return Machine


FuzzNull = controller_machine("null", name="FuzzNull")
FuzzCpu = controller_machine("cpu", name="FuzzCpu")
FuzzDsv4 = controller_machine("null", name="FuzzDsv4", pools="dsv4-tiny")
FuzzDsv41 = controller_machine("null", name="FuzzDsv41", pools="dsv41-tiny")
FuzzCpuDsv4 = controller_machine("cpu", name="FuzzCpuDsv4", pools="dsv4-tiny")

FuzzTp = tp_machine(name="FuzzTp")
FuzzTpDsv4 = tp_machine("dsv4-tiny", name="FuzzTpDsv4")
FuzzTpCpuDsv4 = tp_machine("dsv4-tiny", sizes=(2,), name="FuzzTpCpuDsv4", plane="cpu")

__all__ = [
    "FuzzCpu",
    "FuzzCpuDsv4",
    "FuzzDsv4",
    "FuzzDsv41",
    "FuzzNull",
    "FuzzTp",
    "FuzzTpCpuDsv4",
    "FuzzTpDsv4",
    "controller_machine",
    "tp_machine",
]
