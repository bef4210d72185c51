"""The TP model check: breadth-first over every reachable state of N simulated ranks.

    explore_tp(cfg)          cfg.ranks ranks (2-3), each its own control plane (tpstate.py)
      steps                  every step `tp_steps` offers: a plane call on every rank, an
                             admission whose C1a carries C4 (R85), an
                             issue with each vector of per-rank faults (C2), each rank's own
                             end of each op it still moves, a tick (C4), a cancel (C5)
      new state              checked: every rank's invariants and tree audit; the ranks agree
                             (`disagreement`: equal canonical planes, equal L3 slots, L3 health
                             and next op id -- I7 as the model holds it, and C6b's equal slots)
      every edge             the ranks made the same collectives (lockstep.py: I10, F16, F17)
                             and answered a plane call alike; each tick's completed L3 backups
                             were written by the ranks the rule names (I11), and the tick kept
                             C4's rules (tprules.py: what every rank agreed on was right); an
                             admission the same, and `carried` (its plan kept its L3 copy)
      drain                  by induction, as in the one-plane search (search.py): the drain's
                             first call (cancel the lowest op on every rank, else end the
                             lowest request) is an edge of every state that has one, and a
                             state with neither is quiescent on every rank

A finding is `invariant`, `audit`, `disagree` (the ranks' states differ), `rule` (a C4 rule
broken), `collective` (their collectives differ), `diverged` (a plane call answered
differently by rank), `crash` or `stuck`; with the shortest path of steps to it (BFS).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hicache.core.lifecycle import Lifecycle
from hicache.core.snapshot import RankView
from hicache.distributed.collectives import CollectiveError
from hicache.invariants import check_ranks
from hicache.invariants.registry import check_all
from hicache.oracle.modelcheck.actions import Action
from hicache.oracle.modelcheck.canonical import Key
from hicache.oracle.modelcheck.config import ModelConfig
from hicache.oracle.modelcheck.drain import not_quiescent
from hicache.oracle.modelcheck.search import _candidates_disagree, _path
from hicache.oracle.modelcheck.tprules import admit_rules, tick_rules
from hicache.oracle.modelcheck.tpsteps import (
    Diverged,
    Refused,
    State,
    Step,
    initial_state,
    take,
    tp_steps,
)
from hicache.pools.presets import group
from hicache.pools.spec import SHARDED, PoolGroup

SHOW_CHARS = 300  # a disagreement report shows this much of the differing part


@dataclass(frozen=True)
class TPFinding:
    kind: str
    message: str
    path: tuple[Step, ...]


@dataclass
class TPResult:
    """One TP search's counts (as search.Result: states, edges, depth of the deepest)."""

    config: ModelConfig
    states: int = 0
    edges: int = 0
    depth: int = 0
    exhaustive: bool = False
    ranks_alike: bool = False  # states keyed up to a renaming of ranks
    seconds: float = 0.0
    refusals: int = 0
    fired: set[str] = field(default_factory=set)
    finding: TPFinding | None = None


def state_key(state: State, cfg: ModelConfig, ranks_alike: bool = False) -> Key:
    """Every rank's key (tpstate.RankState.key) with its next op id less the least: the ids
    are history (dropped from a plane's key), but they must stay equal (C2), and a state
    where they are not must be a new state, judged. `ranks_alike`: the ranks' keys as a
    multiset (sorted), merging states that differ by a renaming of ranks (`symmetric`)."""
    ids = tuple(range(cfg.requests)) if cfg.symmetric_requests else ()
    least = min(rs.cp.next_op_id for rs in state)
    keys = [(rs.key(ids), rs.cp.next_op_id - least) for rs in state]
    return tuple(sorted(keys)) if ranks_alike else tuple(keys)


def symmetric(pools: PoolGroup) -> bool:
    """Whether the ranks are interchangeable: every backed-up pool is sharded, so every rank
    writes L3 alike (`ledger.writes_pool`), and the agreement points the model runs (C2, C4:
    element-wise MIN) treat every rank alike. Renaming ranks then maps runs onto runs: a
    state and its renaming reach the same verdicts, and one of them is enough. (A replicated
    pool makes rank 0 its only writer: then every rank keeps its name.)"""
    return all(p.tp_mode == SHARDED for p in pools.backed_up().pools)


