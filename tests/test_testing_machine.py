"""The fuzz machine of `hicache.testing` in CI: the controller on the null plane (fast) and
the CPU data plane (real bytes), the adapter template's one-tier cache through the same
protocol, and broken caches that the machine must catch, naming the difference."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="needs torch (the controller): pip install -e '.[data]'")

import io
import re

from hypothesis import settings

from hicache.errors import ConfigError
from hicache.testing import EngineConfig, make_machine, template
from hicache.testing.adapters.controller import ControllerAdapter, Setup, controller_adapter, setups
from hicache.testing.draws import configs
from hicache.testing.factory import SHAPES
from hicache.testing.runner import arguments, run
from hicache.testing.runner import fuzz as runner_fuzz

_profile = settings()  # the loaded profile (dev, ci or fuzz)


def _budget(examples: int, steps: int) -> settings:
    """`examples` runs of at most `steps` steps, unless the profile asks for more (fuzz)."""
    return settings(
        _profile,
        max_examples=max(examples, _profile.max_examples)
        if _profile.max_examples >= 1000
        else examples,
        stateful_step_count=steps,
        deadline=None,
    )


NullMachine = make_machine(controller_adapter, setups("null"), name="NullMachine")
NullMachine.TestCase.settings = _budget(60, 50)
TestControllerOnNullPlane = NullMachine.TestCase

TemplateMachine = make_machine(template.factory, configs(SHAPES[:1]), name="TemplateMachine")
TemplateMachine.TestCase.settings = _budget(30, 30)
TestAdapterTemplate = TemplateMachine.TestCase


def fuzz(
    steps: int,
    seed: int = 1,
    plane: str = "null",
    adapter: str | None = None,
    report: bool = False,
    pools: str = "mha",
    tp: int = 1,
    mutant: str | None = None,
    no_shrink: bool = False,
) -> tuple[int, str]:
    args = arguments(
        no_shrink=no_shrink,
        seed=seed,
        steps=steps,
        plane=plane,
        adapter=adapter,
        report=report,
        mutant=mutant,
        pools=pools,
        tp=tp,
    )
    out = io.StringIO()
    return run(args, out), out.getvalue()


def test_a_script_gets_the_run_as_a_record_equal_to_what_it_prints() -> None:
    """`fuzz` hands scripts (benchmarks/tp_fuzz.py, null_plane.py) the counts `hicache fuzz`
    prints, so none parses the summary line; the same seed gives the same digest."""
    result = runner_fuzz(arguments(seed=2, steps=100))
    # At least MIN_RUNS; Hypothesis may make more runs than max_examples (since each run also
    # draws its corruptions, selfcheck.py, seed 2 makes 3 under the CI profile: 50, 5, 50 steps).
    assert result.ok and result.status == 0 and result.runs >= 2
    assert f"{result.runs} runs, {result.steps} steps, {result.events} trace events" in result.text
    assert f"trace digest: {result.digest}" in result.text
    assert runner_fuzz(arguments(seed=2, steps=100)).digest == result.digest
    failed = runner_fuzz(
        arguments(seed=1, steps=400, adapter="hicache.testing.adapters.lru:forgetful_adapter")
    )
    assert not failed.ok and failed.status == 1 and "replay: hicache fuzz --seed 1" in failed.text


def test_the_seed_decides_the_run_however_few_the_steps() -> None:
    """Hypothesis' first example is its simplest, the same for every seed: with one run
    (`--steps` under 100) every seed used to print one digest. A negative seed replayed its
    positive twin (Python's random seeds by |seed|) and is refused."""
    from hicache.app.cli import main

    digests = {runner_fuzz(arguments(seed=s, steps=20)).digest for s in (1, 2, 3)}
    assert len(digests) == 3
    assert main(["fuzz", "--seed", "-1", "--steps", "20"]) == 2


def test_an_adapter_that_cannot_be_loaded_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from hicache.app.cli import main

    for spec, says in [
        ("nonexist.mod:f", "no module nonexist.mod here"),
        ("hicache.testing.adapters.lru:nope", "has no 'nope'"),
        ("hicache.testing.adapters.lru", "give module:factory"),
    ]:
        assert main(["fuzz", "--adapter", spec, "--steps", "20"]) == 2
        assert says in capsys.readouterr().err


def test_the_scripts_arguments_refuse_an_option_hicache_fuzz_lacks() -> None:
    with pytest.raises(ConfigError, match="no option \\['step'\\]"):
        arguments(step=10)


def test_a_forgetful_lru_is_caught_and_the_report_names_the_difference() -> None:
    status, text = fuzz(400, adapter="hicache.testing.adapters.lru:forgetful_adapter")
    assert status == 1
    # The model's tree still holds what the engine dropped unreported: an eviction of
    # everything then frees less than the spec's loop would.
    assert "differential check failed: evict(L1, 10000) freed 0 pages with a leaf left" in text
    # The shrunk steps: the setup, then some rule that admits a prompt.
    assert "state.start(setup=" in text and re.search(
        r"state\.(submit|resubmit|restore_from_l3)\(", text
    )
    assert (
        "replay: hicache fuzz --seed 1 --steps 400 --plane null "
        "--adapter hicache.testing.adapters.lru:forgetful_adapter"
    ) in text


class EvictsThenRefuses(ControllerAdapter):
    """Evicts an L1 page before refusing a prefill for room: what the controller did until a
    refused prefill checked first (a rejected operation leaves no trace)."""

    def prefill(self, request_id: int) -> bool:
        served = super().prefill(request_id)
        if not served:
            self.ctl.evict("L1", 1)
        return served


def evicts_then_refuses(config: EngineConfig) -> EvictsThenRefuses:
    from hicache.oracle.vectors.adapters import controller_setup

    return EvictsThenRefuses(controller_setup(config))


def test_a_refused_prefill_that_evicts_is_caught() -> None:
    # Caught or not is the claim: the run as found, not shrunk (shrinking took 5-35 s).
    status, text = fuzz(
        3000, adapter="tests.test_testing_machine:evicts_then_refuses", no_shrink=True
    )
    assert status == 1 and "differential check failed: page changes of a refused prefill" in text, (
        text[-800:]
    )


def test_the_same_seed_gives_the_same_trace_on_the_null_plane() -> None:
    first, second = fuzz(300, seed=7)[1], fuzz(300, seed=7)[1]
    digest = [line for line in first.splitlines() if line.startswith("trace digest:")]
    assert digest and digest[0] in second.splitlines()
    assert fuzz(300, seed=8)[1].count(digest[0]) == 0  # another seed, another trace


@pytest.mark.torch
def test_the_same_seed_gives_the_same_trace_on_the_cpu_plane() -> None:
    first, second = fuzz(60, seed=3, plane="cpu")[1], fuzz(60, seed=3, plane="cpu")[1]
    digest = [line for line in first.splitlines() if line.startswith("trace digest:")]
    assert digest and digest[0] in second.splitlines(), first


@pytest.mark.torch
def test_the_machine_on_the_cpu_plane() -> None:
    status, text = fuzz(300, seed=2, plane="cpu")
    assert status == 0, text


@pytest.mark.gpu
def test_the_machine_on_cuda() -> None:
    status, text = fuzz(300, seed=2, plane="cuda")
    assert status == 0, text


@pytest.mark.torch
def test_a_pool_group_fuzzes_on_the_cpu_plane_from_the_command_line() -> None:
    """`hicache fuzz --pools dsv4-tiny --plane cpu` runs the group machine on bytes (it was
    refused: "--pools needs the null plane", long after the group planes had bytes), and the
    command-line parser hands both through."""
    from hicache.app.cli import main

    assert (
        main(["fuzz", "--pools", "dsv4-tiny", "--plane", "cpu", "--steps", "60", "--seed", "2"])
        == 0
    )
    status, text = fuzz(60, seed=2, plane="cpu", pools="dsv4-tiny")
    assert status == 0 and "plane cpu:" in text, text


def test_fuzz_tp_drives_simulated_ranks_and_its_replay_names_them() -> None:
    """`--tp 2`: two controller ranks in lockstep (the TP machine), each with its own
    faults; a mutant that breaks the L3 write rule (B16) is caught by I11 and the failure's
    replay line, which carries `--tp 2`, fails the same way when run. A TP run needs the controller,
    not an --adapter, and at least one rank."""
    from hicache.app.cli import main

    status, text = fuzz(100, seed=1, tp=2, pools="dsv4-tiny")
    assert status == 0 and "plane null, 2 ranks:" in text, text
    status, text = fuzz(1000, seed=1, tp=2, mutant="B16", no_shrink=True)
    assert status == 1 and "I11 l3_write_multiplicity" in text, text[-800:]
    assert "fuzz: FAILED with seed 1 on the null plane, 2 ranks" in text
    assert "\nsteps:\n" in text  # as found, not shrunk
    replay = "hicache fuzz --seed 1 --steps 1000 --plane null --tp 2 --mutant B16 --no-shrink"
    assert f"replay: {replay}" in text
    # Verify the replay line runs that failure again (a run with the mutant on, not the zoo,
    # which took --mutant alone and refused --plane): with --mutant, status 0 says caught.
    assert main(replay.split()[1:]) == 0
    assert main(["fuzz", "--tp", "2", "--adapter", "hicache.testing.adapters.lru:lru_adapter"]) == 2
    assert main(["fuzz", "--tp", "0"]) == 2
    assert main(["fuzz", "--pools", "nope"]) == 2


@pytest.mark.parametrize("pools, tp", [("mla", 1), ("dsv4", 1), ("dsv41", 2)])
def test_a_preset_of_pages_the_machine_cannot_draw_is_refused_before_any_run(
    pools: str, tp: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """The machine's prompts come in 4-token pages; a full-size preset's anchor pages are
    64 or 256 tokens. `hicache fuzz --pools mla` used to start, fail in the first setup with
    a ConfigError, and report it as a finding (exit 1, shrunk steps, a replay line that
    fails again): now it is a usage error naming the presets it can run."""
    from hicache.app.cli import main

    assert main(["fuzz", "--pools", pools, "--tp", str(tp), "--steps", "50"]) == 2
    err = capsys.readouterr().err
    assert f"{pools!r} has" in err and "4-token pages" in err and f"{pools}-tiny has" in err, err
    assert "FAILED" not in err


@pytest.mark.torch
def test_fuzz_tp_on_the_cpu_plane_moves_every_ranks_bytes() -> None:
    status, text = fuzz(100, seed=3, plane="cpu", tp=2, pools="dsv4-tiny")
    assert status == 0 and "plane cpu, 2 ranks:" in text, text


@pytest.mark.gpu
def test_fuzz_tp_on_cuda() -> None:
    """Two ranks on CUDA: each its own GPU when there are two, else both on one."""
    status, text = fuzz(300, seed=2, plane="cuda", tp=2, pools="dsv4-tiny")
    assert status == 0, text
    status, text = fuzz(300, seed=2, plane="cuda", tp=2)
    assert status == 0, text


def test_each_rank_on_its_own_gpu_when_there_is_one_per_rank() -> None:
    from hicache.distributed.devices import rank_device

    assert [rank_device("cuda", r, 2, gpus=2) for r in range(2)] == ["cuda:0", "cuda:1"]
    assert [rank_device(None, r, 2, gpus=4) for r in range(2)] == ["cuda:0", "cuda:1"]
    assert [rank_device("cuda", r, 2, gpus=1) for r in range(2)] == ["cuda", "cuda"]
    assert rank_device("cpu", 1, 2, gpus=2) == "cpu" and rank_device(None, 0, 3, gpus=0) is None


def test_a_rank_process_binds_its_own_gpu_and_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    """`bind_device` makes cuda:N the process's current device (what names no device lands on
    the rank's GPU, not GPU 0); the CPU, None and a bare "cuda" are left alone."""
    import torch

    from hicache.distributed.devices import bind_device

    bound: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "set_device", bound.append)
    for device in ("cpu", None, "cuda", "cuda:1"):
        bind_device(device)
    assert bound == [torch.device("cuda:1")]


def test_a_failure_report_keeps_the_steps_when_hypothesis_also_printed_a_warning() -> None:
    """A slow shrink makes Hypothesis print a warning and attach the falsifying steps to the
    exception as notes: the report used to print only the warning and lose the steps."""
    from hicache.testing.runner import _report_failure

    failure = AssertionError("differs")
    failure.add_note("state = CacheMachine()\nstate.tick(finish=1)")
    args = arguments(seed=3, steps=20)
    out = io.StringIO()
    _report_failure(
        out, args, failure, "WARNING: Hypothesis has spent more than five minutes shrinking\n"
    )
    text = out.getvalue()
    assert "five minutes" in text and "state.tick(finish=1)" in text
    assert "replay: hicache fuzz --seed 3 --steps 20 --plane null" in text


def test_progress_says_when_a_run_is_past_its_steps_shrinking(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Past `--steps` the runs are Hypothesis shrinking a failure, which can take minutes:
    the progress line says so instead of counting on as if the budget were wrong."""
    from hicache.testing.runner import Progress

    progress = Progress(total_steps=10, show=True)
    progress.last -= 60  # the next add prints
    progress.steps = 25
    progress.add([], {})
    assert "25/10 steps" in capsys.readouterr().err.splitlines()[-1]
    progress.last -= 60
    progress.add([], {})
    assert "(shrinking a failure)" in capsys.readouterr().err


@pytest.mark.torch
@pytest.mark.parametrize("pools", ["mha", "dsv4-tiny"])
def test_the_fuzz_poisons_every_page_a_reservation_takes_on_bytes(pools: str) -> None:
    """On a plane with bytes the fuzz's adapter fills each L1 and L2 page a reservation takes
    (every pool's) with a poison byte, so a page published before its bytes arrived holds
    bytes no copy holds."""
    from hicache.core.tiers import Tier
    from hicache.testing.adapters.controller import POISON_BYTES

    adapter = ControllerAdapter(Setup(plane="cpu", pools=pools))
    try:
        plane = adapter.ctl.byte_plane
        for tier in (Tier.L1, Tier.L2):
            table = adapter.ctl.cp.tables[list(Tier).index(tier)]
            got = table.reserve(2)
            side = plane.pool_pages(tier, got)  # each byte pool's own pages
            rows = [plane.packed(tier, p.name, side[p.source]) for p in plane.pools.pools]
            for r in rows:
                first = int(r.reshape(-1)[0])
                assert first in POISON_BYTES and bool((r == first).all()), tier
            table.release(got)
    finally:
        adapter.close()


@pytest.mark.torch
def test_a_load_back_published_without_its_bytes_is_caught_though_its_pages_held_the_same() -> None:
    """A prompt leaves L1 and is loaded back into the very L1 pages it left (the allocator
    takes them again), by a load-back that moves nothing and reports DONE. The pages' old
    bytes equal the prompt's, so only the poisoning of reserved pages shows the load-back
    never landed: I4 (L1 against L2) after its publication. Seen passing silently with the
    poisoning switched off (`_poison_reserved` a no-op)."""
    from hicache.core.tiers import Direction
    from hicache.dataplane.handles import ReadyHandle
    from hicache.errors import InvariantViolation

    adapter = ControllerAdapter(Setup(plane="cpu", l1_pages=12, l2_pages=12, l3_slots=12))
    try:
        tokens = tuple(range(100, 117))
        adapter.submit(1, tokens)
        assert adapter.prefill(1)
        adapter.finish(1)
        adapter.drain()
        l1_before = sorted(
            int(p) for n in adapter.ctl.cp.tree.nodes() if (v := n.value[0]) is not None for p in v
        )
        adapter.evict("L1", 10_000)
        plane = adapter.ctl.byte_plane
        plane.h2d = lambda src, dst, **kw: ReadyHandle(Direction.H2D, 0)  # type: ignore[method-assign]
        adapter.submit(2, tokens)
        (op,) = [op for op in adapter.ctl.cp.ops.values() if op.direction is Direction.H2D]
        assert set(op.target_pages.tolist()) <= set(l1_before)  # the pages it left, again
        with pytest.raises(InvariantViolation, match="I4 tier_bytes_equal"):
            adapter.tick()  # observes the load-back DONE and publishes it
    finally:
        adapter.close()


def test_a_prompt_through_a_freed_window_is_never_longer_than_the_longest_drawn() -> None:
    """`free_window` admits the prefix through a node plus a tail; uncut, the next pick of
    that prompt's own node grew it by a page, until L1 refused it (`RequestTooLarge`:
    `hicache fuzz --pools dsv4-tiny --seed 3` failed so once the machine drew differently)."""
    from hicache.testing.machines import LONGEST_TOKENS, through_prompt

    through = tuple(range(LONGEST_TOKENS))
    assert through_prompt(through, 4) == through
    assert through_prompt(through[:8], 3) == (*through[:8], 0, 1, 2)
