"""Wrong lifecycle tables, edited consistently: the bugs a porter writes into the tables.

A table mutant edits rows of spec/lifecycle.toml (a guard weakened, an effect dropped, a row's
target changed) and switches the edited tables in where the reference loads them
(`hicache.core.lifecycle.load_lifecycle`): the executor runs the edited rows and the walk's
`transitions` machine is built from them, so the two readings agree with each other and with
the (edited) table. Nothing that compares the table with itself can see such a bug; what
catches it is a judge that does not read the table: the invariant checks over the control
plane's snapshot, and the fuzz's reference model. `hicache spec check` catches every one
through the properties the tables must have (hicache/oracle/speccheck/properties.py); the zoo
measures which of them the fuzz catches too (benchmarks/results/2026-12-04-zoo-tables.md).

Registered in `hicache.testing.mutants` (its table names each one); `ZOO` lists this
module's mutants in the order `hicache fuzz --mutant list` prints them. `RowEdit` and
`patched` serve tests/test_spec_properties.py's catalogue too.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hicache.testing.mutants.base import Mutant, swapped


@dataclass(frozen=True)
class RowEdit:
    """One edit of one residency row of lifecycle.toml: its `field` ("guards", "effects",
    "to", "kind", ...) becomes `value`; `field` None removes the row."""

    row: str
    field: str | None = None
    value: str | tuple[str, ...] | None = None

    def apply(self, tables: dict[str, Any]) -> None:
        """Apply the edit to `tables` (a loaded lifecycle.toml, changed in place); KeyError
        when no row has that name (the edit is stale)."""
        for tier in tables["residency"].values():
            rows = tier["transitions"]
            for i, row in enumerate(rows):
                if row["name"] != self.row:
                    continue
                if self.field is None:
                    del rows[i]
                else:
                    row[self.field] = (
                        list(self.value) if isinstance(self.value, tuple) else self.value
                    )
                return
        raise KeyError(f"no row {self.row!r} in the lifecycle tables")


def edited(tables: Mapping[str, Any], edits: Sequence[RowEdit]) -> dict[str, Any]:
    """A deep copy of `tables` with `edits` applied in order."""
    out = copy.deepcopy(dict(tables))
    for e in edits:
        e.apply(out)
    return out


@contextlib.contextmanager
def patched(edits: Sequence[RowEdit]) -> Iterator[None]:
    """Inside the block, the shipped lifecycle tables load with `edits` applied: every
    `load_lifecycle()` (the control plane's executor, the walk's machine, `check-trace`)
    gets the edited tables; other paths load as they are."""
    import hicache.core.lifecycle as lifecycle
    from hicache.spec import LIFECYCLE_TOML, load_toml

    wrong = lifecycle.Lifecycle(edited(load_toml(LIFECYCLE_TOML), edits))
    original = lifecycle._load_cached
    shipped = str(Path(LIFECYCLE_TOML))

    def load(path: str) -> lifecycle.Lifecycle:
        return wrong if path == shipped else original(path)

    with swapped(lifecycle, "_load_cached", load):
        yield


def _mutant(name: str, description: str, edits: Sequence[RowEdit]) -> Mutant:
    rows = sorted({e.row for e in edits})
    return Mutant(
        name,
        "-",
        f"lifecycle.toml {', '.join(rows)}",
        description,
        lambda: patched(edits),
    )


UNPINNED_LOAD_BACK = (
    RowEdit("h2d_issue", "effects", ("reserve(L1)",)),
    RowEdit("h2d_complete", "effects", ("publish(L1)",)),
    RowEdit("h2d_fail", "effects", ("release(L1)",)),
    RowEdit("h2d_cancel", "effects", ("release(L1)",)),
)
"""A load-back that never pins its L2 source (issue and every end): property source_locked."""

FAILED_LOAD_BACK_PUBLISHED = (
    RowEdit("h2d_fail", "to", "RESIDENT"),
    RowEdit("h2d_fail", "effects", ("publish(L1)", "unlock(L2)")),
)
"""A failed load-back publishes its L1 pages: property publish_on_complete_only."""

BACKUP_KEEPS_ITS_LOCK = (RowEdit("h2s_complete", "effects", ("publish(L3)",)),)
"""A finished L3 backup never unlocks its L2 source: property source_locked."""

PROMOTION_LOCKS_L1 = (RowEdit("s2h_issue", "effects", ("reserve(L2)", "lock(L1)")),)
"""An L3 promotion pins L1 (a load-back's effects copied) instead of its L3 source: property
source_locked."""


EDITS: dict[str, tuple[RowEdit, ...]] = {
    "T-h2d-unpinned": UNPINNED_LOAD_BACK,
    "T-h2d-fail-publishes": FAILED_LOAD_BACK_PUBLISHED,
    "T-h2s-keeps-lock": BACKUP_KEEPS_ITS_LOCK,
    "T-s2h-locks-l1": PROMOTION_LOCKS_L1,
}
"""Each table mutant's edits, by its name."""

ZOO: tuple[Mutant, ...] = (
    _mutant(
        "T-h2d-unpinned",
        "the H2D rows neither lock nor unlock their L2 source (consistent table)",
        UNPINNED_LOAD_BACK,
    ),
    _mutant(
        "T-h2d-fail-publishes",
        "h2d_fail ends RESIDENT and publishes the L1 pages it was filling (consistent table)",
        FAILED_LOAD_BACK_PUBLISHED,
    ),
    _mutant(
        "T-h2s-keeps-lock",
        "h2s_complete does not unlock its L2 source (consistent table)",
        BACKUP_KEEPS_ITS_LOCK,
    ),
    _mutant(
        "T-s2h-locks-l1",
        "s2h_issue locks L1, not its L3 source, which its ends unlock (consistent table)",
        PROMOTION_LOCKS_L1,
    ),
)