def disagreement(state: State, cfg: ModelConfig) -> str | None:
    """Where the ranks' states differ (I7 as the model holds it: the planes equal up to page
    names; L3 slots equal, C6b; L3 health; the next op id, C2), or None."""
    ids = tuple(range(cfg.requests)) if cfg.symmetric_requests else ()
    ref = state[0].key(ids)
    parts = ("plane", "L3 slots", "ops", "L3 online", "quarantine")
    for rs in state[1:]:
        mine = rs.key(ids)
        for i, name in enumerate(parts):
            a, b = mine[i], ref[i]
            if i == 2:  # ops: compare all but the end (a rank's own)
                a, b = tuple(o[:4] for o in a), tuple(o[:4] for o in b)
            if a != b:
                why = _plane_diff(a, b) if i == 0 else _first_diff(a, b)
                return f"rank {rs.rank}'s {name} differs from rank 0's: {why}"
        if rs.cp.next_op_id != state[0].cp.next_op_id:
            return (
                f"rank {rs.rank}'s next op id {rs.cp.next_op_id}, rank 0's {state[0].cp.next_op_id}"
            )
    return None


def _plane_diff(mine: Key, ref: Key) -> str:
    """Which part of two planes' canonical keys differs (canonical.py's layout: the tree,
    the pending ops, the requests, the page owners); a tree node by its tokens."""
    names = ("tree", "pending ops", "requests", "page owners")
    for name, a, b in zip(names, mine, ref):
        if a == b:
            continue
        if name == "tree" and len(a[0]) != len(b[0]):  # (parent, tokens, states, ...)
            return (
                f"nodes (tokens, states) {[(list(x[1]), x[2]) for x in a[0]]} vs "
                f"{[(list(y[1]), y[2]) for y in b[0]]}"
            )[:SHOW_CHARS]
        if name == "tree":
            for x, y in zip(a[0], b[0]):
                if x != y:  # (parent, tokens, states, locks, pending, pages, bookkeeping)
                    return (
                        f"the node of tokens {list(x[1])}: states {x[2]}, locks {x[3]} vs "
                        f"states {y[2]}, locks {y[3]}"
                    )
        return f"{name}: {_first_diff(a, b)}"
    return _first_diff(mine, ref)


def _first_diff(mine: object, ref: object, depth: int = 0) -> str:
    """The innermost pair of differing elements of two nested keys (a readable report)."""
    if isinstance(mine, tuple) and isinstance(ref, tuple) and len(mine) == len(ref) and depth < 8:
        for a, b in zip(mine, ref):
            if a != b:
                return _first_diff(a, b, depth + 1)
    return f"{mine!r} vs {ref!r}"[:SHOW_CHARS]


def judge(state: State, cfg: ModelConfig) -> tuple[str, str] | None:
    """Check a new state: each rank's invariants and audit, then the ranks' agreement; a
    state with no op and no request must be quiescent on every rank."""
    for rs in state:
        broken = check_all(rs.cp.snapshot())
        if broken:
            return "invariant", f"rank {rs.rank}: " + "; ".join(str(v) for v in broken)
        problems = rs.cp.tree.audit() + _candidates_disagree(rs.cp)
        if problems:
            return "audit", f"rank {rs.rank}: " + "; ".join(problems)
    why = disagreement(state, cfg)
    if why is not None:
        return "disagree", why
    for rs in state:
        if not rs.cp.ops and not rs.cp.requests:
            left = not_quiescent(rs.cp) + ([f"handles {sorted(rs.ends)}"] if rs.ends else [])
            if left:
                return "stuck", f"rank {rs.rank}: no op or request is left, yet: " + "; ".join(left)
    return None


def l3_writes(state: State, pools: PoolGroup) -> str | None:
    """I11 over what each rank recorded for the L3 backups the last tick completed: the
    cross-rank checks over views that hold only those records (I7, I8 and I10 then compare
    empty parts; the model checks what they stand for on the states themselves)."""
    modes = tuple((p.name, p.tp_mode) for p in pools.backed_up().pools)
    views = [
        RankView(
            rs.rank,
            len(state),
            (),
            (),
            (),
            (),
            0,
            "",
            (),
            tuple(
                (op_id, pool, n)
                for op_id, wrote in (rs.ledger.ops.items() if rs.ledger else ())
                for pool, n in wrote.items()
            ),
            quiescent=True,
            modes=modes,
        )
        for rs in state
    ]
    broken = check_ranks(views)
    return "; ".join(str(v) for v in broken) if broken else None


