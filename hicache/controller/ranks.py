"""What one rank brings to the admit and serve agreements, and what it takes from them.

    policy_hits(m)            the hits the policy decides on for match `m`: as far as a
                              restore plan reaches, L3 as far as it may serve (one rank too)
    hits(m, prompt, priced,   C1a: this rank's bounds, own L1 hit, choice and endpoint mask
         carried)             in, and its ends of the ops in flight (C4 carried); the hits
                              every rank uses out (tokens), the agreed ends in `carried_ends`
    decide(hits, priced)      the decision on the agreed hits: this rank's own when they are
                              its own hits, else its policy's; across ranks rank 0's choice
                              (C1a's, or C1b asked again)
    served(mat)               C1c carrying C3: the planned node every rank serves through, and
                              whether every rank can make the L1 room for the rest (a
                              collective only where L1 frees windows: elsewhere its own)
    room_for(mat, deepest)    whether this rank's L1 can take the rest (one rank's C3)

Contract: every payload's size is a length every rank knows (the prompt's pages), never this
rank's plan's (spec/tp.md, F17); one rank (`agree.size == 1`) makes no collective here and
`decide` is the policy's own. The collectives themselves are `hicache.distributed.agreement`.
"""

from __future__ import annotations

from collections.abc import Sequence

from hicache.controller.eviction import Evictor
from hicache.controller.l3health import L3Health
from hicache.controller.materialize import Materialization, plan_reach
from hicache.core.control import ControlPlane
from hicache.core.tiers import Tier
from hicache.core.tree import MatchResult, TreeNode
from hicache.dataplane.geometry import KVGeometry
from hicache.distributed.agreement import Agreed, Agreement, Local
from hicache.policy import CostModel
from hicache.policy.decisions import CHOICES
from hicache.policy.policies import Decision, Policy, price_candidates

__all__ = ["RankAgreement"]

Hits = tuple[int, int, int]  # tokens hit in L1, L2, and L3 as far as it may serve


