"""Importing an engine (sglang, vLLM) while the repository root is on `sys.path`.

The repository keeps its Triton kernels in a top-level `kernels/` folder (imported by hicache
as `hicache.kernels`, a symlink). A PyPI package is also called `kernels` (Hugging Face's
kernel hub), and transformers -- which sglang and vLLM import -- looks for it lazily:

    transformers/utils/import_utils.py   _is_package_available("kernels"): find_spec, then
                                         the distribution's version, else import_module
    transformers/integrations/hub_kernels.py
                                         if is_kernels_available():
                                             from kernels import CUDAProperties, ...

Whenever the root is importable (`python -m` or `python -c` run from it, `PYTHONPATH=.`,
pytest's default rootdir insertion) `find_spec("kernels")` finds the repository's folder:

- with the real package installed (0.17 on a GPU image) its version check passes and
  `from kernels import CUDAProperties` fails on the repository's folder: ImportError, the
  engine does not import;
- without it, transformers imports the repository's `kernels/__init__.py` as the top-level
  module `kernels` (its "last resort"), and every later `import kernels` in the process gets
  hicache's gather/scatter module.

`engine_import_path()` is the one place that prevents both, for every engine: while the
engine is imported, the entries of `sys.path` that make the root importable are left out;
and before that, the name `kernels` is bound in `sys.modules` to what it means without the
root -- the installed package, or None ("not installed": `import kernels` raises ImportError
and `importlib.util.find_spec` answers None) -- so imports made later, lazily, with the root
back on the path, find the same. hicache never imports the top-level name `kernels` itself.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SHADOWED = ("kernels",)
"""Top-level names of the repository that are also installed packages an engine imports."""

REPO_ROOT = Path(__file__).resolve().parents[3]
"""The directory holding the `hicache` package (and, in a checkout, `kernels/`)."""

CHECKOUT = (REPO_ROOT / "kernels").is_dir() and (REPO_ROOT / "hicache" / "kernels").resolve() == (
    REPO_ROOT / "kernels"
).resolve()
"""Whether hicache runs from a checkout, whose root holds the shadowing folders (installed
as a wheel, REPO_ROOT is site-packages: nothing is shadowed, nothing is left out)."""


def _is_root(entry: str) -> bool:
    """Whether a `sys.path` entry makes the repository root importable ('' is the cwd)."""
    if not CHECKOUT:
        return False
    try:
        return Path(entry or os.getcwd()).resolve() == REPO_ROOT
    except OSError:
        return False


def _from_root(name: str) -> bool:
    """Whether `sys.modules[name]` is the repository's folder of that name."""
    module = sys.modules.get(name)
    if not CHECKOUT:
        return False
    path = getattr(module, "__file__", None)
    return path is not None and Path(path).resolve().is_relative_to(REPO_ROOT / name)


def bind_shadowed() -> None:
    """Bind each SHADOWED name in `sys.modules` to the installed package, or to None when
    none is installed, as `import` would find it without the root on `sys.path`. A name
    bound already to something else than the repository's folder is left alone."""
    saved = list(sys.path)
    sys.path[:] = [e for e in saved if not _is_root(e)]
    try:
        for name in SHADOWED:
            if name in sys.modules and not _from_root(name):
                continue
            for sub in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                del sys.modules[sub]  # the repository's folder, imported by mistake
            importlib.invalidate_caches()
            if importlib.util.find_spec(name) is None:
                sys.modules[name] = None  # type: ignore[assignment]
            else:
                importlib.import_module(name)
            # Verify the name no longer means the repository's folder.
            assert not _from_root(name), f"{name} still imports from {REPO_ROOT}"
    finally:
        sys.path[:] = saved


@contextmanager
def engine_import_path() -> Iterator[None]:
    """Import an engine inside this block: the SHADOWED names are bound first
    (`bind_shadowed`), and the root stays off `sys.path` until the block ends."""
    bind_shadowed()
    saved = list(sys.path)
    sys.path[:] = [e for e in saved if not _is_root(e)]
    try:
        yield
    finally:
        # Whatever the engine appended meanwhile is kept; the root's entries come back.
        sys.path[:] = saved + [e for e in sys.path if e not in saved]
