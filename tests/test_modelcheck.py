"""The model checker (hicache/oracle/modelcheck/): counts, its reductions' soundness, its findings.

What each test shows:
- the CI configurations give the manifest's counts, fire every spec transition, find nothing;
- the reductions are sound: the unreduced search (concrete ids, pages and history) and the
  reduced one reach the same states up to renaming, the same transitions, the same verdicts;
- a refused call changes nothing (every refusal of a small search checked);
- the plane copies equal `copy.deepcopy` and are independent of their original;
- an injected bug (an edited lifecycle row) is found, with a shortest path whose trace
  `hicache check-trace` rejects (exit 1) while the path without its last step passes (exit 0);
  a state from which the drain is refused is found as `stuck`;
- every path the search takes replays as a valid trace through check-trace.
"""

from __future__ import annotations

import copy
import io

import pytest

from hicache.core.control import ControlPlane
from hicache.core.lifecycle import Lifecycle, load_lifecycle
from hicache.oracle.checktrace import check_lines
from hicache.oracle.modelcheck.actions import apply, is_refusal, offered
from hicache.oracle.modelcheck.canonical import canonical_key, concrete_key
from hicache.oracle.modelcheck.config import ModelConfig, get_config, load_configs
from hicache.oracle.modelcheck.counterexample import write_trace
from hicache.oracle.modelcheck.coverage import composite_edges, graph_edges
from hicache.oracle.modelcheck.search import Finding, Result, explore
from hicache.testing.mutants import activate
from tests.test_execute import edited

ALL_TRANSITIONS = set(load_lifecycle().transitions)

# d2h_issue without parent(L2) == RESIDENT: a child is backed up to L2 before its parent (a
# backup gap, S6).
NO_PARENT_GUARD = ["L1 == RESIDENT"]
# evict_l2 without leaf(L2): the row now allows evicting an L2 parent, which the tree's leaf
# sets (and so `candidates`) do not follow.
NO_LEAF_GUARD = ["locks(L2) == 0", "L1 != H2D_PENDING", "L3 != H2S_PENDING"]


def ci_configs() -> list[ModelConfig]:
    return [c for c in load_configs().values() if c.ci and c.ranks == 1]


def trace_of(cfg: ModelConfig, f: Finding, lc: Lifecycle | None = None) -> list[str]:
    buf = io.StringIO()
    write_trace(cfg, f, buf, lc)
    return buf.getvalue().splitlines()


@pytest.fixture(scope="module")
def ci_results() -> dict[str, Result]:
    return {c.name: explore(c, keep_keys=True) for c in ci_configs()}


def test_ci_configs_give_the_manifests_counts(ci_results: dict[str, Result]) -> None:
    assert ci_results, "the manifest has CI configurations"
    for name, res in ci_results.items():
        exp = res.config.expected
        assert exp is not None, f"{name}: a CI config has expected counts"
        assert res.finding is None and res.exhaustive, name
        assert (res.states, res.edges, res.depth) == (exp.states, exp.edges, exp.depth), name


def test_ci_configs_together_fire_every_spec_transition(ci_results: dict[str, Result]) -> None:
    fired = set().union(*(r.fired for r in ci_results.values()))
    assert fired == ALL_TRANSITIONS
    assert ci_results["tail"].fired == ALL_TRANSITIONS  # spec/modelcheck.md says so


def test_ci_configs_take_every_composite_edge_but_a_private_copys_view_of_a_tree_transition(
    ci_results: dict[str, Result],
) -> None:
    lc = load_lifecycle()
    graph = graph_edges(lc)
    taken = composite_edges(lc, set().union(*(r.steps for r in ci_results.values())))
    assert taken <= graph  # every traced step is an edge of the composite graph
    # Not taken: an L2/L3 row seen from a request's private L1 copy. The reference traces such
    # a row with the node's own triple (its L1 is not the request's copy), never this view.
    views = {
        (b, t, a)
        for b, t, a in graph
        if b.startswith("L1_PRIVATE") and lc.transitions[t].tier != "L1"
    }
    assert graph - taken == views and len(views) == 14


