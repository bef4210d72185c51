"""The control-plane rules of lifecycle.toml (`[[rule]]`) are enforced by the reference.

A rule is a precondition of a public operation that is not a residency transition (so it is
no row's guard). Each rule has one probe here: a call that breaks exactly that rule on a
fresh control plane. `check_rules` fails when a rule has no probe, when a probe names no
rule, or when the reference accepts a probe instead of raising a typed error (and changing
nothing it could be asked about: the probe's plane is thrown away).
"""

from __future__ import annotations

from collections.abc import Callable

from hicache.core.lifecycle import Lifecycle
from hicache.errors import HiCacheError


def _match_short_of_last_token() -> str | None:
    from hicache.core.control import ControlPlane  # the control plane imports the tables: late

    cp = ControlPlane(1, (4, 4, 4), check_mode="off")
    try:
        cp.begin_request(1, [7, 8], match_len=2)
    except HiCacheError:
        return None if not cp.requests else "begin_request raised but left the request live"
    return "begin_request accepted match_len = len(tokens)"


def _ack_matches_pending_id() -> str | None:
    """A stale ack: op 1 backs a node up and is cancelled, op 2 backs it up again; ending op 1
    again (or applying `d2h_complete` to the node in op 1's name) must be refused."""
    from hicache.core.control import ControlPlane
    from hicache.core.tiers import Direction

    cp = ControlPlane(1, (4, 4, 4), check_mode="off")
    cp.begin_request(1, [7, 8])
    cp.compute(1, 1)
    cp.insert(1)
    cp.end_request(1)
    node = cp.tree.match([7]).path[-1]
    stale = cp.issue(Direction.D2H, [node])
    cp.cancel(stale.op_id)
    live = cp.issue(Direction.D2H, [node])
    for ack in (
        lambda: cp.complete(stale.op_id),
        lambda: cp.apply("d2h_complete", [node], live.target_pages, op_id=stale.op_id),
    ):
        try:
            ack()
        except HiCacheError:
            continue
        return f"a stale ack for op {stale.op_id} was accepted while op {live.op_id} fills the node"
    if live.op_id not in cp.ops or node.pending[1] != live.op_id:
        return "a refused stale ack changed the live op's pending id"
    return None


def _partial_end_s2h_only() -> str | None:
    """A D2H over a chain of two nodes (one prompt, split by a second request's match)
    ended part way: complete on the first node, fail on the second. It must be refused,
    the op still pending over both nodes and no lock moved."""
    from hicache.core.control import ControlPlane
    from hicache.core.tiers import Direction

    cp = ControlPlane(1, (4, 4, 4), check_mode="off")
    cp.begin_request(1, [7, 8, 9])
    cp.compute(1, 3)
    cp.insert(1)
    cp.end_request(1)
    cp.begin_request(2, [7, 5])  # matches [7]: the node of [7, 8] is split at 1
    cp.end_request(2)
    chain = list(cp.tree.match([7, 8]).path)
    op = cp.issue(Direction.D2H, chain)
    locks = [n.lock[0] for n in chain]
    try:
        cp.complete_part(op.op_id, 1)
    except HiCacheError:
        if op.op_id not in cp.ops or [n.lock[0] for n in chain] != locks:
            return "a refused partial end changed the op or its source locks"
        return None
    return f"a D2H over {len(chain)} nodes ended part way (complete on 1, fail on the rest)"


PROBES: dict[str, Callable[[], str | None]] = {
    "match_short_of_last_token": _match_short_of_last_token,
    "ack_matches_pending_id": _ack_matches_pending_id,
    "partial_end_s2h_only": _partial_end_s2h_only,
}
"""Rule name -> a probe returning why the rule is not enforced (None: it is)."""


def check_rules(lc: Lifecycle) -> list[str]:
    """One problem per rule without a probe, probe without a rule, or rule not enforced."""
    problems: list[str] = []
    names = [r.name for r in lc.rules]
    for name in names:
        probe = PROBES.get(name)
        if probe is None:
            problems.append(
                f"lifecycle.toml: rule {name} has no probe in hicache/oracle/speccheck/rules.py"
            )
            continue
        why = probe()
        if why is not None:
            problems.append(f"rule {name} is not enforced by the reference: {why}")
    for name in sorted(set(PROBES) - set(names)):
        problems.append(
            f"hicache/oracle/speccheck/rules.py: probe {name} names no [[rule]] of lifecycle.toml"
        )
    return problems
