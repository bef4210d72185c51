"""sglang 0.5.23: UnifiedRadixCache.sanity_check() fails while a write-through load-back of a
node split by the match is in flight: "Duplicate missing" with the Python TreeCore, "Full host
coexistence missing" with the default compiled rust_tree_core (both cores are run below).

Found by the fuzz machine (benchmarks/results/2026-12-05-engine-sglang-hicache.md). Only
sglang's own calls: insert a 20-token prompt (write-through backs it up), evict it from the
device, match 19 tokens (the match splits the node at 16), load_back the split node, issue the
load (ready_to_load_host_cache), then sanity_check() before loading_check() observes the ack.
The split node holds both a device and a host value with no load_back_pending_id (that pin is
set under write_back only), so the check expects it in full_host_duplicates; it is registered
only at the ack (finish_load_back). Once the ack is observed the check passes again.

Run (on CUDA as is; on CPU the two stubs hicache/testing/adapters/sglang_hicache_import.py
names are put in first, nothing else of sglang is changed):

    cd /tmp && PYTHONPATH=/path/to/hicache /path/to/venv/bin/python \
        /path/to/hicache/benchmarks/repros/sglang_hicache_duplicate_missing.py
"""

from array import array

import torch

if not torch.cuda.is_available():
    from hicache.testing.adapters.sglang_hicache_import import import_hicache

    import_hicache()  # the torchvision stub, and the two CPU stubs (host buffer, copy)

from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

PS, SIZE = 4, 28
device = "cuda" if torch.cuda.is_available() else "cpu"
args = ServerArgs(
    model_path="dummy", page_size=PS, hicache_io_backend="direct",
    hicache_mem_layout="layer_first", hicache_write_policy="write_through", hicache_ratio=2.0,
)  # fmt: skip
set_global_server_args_for_scheduler(args)


def key(tokens):
    return RadixKey(array("q", tokens))


for core in ("python", "rust"):
    kv = MHATokenToKVPool(
        size=SIZE, page_size=PS, dtype=torch.float32, head_num=1, head_dim=2, layer_num=2,
        device=device, enable_memory_saver=False,
    )  # fmt: skip
    alloc = PagedTokenToKVPoolAllocator(
        size=SIZE, page_size=PS, dtype=torch.float32, device=device, kvcache=kv, need_sort=False
    )
    params = CacheInitParams(
        req_to_token_pool=ReqToTokenPool(4, 64, device, False),
        token_to_kv_pool_allocator=alloc, page_size=PS, disable=False,
        tree_components=(ComponentType.FULL,), tree_core_backend=core,
    )  # fmt: skip
    cache = UnifiedRadixCache(params=params)
    cache.init_hicache(args, params)
    prompt = list(range(1000, 1020))  # 20 tokens, 5 pages
    cache.insert(InsertParams(key=key(prompt), value=alloc.alloc(20)))
    cache.check_hicache_events()  # the write-through is issued ...
    cache.check_hicache_events()  # ... and acknowledged
    cache.evict(EvictParams(num_tokens=20))
    match = cache.match_prefix(MatchPrefixParams(key=key(prompt[:19])))  # splits at 16
    print(f"{core} tree core: host hit {match.host_hit_length}")
    assert cache.load_back(match.best_match_node)
    cache.ready_to_load_host_cache()
    try:
        cache.sanity_check()
        print("  sanity_check passed while the load-back is in flight")
    except AssertionError as e:
        print("  ENGINE BUG reproduced:", str(e).splitlines()[-1].strip())
    cache.check_hicache_events()  # loading_check observes the ack
    cache.sanity_check()
    print("  after the ack: sanity_check passes")
