"""What a failed check reports: one `Violation` per broken fact, readable by a human.

    I1 ownership_disjoint [L2] pages 3,4 nodes 7: 2 page(s) are in node values and also FREE
    ^^ ^^^^^^^^^^^^^^^^^^ ^^^^ ^^^^^^^^^^ ^^^^^^^  ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
    id name (spec)        tier first pages nodes   one sentence: what is wrong

`pages`, `nodes` and `ops` hold at most `LISTED_MAX` ids each (the smallest ones), so a report
stays short however large the snapshot; the message gives the full count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

LISTED_MAX = 8
"""Most ids a violation lists per field (pages, nodes, ops)."""

IdsLike = Sequence[int] | npt.NDArray[np.integer[Any]]


@dataclass(frozen=True)
class Violation:
    """One broken invariant or structural fact, with the first few things that break it."""

    invariant: str  # "I1".."I6" or "S1".."S7"
    name: str  # the spec's name, e.g. "ownership_disjoint"
    tier: str | None
    pages: tuple[int, ...]  # physical pages of `tier` (smallest first, at most LISTED_MAX)
    nodes: tuple[int, ...]
    ops: tuple[int, ...]
    message: str

    def __str__(self) -> str:
        parts = [self.invariant, self.name]
        if self.tier is not None:
            parts.append(f"[{self.tier}]")
        for label, ids in (("pages", self.pages), ("nodes", self.nodes), ("ops", self.ops)):
            if ids:
                parts.append(f"{label} {','.join(str(i) for i in ids)}")
        return f"{' '.join(parts)}: {self.message}"


@dataclass(frozen=True)
class CheckName:
    """A check's id and spec name; calling `violation` on it builds that check's reports."""

    id: str
    name: str

    def violation(
        self,
        message: str,
        *,
        tier: str | None = None,
        pages: IdsLike = (),
        nodes: IdsLike = (),
        ops: IdsLike = (),
    ) -> Violation:
        """A `Violation` of this check; each id list is trimmed to its `LISTED_MAX` smallest."""
        return Violation(
            self.id, self.name, tier, listed(pages), listed(nodes), listed(ops), message
        )


def listed(ids: IdsLike) -> tuple[int, ...]:
    """The `LISTED_MAX` smallest distinct ids, ascending, as plain ints."""
    arr = np.unique(np.asarray(ids, dtype=np.int64).reshape(-1))
    return tuple(int(i) for i in arr[:LISTED_MAX])


def shown(ids: IdsLike) -> str:
    """`ids` for a message: "3,4,9" (the listed ones), with "..." when there are more."""
    arr = np.unique(np.asarray(ids, dtype=np.int64).reshape(-1))
    head = ",".join(str(int(i)) for i in arr[:LISTED_MAX])
    return head + (",..." if arr.size > LISTED_MAX else "")
