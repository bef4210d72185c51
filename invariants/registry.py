"""Every check, in spec order, with its id, name and one-line summary (spec/invariants.md).

    id  name                    one line
    --  ----------------------  ------------------------------------------------------------
    I1..I6                      the six ownership invariants
    I9  group_atomic            a tier's pool group moves as one (planes with a group)
    S1..S7                      structural checks of the tree's own bookkeeping

`check_all` runs them all; `get_check` finds one by id or name (for a CLI's `--only I2`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hicache.core.snapshot import Snapshot
from hicache.errors import ConfigError
from hicache.invariants.alignment import PAGE_ALIGNED, check_page_aligned
from hicache.invariants.atomic import GROUP_ATOMIC, check_group_atomic
from hicache.invariants.bytes import TIER_BYTES_EQUAL, check_tier_bytes_equal
from hicache.invariants.ordering import PUBLISH_ORDER, check_publish_order
from hicache.invariants.ownership import (
    INFLIGHT_SOURCE_PINNED,
    OWNERSHIP_DISJOINT,
    PAGE_CONSERVATION,
    check_inflight_source_pinned,
    check_ownership_disjoint,
    check_page_conservation,
)
from hicache.invariants.structure import (
    LOCK_ACCOUNTING,
    LOCKS_NON_NEGATIVE,
    NO_DEAD_NODE,
    NO_DOUBLE_REFERENCE,
    PARENT_CHILD_LINKS,
    TIER_ANCESTOR_CLOSED,
    TIER_SIZE_ACCOUNTING,
    check_lock_accounting,
    check_locks_non_negative,
    check_no_dead_node,
    check_no_double_reference,
    check_parent_child_links,
    check_tier_ancestor_closed,
    check_tier_size_accounting,
)
from hicache.invariants.violation import CheckName, Violation

CheckFunc = Callable[[Snapshot], list[Violation]]


@dataclass(frozen=True)
class Check:
    """One invariant or structural check: a pure function of a snapshot."""

    id: str  # "I1".."I6", "I9", "S1".."S7"
    name: str
    summary: str  # one line
    func: CheckFunc

    def __call__(self, s: Snapshot) -> list[Violation]:
        return self.func(s)


def _check(name: CheckName, summary: str, func: CheckFunc) -> Check:
    return Check(name.id, name.name, summary, func)


CHECKS: tuple[Check, ...] = (
    _check(
        OWNERSHIP_DISJOINT,
        "tree-owned, free and private pages of a tier are pairwise disjoint",
        check_ownership_disjoint,
    ),
    _check(
        INFLIGHT_SOURCE_PINNED,
        "an in-flight transfer's source is locked, resident and tree-owned",
        check_inflight_source_pinned,
    ),
    _check(PAGE_ALIGNED, "keys, values and transfer ranges are whole pages", check_page_aligned),
    _check(
        TIER_BYTES_EQUAL,
        "a node's copies in different tiers hold the same bytes",
        check_tier_bytes_equal,
    ),
    _check(
        PUBLISH_ORDER, "completion precedes publication precedes cached_len", check_publish_order
    ),
    _check(
        PAGE_CONSERVATION,
        "free + private + tree == capacity, every page counted once",
        check_page_conservation,
    ),
    _check(
        GROUP_ATOMIC,
        "every side pool of a tier's group follows the anchor's pages",
        check_group_atomic,
    ),
    _check(
        PARENT_CHILD_LINKS,
        "parent and child links agree; one root; no cycle",
        check_parent_child_links,
    ),
    _check(
        NO_DEAD_NODE,
        "no node that holds nothing and has no children stays in the tree",
        check_no_dead_node,
    ),
    _check(
        TIER_SIZE_ACCOUNTING,
        "the tree's per-tier page counter matches its node values",
        check_tier_size_accounting,
    ),
    _check(LOCKS_NON_NEGATIVE, "no lock count is negative", check_locks_non_negative),
    _check(
        NO_DOUBLE_REFERENCE,
        "no physical page is referenced twice within a tier",
        check_no_double_reference,
    ),
    _check(
        TIER_ANCESTOR_CLOSED,
        "a node present in a tier has its parent present there too",
        check_tier_ancestor_closed,
    ),
    _check(
        LOCK_ACCOUNTING,
        "every lock count equals the locks its requests and ops hold",
        check_lock_accounting,
    ),
)

_BY_KEY: dict[str, Check] = {**{c.id: c for c in CHECKS}, **{c.name: c for c in CHECKS}}


def get_check(key: str) -> Check:
    """The check with id `key` ("I2") or name `key` ("inflight_source_pinned")."""
    check = _BY_KEY.get(key)
    if check is None:
        known = ", ".join(f"{c.id} {c.name}" for c in CHECKS)
        raise ConfigError("invariant", f"no check named {key!r}; known: {known}")
    return check


def check_all(s: Snapshot, checks: tuple[Check, ...] = CHECKS) -> list[Violation]:
    """Every violation `checks` (default: all, in spec order) find in `s`; [] when all hold."""
    out: list[Violation] = []
    for check in checks:
        out += check.func(s)
    return out
