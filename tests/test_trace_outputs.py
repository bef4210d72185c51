"""Every trace hicache writes passes `check-trace`: `hicache demo --trace FILE` and `hicache
fuzz --trace FILE` (spec/trace.md; the options in hicache/app/demo.py and
hicache/testing/runner.py), and every engine's trace of every run of a short fuzz."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="needs torch (the controller): pip install -e '.[data]'")

import contextlib
import io
from itertools import pairwise
from pathlib import Path
from typing import Any, ClassVar

from hicache.app import demo
from hicache.core.trace import TraceEvent, TraceHeader
from hicache.oracle.checktrace import check_lines
from hicache.testing import EngineConfig, runner
from hicache.testing.adapters.controller import ControllerAdapter

SEEDS, STEPS = (1, 2, 3), 300  # about 2 s each on the null plane


def fuzz(seed: int, trace: Path | None, steps: int = STEPS, **more: Any) -> tuple[int, str]:
    result = runner.fuzz(
        runner.arguments(
            seed=seed, steps=steps, trace=None if trace is None else str(trace), **more
        )
    )
    return result.status, result.text


def check_file(path: Path) -> Any:
    with open(path) as f:
        return check_lines(f)


@pytest.mark.torch  # the demo runs the CPU data plane
def test_the_demo_trace_passes_check_trace(tmp_path: Path) -> None:
    path = tmp_path / "demo.ndjson"
    with contextlib.redirect_stdout(io.StringIO()):
        # L1 smaller than the working set: restores from L2 and from L3 (about 600 events).
        assert (
            demo.main(
                ["--device", "cpu", "--requests", "40", "--l1-pages", "60", "--trace", str(path)]
            )
            == 0
        )
    lines = path.read_text().splitlines()
    header = TraceHeader.from_json(lines[0])
    assert header.capacities["L1"] == 60 and header.engine == "hicache demo"
    # Verify the trace has the run's backups, restores and evictions, not only admissions.
    names = {TraceEvent.from_json(line).event for line in lines[1:]}
    assert {
        "d2h_complete",
        "h2s_complete",
        "s2h_complete",
        "h2d_complete",
        "lock",
        "evict_l2",
    } <= names
    verdict = check_file(path)
    assert (verdict.exit_code, verdict.events) == (0, len(lines) - 1), verdict.message


def test_the_demo_refuses_a_trace_path_it_cannot_write(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        demo.main(["--trace", "/nonexistent-dir/t.ndjson"])
    assert done.value.code == 2
    assert capsys.readouterr().err.startswith(
        "hicache demo: error: argument --trace: /nonexistent-dir/t.ndjson: "
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_the_fuzz_trace_passes_check_trace(tmp_path: Path, seed: int) -> None:
    path = tmp_path / "fuzz.ndjson"
    status, text = fuzz(seed, path)
    assert status == 0, text
    lines = path.read_text().splitlines()
    assert f"trace: {path} ({len(lines) - 1} events of the last run" in text
    assert TraceHeader.from_json(lines[0]).engine == "hicache controller (fuzz machine)"
    verdict = check_file(path)
    assert (verdict.exit_code, verdict.events) == (0, len(lines) - 1), verdict.message


class EveryEngine(runner.Progress):
    """Progress that checks every engine's trace of every run with `check_lines`."""

    verdicts: ClassVar[list[tuple[int, int, str]]] = []  # shared: runner builds the instance

    def add(self, events: Any, fired: Any) -> None:
        events = list(events)
        super().add(events, fired)
        assert self.last_trace is not None and self.last_trace.header is not None
        header = self.last_trace.header.to_json()
        starts = [i for i, e in enumerate(events) if e.seq == 1] + [len(events)]
        for a, b in pairwise(starts):
            v = check_lines([header, *(e.to_json() for e in events[a:b])])
            self.verdicts.append((v.exit_code, v.events, v.message))


def test_every_engine_of_every_fuzz_run_writes_a_trace_check_trace_accepts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "Progress", EveryEngine)
    EveryEngine.verdicts = []
    status, text = fuzz(4, tmp_path / "fuzz.ndjson", steps=600)
    assert status == 0, text
    assert len(EveryEngine.verdicts) >= 10  # runs, and the engines restarts and crashes opened
    assert [v for v in EveryEngine.verdicts if v[0] != 0] == []
    assert sum(v[1] for v in EveryEngine.verdicts) >= 1000


class LyingAdapter(ControllerAdapter):
    """The controller, but it reports one token more of `cached_len` once a prefix of two
    pages is served: the machine's differential check fails on the first such prefill."""

    def cached_len(self, request_id: int) -> int:
        n = super().cached_len(request_id)
        return n + 1 if n >= 8 else n


def lying_adapter(config: EngineConfig) -> LyingAdapter:
    from hicache.oracle.vectors.adapters import controller_setup

    return LyingAdapter(controller_setup(config))


def test_on_a_failure_the_fuzz_trace_is_the_shrunk_failing_run(tmp_path: Path) -> None:
    path = tmp_path / "fail.ndjson"
    status, text = fuzz(1, path, steps=400, adapter=f"{__name__}:lying_adapter")
    assert status == 1 and "cached_len after prefill: engine 9, reference 8" in text, text
    # Verify the file is the run Hypothesis shrank to and printed: one submit of that prompt.
    shrunk = [line for line in text.splitlines() if "state.submit(" in line]
    assert len(shrunk) == 1, text
    events = [TraceEvent.from_json(line) for line in path.read_text().splitlines()[1:]]
    begun = [e for e in events if e.event == "begin_request"]
    assert len(begun) == 1 and f"tokens={tuple(begun[0].detail['prompt'])}" in shrunk[0]  # type: ignore[arg-type]
    assert f"trace: {path} ({len(events)} events of the last run)" in text
    assert check_file(path).exit_code == 0  # the controller under the lie is correct


def test_last_trace_keeps_the_last_engine_of_the_last_run() -> None:
    """A run that restarted its engine traced each engine from seq 1: the file holds the last."""

    class Adapter:
        def trace_header(self) -> TraceHeader:
            return TraceHeader(4, {"L1": 2})

    last = runner.LastTrace("unused")
    last.factory(lambda setup: Adapter())(None)
    first = [TraceEvent(1, "begin_request", request=1), TraceEvent(2, "end_request", request=1)]
    second = [TraceEvent(1, "begin_request", request=5)]
    last.keep(first + second)
    assert (last.events, last.engines, last.header) == (second, 2, TraceHeader(4, {"L1": 2}))
    last.keep([])
    assert (last.events, last.engines) == ([], 1)


def test_fuzz_trace_needs_an_adapter_with_a_header(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "lru.ndjson"
    argv = [
        "--seed",
        "1",
        "--steps",
        "30",
        "--trace",
        str(path),
        "--adapter",
        "hicache.testing.adapters.lru:lru_adapter",
    ]
    assert runner.main(argv) == 2
    assert "--trace: the adapter has no trace_header()" in capsys.readouterr().err
    assert not path.exists()  # nothing written (the path was tried, not emptied)
    with pytest.raises(SystemExit) as done:
        runner.main(["--trace", str(tmp_path / "no" / "such" / "dir")])
    assert done.value.code == 2
    assert "choose a writable path" in capsys.readouterr().err


def test_the_replay_line_keeps_the_trace_option() -> None:
    args = runner.arguments(seed=3, steps=50, trace="t.ndjson")
    assert runner.replay_command(args).endswith("--trace t.ndjson")
