"""A request's pending restore (a "pending materialization") and its plan.

    stage      ops in flight                        next
    ---------  -----------------------------------  -----------------------------------------
    awaiting   another request's load-back fills    once it ends: pin what it filled, or take
               the shared part                      the shared part into this request's L2 part
    issued     H2D of the L2 part, S2H of the L3    each completion is observed on a tick
               part (both at once)
    promoted   S2H done -> H2D of the L3 part       issued once the L2 part is in L1 (its
                                                    parent must hold L1: no gap)
    done       nothing                              `prefill` advances cached_len to the deepest
                                                    node whose whole path is in L1

Contract: a Materialization is plain data owned by the controller's restore stager
(restore.py); `done` is true exactly when nothing of the restore is pending or still to be
issued. A failed op ends its part (what arrived is used, the rest recomputed, one counted
fallback); a cancel happens when the request ends or gives its restore up
(`cancel_restore`: the restore is then `failed` and settled, with nothing counted). Parts are
parent-first chains in path order: shared, then L2 part, then L3 part (spec/restore.md, "Stages of a
restore").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hicache.core.control import ControlPlane
from hicache.core.lifecycle import ABSENT, RESIDENT
from hicache.core.tiers import Direction, Tier
from hicache.core.tree import MatchResult, TreeNode
from hicache.policy import Decision


@dataclass
class Materialization:
    request_id: int
    tokens: tuple[int, ...]
    decision: Decision
    decision_id: int
    match: MatchResult
    shared: list[TreeNode] = field(default_factory=list)  # filled by other requests' load-backs
    l2_part: list[TreeNode] = field(default_factory=list)  # restored by H2D directly
    l3_part: list[TreeNode] = field(default_factory=list)  # S2H, then H2D
    awaited: set[int] = field(default_factory=set)  # other requests' op ids filling `shared`
    deferred: bool = False  # own parts planned, issued once `awaited` is empty
    ops: set[int] = field(default_factory=set)  # this request's op ids in flight
    s2h_done: bool = False
    l3_h2d_issued: bool = False
    failed: bool = False
    landed_pages: int = 0  # pages this restore's H2D ops (or shared ones) put into L1
    started_at: float = field(default_factory=time.perf_counter)
    ready_at: float | None = None
    prefilled: bool = False  # served: a second prefill is refused

    def record(self) -> tuple[object, ...]:
        """What every rank of a TP cache must hold equal of this restore (I7, spec/tp.md):
        each part's node ids, its own and awaited op ids, its flags and the pages it
        landed. Timings are a rank's own and left out. Plain data: a RankView carries it."""
        return (
            tuple(
                tuple(n.node_id for n in part) for part in (self.shared, self.l2_part, self.l3_part)
            ),
            tuple(sorted(self.ops)),
            tuple(sorted(self.awaited)),
            (self.deferred, self.s2h_done, self.l3_h2d_issued, self.failed, self.prefilled),
            self.landed_pages,
        )

    @property
    def done(self) -> bool:
        return not self.ops and not self.awaited and not self.deferred and not self.needs_l3_h2d

    @property
    def in_flight(self) -> bool:
        """Whether a transfer this restore waits for is running (its own, or a shared one)."""
        return bool(self.ops or self.awaited)

    @property
    def needs_l3_h2d(self) -> bool:
        return bool(self.l3_part) and self.s2h_done and not self.l3_h2d_issued and not self.failed

    @property
    def nodes(self) -> list[TreeNode]:
        """Every planned node, parent first."""
        return self.shared + self.l2_part + self.l3_part


@dataclass(frozen=True)
class Plan:
    shared: list[TreeNode]
    l2_part: list[TreeNode]
    l3_part: list[TreeNode]


def plan_parts(
    cp: ControlPlane,
    match: MatchResult,
    choice: str,
    target_len: int,
    unreadable: Callable[[TreeNode], bool] = lambda node: False,
) -> Plan:
    """Split the path beyond the L1 hit, up to `target_len` tokens, into three parent-first
    runs: `shared` (L1 `H2D_PENDING`: another request's load-back is filling it; this one
    waits for it instead of loading or computing it again), the L2 part (L1 `ABSENT`, L2
    `RESIDENT`) and, for an L3 choice, the L3 part (L1 and L2 `ABSENT`, L3 `RESIDENT`). The
    plan stops at the first node that fits none (e.g. a promotion S2H in flight, or an L3
    copy `unreadable` says must not be read, or a node L1 holds past the hit: its window
    freed): the tokens from there on are recomputed (R35)."""
    shared: list[TreeNode] = []
    l2_part: list[TreeNode] = []
    l3_part: list[TreeNode] = []
    pos = 0
    for node in match.path:
        start, pos = pos, pos + len(node.key)
        if start < match.lengths[0]:
            continue
        if pos > target_len:
            break
        l1, l2 = cp.residency(node, Tier.L1), cp.residency(node, Tier.L2)
        if l1 == f"{Direction.H2D.value}_PENDING" and not l2_part and not l3_part:
            shared.append(node)
        elif l1 == ABSENT and l2 == RESIDENT and not l3_part:
            l2_part.append(node)
        elif (
            choice == "L3"
            and l1 == ABSENT
            and l2 == ABSENT
            and cp.holds(node, Tier.L3)
            and not unreadable(node)
        ):
            l3_part.append(node)
        else:
            break
    return Plan(shared, l2_part, l3_part)


def plan_reach(
    cp: ControlPlane, match: MatchResult, unreadable: Callable[[TreeNode], bool] = lambda n: False
) -> int:
    """Tokens of `match`'s path the deepest restore plan reaches: the end of `plan_parts`'
    plan for L3 with no target, or the L1 hit when it plans nothing. The restore policy
    decides on L2 and L3 hits cut here, so it never chooses a restore no plan makes (which
    the decision log would settle against a recompute): a node L1 holds past the hit (its
    window freed, spec/pools.md "Freed windows") or one L2 is filling (another request's
    promotion in flight) ends every plan, and its tokens are recomputed (R33)."""
    whole = sum(len(node.key) for node in match.path)
    plan = plan_parts(cp, match, "L3", whole, unreadable)
    nodes = plan.shared + plan.l2_part + plan.l3_part
    return cp.tree.prefix_tokens(nodes[-1]) if nodes else match.lengths[0]