def test_every_path_of_a_search_replays_as_a_valid_trace(ci_results: dict[str, Result]) -> None:
    res = ci_results["tail"]
    inner = {step[0] for step in res.parents.values() if step is not None}
    leaves = [k for k in res.parents if k not in inner]  # their paths cover the BFS tree
    assert len(leaves) > 50
    for k in leaves:
        path = res.path_to(k)
        verdict = check_lines(trace_of(res.config, Finding("path", "", path)))
        assert verdict.exit_code == 0, (path, verdict.message)


def test_reductions_are_sound_within_a_depth_bound() -> None:
    cfg = get_config("tail")
    seen: set[object] = set()
    plain = explore(
        cfg, reduction="none", max_depth=9, on_state=lambda cp: seen.add(canonical_key(cp))
    )
    reduced = explore(cfg, max_depth=9, keep_keys=True)
    assert plain.states > 3 * reduced.states  # the reduction does reduce
    assert seen == reduced.keys
    assert plain.fired == reduced.fired and plain.finding is None and reduced.finding is None


def test_request_symmetry_is_sound_within_a_depth_bound() -> None:
    cfg = get_config("pair")
    ids = tuple(range(cfg.requests))
    seen: set[object] = set()
    plain = explore(
        cfg,
        reduction="canonical",
        max_depth=7,
        on_state=lambda cp: seen.add(canonical_key(cp, ids)),
    )
    reduced = explore(cfg, max_depth=7, keep_keys=True)
    assert plain.states > reduced.states
    assert seen == reduced.keys and plain.fired == reduced.fired


def test_no_request_symmetry_when_prompts_differ() -> None:
    cfg = ModelConfig("asym", 2, (2, 2, 2), ((1, 2, 3), (4, 5, 6)), 2, per_request=True)
    assert not cfg.symmetric_requests and get_config("pair").symmetric_requests
    # Request 0 begins [1, 2, 3] only, request 1 [4, 5, 6]: swapping them is no symmetry, so
    # the "symmetric" search keeps the ids and reaches what the plain canonical one reaches.
    plain = explore(cfg, reduction="canonical", max_depth=5)
    symmetric = explore(cfg, max_depth=5)
    assert (symmetric.states, symmetric.edges) == (plain.states, plain.edges)


def test_without_faults_or_aborts_no_fail_or_cancel_fires() -> None:
    base = get_config("tail")
    no_faults = explore(
        ModelConfig("f", base.page_size, base.capacities, base.prompts, 1, faults=False)
    )
    no_aborts = explore(
        ModelConfig("a", base.page_size, base.capacities, base.prompts, 1, aborts=False)
    )
    assert no_faults.exhaustive and no_aborts.exhaustive  # the drain by copy holds without cancels
    assert {t for t in no_faults.fired if t.endswith("_fail")} == set()
    assert {t for t in no_aborts.fired if t.endswith("_cancel")} == set()
    # A fail and a cancel lead to the same state (both release the target, unlock the
    # source): the states stay, the edges drop.
    assert no_faults.states == no_aborts.states == 227
    assert no_faults.edges < 1597 and no_aborts.edges < 1597


def test_reductions_agree_on_a_finding() -> None:
    cfg, lc = get_config("pages"), edited("d2h_issue", guards=NO_PARENT_GUARD)
    plain = explore(cfg, lifecycle=lc, reduction="none")
    reduced = explore(cfg, lifecycle=lc)
    assert plain.finding is not None and reduced.finding is not None
    assert plain.finding.kind == reduced.finding.kind == "invariant"
    assert len(plain.finding.path) == len(reduced.finding.path)


def test_a_refused_call_changes_nothing() -> None:
    res = explore(get_config("tail"), verify_refusals=1)
    assert res.finding is None and res.refusals > 1000
    assert res.refusals_verified == res.refusals


def sample_planes(cfg: ModelConfig, depth: int) -> list[ControlPlane]:
    planes: list[ControlPlane] = []
    explore(cfg, max_depth=depth, on_state=planes.append)
    return planes


def test_clone_equals_deepcopy_and_is_independent() -> None:
    cfg = get_config("pair")
    planes = sample_planes(cfg, 8)
    assert len(planes) > 150
    for cp in planes[::4]:
        before = concrete_key(cp)
        twin = cp.clone()
        assert concrete_key(twin) == concrete_key(copy.deepcopy(cp)) == before
        for a in offered(cp, cfg):
            c = cp.clone()
            try:
                apply(c, cfg, a)
            except Exception as e:
                assert is_refusal(e), e
            assert concrete_key(cp) == before, f"{a} on a copy changed the original"


