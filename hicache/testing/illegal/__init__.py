"""Illegal calls on the control plane, drawn from its current state: each must be refused.

The controller never asks its control plane for what the spec refuses, so the guards and
rules are a second line of defence its traffic never crosses: a guard read on the wrong node
of a chain, or a rule that stopped refusing, shows in no fuzz run. This catalogue makes the
refused calls itself. Each kind looks at the plane as it is now and builds one call the spec
refuses there -- a real node that is locked, a real pending op ended in another op's name --
or none when the state offers it none; `refusal` (base.py) runs it and says what went wrong:
accepted, refused with another error than the one named, or refused after changing something
(`ControlPlane.state_key` before and after: the tree with its LRU ticks, the page tables, the
ops, the requests, the op id counter, the trace events emitted): R4, raise with nothing changed.

    kind                   the call                                     refused by          error
    ---------------------  -------------------------------------------  ------------------  -----
    issue_child_first      issue(d, [child, parent]), each issuable     parent-first chain  IT
                           in a parent-first chain
    issue_gap              issue(d, [node, grandchild])                 parent-first chain  IT
    issue_bad_tail         issue(d, chain): its head issuable, its      the row, on every   IT
                           last node not (source or target wrong)       node
    issue_bad_head         issue(d, chain): its head not issuable,      the row, on every   IT
                           the nodes below it issuable                  node
    issue_parent_gap       issue(d, [node]): its parent lacks T         parent(T) ==        IT
                                                                        RESIDENT
    issue_no_source        issue(d, [node]): source not RESIDENT        the row             IT
    issue_target_busy      issue(d, [node]): target not ABSENT          the row             IT
    issue_freed_window     D2H of a node whose L1 window is freed       a backup needs      IT
                                                                        every pool
    issue_stale_node       issue(d, [a removed handle])                 a live node         IT
    issue_unknown_request  issue(d, [node], a request not live)         a live request      UR
    issue_empty            issue(d, [])                                 no nodes            IT
    issue_in_apply         apply(<d>_issue, [node])                     op rows not in      IT
                                                                        apply
    end_unknown_op         complete / fail / cancel / complete_part     a pending op        UO
                           of an ended or never issued op id
    end_in_apply           apply(an op's end row, its nodes, in         ack_matches_        IT
                           another op's name or its own)                pending_id; apply
    end_part_not_s2h       complete_part of a D2H, H2D or H2S op        partial_end_        IT
                                                                        s2h_only
    end_part_keep          complete_part(an S2H op, keep outside        partial_end_        IT
                           0..its nodes)                                s2h_only
    begin_live_id          begin_request(a live request's id)           one request an id   LR
    begin_match_len        begin_request(prompt, match_len = its        match_short_of_     IT
                           length), or an empty prompt                  last_token
    compute_misaligned     compute(r, 0 .. page_size - 1 tokens)        aligned(range)      IT
    compute_past_prompt    compute(r, to one page past the prompt)      range <= prompt     IT
    compute_twice          compute(r) while r holds private pages       no_private          IT
    advance_unpublished    advance_cached_len(r, a node below r's       published first     IT
                           lock, its path not all RESIDENT in L1)       (I5)
    advance_off_prefix     advance_cached_len(r, an L1 node off r's     r's locked prefix   IT
                           locked prefix)
    advance_stale_node     advance_cached_len(r, a removed handle or    a live node         IT
                           the root)
    pin_stale_node         pin(r, the root or a removed handle, T)      a live node         IT
    unknown_request        compute / insert / advance_cached_len /      a live request      UR
                           pin / unpin / end_request, id not live
    end_request_pending    end_request(r) while an op of r is pending   ops end first       IT
    evict_locked           evict_node(a leaf in T, locked in T)         locks(T) == 0       IT
    evict_inner            evict_node(a node whose child holds T)       leaf(T)             IT
    evict_not_resident     evict_node(a node ABSENT or pending in T)    the row             IT
    evict_stale_node       evict_node(the root or a removed handle)     a live node         IT
    tombstone_refused      tombstone(a node without a trailing pool,    tombstone's         IT
                           not RESIDENT or locked in L1, freed)         guards

IT IllegalTransition, UR UnknownRequest, UO UnknownOp, LR LiveRequest (hicache/core/records.py).
`d` is a transfer direction, `T` a tier, `r` a live request; a "removed handle" is a node
object with a live node's id, key and states that is not the tree's (what a caller holds
after the node it matched was removed). Whether a call is legal is decided from the spec's
rules (base.py: `issuable`), never by asking the plane's own planner, so a broken guard
cannot vouch for itself. The fuzz machine makes these calls (rule.py, `illegal_calls`).
"""

from __future__ import annotations

from collections.abc import Iterator

from hicache.core.control import ControlPlane
from hicache.testing.illegal import requests, transfers
from hicache.testing.illegal.base import Builder, IllegalCall, refusal

KINDS: dict[str, Builder] = {**transfers.BUILDERS, **requests.BUILDERS}
"""Every kind -> its builder, in the order of the table above."""


def calls(cp: ControlPlane, pick: int) -> Iterator[IllegalCall]:
    """One call of every kind the plane's state offers now, in catalogue order; `pick`
    chooses each kind's candidate (the same pick, modulo each kind's count)."""
    for build in KINDS.values():
        call = build(cp, pick)
        if call is not None:
            yield call


__all__ = ["KINDS", "IllegalCall", "calls", "refusal"]
