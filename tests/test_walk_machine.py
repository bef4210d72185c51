"""The walk's `transitions` machine (hicache/core/pagemachine.py) and the executor must agree.

The machine is the library's own (a HierarchicalMachine, one parallel region per tier), built
from lifecycle.toml's raw rows; the executor runs the parsed rows by hand. Shown here: the
machine is what the toml says; the two compositions reach the same graph (and `spec check`
says when they do not); a row the executor runs differently from the tables, or a machine
built from other tables, fails the walk with a MachineDisagreement naming the step -- in a
plane, in check-trace; and check-trace and `hicache fuzz` walk without being asked (this
module's tests build their planes unwalked: tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
from typing import Any

import pytest
from transitions.extensions.nesting import HierarchicalMachine

from hicache.core.control import ControlPlane
from hicache.core.lifecycle import Lifecycle, load_lifecycle
from hicache.core.pagemachine import PageMachine, page_machine
from hicache.core.tiers import Direction
from hicache.core.trace import ListSink, Tracer
from hicache.core.tracewalk import MachineDisagreement, walk, walked_events
from hicache.oracle.checktrace import check_lines
from hicache.oracle.checktrace.generate import controller_trace
from hicache.oracle.speccheck.machine import check_machine
from hicache.spec import LIFECYCLE_TOML, load_toml
from hicache.testing.walking import every_plane_walked, walks

PS = 2
TIERS = ("L1", "L2", "L3")


def executor_edited(name: str, **fields: Any) -> Lifecycle:
    """The shipped tables, loaded anew, with row `name` as the executor runs it (the parsed
    row) edited; the raw tables, which the walk's machine is built from, are as shipped."""
    lc = Lifecycle(load_toml(LIFECYCLE_TOML))
    lc.transitions[name] = dataclasses.replace(lc.transitions[name], **fields)
    return lc


def backing_up(
    lc: Lifecycle | None = None, tracer: Tracer | None = None
) -> tuple[ControlPlane, int]:
    """A plane whose one node, tokens [0, 4), is in L1 with its D2H backup in flight; walked."""
    cp = ControlPlane(PS, (16, 16, 16), check_mode="off", lifecycle=lc, tracer=tracer, walk=True)
    cp.begin_request(1, [1, 2, 3, 4, 5])
    cp.compute(1, 6)
    cp.insert(1)
    cp.end_request(1)
    (node,) = list(cp.tree.nodes())
    return cp, cp.issue(Direction.D2H, [node]).op_id


def test_a_plane_walks_when_asked() -> None:
    assert not walks(ControlPlane(PS, (4, 4, 4)))  # the default: no walk, no sink
    assert not ControlPlane(PS, (4, 4, 4)).tracer.enabled
    assert walks(ControlPlane(PS, (4, 4, 4), walk=True))  # a tracer without a sink gets one
    with every_plane_walked():  # the suite's and `hicache fuzz`'s: planes built deep inside
        assert walks(ControlPlane(PS, (4, 4, 4)))
        assert not walks(ControlPlane(PS, (4, 4, 4), walk=False))  # the builder still decides
        with every_plane_walked():
            assert walks(ControlPlane(PS, (4, 4, 4)))
        assert walks(ControlPlane(PS, (4, 4, 4)))
        sink = ListSink()
        cp, _ = backing_up(tracer=Tracer(sink))  # a caller's sink gets every event, walked
        assert walks(cp) and [e.event for e in sink.events][-1] == "d2h_issue"
    assert not walks(ControlPlane(PS, (4, 4, 4)))  # only while it is open


def test_the_machine_is_the_librarys_built_from_the_toml() -> None:
    toml = load_toml(LIFECYCLE_TOML)
    m = page_machine(load_lifecycle().tables)
    assert isinstance(m.machine, HierarchicalMachine)
    states = {f"page.{t}.{s['name']}" for t in TIERS for s in toml["residency"][t]["states"]}
    assert set(m.machine.get_nested_state_names()) == {
        "page",
        *(f"page.{t}" for t in TIERS),
        *states,
    }
    rows = {r["name"]: (t, r) for t in TIERS for r in toml["residency"][t]["transitions"]}
    assert set(m.machine.events) == set(rows)  # one trigger per row, no auto transitions
    for name, (tier, row) in rows.items():
        (t,) = m.machine.get_nested_transitions(trigger=name)
        assert (t.source, t.dest) == (f"page.{tier}.{row['from']}", f"page.{tier}.{row['to']}")
        guards = row.get("guards", [])
        assert len(t.conditions) == sum(g.startswith(("L1 ", "L2 ", "L3 ")) for g in guards)
        assert set(m.rows[name].checked + m.rows[name].unchecked) == set(guards)
    assert m.start == tuple(toml["residency"][t]["initial"] for t in TIERS)


