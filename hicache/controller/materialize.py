"""A request's pending restore (the write-up's "pending materialization").

    stage      ops in flight                        next
    ---------  -----------------------------------  -----------------------------------------
    issued     H2D of the L2 part, S2H of the L3    each completion is observed on a tick
               part (both at once)
    promoted   S2H done -> H2D of the L3 part       issued once the L2 part is in L1 (its
                                                    parent must hold L1: no gap)
    done       nothing                              publish: advance cached_len to the deepest
                                                    node whose whole path is in L1
A failed or cancelled op ends its part; what did arrive is used, the rest is recomputed
(the fallback). The decode loop runs between ticks, so restores overlap decode.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from hicache.lifecycle import ABSENT, RESIDENT
from hicache.policy import Decision
from hicache.tree import MatchResult, TreeNode


@dataclass
class Materialization:
    request_id: int
    tokens: tuple[int, ...]
    decision: Decision
    decision_id: int
    match: MatchResult
    l2_part: list[TreeNode] = field(default_factory=list)  # restored by H2D directly
    l3_part: list[TreeNode] = field(default_factory=list)  # S2H, then H2D
    ops: set[int] = field(default_factory=set)  # op ids in flight for this request
    s2h_done: bool = False
    l3_h2d_issued: bool = False
    failed: bool = False
    started_at: float = field(default_factory=time.perf_counter)
    ready_at: float | None = None

    @property
    def done(self) -> bool:
        return not self.ops and not self.needs_l3_h2d

    @property
    def needs_l3_h2d(self) -> bool:
        return bool(self.l3_part) and self.s2h_done and not self.l3_h2d_issued and not self.failed


def plan_parts(match: MatchResult, choice: str, target_len: int) -> tuple[list[TreeNode], list[TreeNode]]:
    """Split the path beyond the L1 hit, up to `target_len` tokens, into the nodes restored
    from L2 (L1 absent, L2 resident) and, for an L3 choice, the nodes promoted from L3 first
    (L1 and L2 absent, L3 resident). The plan stops at the first node that fits neither
    (e.g. a load-back already pending for another request): those tokens are recomputed."""
    l2_part: list[TreeNode] = []
    l3_part: list[TreeNode] = []
    pos = 0
    for node in match.path:
        start, pos = pos, pos + len(node.key)
        if start < match.lengths[0]:
            continue
        if pos > target_len:
            break
        s1, s2, s3 = node.state
        if s1 == ABSENT and s2 == RESIDENT and not l3_part:
            l2_part.append(node)
        elif choice == "L3" and s1 == ABSENT and s2 == ABSENT and s3 == RESIDENT:
            l3_part.append(node)
        else:
            break
    return l2_part, l3_part
