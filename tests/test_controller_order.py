"""The order of a controller's steps (spec/restore.md): `admit` issues a restore's L2 part
before its L3 part; a `tick` concludes ops in op-id order, then issues what restores may
issue, then backups (D2H before H2S, each in wanted order). The tick's phases are read from
the spec's table and checked against a traced tick of the reference on the null plane."""

from __future__ import annotations

from pathlib import Path

from hicache.choices import WritePolicy
from hicache.controller.controller import CacheController
from hicache.core.trace import ListSink, TraceEvent, Tracer
from hicache.oracle.speccheck import parse_tables
from tests.test_null_plane import ABC, finish, settle_all, two_stage_restore

SPEC = Path(__file__).resolve().parents[1] / "spec"
C = tuple(range(500, 512))  # 3 pages each, sharing nothing with A, B or each other
D = tuple(range(600, 612))
E = tuple(range(700, 712))


def tick_phases() -> dict[str, int]:
    """spec/restore.md's tick table: event -> the phase whose work it starts."""
    headers = ("phase", "step", "events", "order")
    (found,) = [
        t
        for t in parse_tables((SPEC / "restore.md").read_text(encoding="utf-8"))
        if t.headers == headers
    ]
    phases: dict[str, int] = {}
    for _, row in found.rows:
        for event in row["events"].split(","):
            assert event.strip() not in phases, f"{event} is in two phases"
            phases[event.strip()] = int(row["phase"])
    return phases


def computed(c: CacheController, rid: int, tokens: tuple[int, ...]) -> None:
    """Request `rid` computes `tokens` (a miss) and ends: its node is wanted in L2."""
    c.admit(rid, tokens + (1,))
    c.prefill(rid)
    c.finish(rid)


def traced(c: CacheController) -> ListSink:
    sink = ListSink()
    c.cp.tracer = Tracer(sink)
    c.cp.executor.tracer = c.cp.tracer
    return sink


def first_token(c: CacheController, e: TraceEvent) -> int:
    """The first token of the node event `e` names."""
    assert e.node is not None
    return int(c.cp.tree.node(e.node).key[0])


def issued(events: list[TraceEvent]) -> list[tuple[str, int]]:
    return [(e.event, e.op) for e in events if e.event.endswith("_issue") and e.op is not None]


def test_admit_issues_the_l2_part_before_the_l3_part() -> None:
    c = two_stage_restore()
    sink = traced(c)
    c.admit(3, ABC)
    ops = sorted({op for _, op in issued(sink.events)})
    assert [name for name, _ in dict.fromkeys(issued(sink.events))] == ["h2d_issue", "s2h_issue"]
    assert len(ops) == 2 and issued(sink.events)[0][1] == ops[0]
    c.close()


def test_a_tick_runs_its_phases_in_the_specs_order() -> None:
    """One tick that concludes a backup and both stages of a restore (finished in reverse
    issue order), issues the restore's L3 part's H2D, and two D2H backups and the H2S the
    concluded D2H wants: its events follow the spec's phases, the ends in op-id order, the
    D2H chains in wanted order (D before E) and before the H2S."""
    phases = tick_phases()
    c = two_stage_restore()
    c.cp.evict("L1", 10_000)  # room: nothing below needs make-room's evictions
    computed(c, 4, C)
    c.tick()  # C's D2H: in flight
    (backup,) = list(c.handles)
    c.admit(3, ABC)  # the H2D of A, then the S2H of B
    computed(c, 5, D)
    computed(c, 6, E)  # D and E wanted in L2, D first
    ends = sorted(c.handles)
    for op_id in reversed(ends):
        finish(c, op_id, True)
    sink = traced(c)
    c.tick()
    seen = [e for e in sink.events if e.event in phases]
    order = [phases[e.event] for e in seen]
    assert order == sorted(order), [(e.event, e.op) for e in seen]
    assert set(order) == {1, 2, 3}, order
    concluded = [e.op for e in seen if phases[e.event] == 1]
    assert list(dict.fromkeys(concluded)) == ends  # op-id order
    assert backup == ends[0]
    started = [(e.event, first_token(c, e)) for e in seen if phases[e.event] > 1]
    assert started == [
        ("h2d_issue", ABC[12]),  # the L3 part, B
        ("d2h_issue", D[0]),
        ("d2h_issue", E[0]),
        ("h2s_issue", C[0]),
    ], started
    settle_all(c)
    c.close()


