"""The liveness probes of the controller adapter (hicache/testing/liveness): each property
names what a broken controller does -- one of the zoo's liveness mutants, or a bug planted
here -- and says nothing about the same script on the reference.

Every scenario runs on the null plane (no torch), driven through the adapter as the fuzz
machine drives it; `findings(...)` are the adapter's `check()` lines the probes added."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from hicache.controller.metrics import Metrics
from hicache.dataplane.handles import TransferStatus
from hicache.testing.adapters.controller import ControllerAdapter, Setup
from hicache.testing.mutants import activate
from hicache.testing.protocol import FaultSchedule

ALL = 10_000  # pages an `evict` asks for to give up all a tier can
P = tuple(range(100, 112))  # 3 pages
Q = tuple(range(200, 208))  # 2 pages


def adapter(**kw: Any) -> ControllerAdapter:
    base = {"l1_pages": 12, "l2_pages": 12, "l3_slots": 12, "policy": "always"}
    return ControllerAdapter(Setup(**{**base, **kw}))


def serve(a: ControllerAdapter, rid: int, tokens: tuple[int, ...], end: bool = True) -> None:
    """Admit, let the restore settle, prefill, and (`end`) finish."""
    a.submit(rid, tokens)
    while not a.ready(rid):
        a.drain()
    assert a.prefill(rid)
    if end:
        a.finish(rid)


def findings(a: ControllerAdapter, name: str) -> list[str]:
    """The probes' findings named `name` ("backup undelivered", ...)."""
    return [f for f in a.findings if f.startswith(name)]


@contextlib.contextmanager
def maybe(mutant: str | None) -> Iterator[None]:
    if mutant is None:
        yield
        return
    with activate(mutant):
        yield


def given_up(a: ControllerAdapter, tiers: tuple[str, ...], *prompts: tuple[int, ...]) -> None:
    """`prompts` served in turn (requests 1, 2, ...), every backup drained, then `tiers`
    gave up all they could: the prompts' whole pages are held by the tiers below."""
    for rid, tokens in enumerate(prompts, 1):
        serve(a, rid, tokens)
    a.drain()
    for tier in tiers:
        a.evict(tier, ALL)


def restore_fails(a: ControllerAdapter, tokens: tuple[int, ...], kind: str) -> None:
    """Admit `tokens` (request 99): its restore's one transfer fails as `kind`, observed."""
    a.submit(99, tokens)
    (op,) = a.pending_ops()
    a.fail(op, kind)
    a.tick()


@pytest.mark.parametrize("mutant", [None, "LV-l3-head-only"])
def test_a_node_a_d2h_backed_up_is_in_l3_after_a_drain(mutant: str | None) -> None:
    """Request 1 inserts P; request 2's match splits it (U, then X) before the backup runs,
    so one D2H backs up the chain [U, X]: after a drain both are in L3 (L3 follows L2). The
    mutant wants U alone in L3: X is `backup undelivered`."""
    with maybe(mutant):
        a = adapter(write_policy="write_through")
        serve(a, 1, P + (1,))
        a.submit(2, P[:8] + (2,))
        a.drain()
        got = findings(a, "backup undelivered")
        a.close()
    assert bool(got) == (mutant is not None), got
    assert all("owed L3" in f for f in got)


@pytest.mark.parametrize("mutant", [None, "LV-lru-unsorted"])
def test_each_eviction_takes_the_least_recently_used_leaf(mutant: str | None) -> None:
    """P, then Q, are leaves of L1; P is matched again, so Q is the least recently used:
    `evict(L1, 1)` takes Q. The mutant takes the leaf that became one first (P)."""
    with maybe(mutant):
        a = adapter(write_policy="write_through")
        serve(a, 1, P + (1,))
        serve(a, 2, Q + (1,))
        a.drain()
        a.submit(3, P + (3,))
        a.finish(3)
        a.evict("L1", 1)
        got = findings(a, "eviction order")
        a.close()
    assert bool(got) == (mutant is not None), got


@pytest.mark.parametrize("mutant", [None, "LV-writeback-parent"])
def test_a_write_back_victim_is_backed_up_or_its_loss_counted(mutant: str | None) -> None:
    """Under write_back, P and its child P+Q are in L1 alone; evicting L1 backs each victim
    up first. The mutant backs up the child's parent instead: the child leaves L1 without
    a copy and without `host_pressure` counted (`unbacked eviction`)."""
    with maybe(mutant):
        a = adapter(write_policy="write_back")
        serve(a, 1, P + (1,))
        serve(a, 2, P + Q + (1,))
        a.evict("L1", ALL)
        got = findings(a, "unbacked eviction")
        a.close()
    assert bool(got) == (mutant is not None), got


