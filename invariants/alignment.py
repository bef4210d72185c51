"""I3: allocation, insertion, split and transfer boundaries are page aligned.

A node's key is whole pages, and its value in every tier holds one physical page per key
page. An op covers a page-aligned token range and moves exactly one page per page of it, on
both sides. (Split and insertion boundaries are node key boundaries, so checking every
node's key covers them.)
"""

from __future__ import annotations

import numpy as np

from hicache.core.pages import Pages
from hicache.core.snapshot import Snapshot
from hicache.invariants.violation import CheckName, Violation, shown

PAGE_ALIGNED = CheckName("I3", "page_aligned")


def check_page_aligned(s: Snapshot) -> list[Violation]:
    """I3: node keys are non-negative multiples of `page_size` tokens; every present value
    holds key_tokens / page_size pages; every op's token range is page aligned and its source
    and target each hold (token_end - token_start) / page_size pages."""
    ps = s.page_size
    if ps <= 0:
        return [PAGE_ALIGNED.violation(f"page_size is {ps} tokens; it must be positive")]
    return _node_alignment(s) + _op_alignment(s)


def _node_alignment(s: Snapshot) -> list[Violation]:
    if _nodes_aligned(s):
        return []
    ps = s.page_size
    ids = np.asarray([n.node_id for n in s.nodes], dtype=np.int64)
    keys = np.asarray([n.key_tokens for n in s.nodes], dtype=np.int64)
    aligned = (keys >= 0) & (keys % ps == 0)
    out: list[Violation] = []
    if not aligned.all():
        bad = ids[~aligned]
        out.append(
            PAGE_ALIGNED.violation(
                f"node(s) [{shown(bad)}] have keys of {shown(keys[~aligned])} tokens, not whole "
                f"pages of {ps}",
                nodes=bad,
            )
        )
    for tier in s.tiers:
        # -1 marks "no value in this tier"; a present value must be exactly key/page_size long.
        lengths = np.asarray([_length(n.values.get(tier)) for n in s.nodes], dtype=np.int64)
        wrong = aligned & (lengths >= 0) & (lengths != keys // ps)
        if wrong.any():
            out.append(
                PAGE_ALIGNED.violation(
                    f"node(s) [{shown(ids[wrong])}] hold {shown(lengths[wrong])} page(s) in "
                    f"{tier}, not one per {ps}-token page of their keys",
                    tier=tier,
                    nodes=ids[wrong],
                )
            )
    return out


def _nodes_aligned(s: Snapshot) -> bool:
    """Whether every key is whole pages and every value one page per key page: the common
    case, tested in plain Python (numpy's fixed cost per call dominates at tree sizes)."""
    ps, tiers = s.page_size, tuple(s.tiers)
    for n in s.nodes:
        key = n.key_tokens
        if key < 0 or key % ps:
            return False
        for t in tiers:
            v = n.values.get(t)
            if v is not None and v.size != key // ps:
                return False
    return True


def _length(value: Pages | None) -> int:
    return -1 if value is None else int(value.size)


def _op_alignment(s: Snapshot) -> list[Violation]:
    ps = s.page_size
    out: list[Violation] = []
    for op in s.ops:
        start, end = op.token_start, op.token_end
        if start < 0 or end < start or start % ps or end % ps:
            out.append(
                PAGE_ALIGNED.violation(
                    f"op {op.op_id} covers tokens {start}..{end}, not a range of whole {ps}-token "
                    "pages",
                    tier=op.target,
                    ops=(op.op_id,),
                    nodes=op.node_ids,
                )
            )
            continue
        want = (end - start) // ps
        sides = (("reads", op.source, op.source_pages), ("fills", op.target, op.target_pages))
        for side, tier, p in sides:
            if p.size != want:
                out.append(
                    PAGE_ALIGNED.violation(
                        f"op {op.op_id} {side} {p.size} page(s) of {tier} for tokens "
                        f"{start}..{end} ({want} pages)",
                        tier=tier,
                        ops=(op.op_id,),
                        nodes=op.node_ids,
                    )
                )
    return out
