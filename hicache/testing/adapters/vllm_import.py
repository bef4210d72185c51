"""Importing vLLM's scheduler-side KV cache parts on a CPU machine, for the vLLM adapters
(hicache/testing/adapters/vllm.py and the adapters built on it).

Everything imported here is pure Python in vLLM 0.33.0: the GPU block pool
(`vllm.v1.core.block_pool.BlockPool`, the prefix cache's blocks, free queue and hash map),
its block hashing (`vllm.v1.core.kv_cache_utils`), and the offloading managers
(`vllm.v1.kv_offload`). None of them touches CUDA; vLLM does not import the `kernels`
package, so the repository's own `kernels/` folder cannot shadow anything here.

vLLM is imported on the first call, never at module import: hicache and its tests run
without it. Missing, the call raises `EngineUnavailable` (sglang_import's, one class for
every engine) with the install line.
"""

from __future__ import annotations

import importlib
from typing import Any

from hicache.testing.adapters.engine_path import engine_import_path
from hicache.testing.adapters.sglang_import import EngineUnavailable

INSTALL = (
    "install it as hicache/testing/adapters/vllm.py's docstring says: "
    "pip install --no-deps -r benchmarks/results/2026-12-05-engine-vllm.txt"
)
HASH_ALGO = "sha256"
"""The prefix-caching hash vLLM uses by default (CacheConfig.prefix_caching_hash_algo)."""

_CACHE: dict[str, Any] = {}


def import_vllm() -> dict[str, Any]:
    """vLLM's block pool, block hashing and offloading classes by name, imported once.
    Raises EngineUnavailable, saying how to install vLLM, when it cannot be imported."""
    if _CACHE:
        return _CACHE
    try:
        with engine_import_path():  # the repository's kernels/ shadows a package (engine_path)
            pool = importlib.import_module("vllm.v1.core.block_pool")
            utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
            hashing = importlib.import_module("vllm.utils.hashing")
            base = importlib.import_module("vllm.v1.kv_offload.base")
            cpu = importlib.import_module("vllm.v1.kv_offload.cpu.manager")
            version = importlib.import_module("vllm.version")
    except ImportError as e:
        raise EngineUnavailable(f"vLLM cannot be imported ({e}); {INSTALL}") from e
    hash_fn = hashing.get_hash_fn_by_name(HASH_ALGO)
    utils.init_none_hash(hash_fn)  # what the engine core does once at startup
    _CACHE.update(
        BlockPool=pool.BlockPool,
        hash_block_tokens=utils.hash_block_tokens,
        hash_fn=hash_fn,
        make_offload_key=base.make_offload_key,
        LookupResult=base.LookupResult,
        ReqContext=base.ReqContext,
        ScheduleEndContext=base.ScheduleEndContext,
        CPUOffloadingManager=cpu.CPUOffloadingManager,
        version=str(version.__version__),
    )
    return _CACHE


def vllm_version() -> str:
    """The installed vLLM's version (raises EngineUnavailable without it)."""
    return str(import_vllm()["version"])
