"""The six ownership invariants and the structural checks, as pure predicates over a
`Snapshot` (spec/invariants.md). Imported as `hicache.invariants` (a symlink).

    from hicache.invariants import check_all, InvariantChecker
    violations = check_all(control_plane.snapshot())   # [] when every check holds

Each check is `check_<name>(snapshot) -> list[Violation]`; `CHECKS` lists them in spec order.
"""

from __future__ import annotations

from hicache.invariants.alignment import check_page_aligned
from hicache.invariants.bytes import check_tier_bytes_equal
from hicache.invariants.checker import CheckMode, InvariantChecker, parse_check_mode
from hicache.invariants.ordering import check_publish_order
from hicache.invariants.ownership import (
    check_inflight_source_pinned, check_ownership_disjoint, check_page_conservation,
)
from hicache.invariants.registry import CHECKS, Check, check_all, get_check
from hicache.invariants.snapshot import (
    FREE, PRIVATE, TREE, NodeView, OpView, Pages, RequestView, Snapshot, TierView, pages,
)
from hicache.invariants.structure import (
    check_locks_non_negative, check_no_dead_node, check_no_double_reference,
    check_parent_child_links, check_tier_ancestor_closed, check_tier_size_accounting,
)
from hicache.invariants.violation import Violation

__all__ = [
    "CHECKS", "Check", "CheckMode", "FREE", "InvariantChecker", "NodeView", "OpView", "PRIVATE",
    "Pages", "RequestView", "Snapshot", "TREE", "TierView", "Violation", "check_all",
    "check_inflight_source_pinned", "check_locks_non_negative", "check_no_dead_node",
    "check_no_double_reference", "check_ownership_disjoint", "check_page_aligned",
    "check_page_conservation", "check_parent_child_links", "check_publish_order",
    "check_tier_ancestor_closed", "check_tier_bytes_equal", "check_tier_size_accounting",
    "get_check", "pages", "parse_check_mode",
]