def test_the_machine_answers_from_the_library() -> None:
    m = PageMachine(load_lifecycle().tables)
    assert m.answer("L1", "d2h_issue").after == "L1_D2H_PENDING"
    assert m.answer("L1", "h2d_issue").says == "refuses: no h2d_issue transition leaves L1 RESIDENT"
    assert m.answer("L1_D2H_PENDING", "evict_l1").says == "refuses: guard 'L2 != D2H_PENDING' fails"
    assert m.answer("NOWHERE", "evict_l1").after is None
    assert copy.deepcopy(m) is m  # shared by a plane's copies (check-trace copies its plane)


def test_the_two_compositions_reach_the_same_graph() -> None:
    lc = load_lifecycle()
    assert check_machine(lc) == []
    graph = PageMachine(lc.tables).graph()
    assert set(graph) == {c.states for c in lc.composites}
    assert sum(map(len, graph.values())) == sum(map(len, lc.reachable().values()))


def test_spec_check_names_each_edge_only_one_composition_takes() -> None:
    lc = executor_edited("d2h_fail", dest="RESIDENT")
    only = "lifecycle.toml: the {} takes {} --d2h_fail--> {}, the {} does not"
    machine, by_hand = "transitions machine", "hand-written composition"
    assert check_machine(lc) == [
        only.format(machine, "L1_D2H_PENDING", "L1", by_hand),
        only.format(machine, "L1_D2H_PENDING_L3", "L1_L3", by_hand),
        only.format(by_hand, "L1_D2H_PENDING", "L1_L2", machine),
        only.format(by_hand, "L1_D2H_PENDING_L3", "L1_L2_L3", machine),
    ]


def test_an_executor_row_run_unlike_the_tables_fails_the_walk() -> None:
    """Before the walk had its own machine it walked the executor's own composite graph, so
    an edited parsed row passed: the executor and the walk read the same code."""
    cp, op = backing_up(executor_edited("d2h_fail", dest="RESIDENT"))
    (node,) = list(cp.tree.nodes())
    with pytest.raises(MachineDisagreement) as raised:
        cp.fail(op)
    said = raised.value
    assert (said.event, said.node, said.before) == ("d2h_fail", node.node_id, "L1_D2H_PENDING")
    assert (said.executor, said.machine) == ("L1_L2", "reaches L1")


def test_a_machine_from_other_tables_fails_the_walk() -> None:
    tables = load_toml(LIFECYCLE_TOML)
    (row,) = [r for r in tables["residency"]["L2"]["transitions"] if r["name"] == "d2h_issue"]
    row["guards"] = [*row["guards"], "L3 == RESIDENT"]
    tracer = Tracer(ListSink())
    walk(tracer, Lifecycle(tables))  # the walk's tables only; the plane runs the shipped ones
    with pytest.raises(MachineDisagreement) as raised:
        backing_up(tracer=tracer)
    said = raised.value
    assert (said.event, said.before, said.executor) == ("d2h_issue", "L1", "L1_D2H_PENDING")
    assert said.machine == "refuses: guard 'L3 == RESIDENT' fails"


def test_check_trace_walks_and_names_a_disagreement() -> None:
    assert not walks(ControlPlane(PS, (4, 4, 4)))  # unwalked here: check-trace walks itself
    lines = controller_trace(seed=3, steps=120, faults=True)
    before = walked_events()
    verdict = check_lines(lines)
    assert verdict.exit_code == 0, verdict.message
    assert walked_events() - before >= verdict.events > 50
    fails = sum('"event":"d2h_fail"' in line for line in lines)
    assert fails, "the seed's trace has no failed backup to disagree about"
    with pytest.raises(MachineDisagreement, match="disagree on d2h_fail"):
        check_lines(lines, lifecycle=executor_edited("d2h_fail", dest="RESIDENT"))


def test_hicache_fuzz_walks_every_plane() -> None:
    from hicache.testing import runner

    assert not walks(ControlPlane(PS, (4, 4, 4)))  # unwalked here: the fuzz walks itself
    before = walked_events()
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert runner.main(["--seed", "1", "--steps", "40"]) == 0
    assert walked_events() - before > 40, out.getvalue()
    assert not walks(ControlPlane(PS, (4, 4, 4)))  # and only while it runs
