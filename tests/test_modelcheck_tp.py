"""The TP model check (hicache/oracle/modelcheck/tpsearch.py): simulated ranks, C2 (deferred to
C4 where the reservation reads only agreed state) and C4.

The clean model is exhaustive with the manifest's counts; each TP-zoo mutant the model
reaches is rejected (the finding and its shortest path), and the others are listed with the
reason they are out of its scope (spec/modelcheck.md, "The TP model").
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from hicache.controller.transfers import Transfers
from hicache.distributed.agreement import Agreed, Agreement, Local
from hicache.distributed.collectives import CollectiveMismatch, CollectiveTimeout
from hicache.distributed.refused import RefusedIssue
from hicache.distributed.simulated import ThreadGroup
from hicache.errors import ConfigError, StorageError
from hicache.oracle.modelcheck.actions import Action
from hicache.oracle.modelcheck.cli import main
from hicache.oracle.modelcheck.config import ModelConfig, get_config, load_configs
from hicache.oracle.modelcheck.lockstep import lockstep
from hicache.oracle.modelcheck.search import explore
from hicache.oracle.modelcheck.tprules import tick_rules
from hicache.oracle.modelcheck.tpsearch import explore_tp, state_key
from hicache.oracle.modelcheck.tpstate import PENDING, End
from hicache.oracle.modelcheck.tpsteps import State, Step, initial_state, take
from hicache.pools.presets import group
from hicache.testing.mutants.base import swapped
from hicache.testing.mutants.tp import ZOO

# Mutant -> (the configuration that shows it, the finding's kind).
REJECTED = {
    "B16": ("tp2", "invariant"),
    "B16-ack": ("tp2", "invariant"),
    "TP-conditional": ("tp2", "collective"),
    "TP-local-capacity": ("tp2-fork", "disagree"),
    "TP-cancel-ended": ("tp2", "disagree"),
    "TP-moving-landed": ("tp2-pages", "rule"),
}
# Mutants of what the model does not run: C1a's windows and masks (it runs C1a's hits and the
# C4 it carries, without windows), bytes.
OUT_OF_SCOPE = {"TP-min-of-maxima", "TP-rank-local-bytes"}


def test_tp2_is_exhaustive_with_the_manifests_counts_and_fires_every_transition() -> None:
    cfg = get_config("tp2")
    res = explore_tp(cfg)
    assert res.finding is None and res.exhaustive
    assert cfg.expected is not None
    assert (res.states, res.edges, res.depth) == (
        cfg.expected.states,
        cfg.expected.edges,
        cfg.expected.depth,
    )
    assert len(res.fired) == 23


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_each_tp_zoo_mutant_in_scope_is_rejected(name: str) -> None:
    mutant = next(m for m in ZOO if m.name == name)
    config, kind = REJECTED[name]
    with mutant.patch():
        res = explore_tp(get_config(config), max_states=10000)  # TP-moving-landed: ~7,500
    assert res.finding is not None, f"{name} passed the TP model check"
    assert res.finding.kind == kind, res.finding
    assert res.finding.path, "a finding comes with its path"


@pytest.mark.parametrize(
    ("name", "config", "kind"),
    [
        ("TP-cancel-ended", "tp2", "disagree"),
        ("TP-cancel-ended", "tp2-pages", "disagree"),
        ("TP-moving-landed", "tp2-pages", "rule"),
    ],
)
def test_the_bugs_the_model_check_found_are_rejected_as_mutants(
    name: str, config: str, kind: str
) -> None:
    """C5 (4f44ac3) and C4 (417fbcb) re-planted as they were: C5's cancel parts the ranks'
    trees on both configs; C4's clamp needs a read of two nodes (tp2-pages), where only the
    `landed` rule sees it (the ranks agree on the wrong count). tp2's reads are one node."""
    mutant = next(m for m in ZOO if m.name == name)
    with mutant.patch():
        res = explore_tp(get_config(config), max_states=10000)
    assert res.finding is not None, f"{name} passed the TP model check on {config}"
    assert res.finding.kind == kind, res.finding


def test_b16_on_replicated_pools_is_rejected_and_the_clean_group_model_writes_from_rank_0() -> None:
    """tp2-group (every pool replicated): B16 makes every rank write; caught by I11."""
    mutant = next(m for m in ZOO if m.name == "B16")
    with mutant.patch():
        res = explore_tp(get_config("tp2-group"), max_states=1000)
    assert res.finding is not None and res.finding.kind == "invariant", res.finding
    assert "I11" in res.finding.message and "rank 0 only" in res.finding.message
    assert not res.ranks_alike  # rank 0 is the only writer: ranks keep their names


