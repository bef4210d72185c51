"""Importing SGLang's cache modules on a CPU machine, for hicache/testing/adapters/sglang.py.

`sglang.srt.mem_cache.radix_cache` reaches (through
`sglang.srt.configs`) multimodal modules that import torchvision at module level, and no
torchvision build matches the system's CPU torch. `import_radix_cache` therefore puts a
clearly labelled stub finder for `torchvision*` on `sys.meta_path` for the duration of that
one import (after transformers has recorded that torchvision is absent, so nothing takes it
for a real one), then removes the finder. No cache code touches torchvision.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

from hicache.errors import HiCacheError
from hicache.testing.adapters.engine_path import engine_import_path


class EngineUnavailable(HiCacheError):
    """The engine's package cannot be imported here."""


# -- importing sglang's cache modules -------------------------------------------------------


class _Anything:
    """STUB (torchvision is not installed): any attribute, call or subscript gives another
    stub, so module-level `T.Compose`, `InterpolationMode.BICUBIC` and the like import."""

    def __init__(self, *args: Any, **kwargs: Any) -> None: ...

    def __call__(self, *args: Any, **kwargs: Any) -> _Anything:
        return _Anything()

    def __getattr__(self, name: str) -> _Anything:
        return _Anything()


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()


class _TorchvisionStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """STUB finder for `torchvision` and its submodules, on `sys.meta_path` only while
    `import_radix_cache` imports sglang (see the module docstring)."""

    def find_spec(
        self, name: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _StubModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []


def _transformers_checks_torchvision() -> None:
    """Let transformers look for torchvision (and cache the answer: absent) while no stub is
    on `sys.meta_path`; without transformers, the sglang import below says what is missing."""
    try:
        utils = importlib.import_module("transformers.utils.import_utils")
    except ImportError:
        return
    utils.is_torchvision_available()


def import_radix_cache() -> dict[str, Any]:
    """sglang's cache classes by name (RadixCache, RadixKey, CacheInitParams, the params
    types and PagedTokenToKVPoolAllocator). Raises EngineUnavailable, saying how to
    install sglang, when it cannot be imported."""
    stub = _TorchvisionStub()
    try:
        with engine_import_path():  # the repository's kernels/ shadows a package (engine_path)
            # transformers records "torchvision absent" before the stub exists
            _transformers_checks_torchvision()
            sys.meta_path.insert(0, stub)
            radix = importlib.import_module("sglang.srt.mem_cache.radix_cache")
            base = importlib.import_module("sglang.srt.mem_cache.base_prefix_cache")
            params = importlib.import_module("sglang.srt.mem_cache.cache_init_params")
            paged = importlib.import_module("sglang.srt.mem_cache.allocator.paged")
    except ImportError as e:
        raise EngineUnavailable(
            f"sglang's RadixCache cannot be imported ({e}); install it as "
            "hicache/testing/adapters/sglang.py's docstring says"
        ) from e
    finally:
        if stub in sys.meta_path:
            sys.meta_path.remove(stub)
    return {
        "RadixCache": radix.RadixCache,
        "RadixKey": radix.RadixKey,
        "CacheInitParams": params.CacheInitParams,
        "MatchPrefixParams": base.MatchPrefixParams,
        "InsertParams": base.InsertParams,
        "EvictParams": base.EvictParams,
        "Allocator": paged.PagedTokenToKVPoolAllocator,
    }


def sglang_version() -> str:
    """The installed sglang's version (raises EngineUnavailable without it)."""
    import_radix_cache()
    return str(importlib.import_module("sglang.version").__version__)
