"""The TP model's steps: what may happen next in a state of N ranks, and taking it.

    step     each rank (tpstate.py: the controller's code)  all ranks     offered
    -------  ---------------------------------------------  ------------  ---------------------
    plane    a plane call (compute, insert, end_request,    -             as the one-plane
             evict)                                                       search offers it
    admit    `begin_request` whose C1a carries this rank's  C1a (admit,   as the one-plane
             ends of the ops in flight; the plan's L3 pin,  carrying C4)  search offers
             then the agreed ends applied (R85)                           begin_request
    issue    `Transfers.issue` with this rank's fault:      C2 reserve    every chain and
             none, its reservation refused, its L3 file                   direction, with every
             lost                                                         vector of faults
    land     one rank's handle of one op ends: done,        -             each rank, each op
             failed, a read landed k anchor pages, a read                 it still moves
             met a bad slot
    tick     `Transfers.conclude` over every op in flight,  C4 completion always
             then the L3 drops (`CacheController.tick`)     (none: no op
                                                            in flight)
    cancel   `CacheController._cancel_own` of one op       (C5: none)    each pending op

Every step is taken on copies (the state it starts from is left as it was); the ranks meet
at their collectives in lockstep (lockstep.py). A plane call refused by every rank alike,
and an issue every rank refused with no fault injected, is no edge (`Refused`); a plane
call the ranks answer differently is a finding (`Diverged`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from hicache.controller.l3health import L3Health
from hicache.core.lifecycle import Lifecycle
from hicache.core.tiers import Direction, Tier
from hicache.distributed.agreement import Agreement
from hicache.errors import HiCacheError
from hicache.oracle.modelcheck.actions import Action, apply, is_refusal, offered
from hicache.oracle.modelcheck.config import ModelConfig
from hicache.oracle.modelcheck.coverage import record_into
from hicache.oracle.modelcheck.lockstep import lockstep
from hicache.oracle.modelcheck.search import initial_plane
from hicache.oracle.modelcheck.tpstate import (
    _METRICS,
    FAULTS,
    End,
    RankState,
    admit,
    cancel,
    conclude,
    ends_of,
    issue,
)
from hicache.pools.spec import PoolGroup

State = list[RankState]
PLANE_KINDS = ("begin_request", "compute", "insert", "end_request", "evict")
"""The plane calls the TP model offers (on every rank alike): what makes prefixes, room and
requests for the transfers. Pins and cached lengths are the one-plane search's concern."""


class Step:
    """One step of every rank. kind: plane (`action` on every rank), admit (`action`, a
    begin_request, with C1a carrying C4), issue (`action`, with
    `faults[r]` on rank r), land (rank `rank`'s handle of op `op` ends as `outcome`), tick,
    cancel (op `op` on every rank)."""

    __slots__ = ("action", "faults", "kind", "op", "outcome", "rank")

    def __init__(
        self,
        kind: str,
        action: Action | None = None,
        faults: tuple[str, ...] = (),
        rank: int = -1,
        op: int = -1,
        outcome: End | None = None,
    ) -> None:
        self.kind, self.action, self.faults = kind, action, faults
        self.rank, self.op, self.outcome = rank, op, outcome

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Step) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def __str__(self) -> str:
        if self.kind in ("plane", "admit"):
            return str(self.action)
        if self.kind == "issue":
            return f"{self.action} faults {','.join(self.faults)}"
        if self.kind == "land":
            assert self.outcome is not None  # Verify: a land step names its end.
            arg = f" {self.outcome.arg}" if self.outcome.kind in ("part", "bad") else ""
            return f"land rank {self.rank} op {self.op} {self.outcome.kind}{arg}"
        if self.kind == "cancel":
            return f"cancel op {self.op}"
        return self.kind


class Diverged(Exception):
    """The ranks answered one plane call differently (a finding: `diverged`)."""


class Refused(Exception):
    """Every rank refused the call alike: no edge."""


def initial_state(
    cfg: ModelConfig, fired: set[str] | None = None, lifecycle: Lifecycle | None = None
) -> State:
    """`cfg.ranks` empty planes (of `lifecycle`'s tables: default the shipped ones),
    recording the transitions they fire into `fired`."""
    out = []
    for r in range(cfg.ranks):
        cp = initial_plane(cfg, lifecycle)
        if fired is not None:
            record_into(cp, fired, set())
        out.append(RankState(r, cp, L3Health(cp, _METRICS)))
    return out


def copy_state(state: State) -> State:
    return [rs.copy() for rs in state]