@pytest.mark.parametrize("mutant", [None, "LV-quarantine-forgets"])
def test_a_bad_l3_copy_is_gone_after_the_tick_that_found_it(mutant: str | None) -> None:
    """P is in L3 alone; its restore's S2H fails its checksum. No reader is left once the
    part is dropped, so the tick that observes the failure drops the copy. The mutant
    forgets the quarantine and keeps the copy (`quarantine kept`)."""
    with maybe(mutant):
        a = adapter(write_policy="write_through")
        given_up(a, ("L1", "L2"), P + (1,))
        restore_fails(a, P + (2,), "corrupt")
        got = findings(a, "quarantine kept")
        a.close()
    assert bool(got) == (mutant is not None), got


@pytest.mark.parametrize("mutant", [None, "LV-l3-hit-min"])
def test_a_prompt_only_l3_holds_is_restored_under_always(mutant: str | None) -> None:
    """P is in L3 alone: under `always` the restore from L3 is chosen. The mutant offers an
    L3 hit cut at the L2 hit (0): recompute (`restore skipped`)."""
    with maybe(mutant):
        a = adapter(write_policy="write_through")
        given_up(a, ("L1", "L2"), P + (1,))
        serve(a, 2, P + (2,))
        got = findings(a, "restore skipped")
        a.close()
    assert bool(got) == (mutant is not None), got


def test_a_restore_served_short_of_its_plan_with_nothing_counted_is_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A planted bug: the plan leaves out its last node (so the request recomputes it, no
    fallback counted). P was split in two nodes, both in L2 alone: the L2 restore chosen
    reaches token 12 and serves 8 (`restore short`)."""
    import hicache.controller.controller as controller
    from hicache.controller.materialize import Plan, plan_parts

    a = adapter(write_policy="write_through")
    given_up(a, ("L1",), P + (1,), P[:8] + (2,))

    def short(*args: Any, **kwargs: Any) -> Plan:
        plan = plan_parts(*args, **kwargs)
        return Plan(plan.shared, plan.l2_part[:-1], plan.l3_part)

    monkeypatch.setattr(controller, "plan_parts", short)
    serve(a, 3, P + (3,))
    got = findings(a, "restore short")
    a.close()
    assert got and "to token 12" in got[0] and "to token 8" in got[0], a.findings


@pytest.mark.parametrize("planted", [False, True])
def test_a_waiter_whose_shared_load_back_failed_loads_it_itself(
    planted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Request 3 shares request 2's load-back of P, which fails: the waiter takes the nodes
    into its own L2 part and loads them (spec/restore.md, no fallback of its own). A planted
    bug: the resume forgets the shared part, so request 3 recomputes P. Request 2's counted
    failure excused that before (`restore short` read any request's fallback)."""
    from hicache.controller.restore import RestoreStager

    if planted:
        resume = RestoreStager._resume

        def forgets(self: RestoreStager, mat: Any, issue: Any) -> None:
            mat.shared, mat.l2_part = [], []
            resume(self, mat, issue)

        monkeypatch.setattr(RestoreStager, "_resume", forgets)
    a = adapter(write_policy="write_through")
    given_up(a, ("L1",), P + (1,))
    a.submit(2, P + (2,))
    (op,) = a.pending_ops()
    a.submit(3, P + (3,))  # shares op: nothing of its own in flight
    assert a.pending_ops() == [op]
    a.fail(op, "error")
    a.tick()
    a.finish(2)
    l2_hits = a.ctl.metrics.hit_tokens["L2"]
    for _ in range(8):
        if a.ready(3):
            break
        a.drain()
    assert a.ready(3) and a.prefill(3)
    got = findings(a, "restore short")
    loaded = a.ctl.metrics.hit_tokens["L2"] - l2_hits
    a.close()
    assert bool(got) == planted, got
    assert loaded == (0 if planted else 12)


