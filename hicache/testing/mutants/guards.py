"""Mutants of the control plane's guards and refusals: a second line of defence broken.

The controller never asks its control plane for what the spec refuses, so none of these
changes what a legal run does; each is caught only when a caller makes the illegal call
(the fuzz machine's `illegal_calls`, hicache/testing/illegal/). Three ways a refusal breaks:
a guard read on the wrong node, a rule that stops refusing, a refusal that changes state
before it raises.

Registered in `hicache.testing.mutants` (its table names each one); `ZOO` lists this
module's mutants in the order `hicache fuzz --mutant list` prints them.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

from hicache.testing.mutants.base import Mutant, swapped


def _guard_on_one_node(which: int) -> contextlib.AbstractContextManager[None]:
    """The executor checks a row's source sub-state and guards on one node of a chain only
    (`which`: its index, 0 the first, -1 the last) and takes the others' triples to follow
    ("a chain's nodes move together")."""
    from hicache.core.execute import Executor
    from hicache.core.tiers import TIERS

    original = Executor.__dict__["plan"]

    class OneNode:
        """The lifecycle, except that `check` passes every segment but `checked` unchecked."""

        def __init__(self, lifecycle: Any, checked: Any) -> None:
            self.lifecycle, self.checked = lifecycle, checked

        def check(self, name: str, states: Any, locks: Any = (0, 0, 0), ctx: Any = None) -> Any:
            if ctx is None or ctx.seg is self.checked:
                return self.lifecycle.check(name, states, locks, ctx)
            row = self.lifecycle.transitions[name]
            after = list(states)
            after[TIERS.index(row.tier)] = row.dest
            return tuple(after)

        def __getattr__(self, attr: str) -> Any:
            return getattr(self.lifecycle, attr)

    def plan(self: Any, name: str, segments: Any, **kwargs: Any) -> Any:
        if len(segments) < 2:
            return original(self, name, segments, **kwargs)
        lifecycle = self.lifecycle
        self.lifecycle = OneNode(lifecycle, segments[which])
        try:
            return original(self, name, segments, **kwargs)
        finally:
            self.lifecycle = lifecycle

    return swapped(Executor, "plan", plan)


def _guard_chain_head() -> contextlib.AbstractContextManager[None]:
    """A row checked on a chain's first node only: a chain whose head may be issued and whose
    last node may not (its source gone or pending) is issued over both."""
    return _guard_on_one_node(0)


def _guard_chain_tail() -> contextlib.AbstractContextManager[None]:
    """A row checked on a chain's last node only, the one the op's lock lands on: a chain
    whose head may not be issued (its parent lacks the target, its source is gone) and whose
    nodes below it may is issued over all of them."""
    return _guard_on_one_node(-1)


def _parent_guard_grandparent() -> contextlib.AbstractContextManager[None]:
    """The issue guard `parent(<target>) == RESIDENT` reads the node's grandparent: a node
    whose parent lacks the target tier is issued when the tier above the parent holds it
    (or the parent hangs off the root), leaving a gap in the target tier (S6)."""
    from hicache.core import execute
    from hicache.core.lifecycle import RESIDENT
    from hicache.core.tiers import TIERS

    def parent_resident(self: Any, tier: Any) -> bool:
        node = self.seg.node
        parent = None if node is None or node.parent is None else node.parent.parent
        return (
            parent is None
            or parent.is_root
            or parent.state[TIERS.index(tier)] == RESIDENT
            or any(parent is n for n in self.step_nodes)
        )

    return swapped(execute._Context, "parent_resident", parent_resident)


def _chain_deepest_first() -> contextlib.AbstractContextManager[None]:
    """`issue` checks that neighbours in a chain are parent and child in either order, so a
    chain listed deepest first -- as a walk up from a leaf collects it (SGLang's backup
    walks) -- is issued unreversed: the op's one source lock lands on its shallowest node,
    its deepest node stays unlocked while the transfer reads it, and its pages are cut
    against the wrong token ranges."""
    from hicache.core import control

    def pairwise(nodes: Any) -> list[tuple[Any, Any]]:
        return [(a, b) if b.parent is a else (b, a) for a, b in itertools.pairwise(nodes)]

    return swapped(control, "pairwise", pairwise)


def _advance_locks_first() -> contextlib.AbstractContextManager[None]:
    """`advance_cached_len` takes the request's L1 lock on the new prefix before it verifies
    the node (published, on the request's prefix, no private pages, a whole window), and a
    refusal raises with the lock still held: a refused call leaks a lock nothing releases."""
    from hicache.core.control import ControlPlane
    from hicache.core.lifecycle import RESIDENT
    from hicache.core.tiers import Tier
    from hicache.errors import IllegalTransition

    def advance_cached_len(self: Any, request_id: int, node: Any) -> int:
        req = self._request(request_id)
        self._verify_live([node], "cached_len", Tier.L1)
        self.tree.lock(node, 0)  # the bug: before the checks, and kept when one refuses
        path = self.tree.path_to_root(node)
        bad = [n.node_id for n in path if n.state[0] != RESIDENT]
        if bad:
            raise IllegalTransition("cached_len", "L1", "-", f"nodes {bad} are not in L1")
        if req.locked not in path and not req.locked.is_root:
            raise IllegalTransition("cached_len", "L1", "-", "off the request's locked prefix")
        if req.private_pages.size:
            raise IllegalTransition("cached_len", "L1", "L1_PRIVATE", "private pages held")
        if self.windows.clip(path[::-1]) * self.page_size != self.tree.prefix_tokens(node):
            raise IllegalTransition("cached_len", "L1", "-", "a freed window before it")
        if not req.locked.is_root:
            self.tree.unlock(req.locked, 0)
        req.locked = node
        req.published_len = req.cached_len = self.tree.prefix_tokens(node)
        if self.tracer.enabled:
            self.tracer.emit(
                "cached_len", request=request_id, node=node.node_id, token_end=req.cached_len
            )
        self._check(f"cached_len {request_id}")
        return int(req.cached_len)

    return swapped(ControlPlane, "advance_cached_len", advance_cached_len)


def _tombstone_locked() -> contextlib.AbstractContextManager[None]:
    """`tombstone` no longer refuses a node locked in L1: the window of a prefix a request
    is being served from (or a backup is reading) is freed under it."""
    from hicache.core.control import ControlPlane
    from hicache.core.lifecycle import RESIDENT
    from hicache.core.tiers import Tier
    from hicache.errors import IllegalTransition

    def tombstone(self: Any, node: Any) -> Any:
        self._verify_live([node], "tombstone", Tier.L1)
        value = node.value[0]
        if not self.windows.tombstones or node.state[0] != RESIDENT or value is None:
            raise IllegalTransition("tombstone", "L1", node.state[0], "no window to free")
        if self.windows.freed(node):  # the lock check that stood here is gone
            raise IllegalTransition("tombstone", "L1", node.state[0], "already freed")
        self.windows.table.tombstone(value)
        if self.tracer.enabled:
            self.tracer.emit(
                "tombstone", tier="L1", node=node.node_id, pages=tuple(int(p) for p in value)
            )
        self._check(f"tombstone node {node.node_id}")
        return value

    return swapped(ControlPlane, "tombstone", tombstone)


ZOO: tuple[Mutant, ...] = (
    Mutant(
        "guard-chain-head",
        "-",
        "Executor.plan",
        "a row's state and guards checked on a chain's first node only",
        _guard_chain_head,
    ),
    Mutant(
        "guard-chain-tail",
        "-",
        "Executor.plan",
        "a row's state and guards checked on a chain's last node only",
        _guard_chain_tail,
    ),
    Mutant(
        "parent-guard-grandparent",
        "-",
        "execute._Context.parent_resident",
        "the issue guard parent(T) == RESIDENT reads the node's grandparent",
        _parent_guard_grandparent,
    ),
    Mutant(
        "chain-deepest-first",
        "-",
        "control.pairwise (issue)",
        "issue accepts a chain listed deepest first and issues it unreversed",
        _chain_deepest_first,
    ),
    Mutant(
        "advance-locks-first",
        "-",
        "ControlPlane.advance_cached_len",
        "the new prefix is locked before it is verified; a refusal leaks the lock",
        _advance_locks_first,
    ),
    Mutant(
        "tombstone-locked",
        "-",
        "ControlPlane.tombstone",
        "a window locked in L1 (served, or read by a backup) is freed",
        _tombstone_locked,
    ),
)