def tp_steps(state: State, cfg: ModelConfig) -> list[Step]:
    """Every step offered in `state` (module docstring), in a fixed order. The plane calls
    and chains are read from rank 0's plane (the ranks' planes are equal: checked)."""
    cp = state[0].cp
    out: list[Step] = []
    for a in offered(cp, cfg):
        if a.kind == "begin_request":
            out.append(Step("admit", a))  # across ranks an admission carries C4 (C1a)
        elif a.kind in PLANE_KINDS:
            out.append(Step("plane", a))
        elif a.kind == "issue":
            d = Direction(str(a.arg))
            lost = Tier.L3 in (d.source, d.target)
            choices = FAULTS if lost else FAULTS[:2]
            out += [Step("issue", a, f) for f in itertools.product(choices, repeat=len(state))]
    for rs in state:
        for op_id in sorted(rs.ends):
            if rs.ends[op_id].kind == "pending":
                out += [
                    Step("land", rank=rs.rank, op=op_id, outcome=o) for o in ends_of(rs.cp, op_id)
                ]
    out.append(Step("tick"))
    if cfg.aborts:
        out += [Step("cancel", op=op_id) for op_id in sorted(cp.ops)]
    return out


def take(state: State, cfg: ModelConfig, pools: PoolGroup, step: Step) -> State:
    """The state after `step` on every rank of `state` (which is left unchanged). Raises
    Refused (every rank refused the call alike: no edge), Diverged, a CollectiveError, or
    what a call raised that is no refusal."""
    if step.kind == "plane":
        assert step.action is not None  # Verify: a plane step names its call.
        out = copy_state(state)
        _plane(out, cfg, step.action)
        return out
    if step.kind == "land":
        assert step.outcome is not None  # Verify: a land step names its end.
        out = copy_state(state)
        out[step.rank].ends[step.op] = step.outcome
        return out
    if step.kind == "issue":
        return _issue(state, pools, step)
    if step.kind == "admit":
        return _admit(state, cfg, pools, step)
    if step.kind == "cancel":
        return _each(state, lambda rs, agree: cancel(rs, pools, agree, step.op))
    return _each(state, lambda rs, agree: conclude(rs, pools, agree))


def _each(state: State, run: Callable[[RankState, Agreement], object]) -> State:
    """`run(rank state, agreement)` on a copy of every rank, in lockstep (lockstep.py)."""

    def call(r: int, agree: Agreement) -> RankState:
        rs = state[r].copy()
        run(rs, agree)
        return rs

    return lockstep(len(state), call)


def _plane(state: State, cfg: ModelConfig, a: Action) -> None:
    errors: list[BaseException | None] = []
    for rs in state:
        try:
            apply(rs.cp, cfg, a)
            errors.append(None)
        except Exception as e:  # sorted below: alike refusals are no edge
            if not is_refusal(e):
                raise
            errors.append(e)
    kinds = {None if e is None else type(e).__name__ for e in errors}
    if len(kinds) > 1:
        raise Diverged(f"`{a}`: the ranks answered {sorted(k or 'ok' for k in kinds)}")
    if errors[0] is not None:
        raise Refused(str(errors[0]))


def _admit(state: State, cfg: ModelConfig, pools: PoolGroup, step: Step) -> State:
    """An admission on every rank, in lockstep (tpstate.admit: C1a carrying C4). Refused by
    every rank alike (before C1a): no edge; refused by some: `Diverged`."""
    a = step.action
    assert a is not None and a.request is not None and isinstance(a.arg, int)  # Verify: names r.
    rid, prompt = a.request, cfg.prompts[a.arg]
    errors: list[HiCacheError | None] = [None] * len(state)

    def call(r: int, agree: Agreement) -> RankState:
        rs = state[r].copy()
        errors[r] = admit(rs, pools, agree, rid, prompt)
        return rs

    out = lockstep(len(state), call)
    kinds = {None if e is None else type(e).__name__ for e in errors}
    if len(kinds) > 1:
        raise Diverged(f"`{a}`: the ranks answered {sorted(k or 'ok' for k in kinds)}")
    if errors[0] is not None:
        raise Refused(str(errors[0]))
    return out


def _issue(state: State, pools: PoolGroup, step: Step) -> State:
    a = step.action
    assert a is not None  # Verify: an issue step names its chain.
    what = (Direction(str(a.arg)), a.nodes, a.request)
    errors: list[HiCacheError | None] = [None] * len(state)

    def call(r: int, agree: Agreement) -> RankState:
        rs = state[r].copy()
        errors[r] = issue(rs, pools, agree, what, step.faults[r])
        return rs

    out = lockstep(len(state), call)
    if all(f == "ok" for f in step.faults) and all(e is not None for e in errors):
        # Refused by every rank with no fault injected: no edge, when only the op id moved
        # (a refusal that changed a plane is an edge, and its state is judged).
        if all(old.key(()) == new.key(()) for old, new in zip(state, out)):
            raise Refused(str(errors[0]))
    return out


__all__ = [
    "PLANE_KINDS",
    "Diverged",
    "Refused",
    "State",
    "Step",
    "copy_state",
    "initial_state",
    "take",
    "tp_steps",
]
