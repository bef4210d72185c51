"""The exhaustive search: breadth-first over every reachable state of a configuration.

    explore(cfg)
      start      a fresh plane (no pages used, no request): depth 0
      expand     every action `offered` in a state, each on a copy of it (`ControlPlane.clone`);
                 a refusal is no edge (the copy is unchanged, so the next action reuses it),
                 a success is one edge to a successor
      new state  one whose key (canonical.py) was never seen: check every invariant on it,
                 queue it for the next depth
      drain      from every state some drain reaches the quiescent state (drain.py), shown by
                 induction: each drain call (cancel an op, end a request) is an offered action
                 that removes one op or request, so it suffices that the drain's first call is
                 an edge from every state with an op or a request, and that every state with
                 neither is quiescent. Without `cancel` actions (`aborts` off) a copy of each
                 new state is drained instead
      stop       at the first finding (the shortest path to it: BFS), or when no new state
                 is left (the search is exhaustive), or at `max_depth` / `max_states`

A finding is one of: `invariant` (a new state breaks an invariant), `audit` (the tree's own
recount, `HiRadixTree.audit`, disagrees with its records, or `candidates(tier)` differs from
the nodes the `evict_<tier>` row allows), `crash` (a call raised
something that is no refusal), `stuck` (the drain from a state fails), `refusal` (a refused
call changed the state: checked on every `verify_refusals`-th refusal).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from hicache.core.control import ControlPlane
from hicache.core.execute import node_segments
from hicache.core.lifecycle import RESIDENT, Lifecycle, States
from hicache.core.tiers import TIERS
from hicache.core.trace import Tracer
from hicache.core.tree import TreeNode
from hicache.errors import ConfigError, IllegalTransition
from hicache.invariants.registry import check_all
from hicache.oracle.modelcheck.actions import Action, apply, is_refusal, offered
from hicache.oracle.modelcheck.canonical import Key, canonical_key, concrete_key
from hicache.oracle.modelcheck.config import ModelConfig
from hicache.oracle.modelcheck.coverage import record_into
from hicache.oracle.modelcheck.drain import drain, drain_actions, not_quiescent
from hicache.pools.presets import SINGLE_POOL, group

VERIFY_REFUSALS = 64
"""By default every 64th refusal is checked to have changed nothing (a concrete key of the
copy against the original's: about the cost of one copy, so 1/64 of refusals costs little)."""

REDUCTIONS = ("symmetric", "canonical", "none")
"""Key levels (canonical.py): `symmetric` renames request ids too when the configuration
allows it (else it is `canonical`); `none` hashes the concrete plane (finite only with a
depth bound)."""


@dataclass(frozen=True)
class Finding:
    """What went wrong, and the shortest path of actions from the start that shows it. For
    `stuck`, `path` ends at the stuck state and the drain from there is what fails."""

    kind: str
    message: str
    path: tuple[Action, ...]


@dataclass
class Result:
    """One search's counts. `states` counts distinct keys (the start included), `edges`
    successful action applications (self-loops and edges to known states included), `depth`
    the BFS depth of the deepest state, `fired` the spec transitions run on some edge."""

    config: ModelConfig
    reduction: str  # one of REDUCTIONS
    states: int = 0
    edges: int = 0
    depth: int = 0
    exhaustive: bool = False  # no state left unexpanded (no finding, no limit reached)
    bounded: bool = False  # a new state beyond max_states was found and left out
    seconds: float = 0.0  # wall time of the whole search
    refusals: int = 0  # offered calls the plane refused (no edge)
    refusals_verified: int = 0  # of those, checked to have changed nothing
    fired: set[str] = field(default_factory=set)
    steps: set[tuple[States, str]] = field(default_factory=set)  # composite steps (coverage.py)
    parents: dict[Key, tuple[Key, Action] | None] = field(default_factory=dict)  # with keep_keys
    finding: Finding | None = None

    @property
    def keys(self) -> set[Key]:
        """Every key seen (only when the search ran with `keep_keys`)."""
        return set(self.parents)

    def path_to(self, key: Key) -> tuple[Action, ...]:
        """A shortest path from the start to `key` (only when the search ran with `keep_keys`)."""
        return _path(self.parents, key)

    @property
    def states_per_s(self) -> float:
        return self.states / self.seconds if self.seconds > 0 else 0.0


def initial_plane(
    cfg: ModelConfig,
    lifecycle: Lifecycle | None = None,
    tracer: Tracer | None = None,
    check_mode: str = "off",
) -> ControlPlane:
    """The configuration's empty plane: every page free, no request. Tracing off unless a
    tracer is given (a tracer the environment's walk hook enabled is switched off)."""
    t = tracer or Tracer()
    pools = None if cfg.pools == SINGLE_POOL else group(cfg.pools)
    sizes: dict[str, dict[str, int]] = {}
    for tier, pool, n in cfg.pool_capacities:
        sizes.setdefault(tier, {})[pool] = n
    cp = ControlPlane(
        cfg.page_size,
        cfg.capacities,
        check_mode=check_mode,
        tracer=t,
        lifecycle=lifecycle,
        pools=pools,
        pool_capacities=sizes or None,
    )
    if tracer is None:
        t.sink = None
    return cp


def key_function(cfg: ModelConfig, reduction: str) -> Callable[[ControlPlane], Key]:
    """The key a search with `reduction` hashes states by."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction {reduction!r}: one of {REDUCTIONS}")
    if reduction == "none":
        return concrete_key
    ids = tuple(range(cfg.requests)) if reduction == "symmetric" and cfg.symmetric_requests else ()
    return lambda cp: canonical_key(cp, ids)


def explore(
    cfg: ModelConfig,
    *,
    lifecycle: Lifecycle | None = None,
    reduction: str = "symmetric",
    max_depth: int | None = None,
    max_states: int | None = None,
    verify_refusals: int = VERIFY_REFUSALS,
    keep_keys: bool = False,
    on_state: Callable[[ControlPlane], None] | None = None,
) -> Result:
    """Breadth-first search of `cfg` (module docstring). `lifecycle` replaces the shipped
    tables (an edited row: a mutant); `verify_refusals` N > 0 checks every N-th refusal left
    the state unchanged; `keep_keys` keeps every key seen (and its path) in the result; `on_state`
    is called with each new state's plane (it must not change it). The last two are for tests.
    A configuration of several ranks is the TP model's (tpsearch.explore_tp): ConfigError."""
    if cfg.ranks != 1:
        raise ConfigError(
            f"config {cfg.name}", f"has {cfg.ranks} ranks: explore it with tpsearch.explore_tp"
        )
    key_of = key_function(cfg, reduction)
    res = Result(cfg, reduction)
    start = time.perf_counter()
    root = initial_plane(cfg, lifecycle)
    record_into(root, res.fired, res.steps)
    k0 = key_of(root)
    parents: dict[Key, tuple[Key, Action] | None] = {k0: None}
    bad = _judge(root, cfg)
    res.finding = None if bad is None else Finding(*bad, ())
    frontier = [(root, k0)]
    if on_state is not None:
        on_state(root)
    while frontier and res.finding is None and (max_depth is None or res.depth < max_depth):
        following: list[tuple[ControlPlane, Key]] = []
        for plane, key in frontier:
            res.finding = _expand(
                plane,
                key,
                cfg,
                key_of,
                parents,
                following,
                res,
                verify_refusals,
                on_state,
                max_states,
            )
            if res.finding is not None or res.bounded:
                break
        if following:
            res.depth += 1
        frontier = following if res.finding is None else []
        if res.bounded:
            break
    res.exhaustive = res.finding is None and not frontier and not res.bounded
    res.states, res.seconds = len(parents), time.perf_counter() - start
    if keep_keys:
        res.parents = parents
    return res


def _expand(
    plane: ControlPlane,
    key: Key,
    cfg: ModelConfig,
    key_of: Callable[[ControlPlane], Key],
    parents: dict[Key, tuple[Key, Action] | None],
    following: list[tuple[ControlPlane, Key]],
    res: Result,
    verify_refusals: int,
    on_state: Callable[[ControlPlane], None] | None,
    max_states: int | None = None,
) -> Finding | None:
    """Try every offered action on `plane`; queue new successors; the first finding, if any.
    A new state beyond `max_states` is left out and ends the search (`res.bounded`): the bound
    counts states, and a space of exactly that many is still searched to the end."""
    scratch: ControlPlane | None = None
    steps = drain_actions(plane) if cfg.aborts else []
    first = steps[0] if steps else None  # the drain's first call: it must be an edge (induction)
    for a in offered(plane, cfg):
        if scratch is None:
            scratch = plane.clone()
        try:
            apply(scratch, cfg, a)
        except Exception as e:  # sorted below: a refusal is no edge, anything else a finding
            if not is_refusal(e):
                return Finding(
                    "crash", f"`{a}` raised {type(e).__name__}: {e}", (*_path(parents, key), a)
                )
            if a == first:
                return Finding(
                    "stuck",
                    f"the drain's call `{a}` is refused ({type(e).__name__}: {e})",
                    _path(parents, key),
                )
            res.refusals += 1
            if verify_refusals and res.refusals % verify_refusals == 0:
                res.refusals_verified += 1
                if concrete_key(scratch) != concrete_key(plane):
                    return Finding(
                        "refusal",
                        f"`{a}` was refused ({type(e).__name__}: {e}) but changed the state",
                        (*_path(parents, key), a),
                    )
            continue
        res.edges += 1
        child, scratch = scratch, None
        k = key_of(child)
        if k in parents:
            continue
        if max_states is not None and len(parents) >= max_states:
            res.bounded = True
            return None
        parents[k] = (key, a)
        bad = _judge(child, cfg)
        if bad is not None:
            return Finding(*bad, _path(parents, k))
        if on_state is not None:
            on_state(child)
        following.append((child, k))
    return None


def _judge(plane: ControlPlane, cfg: ModelConfig) -> tuple[str, str] | None:
    """Check a new state: every invariant; and, when the drain is not checked by induction
    (`cfg.aborts` off: `cancel` is no action), that a drain from a copy reaches quiescence.
    Returns (kind, why) or None."""
    broken = check_all(plane.snapshot())
    if broken:
        return "invariant", "; ".join(str(v) for v in broken)
    problems = plane.tree.audit() + _candidates_disagree(plane)
    if problems:
        return "audit", "; ".join(problems)
    if not cfg.aborts:
        copy = plane.clone()
        record_into(copy, set(), set())  # the drain's rows are not edges of the search
        why = drain(copy, lambda a: apply(copy, cfg, a))
        return None if why is None else ("stuck", why)
    if not plane.ops and not plane.requests:
        left = not_quiescent(plane)
        return ("stuck", "no op or request is left, yet: " + "; ".join(left)) if left else None
    return None


def _candidates_disagree(plane: ControlPlane) -> list[str]:
    """Where `candidates(tier)` (what an eviction loop picks from: the tree's leaf sets, then
    the row's guards) differs from the nodes whose `evict_<tier>` row the tables allow."""
    out = []
    for t, tier in enumerate(TIERS):
        name = f"evict_{str(tier).lower()}"
        listed = sorted(n.node_id for n in plane.candidates(tier))
        allowed = sorted(
            n.node_id
            for n in plane.tree.nodes()
            if n.state[t] == RESIDENT and _enabled(plane, name, n)
        )
        if listed != allowed:
            out.append(f"candidates({tier}) lists nodes {listed}, the {name} row allows {allowed}")
    return out


def _enabled(plane: ControlPlane, name: str, node: TreeNode) -> bool:
    try:
        plane.executor.plan(name, node_segments([node]))
    except IllegalTransition:
        return False
    return True


A = TypeVar("A")  # what an edge of a search is labelled with (an Action; a TP model Step)


def _path(parents: dict[Key, tuple[Key, A] | None], key: Key) -> tuple[A, ...]:
    """The edge labels from the start to `key`, along the BFS tree (a shortest path)."""
    out: list[A] = []
    step = parents[key]
    while step is not None:
        out.append(step[1])
        step = parents[step[0]]
    return tuple(reversed(out))