def test_a_fallback_whose_reason_the_state_does_not_allow_is_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A planted bug: a failed load-back is counted as `prefetch_clamped`, a reason only a
    pool group's stopped S2H has; the same failure counted as `transfer_failed` is fine."""
    from hicache.controller.restore import RestoreStager

    original = RestoreStager._drop_part
    for reason, found in ((None, False), ("prefetch_clamped", True)):

        def drop(self: Any, mat: Any, part: Any, why: str, reason: str | None = reason) -> None:
            original(self, mat, part, reason or why)

        monkeypatch.setattr(RestoreStager, "_drop_part", drop)
        a = adapter(write_policy="write_through")
        given_up(a, ("L1",), P + (1,))
        restore_fails(a, P + (2,), "error")
        got = findings(a, "fallback reason")
        a.close()
        assert bool(got) == found, (reason, got)


@pytest.mark.parametrize("planted", [False, True])
def test_an_inserted_node_is_in_l2_after_a_drain_under_write_through(
    planted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under write_through an insert owes L2 its node (spec/policies.md, What a drain
    guarantees). A planted bug: the planner forgets the insert's wish, so the node never
    reaches L2 and no drop is counted (`backup undelivered`, owed L2)."""
    from hicache.controller.backup import BackupPlanner

    if planted:
        monkeypatch.setattr(BackupPlanner, "after_insert", lambda self, node: None)
    a = adapter(write_policy="write_through")
    serve(a, 1, P + (1,))
    a.drain()
    got = findings(a, "backup undelivered")
    a.close()
    assert bool(got) == planted, got
    assert all("owed L2" in f for f in got)


@pytest.mark.parametrize("planted", [None, "forgets", "third", "uncounted"])
def test_the_second_match_of_a_node_owes_l2_under_write_through_selective(
    planted: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under write_through_selective the L1 handle of an admission is owed L2 once its
    `hits` is 2 (spec/policies.md, the worked example: the third request to use the
    prefix). Planted bugs: the planner forgets the wish, or wants it only from the third
    match (`backup undelivered`, owed L2); the tree stops counting matches (`hits count`)."""
    from hicache.controller.backup import BackupPlanner
    from hicache.core.tree import HiRadixTree

    if planted == "forgets":
        monkeypatch.setattr(BackupPlanner, "after_match", lambda self, node: None)
    elif planted == "third":
        want = BackupPlanner.after_match

        def third(self: BackupPlanner, node: Any) -> None:
            if self.cp.hits(node) >= 3:
                want(self, node)

        monkeypatch.setattr(BackupPlanner, "after_match", third)
    elif planted == "uncounted":
        touch = HiRadixTree.touch_match

        def uncounted(self: HiRadixTree, m: Any) -> None:
            hits = [n.hits for n in m.path]
            touch(self, m)
            for n, h in zip(m.path, hits):
                n.hits = h

        monkeypatch.setattr(HiRadixTree, "touch_match", uncounted)
    a = adapter(write_policy="write_through_selective")
    for rid in (1, 2, 3):
        serve(a, rid, P + (1,))
        a.drain()
    undelivered, miscounted = findings(a, "backup undelivered"), findings(a, "hits count")
    a.close()
    assert bool(undelivered) == (planted in ("forgets", "third")), undelivered
    assert all("owed L2" in f for f in undelivered)
    assert bool(miscounted) == (planted == "uncounted"), miscounted


@pytest.mark.parametrize("planted", [False, True])
def test_an_eviction_loop_runs_until_want_is_freed_or_no_candidate_is_left(
    planted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """P and Q are leaves of L1 with L2 copies: `evict(L1, ALL)` takes both. A planted bug:
    the loop stops after its first victim, a candidate left (`eviction count`)."""
    from hicache.core.control import ControlPlane

    if planted:
        original = ControlPlane.evict

        def once(self: Any, tier: Any, n_pages: int, *args: Any, **kwargs: Any) -> int:
            return original(self, tier, min(n_pages, 1), *args, **kwargs)

        monkeypatch.setattr(ControlPlane, "evict", once)
    a = adapter(write_policy="write_through")
    serve(a, 1, P + (1,))
    serve(a, 2, Q + (1,))
    a.drain()
    a.evict("L1", ALL)
    got = findings(a, "eviction count")
    a.close()
    assert bool(got) == planted, got


# -- the counters against the trace (counters.py) ------------------------------------------

REAL_TRANSFER, REAL_INIT = Metrics.transfer, Metrics.__init__


def _cancels_counted_as_failures(self: Metrics, d: Any, n: int, status: Any, t: Any) -> None:
    failed = status is TransferStatus.CANCELLED
    REAL_TRANSFER(self, d, n, TransferStatus.FAILED if failed else status, t)


def _failures_forgotten(self: Metrics, d: Any, n: int, status: Any, t: Any) -> None:
    if status is not TransferStatus.FAILED:
        REAL_TRANSFER(self, d, n, status, t)


def _counted_from_one(self: Metrics, *args: Any, **kwargs: Any) -> None:
    REAL_INIT(self, *args, **kwargs)
    self.window_freed_pages = 1


def _promoted_from_one(self: Metrics, *args: Any, **kwargs: Any) -> None:
    REAL_INIT(self, *args, **kwargs)
    self.promoted_pages = 1  # a counter no trace event moves: judged from 0 all the same


def _fallbacks_falling(self: Metrics, reason: str) -> None:
    self.fallbacks[reason] -= 1


def _one_prompt_token_short(monkeypatch: pytest.MonkeyPatch) -> None:
    from hicache.controller.controller import CacheController

    real = CacheController.admit

    def admit(self: CacheController, *args: Any, **kwargs: Any) -> Any:
        mat = real(self, *args, **kwargs)
        self.metrics.prompt_tokens -= 1  # the last token forgotten
        return mat

    monkeypatch.setattr(CacheController, "admit", admit)


def _evicted(a: ControllerAdapter) -> None:
    """P served, then L1 gives up all it can."""
    given_up(a, ("L1",), P + (1,))


def _cancelled(a: ControllerAdapter) -> None:
    """P only in L2; its restore's H2D is cancelled by the request's end."""
    given_up(a, ("L1",), P + (1,))
    a.submit(99, P + (2,))
    assert a.pending_ops()
    a.finish(99)


def _failed(a: ControllerAdapter) -> None:
    """P only in L2; its restore's H2D fails, observed by a tick."""
    given_up(a, ("L1",), P + (1,))
    restore_fails(a, P + (2,), "fail")


def _refused_at_issue(a: ControllerAdapter) -> None:
    """P only in L2; its restore's H2D cannot get its pinned workspace: the issue raises."""
    given_up(a, ("L1",), P + (1,))
    a.set_faults(FaultSchedule(seed=1, rates={"PINNED_ALLOC": 1.0}))
    a.submit(99, P + (2,))
    a.set_faults(FaultSchedule())
    a.tick()


def test_prompt_tokens_move_with_the_admissions_the_trace_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a = adapter()
    serve(a, 1, P + (1,))
    assert not findings(a, "counter")
    _one_prompt_token_short(monkeypatch)
    serve(a, 2, Q + (1,))
    got = findings(a, "counter")
    a.close()
    assert got and all(f.startswith("counter prompt_tokens") for f in got), got


@pytest.mark.parametrize(
    ("scenario", "planted", "name"),
    [
        (_cancelled, None, None),
        (_cancelled, ("transfer", _cancels_counted_as_failures), "counter transfers.H2D"),
        (_failed, None, None),
        (_failed, ("transfer", _failures_forgotten), "counter transfers.H2D.failed"),
        (_refused_at_issue, None, None),
        (_refused_at_issue, ("ended_at_issue", lambda *a: None), "counter transfers.H2D.failed"),
        (_evicted, None, None),
        (_evicted, ("evicted", lambda *a: None), "counter evicted.L1"),
        (_evicted, ("__init__", _counted_from_one), "counter start"),
        (_evicted, ("__init__", _promoted_from_one), "counter start"),
        (_failed, ("fallback", _fallbacks_falling), "counter fallbacks.transfer_failed: fell"),
    ],
    ids=[
        "cancel",
        "cancel-counted-failed",
        "fail",
        "fail-uncounted",
        "refused",
        "refused-uncounted",
        "evict",
        "evict-uncounted",
        "starts-at-1",
        "untraced-starts-at-1",
        "falls",
    ],
)
def test_each_counter_moves_with_the_events_the_trace_names(
    monkeypatch: pytest.MonkeyPatch,
    scenario: Any,
    planted: tuple[str, Any] | None,
    name: str | None,
) -> None:
    """A transfer cancelled, one failed once observed, one whose issue raised (R13), and
    evictions: the metrics move with the trace's `<dir>_cancel`, `<dir>_fail` and
    `evict_l1` (liveness/counters.py). Each planted bug miscounts one of them
    ("refused-uncounted" is the controller before `Metrics.ended_at_issue`)."""
    if planted is not None:
        monkeypatch.setattr(Metrics, *planted)
    a = adapter(write_policy="write_through")
    scenario(a)
    got = findings(a, "counter")
    a.close()
    if name is None:
        assert not got, got
    else:
        assert got and all(f.startswith(name) for f in got), got
