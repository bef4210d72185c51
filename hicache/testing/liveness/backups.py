"""Durability: what the write policy promised reaches L2 and L3, and every loss is counted.

A backup is owed (spec/policies.md, "What a drain guarantees") from the event that promises
it until it is delivered, its source is gone, or it is excused:

    owed      from                                    delivered     gone (no finding)
    --------  --------------------------------------  ------------  -------------------------
    L2        `insert` under write_through: the node  L2 RESIDENT   L1 left (the eviction is
              and its path's nodes L1 holds without                 counted, below), its own
              L2 (above any freed window)                           `d2h_fail`/`d2h_cancel`,
                                                                    a window freed on it or
                                                                    above, the node removed
              `begin_request` under write_through_
              selective: the L1 handle once its
              `hits` is 2 or more, and its chain
    L3        `d2h_complete` (L3 follows L2, every    L3 RESIDENT   L2 left, its own
              write policy)                                         `h2s_fail`/`h2s_cancel`,
                                                                    the node removed

Selective write-through reads `hits` (spec/policies.md, "The `hits` count"), which the
ledger counts itself from the trace, one cache only: 0 for a new node, both halves of a
split keep it, +1 on every node of an admission's matched path (its first len - 1 tokens).
A count that differs from the node's own is `hits count`. Across ranks the match is cut to
the agreed hits first (spec/tp.md C1); the ledger leaves selective write-through to one cache.

A split owes both halves what the node owed. A backup dropped at issue leaves no event; its
tokens are counted (`dropped_tokens_total{reason}`) before the next event, so the drop
excuses what is owed at that moment in its direction, node by node, each node no longer than
the tokens dropped: `host_pressure`, `window_freed` (L2), `storage_pressure`, `l3_offline`
(L3), `backup_failed` (either). After a `drain` (no transfer in flight, no backup wanted)
nothing may still be owed: `backup undelivered`.

Every L1 eviction of a node without an L2 copy (an `evict_l1` whose `before` lacks L2) drops
exactly its tokens, counted once by the policy's reason (spec/eviction.md): after every call
the tokens so evicted equal the count of `write_through_unbacked_eviction` (write-through
policies) or of `host_pressure` + `window_freed` (write_back), and the other policy's reason
did not grow (one rank: across ranks a planned D2H also drops as `window_freed`): `unbacked
eviction`. An `l3_offline` drop with L3 online is `drop reason`.
"""

from __future__ import annotations

from typing import Any

from hicache.choices import WritePolicy
from hicache.core.lifecycle import RESIDENT, Lifecycle
from hicache.core.tiers import TIERS, Tier
from hicache.core.trace import TraceEvent
from hicache.core.tree import TreeNode

EXCUSES: dict[str, tuple[Tier, ...]] = {
    "host_pressure": (Tier.L2,),
    "window_freed": (Tier.L2,),
    "storage_pressure": (Tier.L3,),
    "l3_offline": (Tier.L3,),
    "backup_failed": (Tier.L2, Tier.L3),
    "write_through_unbacked_eviction": (),
}
"""A dropped backup's reason -> the tiers whose owed copies it may excuse."""
ENDS = {Tier.L2: ("d2h_fail", "d2h_cancel"), Tier.L3: ("h2s_fail", "h2s_cancel")}
SOURCE = {Tier.L2: 0, Tier.L3: 1}  # the index of the tier each owed copy is read from


