"""I4: the L1/L2/L3 copies of a logical page hold the same (rank-local) bytes.

Bytes are compared through `Snapshot.digests(tier, pages)`, one uint64 per physical page,
supplied by the data plane (the null data plane has no bytes and supplies none: the check
is then vacuous). Every node's key pages get one slot in a "logical page" axis:

    logical page   0 1 | 2 3 4 | 5 ...      (node 1: 2 pages, node 2: 3 pages, ...)
    L1 digest      a b | - - - | e          (- : node not RESIDENT in that tier)
    L2 digest      a b | c d x | -
    reference      a b | c d x | e          first tier (in snapshot order) that holds it

Each tier is compared with the reference, so one `digests` call and a few array operations
per tier cover the whole tree.

L3 is a medium that can rot or be truncated under us. What I4 asserts there is about the bytes
a read would *serve*: a slot whose bytes fail their recorded checksum, or cannot be read at all,
can never be served (the read that meets it is a miss and drops the copy), so the data plane
reports it as `UNSERVABLE` and I4 exempts it. Every other L3 slot must hold exactly the bytes
of the other tiers' copies -- so a slot written with the wrong page (B13, B15) still fails I4,
while bit rot, which only a read can detect, does not crash the checker.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from hicache.core.pages import Pages, pages
from hicache.core.snapshot import UNSERVABLE, Snapshot
from hicache.invariants.claims import Ids
from hicache.invariants.ownership import RESIDENT
from hicache.invariants.violation import CheckName, Violation

TIER_BYTES_EQUAL = CheckName("I4", "tier_bytes_equal")


def check_tier_bytes_equal(s: Snapshot) -> list[Violation]:
    """I4: for every node RESIDENT in two or more tiers, the digests of its pages agree page by
    page across those tiers. Nodes whose value length is wrong (I3) and pages outside a tier
    (I6) are skipped here; no digests means nothing to compare."""
    if s.digests is None or s.page_size <= 0 or not s.nodes:
        return []
    keys = np.asarray([n.key_tokens for n in s.nodes], dtype=np.int64)
    n_pages = np.where((keys >= 0) & (keys % s.page_size == 0), keys // s.page_size, 0)
    starts = np.concatenate(([0], np.cumsum(n_pages)[:-1]))
    total = int(n_pages.sum())
    node_of = np.repeat(np.asarray([n.node_id for n in s.nodes], dtype=np.int64), n_pages)
    tiers = list(s.tiers)
    digest = np.zeros((len(tiers), total), dtype=np.uint64)
    held = np.zeros((len(tiers), total), dtype=bool)
    physical = np.full((len(tiers), total), -1, dtype=np.int64)
    for t, tier in enumerate(tiers):
        p, pos = _resident_pages(s, tier, n_pages, starts)
        if not p.size:
            continue
        d = np.asarray(s.digests(tier, p), dtype=np.uint64).reshape(-1)
        # Verify the data plane kept the digest contract (one value per page asked).
        if d.size != p.size:
            raise ValueError(
                f"digests({tier!r}, {p.size} pages) returned {d.size} values; "
                "it must return one uint64 per page"
            )
        ok = d != UNSERVABLE  # rotten medium: never served, so no copy to compare (see above)
        digest[t, pos[ok]], held[t, pos[ok]], physical[t, pos[ok]] = d[ok], True, p[ok]
    first = np.argmax(held, axis=0)  # the first tier holding each logical page (0 if none)
    reference = digest[first, np.arange(total)]
    out: list[Violation] = []
    for t, tier in enumerate(tiers):
        bad = np.flatnonzero(held[t] & (digest[t] != reference))
        if bad.size:
            ref_tier = tiers[int(first[bad[0]])]
            out.append(
                TIER_BYTES_EQUAL.violation(
                    f"{bad.size} page(s) of {tier} hold bytes that differ from the same logical "
                    f"pages in {ref_tier} (first: {tier} page {physical[t, bad[0]]} vs {ref_tier} "
                    f"page {physical[first[bad[0]], bad[0]]})",
                    tier=tier,
                    pages=physical[t, bad],
                    nodes=node_of[bad],
                )
            )
    return out


def _resident_pages(s: Snapshot, tier: str, n_pages: Ids, starts: Ids) -> tuple[Pages, Ids]:
    """The in-range physical pages of every node RESIDENT in `tier` with a well-formed value,
    and each page's logical position."""
    view = s.tiers[tier]
    known = min(view.capacity, int(view.owner.size))
    want = n_pages.tolist()
    chosen: list[int] = []
    values: list[Pages] = []
    for i, n in enumerate(s.nodes):
        v = n.values.get(tier)
        if v is not None and len(v) == want[i] and want[i] and n.states.get(tier) == RESIDENT:
            chosen.append(i)
            values.append(v)
    if not values:
        return pages(), pages()
    p = np.concatenate(values).astype(np.int64, copy=False)
    counts = n_pages[chosen]
    pos = _positions(starts[chosen], counts)
    keep = (p >= 0) & (p < known)
    return p[keep], pos[keep]


def _positions(starts: Ids, counts: Ids) -> npt.NDArray[np.int64]:
    """`[s0, s0+1, .., s0+c0-1, s1, ..]`: the ranges starts[i] + 0..counts[i]-1, concatenated."""
    run_start = np.concatenate(([0], np.cumsum(counts)[:-1]))
    return (np.repeat(starts - run_start, counts) + np.arange(int(counts.sum()))).astype(np.int64)
