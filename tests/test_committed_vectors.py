"""The committed conformance vectors (spec/vectors/) are what the reference generates today:
a port in another language runs them without running the reference, so they must not drift."""

from __future__ import annotations

from pathlib import Path

from hicache.app.cli import main
from hicache.oracle.vectors.adapters import controller
from hicache.oracle.vectors.run import run_dir

COMMITTED = Path(__file__).resolve().parent.parent / "spec" / "vectors"
REGENERATE = "rm -r spec/vectors && hicache vectors generate spec/vectors"


def test_committed_vectors_are_what_the_reference_generates(tmp_path: Path) -> None:
    assert main(["vectors", "generate", str(tmp_path)]) == 0
    fresh = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    committed = {p.name: p.read_bytes() for p in COMMITTED.iterdir()}
    assert sorted(committed) == sorted(fresh), f"files differ; rewrite them with `{REGENERATE}`"
    stale = sorted(name for name in fresh if fresh[name] != committed[name])
    assert not stale, f"{stale} differ from what the reference generates; `{REGENERATE}`"


def test_committed_vectors_pass_on_the_reference_controller() -> None:
    verdicts = run_dir(COMMITTED, controller)
    assert len(verdicts) == 48
    assert [v.line() for v in verdicts if v.status != "PASS"] == []
