"""A restore's S2H that stopped part way: which of its nodes may be published.

An S2H of a pool group may end with only part of each pool landed (`TransferHandle.landed`:
per pool, a leading run of its own pages; a pool left out landed none). What may be
published is `prefetch_clamp`'s `published` anchor pages (spec/pools.md, "prefetch_clamp";
scenarios F11, F12). The lifecycle publishes whole nodes (a node's value in a tier is all of
its pages or none), so the clamp is taken down to whole nodes: the leading nodes of the op
whose pages all lie within `published`. The control plane then completes those and fails
the rest (`ControlPlane.complete_part`), which releases every other reserved page of every
pool. Pure: the caller applies the answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hicache.core.tree import TreeNode
from hicache.pools.hits import prefetch_clamp
from hicache.pools.spec import PoolGroup


def clamped_nodes(group: PoolGroup, nodes: Sequence[TreeNode], landed: Mapping[str, int]) -> int:
    """How many leading `nodes` (an S2H's parent-first chain, anchor pages in order) to
    publish when `landed[pool]` of each pool's pages arrived: the most whole nodes whose
    anchor pages fit in `prefetch_clamp(group, landed, reserved).published`, `reserved`
    being every page of the chain, and in every other pool's landed pages (L2 holds whole
    groups). ConfigError (from `prefetch_clamp`) for a report naming
    a pool the group lacks or a count beyond what was reserved."""
    reserved = sum(n.num_pages for n in nodes)
    published = prefetch_clamp(group, landed, reserved).published
    # The host tiers hold whole groups (a window is freed in L1 only, spec/pools.md "Freed
    # windows"), so the pools `prefetch_clamp` does not clamp by -- trailing and state pools
    # -- must have landed too: a published L2 page lacks no pool's bytes.
    published = min(
        [published]
        + [landed.get(p.name, 0) // group.ratio(p.name) for p in group.backed_up().pools]
    )
    keep = covered = 0
    for node in nodes:
        if covered + node.num_pages > published:
            break
        covered += node.num_pages
        keep += 1
    # Verify the nodes published lie within the clamp: never a page some pool lacks.
    assert covered <= published, (covered, published)
    return keep