def test_an_injected_guard_bug_is_found_with_a_trace_check_trace_rejects() -> None:
    cfg, lc = get_config("pages"), edited("d2h_issue", guards=NO_PARENT_GUARD)
    res = explore(cfg, lifecycle=lc)
    f = res.finding
    assert f is not None and f.kind == "invariant" and f.message.startswith("S6")
    assert [str(a) for a in f.path] == [
        "begin_request r0 0",
        "compute r0 1",
        "insert r0",
        "compute r0 1",
        "insert r0",
        "issue D2H nodes 2",
    ]  # the shortest path
    lines = trace_of(cfg, f, lc)
    assert '"format":"hicache-trace"' in lines[0]
    verdict = check_lines(lines)
    assert verdict.exit_code == 1 and verdict.seq == len(lines) - 1, verdict.message
    assert "parent(L2) == RESIDENT" in verdict.message
    prefix = Finding("path", "", f.path[:-1])  # the same path, short of the bad step: valid
    assert check_lines(trace_of(cfg, prefix, lc)).exit_code == 0


def test_a_row_the_tree_does_not_follow_is_an_audit_finding() -> None:
    res = explore(get_config("pages"), lifecycle=edited("evict_l2", guards=NO_LEAF_GUARD))
    f = res.finding
    assert f is not None and f.kind == "audit"
    assert f.message == "candidates(L2) lists nodes [2], the evict_l2 row allows [1, 2]"
    assert str(f.path[-1]) == "complete op 1"


@pytest.mark.parametrize("mutant, check", [("B02", "I1"), ("B03", "I6"), ("B04", "S7")])
def test_a_state_with_a_broken_record_is_never_merged_with_a_correct_one(
    mutant: str, check: str
) -> None:
    """B02 frees an L2 page a node still holds, B03 leaks an op's target pages: the tree, the
    ops and the requests are then exactly as in a correct state; only the page table differs.
    The key once left the owners out (they follow from the rest in a correct plane), so these
    states were merged with correct ones, never judged, and both mutants went unfound."""
    with activate(mutant):
        res = explore(get_config("tail"))
    assert res.finding is not None and res.finding.kind == "invariant", mutant
    assert res.finding.message.startswith(check)


def test_a_leaf_set_that_disagrees_with_the_evict_guard_is_found() -> None:
    """The zoo's B07-leaf keys every tier's leaf sets on L1's children: the plane's guards still
    refuse a non-leaf, but `candidates(L2)` (what an eviction loop picks from) misses a real
    leaf. Found by the tree's audit and the candidates-vs-guard comparison in every state."""
    with activate("B07-leaf"):
        res = explore(get_config("pages"))
    assert res.finding is not None and res.finding.kind == "audit"
    assert "leaf set" in res.finding.message and "candidates(L2)" in res.finding.message


@pytest.mark.parametrize("aborts", [True, False])
def test_a_state_the_drain_cannot_leave_is_stuck(aborts: bool) -> None:
    # h2d_cancel refused unless the node also holds L3: a load-back of an L2-only node can
    # never be cancelled, so its request can never end.
    lc = edited("h2d_cancel", guards=["L3 == RESIDENT"])
    cfg = ModelConfig("tail-mutant", 2, (2, 2, 2), ((1, 2, 3),), 1, aborts=aborts)
    res = explore(cfg, lifecycle=lc)
    f = res.finding
    assert f is not None and f.kind == "stuck", res.finding
    assert "h2d_cancel" in f.message or "cancel" in f.message
    assert f.path[-1].kind == "issue" and f.path[-1].arg == "H2D"
    buf = io.StringIO()
    ended = write_trace(cfg, f, buf, lc)
    assert "cancel" in ended
    # The refused call emits nothing: the trace itself is valid, the finding is the refusal.
    assert check_lines(buf.getvalue().splitlines()).exit_code == 0


def test_an_unexpected_exception_is_a_crash_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: ControlPlane, request_id: int, node: object) -> int:
        raise RuntimeError("injected")

    monkeypatch.setattr(ControlPlane, "advance_cached_len", broken)
    res = explore(get_config("tail"))
    assert (
        res.finding is not None
        and res.finding.kind == "crash"
        and "injected" in res.finding.message
    )
    assert res.finding.path[-1].kind == "advance_cached_len"
