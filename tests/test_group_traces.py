"""`hicache check-trace` reads a pool-group engine's trace: the header names the group (its
preset, hit policy and side capacities), and the group's own events -- `tombstone`,
`revive`, and an S2H that ends part completed, part failed -- replay on a group plane. Every
engine of every run of the dsv4-tiny fuzz machine is judged: all valid, the group events
among them. (Before, a group trace replayed on a single-pool plane and its first
`tombstone` was "not enabled".)"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from itertools import pairwise

import pytest

pytest.importorskip("torch", reason="needs torch (the controller): pip install -e '.[data]'")

from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from hicache.core.trace import ListSink, TraceEvent, TraceHeader, Tracer
from hicache.oracle.checktrace.replay import check_lines
from hicache.testing.adapters.controller import ControllerAdapter, Setup
from hicache.testing.machines import controller_machine
from hicache.testing.seeded import no_source_constants
from tests.budgets import budget


def engines(events: list[TraceEvent]) -> list[list[TraceEvent]]:
    """One adapter's events, cut into its engines' traces (each starts again at seq 1)."""
    starts = [i for i, e in enumerate(events) if e.seq == 1] + [len(events)]
    return [events[a:b] for a, b in pairwise(starts)]


def test_every_engine_of_the_group_fuzz_passes_check_trace() -> None:
    verdicts: list[tuple[int, str]] = []
    seen: Counter[str] = Counter()

    class Judged(ControllerAdapter):
        def close(self) -> None:
            header: TraceHeader = self.trace_header()
            events = self.trace()
            super().close()
            for one in engines(events):
                seen.update(e.event for e in one)
                lines = [header.to_json(), *(e.to_json() for e in one)]
                v = check_lines(lines)
                verdicts.append((v.exit_code, v.message))
                # A trace may stop anywhere: cut it inside end_request's discards (where a
                # cut used to be misread as insert) and half way.
                inside = [
                    i + 1
                    for i, (e, f) in enumerate(pairwise(one))
                    if e.event == "discard" and f.event == "end_request"
                ][:2]
                for k in (*inside, len(one) // 2):
                    v = check_lines(lines[: k + 1])
                    verdicts.append((v.exit_code, f"cut after event {k}: {v.message}"))
                    seen["cuts inside end_request"] += k in inside

    def judged(setup: Setup) -> ControllerAdapter:
        return Judged(setup)

    machine = controller_machine("null", adapter=judged, pools="dsv4-tiny")
    machine._hypothesis_internal_use_seed = 1
    config = settings(
        max_examples=budget(50, 500),  # runs of the machine (the fuzz profile: 10x)
        stateful_step_count=50,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    # Typed alike for every Hypothesis: older releases leave it untyped (no-untyped-call).
    run_machine: Callable[..., None] = run_state_machine_as_test
    with no_source_constants():
        run_machine(machine, settings=config)
    bad = [message for code, message in verdicts if code != 0]
    assert verdicts and not bad, bad[:1]
    assert seen["tombstone"] and seen["revive"] and seen["s2h_fail"], dict(seen)
    assert seen["cuts inside end_request"] > 10, dict(seen)


def test_an_s2h_that_published_part_of_its_chain_replays_as_complete_part() -> None:
    """An aimed partial read of A + B that keeps A (seed 7: c4 landed 3 of 6): the trace has
    `s2h_complete` of A then `s2h_fail` of B under one op, which check-trace replays as
    `complete_part(op, 1)`; the header names the group."""
    from tests.test_upstream_scenarios import aimed_partial_restore

    sink = ListSink()
    c, _, _, _ = aimed_partial_restore(7, tracer=Tracer(sink))
    c.tick()
    header = c.cp.trace_header()
    c.close()
    ends = [(e.event, e.op) for e in sink.events if e.event in ("s2h_complete", "s2h_fail")]
    assert [name for name, _ in ends] == ["s2h_complete", "s2h_fail"] and ends[0][1] == ends[1][1]
    assert header.pools["group"] == "dsv4-tiny"
    verdict = check_lines([header.to_json(), *(e.to_json() for e in sink.events)])
    assert verdict.exit_code == 0, verdict.message


@pytest.mark.parametrize(
    "pools, why",
    [
        ({"group": "dsv9"}, "header pools"),  # no such preset
        ({"group": "dsv4-tiny", "hit_policy": "best"}, "header pools"),  # no such policy
        ({"hit_policy": "all_pools"}, "pools"),  # the group is required
        ({"group": "dsv4-tiny", "capacities": {"L4": {}}}, "pools.capacities"),
    ],
)
def test_a_bad_pools_header_is_malformed_input(pools: dict[str, object], why: str) -> None:
    header = (
        TraceHeader(4, {"L1": 8, "L2": 8, "L3": 8}).to_json()[:-1]
        + f',"pools":{json.dumps(pools)}}}'
    )
    verdict = check_lines([header])
    assert verdict.exit_code == 2 and why in verdict.message, verdict.message
