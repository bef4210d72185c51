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
`guesses` names the fields whose values no source states (spec/pools.toml marks them);
`upstream` is the pool's name in SGLang, where it differs.

A pool with `backupable = False` is request-scoped: it lives in L1 for one request, holds no
part of any node's value, takes no part in hits, and no backup path (D2H, L2 -> L3) may name
it (`PoolGroup.backup_pools`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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

DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}
"""Element type name -> bytes per element, for typed rows (fp8 pages move as raw bytes)."""

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
    upstream: str = ""

    def __post_init__(self) -> None:
        where = f"pools.{self.name}"
        if not self.name:
            raise ConfigError("pools.name", "a pool needs a name")
        if self.role not in ROLES:
            raise ConfigError(f"{where}.role", f"one of {ROLES}, got {self.role!r}")
        if self.hit_policy not in HIT_POLICIES:
            raise ConfigError(
                f"{where}.hit_policy", f"one of {HIT_POLICIES}, got {self.hit_policy!r}"
            )
        if self.tp_mode not in TP_MODES:
            raise ConfigError(f"{where}.tp_mode", f"one of {TP_MODES}, got {self.tp_mode!r}")
        for name in ("window_pages", "layers", "rows_per_layer", "row_bytes"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                raise ConfigError(f"{where}.{name}", f"a non-negative integer, got {v!r}")
        if not isinstance(self.backupable, bool):
            raise ConfigError(f"{where}.backupable", f"true or false, got {self.backupable!r}")
        if not isinstance(self.page_size, int) or self.page_size <= 0:
            raise ConfigError(f"{where}.page_size", f"a positive integer, got {self.page_size!r}")
        if self.has_allocator and self.indices_from not in ("", self.name):
            raise ConfigError(
                f"{where}.indices_from",
                f"an {self.role} pool allocates its own indices, got {self.indices_from!r}",
            )
        if not self.has_allocator and self.indices_from in ("", self.name):
            raise ConfigError(
                f"{where}.indices_from", f"a {self.role} pool takes another pool's indices"
            )
        if (self.hit_policy == TRAILING_PAGES) != (self.window_pages > 0):
            raise ConfigError(
                f"{where}.window_pages",
                f"positive exactly for TRAILING_PAGES, got {self.window_pages} "
                f"with {self.hit_policy}",
            )
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
    def rows_per_page(self) -> int:
        """Rows of `row_bytes` one page of this pool holds: `rows_per_layer` per layer."""
        return self.layers * self.rows_per_layer

    @property
    def bytes_per_page(self) -> int:
        """Raw bytes of one page (0: an index-only pool, such as dsv4's anchor)."""
        return self.rows_per_page * self.row_bytes

    def check_window(self, where: str, source_pages: int, tier: str = "") -> None:
        """Verify this pool's trailing window fits in the `source_pages` pages of its source
        (a hit needs the whole window resident at once); ConfigError naming
        `<where>.<pool>.window_pages` otherwise. `tier` names where those pages are, for the
        message ("" when no tier is meant)."""
        if self.window_pages > source_pages:
            held = f" in {tier}" if tier else ""
            raise ConfigError(
                f"{where}.{self.name}.window_pages",
                f"a window of {self.window_pages} pages does not fit in "
                f"{self.source!r}'s {source_pages} pages{held}; give "
                f"{self.source!r} more pages or shorten the window",
            )


@dataclass(frozen=True)
class TypedRows:
    """What the bytes of a typed group of one are: each K or V row of its one pool is
    `page_size x kv_heads x head_dim` elements of `dtype` (MHA). A pool table holds raw bytes
    only; a KV geometry types the group of one whose rows it describes, which is what lets
    the data plane keep that pool as one typed tensor and move it on its single-pool path."""

    kv_heads: int
    head_dim: int
    dtype: str

    def row_bytes(self, page_size: int) -> int:
        """Bytes of one K or V row of a `page_size`-token page."""
        return page_size * self.kv_heads * self.head_dim * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class PoolGroup:
    """A validated pool group: the pools of one tier, in table order. Construction checks
    every rule of spec/pools.md "Group rules" and raises ConfigError naming the field;
    `check_capacity` and `backup_pools` check the two rules that need more than the table.
    `typed`: for a group of one MHA pool, what its rows hold (`TypedRows`); None for raw
    bytes (every preset as the table gives it)."""

    name: str
    pools: tuple[PoolSpec, ...]
    typed: TypedRows | None = None

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
        # Verify the anchor can be backed up: a node's value in L2/L3 is anchor pages.
        if not anchor.backupable:
            raise ConfigError(
                f"{where}.{anchor.name}.backupable",
                "the anchor's indices are every tier's node values; it must be backupable",
            )
        for p in self.pools:
            if p.has_allocator:
                if p.role == ALLOCATING and anchor.page_size % p.page_size:
                    raise ConfigError(
                        f"{where}.{p.name}.page_size",
                        f"{p.page_size} must divide the anchor's {anchor.page_size}",
                    )
                continue
            _check_derived(where, p, by_name.get(p.indices_from))
        if self.typed is not None:
            self._check_typed(where, anchor, self.typed)

    def _check_typed(self, where: str, anchor: PoolSpec, typed: TypedRows) -> None:
        """Verify typed rows describe the group: one pool, the anchor, two rows a layer of
        exactly the bytes the element type and sizes give."""
        if len(self.pools) != 1 or anchor.rows_per_layer != 2:
            raise ConfigError(
                f"{where}.typed", "only a group of one MHA pool (K and V rows) has typed rows"
            )
        for name in ("kv_heads", "head_dim"):
            v = getattr(typed, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"{where}.typed.{name}", f"a positive integer, got {v!r}")
        if typed.dtype not in DTYPE_BYTES:
            raise ConfigError(
                f"{where}.typed.dtype", f"one of {sorted(DTYPE_BYTES)}, got {typed.dtype!r}"
            )
        if typed.row_bytes(anchor.page_size) != anchor.row_bytes:
            raise ConfigError(
                f"{where}.typed",
                f"{typed} rows of {anchor.page_size}-token pages are "
                f"{typed.row_bytes(anchor.page_size)} bytes, the pool's are {anchor.row_bytes}",
            )

    @property
    def anchor(self) -> PoolSpec:
        return next(p for p in self.pools if p.role == ANCHOR)

    def pool(self, name: str) -> PoolSpec:
        for p in self.pools:
            if p.name == name:
                return p
        raise ConfigError(
            f"presets.{self.name}", f"no pool {name!r}; pools: {[p.name for p in self.pools]}"
        )

    def ratio(self, pool: str) -> int:
        """Pages of `pool` per anchor page (anchor.page_size // its page_size; the construction
        rules make it a whole number). A derived pool's is its source's."""
        return self.anchor.page_size // self.pool(pool).page_size

    def backed_up(self) -> PoolGroup:
        """This group without its request-scoped (non-backupable) pools: the pools that hold
        part of a node's value, which L2 and L3 keep (a request-scoped pool's derived pools
        are request-scoped too, so what is left is a valid group). `self` when none is."""
        kept = tuple(p for p in self.pools if p.backupable)
        return self if len(kept) == len(self.pools) else PoolGroup(self.name, kept, self.typed)

    @property
    def allocating(self) -> tuple[PoolSpec, ...]:
        """Pools with a free list, in sorted name order: the order every group reservation
        takes them in (and rolls back in reverse)."""
        return tuple(sorted((p for p in self.pools if p.has_allocator), key=lambda p: p.name))

    def derived(self, source: str) -> tuple[PoolSpec, ...]:
        """The sidecar and state pools on `source`'s indices, in table order."""
        return tuple(p for p in self.pools if not p.has_allocator and p.indices_from == source)

    def bytes_per_page(self, source: str) -> int:
        """Bytes one page of allocating pool `source` names across every pool on its
        indices (itself included)."""
        return sum(p.bytes_per_page for p in self.pools if p.source == source)

    @property
    def bytes_per_anchor_page(self) -> int:
        """Bytes of every pool on the anchor's indices, per anchor page."""
        return self.bytes_per_page(self.anchor.name)

    @property
    def value_bytes_per_anchor_page(self) -> int:
        """Bytes of the group's backupable pools for one anchor page of tokens: each pool's
        bytes per page times its pages per anchor page, a trailing-window pool counted as if
        the page were in its window; request-scoped pools hold no part of a node's value. The
        width of a node's value per anchor page, the pools side by side (what a producer writes
        and a backup moves); at least `bytes_per_anchor_page`."""
        return sum(p.bytes_per_page * self.ratio(p.name) for p in self.pools if p.backupable)

    def check_capacity(self, capacity_pages: Mapping[str, int]) -> None:
        """Verify a tier's sizes fit the group: `capacity_pages` maps every allocating pool
        (anchor included) to its page count in the tier, and a TRAILING_PAGES pool's window
        fits in its source's pages (a hit needs the whole window resident at once).
        ConfigError names `<pool>.capacity_pages` or `<pool>.window_pages`."""
        where = f"presets.{self.name}"
        owners = {p.name for p in self.allocating}
        extra = sorted(set(capacity_pages) - owners)
        if extra:
            raise ConfigError(
                f"{where}.{extra[0]}.capacity_pages",
                f"only allocating pools have a capacity; those are {sorted(owners)}",
            )
        for name in sorted(owners):
            n = capacity_pages.get(name)
            if not isinstance(n, int) or n <= 0:
                raise ConfigError(
                    f"{where}.{name}.capacity_pages", f"a positive integer, got {n!r}"
                )
        for p in self.pools:
            p.check_window(where, capacity_pages[p.source])

    def backup_pools(self, names: Iterable[str] | None = None) -> tuple[PoolSpec, ...]:
        """The pools a backup path (D2H, L2 -> L3) moves: `names`, or every backupable pool
        when None, in table order. ConfigError naming `<pool>.backupable` if one is
        request-scoped, or the pool if the group has no such pool."""
        if names is None:
            return tuple(p for p in self.pools if p.backupable)
        wanted = set(names)
        for name in sorted(wanted):
            p = self.pool(name)
            if not p.backupable:
                raise ConfigError(
                    f"presets.{self.name}.{name}.backupable",
                    f"{name!r} is request-scoped (backupable = false); "
                    "leave it off every backup path (R63)",
                )
        return tuple(p for p in self.pools if p.name in wanted)


def _check_derived(where: str, p: PoolSpec, src: PoolSpec | None) -> None:
    """The rules for a sidecar or state pool `p` whose source is `src` (None: not in the group)."""
    if src is None:
        raise ConfigError(
            f"{where}.{p.name}.indices_from", f"source pool {p.indices_from!r} is not in the group"
        )
    if not src.has_allocator:
        raise ConfigError(
            f"{where}.{p.name}.indices_from",
            f"source {src.name!r} is a {src.role} pool; a source allocates",
        )
    if p.role == STATE and src.role != ALLOCATING:
        raise ConfigError(
            f"{where}.{p.name}.indices_from",
            f"a state pool takes an allocating pool's indices, not {src.role} {src.name!r}",
        )
    if p.page_size != src.page_size:
        raise ConfigError(
            f"{where}.{p.name}.page_size",
            f"{p.page_size} differs from its source {src.name!r}'s {src.page_size}",
        )
    # Verify a derived pool is backed up only with its source: it has no indices of its own.
    if p.backupable and not src.backupable:
        raise ConfigError(
            f"{where}.{p.name}.backupable",
            f"its source {src.name!r} is request-scoped, so it is too",
        )
