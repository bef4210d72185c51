"""Building SGLang's hierarchical cache (UnifiedRadixCache with HiCache on) on a CPU machine,
for hicache/testing/adapters/sglang_hicache.py.

What runs unmodified on CPU: the tree (`UnifiedRadixCache` over sglang's Python TreeCore, or
the compiled `rust_tree_core`), the HiCache controller (`HybridCacheController` over
`HiCacheController`: write/load queues, acks, host-pool accounting), the host pool
(`MHATokenToKVPoolHost` in a `HostPoolGroup`) and the transfer engine (`L2TransferEngine`):
sglang picks `torch.cpu` as its device module there (utils/common.py `get_device_module`),
whose `Stream` and `Event` are synchronous. Two things stop it, each replaced by a STUB at a
seam the code itself has:

    where (sglang 0.5.23)                   the call and the error         the STUB
    --------------------------------------  -----------------------------  --------------------
    mem_cache/pool_host/common.py:349       alloc_with_host_register ->    a "cpu" entry in
    (ALLOC_MEMORY_FUNCS, :453, keyed by     _cuda_host_register (:147)     the same table: the
    device type; npu/musa/xpu have their    torch.cuda.cudart():           host buffer unpinned
    own entries)                            "AssertionError: Torch not     (torch.zeros)
                                            compiled with CUDA enabled"
    mem_cache/pool_host/mha.py:60-89        transfer_kv_direct is bound    transfer_kv_direct:
    (the transfer ops, bound per platform:  only on CUDA/HIP/XPU: on CPU   the same contract
    sgl_kernel.kvcacheio on CUDA/HIP,       `NameError: name               in torch (dst[i] =
    pool_host/_kvcacheio on XPU)            'transfer_kv_direct' is not    src[i] per layer)
                                            defined` at the first backup

The host pool's layout is `layer_first` and the io backend `direct` (the pair
transfer_kv_direct serves; `page_first`, the default layout, needs the `kernel` backend's
sgl_kernel ops). L3 (`--hicache-storage-backend file`, HiCacheFile) is not driven: its
prefetch and backup run on four background threads (managers/cache_controller.py
`_start_storage_threads`) whose interleaving the fuzz machine cannot order.
"""

from __future__ import annotations

import importlib
from typing import Any

from hicache.testing.adapters.sglang_import import EngineUnavailable, import_radix_cache


def _alloc_unpinned(
    dims: tuple[int, ...],
    dtype: Any,
    device: str,
    pin_memory: bool,
    allocator: Any,
    registration_granularity_bytes: int | None = None,
) -> Any:
    """STUB for pool_host/common.py's `alloc_with_host_register` on CPU: the host buffer,
    not registered with CUDA (there is none), zeroed."""
    import torch

    return torch.zeros(dims, dtype=dtype, device=device)


def _transfer_kv_direct(
    src_layers: list[Any], dst_layers: list[Any], src_indices: Any, dst_indices: Any, page_size: int
) -> None:
    """STUB for sgl_kernel.kvcacheio's transfer_kv_direct: per layer, the token rows
    `src_indices` of the source land at `dst_indices` of the destination."""
    # Verify the two sides pair up, as the kernel does before copying.
    assert len(src_layers) == len(dst_layers) and len(src_indices) == len(dst_indices)
    for source, target in zip(src_layers, dst_layers, strict=True):
        target[dst_indices] = source[src_indices]


def import_hicache() -> dict[str, Any]:
    """sglang's hierarchical cache classes by name, with the CPU STUBs above in place.
    EngineUnavailable (saying how to install sglang) when it cannot be imported."""
    import_radix_cache()  # the torchvision stub and the kernels shadowing (engine_path)
    try:
        common = importlib.import_module("sglang.srt.mem_cache.pool_host.common")
        mha = importlib.import_module("sglang.srt.mem_cache.pool_host.mha")
        urc = importlib.import_module("sglang.srt.mem_cache.unified_radix_cache")
        pool = importlib.import_module("sglang.srt.mem_cache.memory_pool")
        base = importlib.import_module("sglang.srt.mem_cache.unified_cache.components.base")
        server_args = importlib.import_module("sglang.srt.server_args")
    except ImportError as e:
        raise EngineUnavailable(
            f"sglang's UnifiedRadixCache cannot be imported ({e}); install it as "
            "hicache/testing/adapters/sglang_hicache.py's docstring says"
        ) from e
    common.ALLOC_MEMORY_FUNCS["cpu"] = _alloc_unpinned
    if not hasattr(mha, "transfer_kv_direct"):  # bound only on CUDA/HIP/XPU
        mha.transfer_kv_direct = _transfer_kv_direct  # type: ignore[attr-defined]
    return {
        "UnifiedRadixCache": urc.UnifiedRadixCache,
        "MHATokenToKVPool": pool.MHATokenToKVPool,
        "ReqToTokenPool": pool.ReqToTokenPool,
        "ComponentType": base.ComponentType,
        "ServerArgs": server_args.ServerArgs,
        "set_server_args": server_args.set_global_server_args_for_scheduler,
    }