def test_every_tp_zoo_mutant_is_rejected_or_listed_out_of_scope() -> None:
    assert {m.name for m in ZOO} == set(REJECTED) | OUT_OF_SCOPE


def test_three_ranks_a_skipped_completion_is_found() -> None:
    mutant = next(m for m in ZOO if m.name == "TP-conditional")
    with mutant.patch():
        res = explore_tp(get_config("tp3"), max_states=500)
    assert res.finding is not None and res.finding.kind == "collective"
    assert "skipped" in res.finding.message


def test_a_rank_that_does_not_skip_the_op_id_of_an_aborted_issue_is_found() -> None:
    """C2 (a transfer of L1 where L1 frees windows: tp2-group's D2H and H2D)."""
    from hicache.core.control import ControlPlane

    with swapped(ControlPlane, "skip_op_id", lambda self: None):
        res = explore_tp(get_config("tp2-group"))
    assert res.finding is not None and res.finding.kind == "disagree"
    assert "next op id" in res.finding.message
    assert any("refused" in str(s) for s in res.finding.path)


def test_an_abort_that_keeps_the_reservation_on_one_rank_is_found() -> None:
    """C2's abort releases on every rank: rank 0 keeping its op when the ranks did not
    agree (Agreement.reserve answering it alone "commit") leaves the planes apart."""
    original = Agreement.__dict__["reserve"]

    def reserve(self: Agreement, ok: bool, pages: int) -> bool:
        return original(self, ok, pages) or (self.rank == 0 and ok)

    with swapped(Agreement, "reserve", reserve):
        res = explore_tp(get_config("tp2-group"))
    assert res.finding is not None and res.finding.kind == "disagree", res.finding
    assert "refused" in str(res.finding.path[-1])


def _drop_refused(
    self: Transfers, direction: Any, chain: Any, rid: Any, need: int, parent: Any, *more: Any
) -> Any:
    """A refused issue that takes no op on the refusing rank (the naive fold of C2 into C4:
    the op id skipped, its pages never taken), the others' op kept until C4."""
    got = ORIGINAL_ISSUE_HERE(self, direction, chain, rid, need, parent, *more)
    if isinstance(got[1], RefusedIssue):
        self.cp.fail(got[0].op_id)
        return None, None, got[1].refusal, True
    return got


ORIGINAL_ISSUE_HERE = Transfers.__dict__["_issue_here"]


def test_a_refused_issue_that_takes_no_op_on_its_rank_is_found() -> None:
    """The deferred reserve (spec/tp.md C2): a rank whose issue was refused must take the op
    all the same, or the ranks' ops, free counts and next op ids part until C4."""
    with swapped(Transfers, "_issue_here", _drop_refused):
        res = explore_tp(get_config("tp2"))
    assert res.finding is not None and res.finding.kind == "disagree", res.finding
    assert "refused" in str(res.finding.path[-1])


def test_an_op_refused_on_one_rank_and_published_on_another_is_found() -> None:
    """C4 must fail an op some rank refused: rank 0 ending it by its own handle alone (a
    refusal elsewhere ignored) publishes what rank 1 never moved."""

    def completion(self: Agreement, local: Sequence[Local]) -> list[Agreed]:
        agreed: list[Agreed] = ORIGINAL_COMPLETION(self, local)
        if self.rank:
            return agreed
        return [(x[0], x[1] and mine[1], *x[2:]) for x, mine in zip(agreed, local)]

    with swapped(Agreement, "completion", completion):
        res = explore_tp(get_config("tp2"))
    assert res.finding is not None and res.finding.kind == "disagree", res.finding
    assert any("refused" in str(s) for s in res.finding.path)


def test_a_cancel_settled_by_the_local_end_is_found() -> None:
    """C5: before the fix, a rank whose handle a tick had seen end published the op on
    cancel while the others released it (tests/test_tp_cancel.py shows it on the cluster)."""
    original = Transfers.__dict__["settle"]

    def settle(self: Transfers, op_id: int, failed: bool | None = None, **kw: object) -> None:
        self.tp = self.tp and failed is not None  # the cancel path as one rank takes it
        original(self, op_id, failed, **kw)

    with swapped(Transfers, "settle", settle):
        res = explore_tp(get_config("tp2"))
    assert res.finding is not None and res.finding.kind == "disagree", res.finding
    steps = [str(s) for s in res.finding.path]
    assert steps[-1].startswith("cancel") and "tick" in steps and len(steps) == 7, steps


