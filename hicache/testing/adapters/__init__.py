"""Adapters: engines driven through `CacheUnderTest` (controller.py: hicache's controller on
the null, CPU and CUDA planes; lru.py: a plain LRU cache without tiers, the minimal example)."""
