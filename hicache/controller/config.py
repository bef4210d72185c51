"""CacheConfig: every knob of the controller, validated at construction.

| Name | Default | Description |
| --- | --- | --- |
| geometry | tiny | KV geometry preset or `KVGeometry` |
| l1_pages, l2_pages, l3_slots | 64, 128, 512 | capacity of each tier, in pages |
| device | None | "cuda", "cpu" or None (cuda when available) |
| l3_path | None | L3 file; None: an unlinked temporary file (nothing left on disk, even after a crash). An existing path is used only if it is a hicache L3 file (its slots start empty); a symlink is never followed |
| l3_overwrite | False | let `l3_path` replace an existing regular file that is not a hicache L3 file (never a symlink or a non-regular file) |
| backend | "auto" | gather/scatter kernels: auto, triton, torch |
| policy | "cost" | restore-vs-recompute: cost, always, never, threshold |
| write_policy | "write_through" | write_through (first insert), write_through_selective (second hit), write_back (on L1 eviction) |
| promotion | True | a restore from L3 keeps the promoted pages in L2 |
| prefetch | True | restores overlap decode; False: restores block the request |
| check_mode | "every" | invariant checks: off, every, periodic N |
| verify | True | compare every restored page with the producer's expected bytes |
| load_back_overlap | "share" | a restore whose path meets another request's pending load-back: share (wait for that op) or back_off (SGLang: plan nothing past the L1 hit, recompute) |
| pools | "mha" | pool group preset of every tier (spec/pools.toml; its anchor page size must be the geometry's): a group of several pools keeps anchor pages as the tree's values, its side pools following, and needs a data plane without bytes for now |
| io_threads | 4 | bounded L3 I/O thread pool; 0: deterministic, L3 I/O runs on the polling thread at the first poll after its issue, in issue order (replays of real-byte runs match) |
"""

from __future__ import annotations

from dataclasses import dataclass

from hicache.dataplane.geometry import KVGeometry, preset
from hicache.errors import ConfigError
from hicache.invariants.checker import parse_check_mode
from hicache.pools.presets import group as pool_group

POLICIES = ("cost", "always", "never", "threshold")
WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
BACKENDS = ("auto", "triton", "torch")
LOAD_BACK_OVERLAPS = ("share", "back_off")


@dataclass(frozen=True)
class CacheConfig:
    geometry: KVGeometry | str = "tiny"
    l1_pages: int = 64
    l2_pages: int = 128
    l3_slots: int = 512
    device: str | None = None
    l3_path: str | None = None
    l3_overwrite: bool = False
    backend: str = "auto"
    policy: str = "cost"
    write_policy: str = "write_through"
    promotion: bool = True
    prefetch: bool = True
    check_mode: str = "every"
    verify: bool = True
    io_threads: int = 4
    load_back_overlap: str = "share"
    pools: str = "mha"

    def __post_init__(self) -> None:
        if isinstance(self.geometry, str):
            object.__setattr__(self, "geometry", preset(self.geometry))
        for name in ("l1_pages", "l2_pages", "l3_slots", "io_threads"):
            v = getattr(self, name)
            low = 0 if name == "io_threads" else 1  # 0 threads: the deterministic I/O schedule
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ConfigError(name, f"must be an integer >= {low}, got {v!r}")
        if not isinstance(self.l3_overwrite, bool):
            raise ConfigError("l3_overwrite", f"must be True or False, got {self.l3_overwrite!r}")
        for name, allowed in (("policy", POLICIES), ("write_policy", WRITE_POLICIES), ("backend", BACKENDS),
                              ("load_back_overlap", LOAD_BACK_OVERLAPS)):
            if getattr(self, name) not in allowed:
                raise ConfigError(name, f"one of {', '.join(allowed)}; got {getattr(self, name)!r}")
        if self.device not in (None, "cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise ConfigError("device", f"cpu, cuda or cuda:N; got {self.device!r}")
        parse_check_mode(self.check_mode)  # raises ConfigError naming check_mode
        if self.pools != "mha":
            pool_group(self.pools)  # raises ConfigError naming the preset

    @property
    def kv(self) -> KVGeometry:
        assert isinstance(self.geometry, KVGeometry), "geometry is resolved in __post_init__"
        return self.geometry