def test_ranks_alike_reaches_the_renamed_states_of_the_full_search() -> None:
    """The rank-symmetry reduction (tpsearch.symmetric): the states it keeps are exactly
    the full search's states up to a renaming of ranks, with the same verdict."""
    cfg = ModelConfig("tp2-one-page", 2, (1, 1, 1), ((1, 2),), 1, ranks=2)
    full: set[object] = set()
    alike: set[object] = set()
    a = explore_tp(cfg, ranks_alike=False, on_state=lambda s: full.add(state_key(s, cfg, True)))
    b = explore_tp(cfg, ranks_alike=True, on_state=lambda s: alike.add(state_key(s, cfg, True)))
    assert a.finding is None and b.finding is None and a.exhaustive and b.exhaustive
    assert full == alike and len(alike) + 1 == b.states  # on_state sees all but the start
    assert a.states > b.states


def _completion_without_reasons(self: Agreement, local: Sequence[Local]) -> list[Agreed]:
    """Agreement.completion that drops the bad-slot reason: no rank drops the copy."""
    agreed = ORIGINAL_COMPLETION(self, local)
    return [(ended, failed, kept, 0, slot, lost) for ended, failed, kept, _, slot, lost in agreed]


ORIGINAL_COMPLETION = Agreement.__dict__["completion"]


PAGES = ModelConfig("tp2-pages", 1, (2, 2, 2), ((1, 2),), 1, ranks=2)  # two-node reads
TO_READ = [  # from the empty planes to a two-node read (S2H) in flight on both ranks
    Step("plane", Action("begin_request", 0, arg=0)),
    Step("plane", Action("compute", 0, arg=2)),
    Step("plane", Action("insert", 0)),
    Step("plane", Action("end_request", 0)),
    Step("issue", Action("issue", None, (1,), "D2H"), ("ok", "ok")),
    Step("land", rank=0, op=1, outcome=End("done")),
    Step("land", rank=1, op=1, outcome=End("done")),
    Step("tick"),
    Step("issue", Action("issue", None, (1,), "H2S"), ("ok", "ok")),
    Step("land", rank=0, op=2, outcome=End("done")),
    Step("land", rank=1, op=2, outcome=End("done")),
    Step("tick"),
    Step("plane", Action("evict", None, (1,), "L2")),
    Step("plane", Action("begin_request", 0, arg=0)),  # splits the node at the L1 hit
    Step("issue", Action("issue", 0, (2, 1), "S2H"), ("ok", "ok")),
]


def _ticked(ends: list[End]) -> tuple[State, State]:
    """The state with the read in flight, each rank's end of it as `ends`; and after a tick."""
    state = initial_state(PAGES)
    for step in TO_READ:
        state = take(state, PAGES, PAGES_GROUP, step)
    (read,) = state[0].cp.ops
    assert len(state[0].cp.ops[read].nodes) == 2
    for r, end in enumerate(ends):
        if end.kind != "pending":
            state = take(state, PAGES, PAGES_GROUP, Step("land", rank=r, op=read, outcome=end))
    return state, take(state, PAGES, PAGES_GROUP, Step("tick"))


PAGES_GROUP = group("mha")


def test_c4_keeps_no_node_a_rank_still_moving_the_read_never_landed() -> None:
    """Rank 0's read landed one node and stopped; rank 1's still moves: no node is kept on
    either rank (before the fix in transfers.py rank 1 counted all as landed, and both
    published the first node: the C4 rule `landed` reports it)."""
    before, after = _ticked([End("part", 1), PENDING])
    assert tick_rules(before, after, PAGES_GROUP) is None
    assert [[n.state[1] for n in rs.cp.tree.nodes()] for rs in after] == [["ABSENT"] * 2] * 2


def test_a_read_published_past_what_landed_is_found() -> None:
    """Every rank clamps a read that stopped part way to all of its nodes: the ranks agree
    (each publishes the same), so only the C4 rule `landed` sees it."""
    from hicache.controller import transfers

    before, after = _ticked([End("part", 1), End("part", 1)])
    assert tick_rules(before, after, PAGES_GROUP) is None  # the first node kept, rightly
    with swapped(transfers, "clamped_nodes", lambda group, nodes, landed: len(nodes)):
        before, after = _ticked([End("part", 1), End("part", 1)])
    why = tick_rules(before, after, PAGES_GROUP)
    assert why is not None and "C4 landed" in why and "landed [1, 1]" in why