class BackupLedger:
    """What one controller owes, from its trace (module docstring)."""

    def __init__(
        self,
        ctl: Any,
        write_policy: WritePolicy,
        lifecycle: Lifecycle,
        findings: list[str],
        tp: bool = False,
    ) -> None:
        """`tp`: `ctl` is one rank of a tensor-parallel cache, where a planned D2H refused
        for a window freed on some rank drops its tokens as `window_freed` under every
        policy (spec/tp.md C2); on one rank only write-back counts that reason."""
        self.tp = tp
        self.tree = ctl.cp.tree
        self.ctl = ctl
        self.findings = findings
        self.write_through = write_policy is WritePolicy.WRITE_THROUGH
        self.selective = write_policy is WritePolicy.WRITE_THROUGH_SELECTIVE and not tp
        self.hits: dict[int, int] = {}  # node id -> matches through it (selective only)
        self.write_back = write_policy is WritePolicy.WRITE_BACK
        self.states = {c.name: c.states for c in lifecycle.composites}
        self.owed: dict[Tier, set[int]] = {Tier.L2: set(), Tier.L3: set()}
        self.freed: set[int] = set()  # nodes whose L1 window is freed
        self.seen = dict(ctl.metrics.dropped_tokens)  # drops already taken into account
        self.start = dict(self.seen)
        self.unbacked = 0  # tokens of L1 evictions without an L2 copy
        self.balanced = True  # the first mismatch is reported once

    # -- the trace, event by event ------------------------------------------------------------

    def event(self, e: TraceEvent) -> None:
        if self.ctl.metrics.dropped_tokens != self.seen:
            self._excuse_drops()  # counted before this event: judged on the state before it
        name, node = e.event, e.node
        if name == "begin_request" and self.selective:
            self._matched(e)
        if node is None:
            return
        if name == "split":
            upper = e.detail.get("upper")
            if isinstance(upper, int):
                self.hits[upper] = self.hits.get(node, 0)  # both halves keep the count
            for owed in self.owed.values():
                if node in owed and isinstance(upper, int):
                    owed.add(upper)
            if node in self.freed and isinstance(upper, int):
                self.freed.add(upper)
        elif name == "node_remove":
            for owed in self.owed.values():
                owed.discard(node)
        elif name == "tombstone":  # a D2H chain ends before a freed window (policies.md)
            self.freed.add(node)
            self._forget_below(node)
        elif name == "revive":
            self.freed.discard(node)
        elif e.after is not None:
            self._lifecycle(e, node, self.states[e.after])

    def _lifecycle(self, e: TraceEvent, node: int, after: tuple[str, str, str]) -> None:
        name = e.event
        if name == "evict_l1" and e.before is not None and self.states[e.before][1] != RESIDENT:
            self.unbacked += (e.token_end or 0) - (e.token_start or 0)
        for tier, owed in self.owed.items():
            t = TIERS.index(tier)
            if node in owed and (
                after[t] == RESIDENT or after[SOURCE[tier]] != RESIDENT or name in ENDS[tier]
            ):
                owed.discard(node)
        if name == "d2h_complete" and after[2] != RESIDENT:
            self.owed[Tier.L3].add(node)
        elif name == "insert" and self.write_through:
            self._owe_l2(self.tree.node(node))

    def _matched(self, e: TraceEvent) -> None:
        """An admission: +1 on every node of its matched path (the prompt's first len - 1
        tokens, the tree as the match left it); its L1 handle (the node ending its L1 hit) is
        owed L2, with its chain, once its count is 2 (spec/policies.md)."""
        prompt = e.detail.get("prompt")
        hit = e.detail.get("hit")
        if not isinstance(prompt, list) or not isinstance(hit, list) or not prompt:
            return
        path = self.tree.match(tuple(prompt[: len(prompt) - 1]), split=False, touch=False).path
        at, handle = 0, None
        for n in path:
            count = self.hits[n.node_id] = self.hits.get(n.node_id, 0) + 1
            if count != n.hits:
                self.findings.append(
                    f"hits count: node {n.node_id} holds hits {n.hits}, but {count} matches "
                    f"passed through it (spec/policies.md, The `hits` count; request {e.request})"
                )
                self.hits[n.node_id] = n.hits  # reported once; judge on from the node's
            at += len(n.key)
            if at == hit[0]:
                handle = n
        if handle is not None and self.hits[handle.node_id] >= 2:
            self._owe_l2(handle)

    def _owe_l2(self, node: TreeNode) -> None:
        """Write-through wants the inserted node (selective: the L1 handle) in L2, with every
        node of its path that L1 holds and L2 lacks (its chain), down to the first node whose
        window is freed."""
        path = list(reversed(self.tree.path_to_root(node)))
        for n in path:
            if n.node_id in self.freed:
                return
            if n.state[0] == RESIDENT and n.state[1] != RESIDENT:
                self.owed[Tier.L2].add(n.node_id)

    def _forget_below(self, node_id: int) -> None:
        top = self.tree.node(node_id)
        stack = [top]
        while stack:
            n = stack.pop()
            self.owed[Tier.L2].discard(n.node_id)
            stack.extend(n.children.values())

    def _excuse_drops(self) -> None:
        """Each drop counted since the last look excuses what is owed in its direction now and
        lacks the target tier, node by node, where the node is no longer than the drop."""
        now = self.ctl.metrics.dropped_tokens
        for reason, tokens in now.items():
            dropped = tokens - self.seen.get(reason, 0)
            for tier in EXCUSES[reason] if dropped > 0 else ():
                t = TIERS.index(tier)
                for node_id in list(self.owed[tier]):
                    n = self.tree.node(node_id)
                    if n.state[t] != RESIDENT and len(n.key) <= dropped:
                        self.owed[tier].discard(node_id)
        self.seen = dict(now)

    # -- after each call ----------------------------------------------------------------------

    def after(self, call: str) -> None:
        """The counts after every call; after a drain, nothing may be owed."""
        self._excuse_drops()
        self._verify_counts()
        if call != "drain":
            return
        for tier, owed in self.owed.items():
            for node_id in sorted(owed):
                n = self.tree.node(node_id)
                start = self.tree.prefix_tokens(n) - len(n.key)
                self.findings.append(
                    f"backup undelivered: node {node_id} (tokens {start}..{start + len(n.key)}) "
                    f"is owed {tier} ({'write-through' if tier is Tier.L2 else 'L3 follows L2'}),"
                    f" holds {'L1' if tier is Tier.L2 else 'L2'} and lacks {tier} after a drain,"
                    " and no drop was counted for it (spec/policies.md, What a drain guarantees)"
                )
            owed.clear()

    def _verify_counts(self) -> None:
        grown = {r: n - self.start.get(r, 0) for r, n in self.ctl.metrics.dropped_tokens.items()}
        if self.write_back:
            counted = grown["host_pressure"] + grown["window_freed"]
            wrong, named = grown["write_through_unbacked_eviction"], "host_pressure + window_freed"
        else:
            counted = grown["write_through_unbacked_eviction"]
            wrong = 0 if self.tp else grown["window_freed"]
            named = "write_through_unbacked_eviction"
        if self.balanced and (counted != self.unbacked or wrong):
            self.balanced = False
            self.findings.append(
                f"unbacked eviction: L1 evicted {self.unbacked} tokens no L2 copy held, "
                f"{counted} counted as {named}, {wrong} under the other policy's reason "
                "(spec/eviction.md: an L1 victim without an L2 copy is counted once, by reason)"
            )
        if grown["l3_offline"] and self.ctl.l3_online:
            self.findings.append("drop reason: a backup counted as l3_offline while L3 is online")
            self.start["l3_offline"] = self.ctl.metrics.dropped_tokens["l3_offline"]
