"""The repository's top-level `kernels/` folder must not shadow the installed `kernels`
package an engine imports (hicache/testing/adapters/engine_path.py). Each case runs a fresh
interpreter from the repository root, as `python -m pytest` and `hicache fuzz` from the root
do, with a stand-in for the installed package (a distribution `kernels` 0.17.0, the version
transformers accepts) on PYTHONPATH."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hicache.testing.adapters.engine_path import CHECKOUT, REPO_ROOT

pytestmark = pytest.mark.skipif(not CHECKOUT, reason="only a checkout has kernels/ at its root")

FAKE_KERNELS = '''
"""Stand-in for the installed `kernels` package (Hugging Face's kernel hub)."""
INSTALLED = True


def _decorator(*args, **kwargs):
    # what a decorator factory returns: it keeps what it decorates
    return args[0] if len(args) == 1 and callable(args[0]) else _decorator


def _factory(*args, **kwargs):
    return _decorator


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _factory
'''

ENGINE = '''
"""A stand-in engine that imports the `kernels` package at import and again lazily."""
from kernels import CUDAProperties


def later():
    from kernels import INSTALLED
    return INSTALLED
'''


def _site(tmp_path: Path, installed: bool) -> Path:
    site = tmp_path / "site"
    (site / "fakeengine").mkdir(parents=True)
    (site / "fakeengine" / "__init__.py").write_text(ENGINE)
    if installed:
        (site / "kernels").mkdir()
        (site / "kernels" / "__init__.py").write_text(FAKE_KERNELS)
        info = site / "kernels-0.17.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kernels\nVersion: 0.17.0\n")
    return site


def _run_from_root(site: Path, script: str) -> subprocess.CompletedProcess[str]:
    """`python -c script` from the repository root ('' first on sys.path), `site` after it."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO_ROOT)]))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_from_the_root_the_folder_shadows_the_package(tmp_path: Path) -> None:
    """The failure the helper exists for: a bare import from the root gets the folder."""
    got = _run_from_root(_site(tmp_path, installed=True), "import fakeengine")
    assert got.returncode != 0
    assert "cannot import name 'CUDAProperties' from 'kernels'" in got.stderr


def test_an_engine_imported_through_the_helper_gets_the_package(tmp_path: Path) -> None:
    got = _run_from_root(
        _site(tmp_path, installed=True),
        """
        import sys, kernels as shadow  # the folder, imported by mistake first
        from hicache.testing.adapters.engine_path import engine_import_path
        with engine_import_path():
            import fakeengine
        assert '' in sys.path or any(p.endswith('site') for p in sys.path)
        # a lazy import later, with the root back on sys.path, finds the package too
        print(fakeengine.later(), sys.modules['kernels'].__file__)
        import hicache.kernels
        print(hicache.kernels.__file__)
        """,
    )
    assert got.returncode == 0, got.stderr
    lazy, package, ours = got.stdout.split()
    assert lazy == "True" and package.endswith("site/kernels/__init__.py")
    assert Path(ours).resolve() == (REPO_ROOT / "kernels" / "__init__.py").resolve()


def test_without_the_package_the_name_is_not_found_at_all(tmp_path: Path) -> None:
    got = _run_from_root(
        _site(tmp_path, installed=False),
        """
        import importlib.util
        from hicache.testing.adapters.engine_path import bind_shadowed
        bind_shadowed()
        print(importlib.util.find_spec('kernels'))
        try:
            import kernels
        except ImportError:
            print('ImportError')
        """,
    )
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["None", "ImportError"]


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang not installed")
def test_sglang_imports_from_the_root_beside_an_installed_kernels(tmp_path: Path) -> None:
    """transformers takes the stand-in 0.17.0 for the hub package and imports
    `CUDAProperties` from `kernels`: from the root that failed before the helper."""
    got = _run_from_root(
        _site(tmp_path, installed=True),
        """
        import sys
        from hicache.testing.adapters.sglang_import import import_radix_cache
        import_radix_cache()
        from transformers.utils.import_utils import is_kernels_available
        print(is_kernels_available(), sys.modules['kernels'].__file__)
        """,
    )
    assert got.returncode == 0, got.stderr[-2000:]
    available, package = got.stdout.split()[-2:]
    assert available == "True" and package.endswith("site/kernels/__init__.py")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")
def test_vllm_imports_from_the_root_without_taking_the_folder_for_the_package(
    tmp_path: Path,
) -> None:
    """vLLM imports transformers too: from the root, without the hub package installed,
    transformers took the repository's kernels/ for it (`sys.modules['kernels']` was hicache's
    gather/scatter module) before vllm_import used the helper."""
    got = _run_from_root(
        _site(tmp_path, installed=False),
        """
        import sys
        from hicache.testing.adapters.vllm_import import import_vllm
        import_vllm()
        from transformers.utils.import_utils import is_kernels_available
        print(is_kernels_available(), sys.modules.get('kernels'))
        """,
    )
    assert got.returncode == 0, got.stderr[-2000:]
    assert got.stdout.split()[-2:] == ["False", "None"], got.stdout
