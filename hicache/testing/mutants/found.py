"""Mutants that put back bugs found from outside (an outside fuzzer, an upstream scenario):
each was fixed at its root, and the fuzz machine learned to catch its class.

Registered in `hicache.testing.mutants` (its table names each one); `ZOO` lists this
module's mutants in the order `hicache fuzz --mutant list` prints them.
"""

from __future__ import annotations

import contextlib
from typing import Any

from hicache.testing.mutants.base import Mutant, swapped


def _f11_no_clamp() -> contextlib.AbstractContextManager[None]:
    """An S2H that stopped part way publishes every node it was reading, not only the whole
    nodes within `prefetch_clamp` of what landed (SGLang #30334: a prefix published past a
    sidecar's coverage). The landed report is still drawn and applied."""
    import hicache.controller.transfers as transfers

    return swapped(transfers, "clamped_nodes", lambda group, nodes, landed: len(nodes))


def _decision_unplanned() -> contextlib.AbstractContextManager[None]:
    """The restore policy decides on the L2 and L3 hits whole, past where every restore plan
    stops (a node L1 holds with its window freed, a promotion in flight): a restore chosen
    whose plan restores nothing, no fallback counted (issue 30, section 5: the outside
    fuzzer's find, an L2 choice over a freed window)."""
    from hicache.controller.ranks import RankAgreement

    def policy_hits(self: Any, m: Any) -> tuple[int, int, int]:
        return m.lengths[0], m.lengths[1], max(m.lengths[1], self.l3.servable_len(m))

    return swapped(RankAgreement, "policy_hits", policy_hits)


def _replay_unrevived() -> contextlib.AbstractContextManager[None]:
    """Under anchor_recompute_swa the L1 hit is the anchor's whole run even when the window
    before its end has a freed page: the replay is counted but never made, so the window is
    never revived and every later hit replays it again (issue 30, section 5)."""
    from hicache.pools.hits import ALL_POOLS
    from hicache.pools.windows import L1Windows

    original = L1Windows.__dict__["clip"]

    def clip(self: Any, run: Any) -> int:
        if self.policy == ALL_POOLS:
            return int(original(self, run))
        return sum(len(node.key) for node in run) // int(self.page_size)

    return swapped(L1Windows, "clip", clip)


def _l3_no_lock() -> contextlib.AbstractContextManager[None]:
    """An explicit L3 path is opened without its lock: a second controller on the path a
    live one uses takes the file over (issue 30, section 5: the outside fuzzer's find)."""
    from hicache.dataplane import storage

    return swapped(storage, "_lock", lambda path, fd: None)


ZOO: tuple[Mutant, ...] = (
    Mutant(
        "F11-no-clamp",
        "-",
        "transfers.clamped_nodes",
        "an S2H stopped part way "
        "publishes every node it read, not the clamp of what landed in every pool",
        _f11_no_clamp,
    ),
    Mutant(
        "decision-unplanned",
        "-",
        "RankAgreement.policy_hits",
        "the policy decides on hits past where every plan stops: a restore chosen, none planned",
        _decision_unplanned,
    ),
    Mutant(
        "replay-unrevived",
        "-",
        "L1Windows.clip",
        "anchor_recompute_swa serves the anchor's whole run over a freed window: never revived",
        _replay_unrevived,
    ),
    Mutant(
        "L3-no-lock",
        "-",
        "storage._lock",
        "an explicit L3 path is opened unlocked: a second controller takes a live one's file over",
        _l3_no_lock,
    ),
)