def test_c4_dropping_the_bad_slot_reason_is_found() -> None:
    with swapped(Agreement, "completion", _completion_without_reasons):
        res = explore_tp(get_config("tp2"))
    assert res.finding is not None and res.finding.kind == "rule", res.finding
    assert "C4 bad slot" in res.finding.message


def test_a_lost_l3_file_kept_to_one_rank_is_found() -> None:
    """An L3 file lost on one rank takes L3 offline on every rank, at the C4 that ends the
    refused op: the rank that found it taking L3 offline alone, at the issue, parts the
    ranks (a second L3 issue would be refused on that rank only, before the op exists)."""

    def issue_here(
        self: Transfers, direction: Any, chain: Any, rid: Any, need: int, parent: Any, *more: Any
    ) -> Any:
        got = ORIGINAL_ISSUE_HERE(self, direction, chain, rid, need, parent, *more)
        if isinstance(got[1], RefusedIssue) and got[1].lost:
            self.l3.take_offline(StorageError("<model L3>", "lost"))
        return got

    with swapped(Transfers, "_issue_here", issue_here):
        res = explore_tp(get_config("tp2"))
    assert res.finding is not None and res.finding.kind == "disagree", res.finding
    assert "L3 online" in res.finding.message and "lost" in str(res.finding.path[-1])


def test_c4_dropping_the_lost_flag_is_found() -> None:
    """C4's sixth value: with it dropped no rank takes L3 offline (the ranks still agree);
    the `lost` rule sees it."""

    def completion(self: Agreement, local: Sequence[Local]) -> list[Agreed]:
        return [(*x[:5], False) for x in ORIGINAL_COMPLETION(self, local)]

    with swapped(Agreement, "completion", completion):
        res = explore_tp(get_config("tp2"))
    assert res.finding is not None and res.finding.kind == "rule", res.finding
    assert "C4 lost" in res.finding.message


def test_lockstep_gives_what_the_thread_group_gives() -> None:
    rows = [(True, 2), (False, 2), (True, 1)]
    group = ThreadGroup(3, timeout_s=5.0)
    threads = group.run(lambda r: Agreement(group.member(r)).reserve(*rows[r]))
    assert lockstep(3, lambda r, agree: agree.reserve(*rows[r])) == threads
    local = [[(True, False, 2, 0, 5, False)], [(False, False, 2, 1, 3, True)]]
    group2 = ThreadGroup(2, timeout_s=5.0)
    threads2 = group2.run(lambda r: Agreement(group2.member(r)).completion(local[r]))
    assert lockstep(2, lambda r, agree: agree.completion(local[r])) == threads2


def test_lockstep_reports_a_skipped_and_a_mismatched_collective() -> None:
    with pytest.raises(CollectiveTimeout, match="skipped"):
        lockstep(2, lambda r, agree: None if r else agree.reserve(True, 1))
    with pytest.raises(CollectiveMismatch):
        lockstep(2, lambda r, agree: agree.completion([(True, False, 1, 0, 0, False)] * (r + 1)))


def test_the_cli_runs_a_tp_config_and_prints_a_finding_with_its_path(tmp_path: Path) -> None:
    manifest = tmp_path / "configs.toml"
    manifest.write_text(
        '[[config]]\nname = "one"\npage_size = 2\ncapacities = [1, 1, 1]\n'
        "prompts = [[1, 2]]\nrequests = 1\nranks = 2\n"
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["--config", "one", "--configs", str(manifest)]) == 0
    assert "(2 ranks)" in out.getvalue() and "exhaustive" in out.getvalue()
    mutant = next(m for m in ZOO if m.name == "TP-conditional")
    out = io.StringIO()
    with mutant.patch(), contextlib.redirect_stdout(out):
        assert main(["--config", "one", "--configs", str(manifest)]) == 1
    text = out.getvalue()
    assert "finding (collective)" in text and "shortest path" in text and "tick" in text


def test_the_cli_refuses_one_plane_options_for_a_tp_config() -> None:
    with pytest.raises(SystemExit) as e, contextlib.redirect_stderr(io.StringIO()) as err:
        main(["--config", "tp2", "--max-depth", "3"])
    assert e.value.code == 2 and "--max-states" in err.getvalue()


def test_the_one_plane_search_refuses_a_config_of_several_ranks() -> None:
    with pytest.raises(ConfigError, match="ranks"):
        explore(get_config("tp2"))


