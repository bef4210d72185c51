"""The six ownership invariants, the pool-group invariant I9 and the structural checks, as
pure predicates over a `Snapshot`, and the cross-rank invariants over every rank's `RankView`
(spec/invariants.md). Imported as `hicache.invariants` (a
symlink).

    from hicache.invariants import check_all, InvariantChecker
    violations = check_all(control_plane.snapshot())   # [] when every check holds

Each check is `check_<name>(snapshot) -> list[Violation]`; `CHECKS` lists them in spec order.

The checker sits above the core: it imports the vocabulary it reads (`hicache.core.pages`:
`Pages`, `pages()`, FREE / PRIVATE / TREE; `hicache.core.snapshot`: `Snapshot` and its records)
and the core never imports a check. Code outside this package uses only the entry points
below (`tests/test_layering.py` enforces it); the individual `check_<name>` functions and
their helpers are the checker's own business (and its tests').

    entry point        module                        what for
    -----------------  ----------------------------  --------------------------------------
    InvariantChecker   hicache.invariants.checker    the control plane runs the checks
    CheckMode          hicache.invariants.checker    a parsed `check_mode` setting
    parse_check_mode   hicache.invariants.checker    validates `check_mode` (configs)
    check_all          hicache.invariants.registry   every violation in a snapshot (library)
    CHECKS, Check      hicache.invariants.registry   the list the CLI, spec check, bench show
    get_check          hicache.invariants.registry   one check by id or name (`--only I2`)
    Violation          hicache.invariants.violation  one failed check (library, reports)
    group_view         hicache.invariants.groups     a pool group table's view (GroupView)
    check_ranks        hicache.invariants.ranks      I7, I8, I10, I11 over every rank's view
    RANK_CHECKS        hicache.invariants.ranks      the cross-rank checks (spec check, reports)
    check_group_*,     hicache.invariants.groups     I6 per pool of a group, and a failed
    check_reserve_*                                  reserve_group's rollback (not registered:
                                                     they read a GroupTable caller's records;
                                                     a plane's group is I9, registered)
"""

from __future__ import annotations

from hicache.invariants.alignment import check_page_aligned
from hicache.invariants.atomic import check_group_atomic
from hicache.invariants.bytes import check_tier_bytes_equal
from hicache.invariants.checker import CheckMode, InvariantChecker, parse_check_mode
from hicache.invariants.groups import (
    GroupView,
    check_group_conservation,
    check_reserve_rolled_back,
    group_view,
)
from hicache.invariants.ordering import check_publish_order
from hicache.invariants.ownership import (
    check_inflight_source_pinned,
    check_ownership_disjoint,
    check_page_conservation,
)
from hicache.invariants.ranks import RANK_CHECKS, RankCheck, check_ranks
from hicache.invariants.registry import CHECKS, Check, check_all, get_check
from hicache.invariants.structure import (
    check_lock_accounting,
    check_locks_non_negative,
    check_no_dead_node,
    check_no_double_reference,
    check_parent_child_links,
    check_tier_ancestor_closed,
    check_tier_size_accounting,
)
from hicache.invariants.violation import Violation

ENTRY_POINTS = frozenset(
    {
        "InvariantChecker",
        "CheckMode",
        "parse_check_mode",
        "check_all",
        "CHECKS",
        "Check",
        "get_check",
        "Violation",
        "GroupView",
        "group_view",
        "check_group_conservation",
        "check_reserve_rolled_back",
        "check_ranks",
        "RANK_CHECKS",
        "RankCheck",
    }
)
"""The names code outside `hicache.invariants` may import from it (see the table above)."""

__all__ = [
    "CHECKS",
    "ENTRY_POINTS",
    "RANK_CHECKS",
    "Check",
    "CheckMode",
    "GroupView",
    "InvariantChecker",
    "RankCheck",
    "Violation",
    "check_all",
    "check_group_atomic",
    "check_group_conservation",
    "check_inflight_source_pinned",
    "check_lock_accounting",
    "check_locks_non_negative",
    "check_no_dead_node",
    "check_no_double_reference",
    "check_ownership_disjoint",
    "check_page_aligned",
    "check_page_conservation",
    "check_parent_child_links",
    "check_publish_order",
    "check_ranks",
    "check_reserve_rolled_back",
    "check_tier_ancestor_closed",
    "check_tier_bytes_equal",
    "check_tier_size_accounting",
    "get_check",
    "group_view",
    "parse_check_mode",
]