def explore_tp(
    cfg: ModelConfig,
    *,
    lifecycle: Lifecycle | None = None,
    max_states: int | None = None,
    ranks_alike: bool | None = None,
    on_state: Callable[[State], None] | None = None,
) -> TPResult:
    """Breadth-first search of `cfg` over `cfg.ranks` ranks (module docstring); `max_states`
    bounds the states kept (the search then is not exhaustive); `ranks_alike` keys states up
    to a renaming of ranks (default: when `symmetric`); `on_state` sees each new state
    (tests)."""
    res = TPResult(cfg)
    start = time.perf_counter()
    pools = group(cfg.pools)
    root = initial_state(cfg, res.fired, lifecycle)
    alike = symmetric(pools) if ranks_alike is None else ranks_alike
    res.ranks_alike = alike

    def key_of(state: State) -> Key:
        return state_key(state, cfg, alike)

    k0 = key_of(root)
    parents: dict[Key, tuple[Key, Step] | None] = {k0: None}
    bad = judge(root, cfg)
    res.finding = None if bad is None else TPFinding(*bad, ())
    frontier = [(root, k0)]
    while frontier and res.finding is None:
        following: list[tuple[State, Key]] = []
        for state, key in frontier:
            res.finding = _expand(
                state, key, cfg, pools, key_of, parents, following, res, max_states
            )
            if res.finding is not None or (max_states is not None and len(parents) >= max_states):
                break
        if following:
            res.depth += 1
        if on_state is not None:
            for s, _ in following:
                on_state(s)
        frontier = following if res.finding is None else []
        if max_states is not None and len(parents) >= max_states:
            break
    res.exhaustive = res.finding is None and not frontier
    res.states, res.seconds = len(parents), time.perf_counter() - start
    return res


def _expand(
    state: State,
    key: Key,
    cfg: ModelConfig,
    pools: PoolGroup,
    key_of: Callable[[State], Key],
    parents: dict[Key, tuple[Key, Step] | None],
    following: list[tuple[State, Key]],
    res: TPResult,
    max_states: int | None,
) -> TPFinding | None:
    cp = state[0].cp
    first = (
        Step("cancel", op=min(cp.ops))
        if cp.ops and cfg.aborts
        else Step("plane", Action("end_request", min(cp.requests)))
        if cp.requests and not cp.ops
        else None
    )
    # An issue every plane refused with no fault (the all-"ok" vector comes first) is tried
    # under no other vector: with the plane refusing, a fault changes nothing in the shipped
    # code (a refused reservation fails before the plane would, a lost file is found only
    # after the plane issued), and trying them would triple the edges of a search.
    refused_chains: set[str] = set()
    for step in tp_steps(state, cfg):
        if step.kind == "issue" and str(step.action) in refused_chains:
            continue
        try:
            child = take(state, cfg, pools, step)
        except Refused as e:
            if step == first:
                return TPFinding(
                    "stuck", f"the drain's call `{step}` is refused ({e})", _path(parents, key)
                )
            res.refusals += 1
            if step.kind == "issue":
                refused_chains.add(str(step.action))
            continue
        except Diverged as e:
            return TPFinding("diverged", str(e), (*_path(parents, key), step))
        except CollectiveError as e:
            return TPFinding("collective", f"{type(e).__name__}: {e}", (*_path(parents, key), step))
        except Exception as e:  # a call raised something that is no refusal
            return TPFinding(
                "crash", f"`{step}` raised {type(e).__name__}: {e}", (*_path(parents, key), step)
            )
        res.edges += 1
        if step.kind in ("tick", "admit"):
            why = l3_writes(child, pools)
            if why is not None:
                return TPFinding("invariant", why, (*_path(parents, key), step))
            rules = tick_rules if step.kind == "tick" else admit_rules
            why = rules(state, child, pools)
            if why is not None:
                return TPFinding("rule", why, (*_path(parents, key), step))
        k = key_of(child)
        if k in parents:
            continue
        if max_states is not None and len(parents) >= max_states:
            return None
        parents[k] = (key, step)
        bad = judge(child, cfg)
        if bad is not None:
            return TPFinding(*bad, _path(parents, k))
        following.append((child, k))
    return None


__all__ = ["TPFinding", "TPResult", "disagreement", "explore_tp", "judge", "state_key", "symmetric"]
