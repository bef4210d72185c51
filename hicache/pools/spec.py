"""One pool of a group, and the group: the vocabulary of spec/pools.md.

A tier holds a *pool group*. Exactly one pool is the **anchor**: its page indices are the
tree's identity (a node's value in a tier is anchor pages). The other pools are

    role        allocator  indices                 what it is
    ----------  ---------  ----------------------  -------------------------------------------
    anchor      yes        its own                 the tree's index space (may hold no bytes)
    allocating  yes        its own                 a side pool with its own free list (swa)
    sidecar     no         its source's            bytes on the source's indices (c4, c128)
    state       no         its source's            rolling state on an allocating pool's
                                                   indices; refuses alloc/free/available

A derived pool (sidecar or state) never allocates and is never released on its own: it takes
its source's indices, and it is released exactly once, through its source. So a group
reservation is one reservation per *allocating* pool (the anchor included), and everything
else follows.

Hit policies: `ALL_PAGES` -- every page up to the hit must be present; `TRAILING_PAGES` --
only the `window_pages` pages before the hit's endpoint must be (the legal endpoints are a
set, not a prefix).

Byte sizes: a pool's page holds `layers * rows_per_layer` rows of `row_bytes` bytes each
(MHA: 2 rows a layer, K and V; MLA: 1 latent row). An anchor may hold no bytes (`layers = 0`).
`guesses` names the fields whose values no source states (spec/pools.toml marks them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hicache.errors import ConfigError

ANCHOR = "anchor"
ALLOCATING = "allocating"
SIDECAR = "sidecar"
STATE = "state"
ROLES = (ANCHOR, ALLOCATING, SIDECAR, STATE)
ALLOCATOR_ROLES = (ANCHOR, ALLOCATING)

ALL_PAGES = "ALL_PAGES"
TRAILING_PAGES = "TRAILING_PAGES"
HIT_POLICIES = (ALL_PAGES, TRAILING_PAGES)

REPLICATED = "replicated"
SHARDED = "sharded"
TP_MODES = (REPLICATED, SHARDED)


@dataclass(frozen=True)
class PoolSpec:
    """One pool of a group (a row of spec/pools.toml). Units: `page_size` in tokens,
    `window_pages` in this pool's pages, `row_bytes` in bytes."""

    name: str
    role: str = ANCHOR
    indices_from: str = ""  # "" means its own (anchor, allocating)
    hit_policy: str = ALL_PAGES
    window_pages: int = 0  # TRAILING_PAGES only: pages that must precede an endpoint
    page_size: int = 16
    layers: int = 1
    rows_per_layer: int = 2
    row_bytes: int = 0
    tp_mode: str = REPLICATED
    backupable: bool = True
    guesses: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        where = f"pools.{self.name}"
        if not self.name:
            raise ConfigError("pools.name", "a pool needs a name")
        if self.role not in ROLES:
            raise ConfigError(f"{where}.role", f"one of {ROLES}, got {self.role!r}")
        if self.hit_policy not in HIT_POLICIES:
            raise ConfigError(f"{where}.hit_policy", f"one of {HIT_POLICIES}, got {self.hit_policy!r}")
        if self.tp_mode not in TP_MODES:
            raise ConfigError(f"{where}.tp_mode", f"one of {TP_MODES}, got {self.tp_mode!r}")
        for name in ("window_pages", "layers", "rows_per_layer", "row_bytes"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                raise ConfigError(f"{where}.{name}", f"a non-negative integer, got {v!r}")
        if not isinstance(self.page_size, int) or self.page_size <= 0:
            raise ConfigError(f"{where}.page_size", f"a positive integer, got {self.page_size!r}")
        if self.has_allocator and self.indices_from not in ("", self.name):
            raise ConfigError(f"{where}.indices_from",
                              f"an {self.role} pool allocates its own indices, got {self.indices_from!r}")
        if not self.has_allocator and self.indices_from in ("", self.name):
            raise ConfigError(f"{where}.indices_from", f"a {self.role} pool takes another pool's indices")
        if (self.hit_policy == TRAILING_PAGES) != (self.window_pages > 0):
            raise ConfigError(f"{where}.window_pages",
                              f"positive exactly for TRAILING_PAGES, got {self.window_pages} "
                              f"with {self.hit_policy}")
        unknown = [g for g in self.guesses if g not in self.__dataclass_fields__]
        if unknown:
            raise ConfigError(f"{where}.guesses", f"not fields of a pool: {unknown}")

    @property
    def has_allocator(self) -> bool:
        """Anchor and allocating pools keep a free list; sidecar and state pools do not."""
        return self.role in ALLOCATOR_ROLES

    @property
    def source(self) -> str:
        """The pool whose indices this one uses (itself for anchor and allocating pools)."""
        return self.indices_from or self.name

    @property
    def bytes_per_page(self) -> int:
        return self.layers * self.rows_per_layer * self.row_bytes


@dataclass(frozen=True)
class PoolGroup:
    """A validated pool group: the pools of one tier, in table order. Construction checks
    every rule of spec/pools.md "Group rules" and raises ConfigError naming the field."""

    name: str
    pools: tuple[PoolSpec, ...]

    def __post_init__(self) -> None:
        where = f"presets.{self.name}"
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ConfigError(f"{where}.pools", f"pool names must be unique, got {names}")
        anchors = [p.name for p in self.pools if p.role == ANCHOR]
        if len(anchors) != 1:
            raise ConfigError(f"{where}.pools", f"a group has exactly one anchor, got {anchors}")
        by_name = {p.name: p for p in self.pools}
        anchor = by_name[anchors[0]]
        for p in self.pools:
            if p.has_allocator:
                if p.role == ALLOCATING and anchor.page_size % p.page_size:
                    raise ConfigError(f"{where}.{p.name}.page_size",
                                      f"{p.page_size} must divide the anchor's {anchor.page_size}")
                continue
            src = by_name.get(p.indices_from)
            if src is None:
                raise ConfigError(f"{where}.{p.name}.indices_from",
                                  f"source pool {p.indices_from!r} is not in the group")
            if not src.has_allocator:
                raise ConfigError(f"{where}.{p.name}.indices_from",
                                  f"source {src.name!r} is a {src.role} pool; a source allocates")
            if p.role == STATE and src.role != ALLOCATING:
                raise ConfigError(f"{where}.{p.name}.indices_from",
                                  f"a state pool takes an allocating pool's indices, not {src.role} {src.name!r}")
            if p.page_size != src.page_size:
                raise ConfigError(f"{where}.{p.name}.page_size",
                                  f"{p.page_size} differs from its source {src.name!r}'s {src.page_size}")

    @property
    def anchor(self) -> PoolSpec:
        return next(p for p in self.pools if p.role == ANCHOR)

    def pool(self, name: str) -> PoolSpec:
        for p in self.pools:
            if p.name == name:
                return p
        raise ConfigError(f"presets.{self.name}", f"no pool {name!r}; pools: {[p.name for p in self.pools]}")

    @property
    def allocating(self) -> tuple[PoolSpec, ...]:
        """Pools with a free list, in sorted name order: the order every group reservation
        takes them in (and rolls back in reverse)."""
        return tuple(sorted((p for p in self.pools if p.has_allocator), key=lambda p: p.name))

    def derived(self, source: str) -> tuple[PoolSpec, ...]:
        """The sidecar and state pools on `source`'s indices, in table order."""
        return tuple(p for p in self.pools if not p.has_allocator and p.indices_from == source)

    @property
    def bytes_per_anchor_page(self) -> int:
        """Bytes of every pool on the anchor's indices, per anchor page."""
        return sum(p.bytes_per_page for p in self.pools if p.source == self.anchor.name)