class RankAgreement:
    def __init__(
        self,
        cp: ControlPlane,
        agree: Agreement,
        kv: KVGeometry,
        policy: Policy,
        model: CostModel,
        evictor: Evictor,
        l3: L3Health,
    ) -> None:
        """`l3`: L3's health, which bounds the L3 hit the policy is offered (`policy_hits`)."""
        self.cp, self.agree, self.kv = cp, agree, kv
        self.policy, self.model, self.evictor = policy, model, evictor
        self.l3 = l3
        self.tp = agree.tp
        # C1a's by-products for the admission in progress: this rank's own hits, its decision
        # on them, and rank 0's choice code (None: rank 0's own hits were cut, C1b decides).
        self._own: tuple[Hits, Decision, int | None] | None = None
        self.carried_ends: list[Agreed] = []  # the agreed ends C1a carried (C4 carried by C1a)

    def policy_hits(self, m: MatchResult) -> Hits:
        """The hits, in tokens, the policy decides on for match `m`: L1, L2, and L3 as far
        as it may serve (a quarantined or offline L3 copy serves nothing), both only as far
        as a restore plan reaches (`plan_reach`: a node L1 holds past its hit, its window
        freed, or one another request promotes is recomputed): the policy never picks a
        tier whose plan restores nothing."""
        reach = plan_reach(self.cp, m, self.l3.stops_at)
        l3 = max(m.lengths[1], self.l3.servable_len(m))
        return m.lengths[0], min(m.lengths[1], reach), min(l3, reach)

    def hits(
        self, m: MatchResult, prompt: int, priced: int, carried: Sequence[Local] = ()
    ) -> tuple[int, ...]:
        """C1a (spec/tp.md): the per-tier hits, in tokens, every rank uses for match `m` (this
        rank's own) of a prompt of `prompt` page-aligned tokens (at least 1), whose prefill
        computes through `priced` tokens (`prefill_end`: what the policy prices). `carried`:
        this rank's ends of the ops in flight, which the gather carries (C4 carried by C1a);
        their agreed ends are left in `carried_ends` for the admission to apply once it
        pinned its plan."""
        ps = self.kv.page_size
        deepest = self.cp.leading_run(m.path, Tier.L1)  # the L1 run, before any window rule
        run = list(m.path[: m.path.index(deepest) + 1]) if deepest is not None else []
        own = self.policy_hits(m)
        decision = self.policy.decide(*own, priced, self.kv.bytes_per_token)
        windows = self.cp.windows
        # The mask spans the prompt's page ends: a length every rank knows (F17).
        mask = windows.endpoint_mask(run, prompt // ps) if windows.hit_pages else None
        # Without a mask the L1 bound is this rank's own hit: under anchor_recompute_swa one
        # ending before the window it replays (a node end on every rank: replay_start split
        # there), and any end before it is legal too, so the least of them is.
        l1 = sum(len(n.key) for n in run) if mask is not None else m.lengths[0]
        bounds = [l1 // ps, m.lengths[1] // ps, m.lengths[2] // ps]
        agreed, rank0, self.carried_ends = self.agree.admit(
            bounds, m.lengths[0] // ps, CHOICES.index(decision.choice), mask, carried
        )
        self._own = (own, decision, rank0)
        return tuple(pages * ps for pages in agreed)

    def decide(self, hits: Hits, priced: int) -> Decision:
        """The decision on `hits` (the agreed ones across ranks) for a prompt whose prefill
        computes through `priced` tokens (`prefill_end`). Across ranks every rank takes rank
        0's choice (a cost model's timings are its own): C1a's when rank 0's own hits were the
        agreed ones, else C1b's.
        Consumes the by-products of the `hits` call of this admission."""
        own, self._own = self._own, None
        if own is not None and own[0] == hits:
            decision = own[1]  # the agreed hits are this rank's own: so is the decision
        else:
            decision = self.policy.decide(*hits, priced, self.kv.bytes_per_token)
        if not self.tp:
            return decision
        assert own is not None, "across ranks every admission makes C1a first"
        code = own[2]
        if code is None:  # rank 0's own hits were cut: it chooses again, on the agreed ones
            code = self.agree.choice(CHOICES.index(decision.choice))
        chosen = CHOICES[code]
        if chosen == decision.choice:
            return decision
        cands = price_candidates(self.model, *hits, priced, self.kv.bytes_per_token)
        return cands.decision(
            chosen, f"rank 0's choice ({chosen}; this rank's: {decision.choice}, {decision.reason})"
        )

    def served(self, mat: Materialization) -> tuple[TreeNode | None, bool]:
        """C1c, carrying C3: (the planned node every rank may serve through, whether every
        rank can make the L1 room for the rest), by masks over the prompt's page ends (their
        length is the prompt's: the same on every rank, whatever each rank's restore plan
        holds now, F17). The room entry of each endpoint this rank can serve says whether it
        could compute the rest after it.

        Only an L1 that frees windows (a group with a trailing pool: the configuration, the
        same on every rank) makes the collective. Elsewhere both masks read only what every
        rank holds equal -- L1 residency and locks (C1a, C2, C4 agreed them) and L1's free
        count -- so this rank's own answer is every rank's, and no collective is made."""
        ps = self.kv.page_size
        ends: dict[int, TreeNode] = {}  # page end -> the servable planned node ending there
        for i, ok in enumerate(self.cp.servable_mask(mat.nodes)):
            if ok and i:  # (a planned node past the servable run may be gone from the tree)
                ends[self.cp.tree.prefix_tokens(mat.nodes[i - 1]) // ps] = mat.nodes[i - 1]
        servable = [0] * (len(mat.tokens) // ps + 1)
        room = [1] * len(servable)
        room[0] = int(self.room_for(mat, None))
        for end, node in ends.items():
            servable[end], room[end] = 1, int(self.room_for(mat, node))
        if self.cp.windows.tombstones:  # a window freed on one rank: the answers may differ
            served, room_all = self.agree.serve(servable, room)
        else:  # every input is state every rank holds equal: this rank's answer is theirs
            served = max((e for e, ok in enumerate(servable) if ok), default=0)
            room_all = bool(room[served])
        return (ends.get(served) if served else None), room_all

    def room_for(self, mat: Materialization, deepest: TreeNode | None) -> bool:
        """Whether this rank's L1 can take the pages a prefill of `mat` computes when it
        serves through `deepest` (None: through the request's `cached_len`): free pages, or
        pages eviction could free without touching the served prefix."""
        ps = self.kv.page_size
        start = (
            self.cp.tree.prefix_tokens(deepest)
            if deepest is not None
            else self.cp.cached_len(mat.request_id)
        )
        need = (-(-len(mat.tokens) // ps) * ps - start) // ps
        if need <= 0:
            return True
        keep = self.cp.tree.path_to_root(deepest) if deepest is not None else ()
        return self.cp.free_pages(Tier.L1) >= need or self.evictor.can_make_room_l1(need, keep)
