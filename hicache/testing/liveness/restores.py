"""Efficiency of restores: an available restore is chosen and served, and every fallback has
a reason the spec allows in that state.

At each admission the probe works out, from the match and the tree as `begin_request` left
them, the deepest plan spec/restore.md allows ("Stages of a restore": a shared part, an L2
part, an L3 part, each a run of the path past the L1 hit) and the hits the policy is offered
(spec/policies.md: the L2 and L3 hits cut where that plan stops, the L3 hit also before the
first copy a read found bad, none with L3 offline). Then:

    when          finding             what was wrong
    ------------  ------------------  -------------------------------------------------------
    admit         restore skipped     under `always`, the choice is shallower than the deepest
                                      candidate offered; `restore choice`: deeper (under
                                      `never`, not recompute)
    prefill       restore short       a restore was chosen, yet the request is served less than
                                      its plan's end (`hit_tokens` L2 + L3 it gained), with no
                                      fallback counted for it (a part of its own dropped, or
                                      its admission backed off), no `cancel_restore`, no window
                                      freed since it was admitted: another request's fallback
                                      excuses nothing (a waiter whose shared load-back failed
                                      loads the nodes itself, spec/restore.md)
    any call      fallback reason     a fallback counted that the state does not allow:
                                      `load_back_pending` without back_off, `prefetch_clamped`
                                      without a pool group, `l3_offline` with L3 online,
                                      `dropped` or `restore_gap` with no L3 restore live, any
                                      with no restore live; `restore_gap` for an L3 part whose
                                      chain's parent holds L1 (seen as the part is dropped)

Only the `always` and `never` policies name one choice for given hits (`cost` prices them,
and the machine draws only those two).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hicache.choices import LoadBackOverlap, RestorePolicy
from hicache.core.lifecycle import ABSENT, RESIDENT
from hicache.core.tiers import Direction, Tier
from hicache.core.trace import TraceEvent
from hicache.core.tree import MatchResult
from hicache.pools.presets import SINGLE_POOL
from hicache.testing.liveness.quarantine import Quarantine

RESTORES = ("L2", "L3")
DEPTH = {"recompute": 0, "L2": 1, "L3": 2}
H2D_PENDING = f"{Direction.H2D.value}_PENDING"


@dataclass(frozen=True)
class Expected:
    """The spec's choice for one admission, the L1 hit, and the end its plan reaches."""

    choice: str
    l1: int
    end: int


@dataclass(frozen=True)
class Before:
    """What a call starts from: the fallbacks counted, the restores live and their choices."""

    fallbacks: dict[str, int]
    live: dict[int, str]
    restored: int  # hit tokens credited to L2 and L3 so far


