"""Without an optional dependency, commands say what to install (one line, exit 2), and the
CPU data plane runs without Triton."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hicache.app import cli
from hicache.app.cli import main
from hicache.app.extras import install_hint, is_optional


def _without(module: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run `hicache ARGV` in a fresh interpreter in which `module` cannot be imported."""
    probe = (
        f"import sys; sys.modules[{module!r}] = None\n"
        f"from hicache.app.cli import main\nsys.exit(main({argv!r}))"
    )
    return subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )


def test_demo_without_torch_says_what_to_install() -> None:
    done = _without("torch", ["demo"])
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert "hicache.app.demo needs torch" in done.stderr
    assert "pip install torch" in done.stderr and "'.[data]'" in done.stderr


def test_a_bench_without_torch_says_what_to_install() -> None:
    done = _without("torch", ["bench", "transfer"])
    assert done.returncode == 2 and "pip install -e '.[data]'" in done.stderr, done.stderr


def test_the_kernel_bench_without_triton_says_what_to_install() -> None:
    pytest.importorskip("torch")  # without torch, torch is what is missing first
    done = _without("triton", ["bench", "kernels"])
    assert done.returncode == 2 and "pip install -e '.[gpu]'" in done.stderr, done.stderr


def test_missing_modules_met_while_running_are_explained_only_if_optional(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class Module:
        missing = "torch.cuda"

        @staticmethod
        def main(argv: list[str]) -> int:
            raise ModuleNotFoundError(f"No module named {Module.missing!r}", name=Module.missing)

    monkeypatch.setitem(sys.modules, "hicache_test_fake_command", Module)
    monkeypatch.setitem(cli.DELEGATED, ("demo",), "hicache_test_fake_command")
    assert main(["demo"]) == 2
    assert capsys.readouterr().err == (
        "hicache: error: " + install_hint("hicache_test_fake_command", "torch") + "\n"
    )
    Module.missing = "hicache_no_such_internal_module"  # a bug, not a missing extra
    with pytest.raises(ModuleNotFoundError):
        main(["demo"])


def test_which_modules_are_optional() -> None:
    assert is_optional("torch") and is_optional("triton.language")
    assert is_optional("transformers") and not is_optional("numpy")
    assert not is_optional(None) and not is_optional("hicache.core.tree")
    assert install_hint("x", "transformers.models").endswith(
        "pip install -e '.[model]' from a checkout"
    )


def test_cpu_kernels_need_no_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backend "auto" on CPU picks torch when Triton cannot be imported, so the `data` extra
    leaves Triton out."""
    torch = pytest.importorskip("torch")
    import hicache.kernels
    from hicache.kernels import KernelSet

    # As if triton were not installed, even if an earlier test imported the Triton kernels.
    monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.delitem(sys.modules, "hicache.kernels.triton_rows", raising=False)
    monkeypatch.delattr(hicache.kernels, "triton_rows", raising=False)
    l1 = torch.zeros((2, 1, 4, 16, 1, 8), dtype=torch.float16)
    chosen = KernelSet.create(l1, "auto")
    assert (chosen.gather_backend, chosen.scatter_backend) == ("torch", "torch")
    assert "triton is not importable" in chosen.reason


SHADOW = 'raise ModuleNotFoundError("No module named {0!r}", name={0!r})\n'


@pytest.mark.skipif(
    os.environ.get("HICACHE_WITHOUT_TORCH") == "1", reason="this is the run without torch"
)
def test_the_suite_passes_without_torch(tmp_path: Path) -> None:
    """The README's test command on a machine without torch: every test that needs it skips
    itself (module-level importorskip or the `torch` marker) and the rest pass. torch and
    triton are shadowed by packages that fail to import, on PYTHONPATH, so the subprocesses
    the tests start lack them too; a new test that forgets to say it needs torch fails here."""
    for module in ("torch", "triton"):
        (tmp_path / module).mkdir()
        (tmp_path / module / "__init__.py").write_text(SHADOW.format(module))
    env = {
        **os.environ,
        "HICACHE_WITHOUT_TORCH": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "tests"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env=env,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = done.stdout.splitlines()[-1]
    assert " passed" in summary and " skipped" in summary, summary