def test_a_tp_config_without_aborts_is_refused(tmp_path: Path) -> None:
    manifest = tmp_path / "configs.toml"
    manifest.write_text(
        '[[config]]\nname = "x"\npage_size = 2\ncapacities = [1, 1, 1]\n'
        "prompts = [[1, 2]]\nrequests = 1\nranks = 2\naborts = false\n"
    )
    with pytest.raises(ConfigError, match="always has faults and aborts"):
        load_configs(manifest)


def test_tp_configs_have_expected_counts_and_two_or_three_ranks() -> None:
    tp = [c for c in load_configs().values() if c.ranks > 1]
    assert {c.ranks for c in tp} == {2, 3}
    assert all(c.expected is not None for c in tp)


def test_tp2_admit_is_exhaustive_and_its_admissions_carry_c4() -> None:
    """tp2-admit: two requests, so a read is in flight when the other request is admitted,
    and C1a carries its end (R85). Exhaustive, clean, the manifest's counts; some admission
    ends an op (the carried C4 is reached, not only offered)."""
    cfg = get_config("tp2-admit")
    lost: list[int] = []

    def seen(state: State) -> None:  # the rule `carried` checks this too; here, every state
        lost.extend(rs.rank for rs in state if not rs.plan_held)

    res = explore_tp(cfg, on_state=seen)
    assert res.finding is None and res.exhaustive
    assert cfg.expected is not None
    assert (res.states, res.edges, res.depth) == (
        cfg.expected.states,
        cfg.expected.edges,
        cfg.expected.depth,
    )
    assert not lost
    # An admission that ends an op in flight: the op is gone on every rank after the step.
    state = initial_state(cfg)
    for step in (
        Step("admit", Action("begin_request", 0, arg=0)),
        Step("plane", Action("compute", 0, arg=2)),
        Step("plane", Action("insert", 0)),
        Step("plane", Action("end_request", 0)),
        Step("issue", Action("issue", None, (1,), "D2H"), ("ok", "ok")),
        Step("land", rank=0, op=1, outcome=End("done")),
        Step("land", rank=1, op=1, outcome=End("done")),
    ):
        state = take(state, cfg, group(cfg.pools), step)
    assert all(1 in rs.cp.ops for rs in state)
    after = take(state, cfg, group(cfg.pools), Step("admit", Action("begin_request", 1, arg=0)))
    assert all(1 not in rs.cp.ops and not rs.ends for rs in after)  # published by C1a


def _carry_then_plan(
    rs: Any, t: Any, request_id: int, m: Any, flying: Any, mine: Any, ends: Any
) -> bool:
    """R85's mutant: the carried ends applied as soon as the match is cut, before the plan
    pins its L3 part (a pin then refused stands for the plan's missing copy)."""
    from hicache.core.tiers import Tier
    from hicache.errors import IllegalTransition
    from hicache.oracle.modelcheck import tpstate

    node = tpstate.planned_l3(rs, m)
    t.apply(flying, mine, ends)
    if node is None:
        return True
    try:
        rs.cp.pin(request_id, node, Tier.L3)
    except IllegalTransition:
        return False
    rs.cp.unpin(request_id, node)
    return True


def test_carried_ends_applied_before_the_plan_pins_its_copy_are_found() -> None:
    """R85: a bad slot that C1a carried drops the L3 copy the admission's agreed L3 hit
    counted when it is applied before the plan pins it. Found on tp2-admit (a read of one
    request meets a bad slot while the other is admitted), by the rule `carried`."""
    from hicache.oracle.modelcheck import tpstate

    with swapped(tpstate, "plan_then_carry", _carry_then_plan):
        res = explore_tp(get_config("tp2-admit"))
    assert res.finding is not None and res.finding.kind == "rule", res.finding
    assert "C1a carried" in res.finding.message
    assert any("bad" in str(s) for s in res.finding.path)
    assert str(res.finding.path[-1]).startswith("begin_request")


def test_c1a_applying_each_ranks_own_ends_is_found() -> None:
    """C1a's carried ends are the column MIN, as C4's: a rank applying the ends it observed
    itself publishes what another rank has not landed, and the ranks part (disagree)."""
    from hicache.distributed.agreement import decode_ends, encode_ends

    original = Agreement.__dict__["admit"]

    def admit(self: Agreement, bounds: Any, own: int, code: int, mask: Any, carried: Any) -> Any:
        hits, rank0, _ = original(self, bounds, own, code, mask, carried)
        return hits, rank0, decode_ends(encode_ends(carried))

    with swapped(Agreement, "admit", admit):
        res = explore_tp(get_config("tp2"))
    assert res.finding is not None and res.finding.kind == "disagree", res.finding
    assert str(res.finding.path[-1]).startswith("begin_request")