def test_a_chain_behind_a_pending_backup_stays_wanted_and_one_with_nothing_left_is_forgotten() -> (
    None
):
    """spec/policies.md, rule 2: X's D2H is in flight when its child Y is wanted in L2: Y's
    chain is empty and Y blocked (still wanted); once X's D2H completed, Y's chain is [Y].
    A node that holds L2 already is forgotten."""
    from hicache.controller.backup import BackupPlanner
    from hicache.core.control import ControlPlane
    from hicache.core.tiers import Direction

    cp = ControlPlane(2, (8, 8, 8))
    planner = BackupPlanner(cp, WritePolicy.WRITE_THROUGH)
    cp.begin_request(1, [1, 2, 3, 4, 9])
    cp.compute(1, 6)
    cp.insert(1)
    x = cp.prefix_node(1)
    op = cp.issue(Direction.D2H, [x])
    cp.end_request(1)
    cp.begin_request(2, [1, 2, 3, 4, 5, 6, 9])
    cp.compute(2, 4)
    cp.insert(2)
    y = cp.prefix_node(2)
    planner.want(Direction.D2H, y)
    assert list(planner.due()) == [] and planner.pending
    cp.complete(op.op_id)
    assert list(planner.due()) == [(Direction.D2H, [y])] and not planner.pending
    planner.want(Direction.D2H, x)
    assert list(planner.due()) == [] and not planner.pending


def test_an_l3_part_dropped_with_its_l2_part_is_a_fallback_of_its_own() -> None:
    """spec/restore.md: one fallback per dropped part. The L2 part's H2D cannot be issued (an
    aimed `alloc`: L1 refuses the reservation), so the L3 part behind it is dropped too: a
    `no_room` for the L2 part and a `restore_gap` for the L3 part (before: only the first was
    counted), both pins released, nothing issued."""
    from hicache.core.tiers import Direction
    from hicache.dataplane.faults import FaultInjector

    c = two_stage_restore()
    c.faults = FaultInjector()
    c.faults.aim("alloc", direction=Direction.H2D)
    before = dict(c.metrics.fallbacks)
    mat = c.admit(3, ABC)
    counted = {r: n - before[r] for r, n in c.metrics.fallbacks.items() if n != before[r]}
    assert counted == {"no_room": 1, "restore_gap": 1}, counted
    assert not c.handles and not c.cp.requests[3].pins and mat.done
    assert c.prefill(3) == len(ABC)  # nothing restored: the whole prompt is recomputed
    c.finish(3)
    c.close()


def test_a_wish_on_a_node_that_leaves_the_tree_passes_to_the_node_above_it() -> None:
    """spec/policies.md, rules 1 and 4: U and X reached L2 by one D2H, so both are owed L3;
    the wish is X's (the chain's last). X leaves L1 and L2 before its H2S is planned, so it
    leaves the tree: the wish passes to U, which still holds L2, and U's H2S is planned. (It
    was forgotten with X: U never reached L3 and no drop was counted -- the fuzz machine's
    `backup undelivered` finding, seed 0.)"""
    from hicache.controller.backup import BackupPlanner
    from hicache.core.control import ControlPlane
    from hicache.core.tiers import Direction, Tier

    cp = ControlPlane(2, (8, 8, 8))
    planner = BackupPlanner(cp, WritePolicy.WRITE_THROUGH)
    cp.begin_request(1, [1, 2, 3, 4, 9])
    cp.compute(1, 6)
    cp.insert(1)
    cp.end_request(1)
    cp.begin_request(2, [1, 2, 9])  # its match splits the node after 2 tokens: U, then X
    cp.end_request(2)
    u, x = reversed(cp.tree.path_to_root(cp.tree.match([1, 2, 3, 4], touch=False).path[-1]))
    op = cp.issue(Direction.D2H, [u, x])
    cp.complete(op.op_id)
    planner.after_d2h(x)
    cp.evict_node(x, Tier.L1)
    cp.evict_node(x, Tier.L2)
    assert not cp.is_live(x)
    assert list(planner.due()) == [(Direction.H2S, [u])] and not planner.pending
