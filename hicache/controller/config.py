"""CacheConfig: every knob of the controller, validated at construction.

The knobs, their defaults and legal values are spec/config.md's table, a checked copy of this
class (`hicache spec check` compares the names and defaults and probes the legal values): a
knob added, renamed or given another default here fails the check until the table says so.
A value outside a knob's legal values raises ConfigError naming the knob.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hicache.choices import (
    EnumField,
    HitPolicy,
    LoadBackOverlap,
    RestorePolicy,
    TransferRoute,
    WritePolicy,
)
from hicache.dataplane.geometry import KVGeometry, preset
from hicache.dataplane.groupgeometry import one_pool
from hicache.dataplane.routes import GROUP_NOT_PITCHED
from hicache.dataplane.taskgroup import IO_THREADS
from hicache.errors import ConfigError
from hicache.invariants.checker import parse_check_mode
from hicache.pools.hits import GROUP_HIT_POLICIES, check_policy, required_pools
from hicache.pools.presets import SINGLE_POOL
from hicache.pools.spec import PoolGroup
from hicache.pools.tierpools import window_pools


def pool_group(name: str) -> PoolGroup:
    """The pool-group preset `name` of spec/pools.toml (`hicache.pools.presets.group`).
    ConfigError naming `pools` for an unknown name."""
    from hicache.pools.presets import group

    try:
        return group(name)
    except ConfigError as e:
        raise ConfigError("pools", str(e).split(": ", 1)[-1]) from None


POLICIES = tuple(RestorePolicy)
WRITE_POLICIES = tuple(WritePolicy)
BACKENDS = ("auto", "triton", "torch")
LOAD_BACK_OVERLAPS = tuple(LoadBackOverlap)
TRANSFER_ROUTES = tuple(TransferRoute)
CHOICES: dict[str, tuple[str, ...]] = {
    "backend": BACKENDS,
    "transfer_route": TRANSFER_ROUTES,
    "policy": POLICIES,
    "write_policy": WRITE_POLICIES,
    "load_back_overlap": LOAD_BACK_OVERLAPS,
    "hit_policy": GROUP_HIT_POLICIES,
}
"""Knob -> its legal values, for the knobs that are one of a list (spec/config.md's `one of:`
rows, compared with these by `hicache spec check`). The enumerated ones are hicache/choices.py's
enums: the field holds the member, set from it or its string (`EnumField`)."""


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
    transfer_route: EnumField[TransferRoute] = EnumField(TransferRoute.AUTO)
    chunk_pages: int | None = None
    policy: EnumField[RestorePolicy] = EnumField(RestorePolicy.COST)
    write_policy: EnumField[WritePolicy] = EnumField(WritePolicy.WRITE_THROUGH)
    promotion: bool = True
    prefetch: bool = True
    layerwise: bool = False
    check_mode: str = "every"
    verify: bool = True
    io_threads: int = IO_THREADS
    load_back_overlap: EnumField[LoadBackOverlap] = EnumField(LoadBackOverlap.SHARE)
    pools: str = SINGLE_POOL
    hit_policy: EnumField[HitPolicy] = EnumField(HitPolicy.ALL_POOLS)
    l1_window_pages: int | None = None
    rank_check_every: int = 0
    quiesce_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        # R77: every knob is validated here; a value outside its legal values is ConfigError.
        if isinstance(self.geometry, str):
            object.__setattr__(self, "geometry", preset(self.geometry))
        for name in ("l1_pages", "l2_pages", "l3_slots", "io_threads", "rank_check_every"):
            v = getattr(self, name)
            # 0 threads: the deterministic I/O schedule; 0 admissions: no cross-rank check.
            low = 0 if name in ("io_threads", "rank_check_every") else 1
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ConfigError(name, f"must be an integer >= {low}, got {v!r}")
        c = self.chunk_pages
        if c is not None and (not isinstance(c, int) or isinstance(c, bool) or c < 1):
            raise ConfigError("chunk_pages", f"None or an integer >= 1, got {c!r}")
        for name in ("l3_overwrite", "promotion", "prefetch", "layerwise", "verify"):
            if not isinstance(getattr(self, name), bool):  # a string "no" is truthy
                raise ConfigError(name, f"must be True or False, got {getattr(self, name)!r}")
        for name, allowed in CHOICES.items():
            if name != "hit_policy" and getattr(self, name) not in allowed:  # hit_policy: below
                raise ConfigError(name, f"one of {', '.join(allowed)}; got {getattr(self, name)!r}")
        if self.device not in (None, "cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise ConfigError("device", f"cpu, cuda or cuda:N; got {self.device!r}")
        parse_check_mode(self.check_mode)  # raises ConfigError naming check_mode
        t = self.quiesce_timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < float("inf"):
            raise ConfigError("quiesce_timeout_s", f"must be a number of seconds > 0, got {t!r}")
        self._check_pools()

    def _check_pools(self) -> None:
        """A group's anchor pages are the tree's pages: same page size; a group the data plane
        keeps as raw bytes has temporary L3 files (one per pool), so no `l3_path`."""
        group = self.group
        check_policy(self.hit_policy)
        required_pools(group, self.hit_policy)  # ConfigError: a group this policy cannot serve
        if self.transfer_route is TransferRoute.PITCHED and group.typed is None:
            raise ConfigError("transfer_route", f"{self.pools!r}: {GROUP_NOT_PITCHED}")
        if self.chunk_pages is not None and group.typed is None:
            raise ConfigError(
                "chunk_pages",
                f"{self.pools!r}: a pool group's transfers are not chunked; leave it None",
            )
        gpu = self.device is not None and self.device.startswith("cuda")
        if self.transfer_route is TransferRoute.MAPPED and gpu and self.backend == "torch":
            raise ConfigError(
                "transfer_route",
                "the mapped route on a GPU is a Triton kernel: backend auto or triton",
            )
        if self.l1_window_pages is not None:
            v = self.l1_window_pages
            if not window_pools(group):
                raise ConfigError(
                    "l1_window_pages",
                    f"{self.pools!r} has no trailing side pool (pools = dsv4-tiny, ...)",
                )
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= self.l1_pages:
                raise ConfigError(
                    "l1_window_pages", f"an integer in 1..l1_pages ({self.l1_pages}); got {v!r}"
                )
        if group.anchor.page_size != self.kv.page_size:
            raise ConfigError(
                "pools",
                page_size_advice(str(self.pools), group.anchor.page_size, self.kv.page_size),
            )
        if self.l3_path is not None and group.typed is None:
            raise ConfigError(
                "l3_path",
                f"a pool group ({self.pools!r}) keeps one temporary L3 "
                "file per pool; leave l3_path unset (R55)",
            )

    @property
    def group(self) -> PoolGroup:
        """The pool group `pools` names. `mha` is the geometry's group of one (`one_pool`: its
        pool at the geometry's sizes); a preset that is that same pool is typed by the
        geometry too (`PoolGroup.typed`); every other group holds raw bytes."""
        one = one_pool(self.kv)
        if self.pools == SINGLE_POOL:
            return one
        named = pool_group(self.pools)
        if named.pools == one.pools:
            return dataclasses.replace(named, typed=one.typed)
        return named

    RANK_LOCAL = (
        "device",
        "l3_path",
        "l3_overwrite",
        "backend",
        "transfer_route",
        "chunk_pages",
        "check_mode",
        "verify",
        "io_threads",
    )
    """Fields a tensor-parallel rank may set for itself (where its bytes live and how it
    checks them); every other field is in `fingerprint()`."""

    def fingerprint(self) -> dict[str, object]:
        """The fields every rank of a tensor-parallel cache must share (spec/tp.md C0), by
        name: all but RANK_LOCAL, the geometry as its sizes."""
        out: dict[str, object] = {}
        for f in dataclasses.fields(self):
            if f.name not in self.RANK_LOCAL:
                out[f.name] = getattr(self, f.name)
        return out

    @property
    def l1_request_pages(self) -> int:
        """The most pages one request may compute in L1: `l1_pages`, or fewer when L1 holds
        fewer windows (each computed page takes its window)."""
        return min(self.l1_pages, self.l1_window_pages or self.l1_pages)

    @property
    def pool_capacities(self) -> dict[str, dict[str, int]] | None:
        """Side-pool capacities that differ from the default (the tier's * ratio): the
        trailing side pools of L1 when `l1_window_pages` is set; None otherwise."""
        group = self.group
        if self.l1_window_pages is None:
            return None
        return {
            "L1": {name: self.l1_window_pages * group.ratio(name) for name in window_pools(group)}
        }

    def page_bytes(self) -> dict[str, int]:
        """Bytes of one own page per backed-up pool, by pool name (the single pool's: the
        geometry's page): the unit the L3 write ledger counts bytes in."""
        return {p.name: p.bytes_per_page for p in self.group.backed_up().pools}

    @property
    def kv(self) -> KVGeometry:
        assert isinstance(self.geometry, KVGeometry), "geometry is resolved in __post_init__"
        return self.geometry


def page_size_advice(pools: str, anchor_tokens: int, geometry_tokens: int) -> str:
    """Why pool group `pools` (anchor pages of `anchor_tokens`) cannot run on a geometry of
    `geometry_tokens`-token pages, and what can: the geometry presets of the anchor's page
    size, else the groups that fit the geometry and the Python way to a geometry of that size
    (no preset has 64- or 256-token pages)."""
    from hicache.dataplane.geometry import PRESETS
    from hicache.pools.presets import load_presets

    said = (
        f"{pools!r} has {anchor_tokens}-token anchor pages, the geometry "
        f"{geometry_tokens}-token pages"
    )
    fits = sorted(n for n, g in PRESETS.items() if g.page_size == anchor_tokens)
    if fits:
        return (
            f"{said}; choose --geometry {' or '.join(fits)} (a geometry of the anchor's page size)"
        )
    groups = sorted(n for n, g in load_presets().items() if g.anchor.page_size == geometry_tokens)
    return (
        f"{said}, and no geometry preset has {anchor_tokens}-token pages; on this geometry "
        f"choose a group of {geometry_tokens}-token anchor pages ({', '.join(groups)}), or, "
        f"from Python, CacheConfig(geometry=KVGeometry(page_size={anchor_tokens}, ...), "
        f"pools={pools!r})"
    )