class RestoreProbe:
    """Judges one controller's restores (module docstring)."""

    def __init__(self, ctl: Any, setup: Any, quarantine: Quarantine, findings: list[str]) -> None:
        self.ctl = ctl
        self.policy = setup.policy
        self.share = setup.load_back_overlap is LoadBackOverlap.SHARE
        self.group = setup.pools != SINGLE_POOL
        self.quarantine = quarantine
        self.findings = findings
        self.expected: dict[int, Expected] = {}
        self.since: dict[int, int] = {}  # request -> windows freed when it was admitted
        self.own: dict[int, int] = {}  # request -> fallbacks counted for it since admitted
        self.cancelled: set[int] = set()
        self.windows_freed = 0  # `tombstone` events so far
        self._begin: Callable[..., MatchResult] = ctl.cp.begin_request
        ctl.cp.begin_request = self.begin_request  # sees each match before the decision
        ctl.stager.on_drop.append(self.dropped)  # sees each part dropped, as it goes

    def dropped(self, mat: Any, part: list[Any], reason: str) -> None:
        """`restore_gap` ends an L3 part whose chain's parent did not reach L1 (its L2 part
        failed or was never issued; spec/restore.md): a gap under a parent L1 holds drops a
        part that could have landed."""
        self.own[mat.request_id] = self.own.get(mat.request_id, 0) + 1
        parent = part[0].parent if part else None
        if reason == "restore_gap" and parent is not None and self.ctl.cp.holds(parent, Tier.L1):
            self.findings.append(
                f"fallback reason: restore_gap for request {mat.request_id}, but its L3 part's "
                f"parent (node {parent.node_id}) holds L1 (spec/restore.md: a gap is an L3 "
                "part whose chain's parent did not reach L1)"
            )

    def begin_request(self, request_id: int, tokens: Any, *args: Any, **kwargs: Any) -> MatchResult:
        m = self._begin(request_id, tokens, *args, **kwargs)
        self.expected[request_id] = self._expect(m)
        return m

    def event(self, e: TraceEvent) -> None:
        if e.event == "tombstone":
            self.windows_freed += 1

    # -- the spec's plan ----------------------------------------------------------------------

    def _expect(self, m: MatchResult) -> Expected:
        l1, l2, _ = m.lengths
        reach = self._reach(m)
        l2_cut = min(l2, reach)
        l3_cut = min(max(l2, self._servable(m)), reach)
        choice = "recompute"
        if self.policy is RestorePolicy.ALWAYS and l3_cut > max(l1, l2_cut):
            choice = "L3"
        elif self.policy is RestorePolicy.ALWAYS and l2_cut > l1:
            choice = "L2"
        end = {"L3": l3_cut, "L2": l2_cut}.get(choice, l1)
        return Expected(choice, l1, end)

    def _reach(self, m: MatchResult) -> int:
        """Where the deepest plan ends: past the L1 hit, nodes another request loads into L1
        (the shared part), then nodes L2 holds and L1 lacks (the L2 part), then nodes only L3
        holds, each a copy L3 may serve (the L3 part); parts in that order."""
        l1, end, part = m.lengths[0], 0, 0
        reached = l1
        for node in m.path:
            start, end = end, end + len(node.key)
            if start < l1:
                continue
            s1, s2, s3 = node.state
            if s1 == H2D_PENDING and part == 0:
                now = 0
            elif s1 == ABSENT and s2 == RESIDENT and part <= 1:
                now = 1
            elif s1 == s2 == ABSENT and s3 == RESIDENT and self._l3_serves(node):
                now = 2
            else:
                break
            part, reached = now, end
        return reached

    def _servable(self, m: MatchResult) -> int:
        """The L3 run of the path from the root, cut before the first bad copy."""
        tokens = 0
        for node in m.path:
            if node.state[2] != RESIDENT or not self._l3_serves(node):
                break
            tokens += len(node.key)
        return min(tokens, m.lengths[2])

    def _l3_serves(self, node: Any) -> bool:
        return bool(self.ctl.l3_online) and not self.quarantine.quarantined(node)

    # -- around each call ---------------------------------------------------------------------

    def before(self) -> Before:
        metrics = self.ctl.metrics
        live = {rid: mat.decision.choice for rid, mat in self.ctl.restores.items()}
        return Before(dict(metrics.fallbacks), live, _restored(metrics))

    def after(self, call: str, request_id: int | None, before: Before) -> None:
        metrics = self.ctl.metrics
        if call == "submit" and request_id is not None:
            backed_off = metrics.fallbacks["load_back_pending"] - before.fallbacks.get(
                "load_back_pending", 0
            )
            self._admitted(request_id, backed_off)
        elif call == "prefill" and request_id is not None:
            self._served(request_id, _restored(metrics) - before.restored)
        elif call == "cancel_restore" and request_id is not None:
            self.cancelled.add(request_id)
        elif call == "finish" and request_id is not None:
            self.expected.pop(request_id, None)
            self.since.pop(request_id, None)
            self.own.pop(request_id, None)
            self.cancelled.discard(request_id)
        grown = {r: n - before.fallbacks.get(r, 0) for r, n in metrics.fallbacks.items()}
        live = {**before.live, **{r: m.decision.choice for r, m in self.ctl.restores.items()}}
        for reason in (r for r, n in grown.items() if n > 0):
            why = self._disallowed(reason, set(live.values()))
            if why:
                self.findings.append(f"fallback reason: {grown[reason]} x {reason} {why}")

    def _admitted(self, request_id: int, backed_off: int) -> None:
        """`backed_off`: `load_back_pending` counted by this admission (its own fallback)."""
        mat = self.ctl.restores.get(request_id)
        want = self.expected.get(request_id)
        self.since[request_id] = self.windows_freed
        self.own[request_id] = self.own.get(request_id, 0) + backed_off  # and drops in it
        if mat is None or want is None or self.policy not in ("always", "never"):
            return
        chose = mat.decision.choice
        if chose != want.choice:
            # Skipped: a shallower choice than the plan offers; else a choice no plan makes.
            what = "skipped" if DEPTH[chose] < DEPTH[want.choice] else "choice"
            self.findings.append(
                f"restore {what}: request {request_id} under policy {self.policy} chose "
                f"{chose} over hits {list(mat.match.lengths)}, but the spec's plan offers "
                f"{want.choice} (to token {want.end}; spec/policies.md, restore policies)"
            )
            del self.expected[request_id]  # judged: what it serves is not judged again

    def _served(self, request_id: int, gained: int) -> None:
        """A prefill that succeeded, crediting `gained` L2 and L3 hit tokens: the restore
        served its L1 hit plus those, against its plan's end."""
        want, since = self.expected.pop(request_id, None), self.since.get(request_id)
        if want is None or since is None or want.choice not in RESTORES:
            return
        served = want.l1 + gained
        excused = (
            self.own.get(request_id, 0) > 0
            or request_id in self.cancelled
            or self.windows_freed != since
        )
        if served < want.end and not excused:
            self.findings.append(
                f"restore short: request {request_id} chose {want.choice} to token {want.end} "
                f"but was served from the cache to token {served}, with no fallback counted for "
                "it, no cancel_restore and no window freed (spec/restore.md: every planned page "
                "lands and is served, or its part's fallback is counted)"
            )

    def _disallowed(self, reason: str, choices: set[str]) -> str:
        """Why `reason` is not a fallback the state allows ("" when it is)."""
        if not choices & set(RESTORES):
            return "with no restore live (spec/restore.md: a fallback is a planned part's)"
        if reason == "load_back_pending" and self.share:
            return "though load_back_overlap is share (a load-back is shared, not backed off)"
        if reason == "prefetch_clamped" and not self.group:
            return "without a pool group (only a group's S2H stops part way, pools.md F11)"
        if reason == "l3_offline" and self.ctl.l3_online:
            return "while L3 is online"
        if reason in ("dropped", "restore_gap") and "L3" not in choices:
            return "with no L3 restore live (both end an L3 part)"
        return ""


def _restored(metrics: Any) -> int:
    """Prompt tokens served from L2 and L3 so far (`prefill` credits a restore's)."""
    return int(metrics.hit_tokens["L2"] + metrics.hit_tokens["L3"])
