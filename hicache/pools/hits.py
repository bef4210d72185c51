"""Hits across pools: how long a prefix a pool group can serve (spec/pools.md, "Hits across
pools"). Pure functions, stdlib only.

Units. Endpoints and hits are in **anchor pages** (the tree's identity) unless a name says
otherwise. A pool's presence is in its *own* pages: a pool whose page is `ratio` =
anchor.page_size // pool.page_size times smaller reports `ratio` entries per anchor page, and
anchor endpoint `e` is legal in it exactly when its own endpoint `e * ratio` is:

    anchor pages   |   a0    |   a1    |   a2    |      anchor page_size 4
    swa pages      | s0 | s1 | s2 | s3 | s4 | s5 |      swa page_size 2, ratio 2
    endpoints      0         1         2         3      (anchor pages: 0..n)

Endpoint `e` (0 <= e <= n) ends a hit of the first `e` pages. Per pool:

    ALL_PAGES              legal: e <= the leading run of present pages
    TRAILING_PAGES(W)      legal: the W pages before e, [max(0, e - W), e), are all present

For e < W the window is clipped at the path start: a run that starts at page 0 serves every
endpoint it covers. That is SGLang's SWA validator, whose run counter starts at infinity for
a path with no gap since the root; after a gap the run must reach W again (`swa_boundaries`).
e = 0 is always legal.

Which pools are matched. Every pool except state pools and non-backupable pools. A state
pool shares an allocating pool's indices and is reserved, evicted and released with it, so
its presence is its source's; SGLang likewise matches only its FULL and SWA tree components.
A non-backupable pool is request-scoped (V4.1's pair ring): no tier keeps it for reuse. Both
are refused in a presence mapping (ConfigError), never silently read. A matched pool missing
from the mapping counts as holding nothing (SGLang #37145: "not reported" must never mean
"ignore").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from hicache.choices import HitPolicy
from hicache.errors import ConfigError
from hicache.pools.spec import ALL_PAGES, STATE, TRAILING_PAGES, PoolGroup, PoolSpec

ALL_POOLS = HitPolicy.ALL_POOLS
ANCHOR_RECOMPUTE_SWA = HitPolicy.ANCHOR_RECOMPUTE_SWA
GROUP_HIT_POLICIES = tuple(HitPolicy)


def leading_run(present: Sequence[bool]) -> int:
    """Pages in the leading run of present pages (SGLang's `count_pool_hits`): the index of
    the first absent page, or len(present) when none is absent."""
    for page, here in enumerate(present):
        if not here:
            return page
    return len(present)


def trailing_endpoints(present: Sequence[bool], window: int) -> frozenset[int]:
    """The legal endpoints of a TRAILING_PAGES(window) pool, in its own pages: e in 0..n with
    [max(0, e - window), e) all present. Raises ConfigError for window < 1."""
    _check_window(window)
    legal = {0}
    run = 0  # present pages ending just before endpoint e
    for e, here in enumerate(present, 1):
        run = run + 1 if here else 0
        if run >= min(window, e):  # the window is clipped at the path start
            legal.add(e)
    return frozenset(legal)


def swa_boundaries(path: Sequence[tuple[int, bool]], window: int) -> tuple[int, ...]:
    """SGLang's SWA tree validator over one tree path: the node boundaries (in pages from the
    root, 0 first) where a hit may end. `path` is (pages, window value present) per node, root's
    child first. The contiguous length is accumulated along the path and reset at a node
    without its window value (a gap); a node's end is accepted when the node is present and
    either no gap came before it or the length since the last gap reaches `window`. So a hit
    never counts a window with a gap in it. Equals `trailing_endpoints` of the pages, read at
    node ends."""
    _check_window(window)
    accepted = [0]
    offset = 0
    since_gap: int | None = None  # None: no gap since the root (SGLang counts it infinite)
    for i, (pages, here) in enumerate(path):
        if not isinstance(pages, int) or pages < 1:
            raise ConfigError(f"path[{i}].pages", f"a node holds at least one page, got {pages!r}")
        offset += pages
        if not here:
            since_gap = 0
            continue
        since_gap = None if since_gap is None else since_gap + pages
        if since_gap is None or since_gap >= window:
            accepted.append(offset)
    return tuple(accepted)


@dataclass(frozen=True)
class Endpoints:
    """One pool's legal endpoints, in anchor pages, out of 0..pages (0 is always legal)."""

    pages: int
    legal: frozenset[int]

    def __post_init__(self) -> None:
        if 0 not in self.legal or not all(0 <= e <= self.pages for e in self.legal):
            raise ConfigError(
                "legal", f"endpoints in 0..{self.pages}, 0 included, got {sorted(self.legal)}"
            )

    @property
    def largest(self) -> int:
        return max(self.legal)

    def endpoint_mask(self, n: int) -> tuple[int, ...]:
        """The fixed-length form: n + 1 entries, entry e is 1 when e is legal (e = 0..n).
        Ranks that build it over one n (the prompt's pages) get one length, so one elementwise MIN
        (`intersect_masks`) intersects them; endpoints above n are left out."""
        if not isinstance(n, int) or n < 0:
            raise ConfigError("n", f"the mask's bound is an endpoint >= 0, got {n!r}")
        return tuple(int(e in self.legal) for e in range(n + 1))


def intersect_masks(masks: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """The endpoints legal in every mask: the elementwise minimum of equal-length 0/1 masks.
    Masks of different lengths were built with different bounds (SGLang #39267: a gloo
    reduction of unequal sizes) and are refused, as are entries other than 0 and 1 (R65)."""
    if not masks:
        raise ConfigError("masks", "intersect at least one mask")
    lengths = sorted({len(m) for m in masks})
    if len(lengths) != 1:
        raise ConfigError(
            "masks",
            f"lengths differ {lengths}: build every mask over the one "
            "n every rank knows (the prompt's pages; n + 1 entries; R65)",
        )
    if any(v not in (0, 1) for m in masks for v in m):
        raise ConfigError("masks", "entries are 0 or 1")
    return tuple(min(column) for column in zip(*masks))


def largest_endpoint(mask: Sequence[int]) -> int:
    """The largest endpoint set in `mask`. Entry 0 (the empty hit) must be set."""
    if not mask or mask[0] != 1:
        raise ConfigError("mask", "entry 0 (the empty hit) is always legal and must be 1")
    return max(e for e, v in enumerate(mask) if v)


class PoolHit(NamedTuple):
    """One matched pool's part in a hit; `leading_run` and `endpoints` in anchor pages."""

    pool: str
    hit_policy: str  # ALL_PAGES or TRAILING_PAGES
    reported: bool  # False: missing from the presence mapping, read as holding nothing
    leading_run: int
    endpoints: Endpoints


class GroupHit(NamedTuple):
    """The agreed hit of a group under one group hit policy.

    `required`: the pools the policy needs to serve the hit (`required_pools`). `bound`: the
    minimum leading run over required ALL_PAGES pools (`pages` if none). `hit`: the
    largest endpoint <= bound legal in every required TRAILING_PAGES pool, in anchor pages;
    `hit_tokens` the same in tokens. `recompute_tokens`: under anchor_recompute_swa, the
    trailing window before the hit that is replayed instead of restored (0 under all_pools).
    """

    policy: HitPolicy
    required: tuple[str, ...]
    pages: int
    bound: int
    hit: int
    hit_tokens: int
    recompute_tokens: int
    pools: tuple[PoolHit, ...]

    def mask(self, n: int) -> tuple[int, ...]:
        """The endpoints 0..n legal in every required pool, as a fixed-length 0/1 mask. For
        tensor parallelism n is the prompt's page count, known to every rank before the call
        (spec/tp.md C1a); the ranks intersect their masks (elementwise MIN) and the largest
        common endpoint within the agreed run is the hit."""
        return intersect_masks(
            [p.endpoints.endpoint_mask(n) for p in self.pools if p.pool in self.required]
        )


def check_policy(name: HitPolicy | str) -> HitPolicy:
    """`name` as the group hit policy it names; else ConfigError naming the choices."""
    if name not in GROUP_HIT_POLICIES:
        raise ConfigError("hit_policy", f"one of {GROUP_HIT_POLICIES}, got {name!r}")
    return HitPolicy(name)


def matched_pools(group: PoolGroup) -> tuple[PoolSpec, ...]:
    """The pools a hit is matched over, in table order: the anchor and every backupable
    non-state pool."""
    anchor = group.anchor.name
    return tuple(p for p in group.pools if p.name == anchor or (p.role != STATE and p.backupable))


def required_pools(group: PoolGroup, policy: HitPolicy | str) -> tuple[str, ...]:
    """The pools that must serve a hit under `policy`. all_pools: every matched pool.
    anchor_recompute_swa: the anchor and the ALL_PAGES pools on its indices; the trailing pools
    are rebuilt by replaying their window. A matched ALL_PAGES pool outside the anchor's
    family would need the whole prefix replayed, so that policy refuses such a group."""
    matched = matched_pools(group)
    if check_policy(policy) == ALL_POOLS:
        return tuple(p.name for p in matched)
    anchor = group.anchor.name
    for p in matched:
        if p.hit_policy == ALL_PAGES and p.source != anchor:
            raise ConfigError(
                f"presets.{group.name}.{p.name}.hit_policy",
                f"{ANCHOR_RECOMPUTE_SWA} replays only a trailing window, and this "
                f"ALL_PAGES pool is on {p.source!r}'s indices; use {ALL_POOLS}",
            )
    return tuple(p.name for p in matched if p.name == anchor or p.hit_policy == ALL_PAGES)


def pool_hits(
    group: PoolGroup, presence: Mapping[str, Sequence[bool]], pages: int
) -> tuple[PoolHit, ...]:
    """Each matched pool's leading run and legal endpoints over the first `pages` anchor
    pages. `presence[pool]` has pages * ratio entries (the pool's own pages). Raises
    ConfigError, naming `presence.<pool>`, for an unknown, state or non-backupable pool or a
    length that differs; a matched pool not in `presence` counts as holding nothing."""
    _check_presence(group, presence, pages)
    out = []
    for pool in matched_pools(group):
        ratio = group.ratio(pool.name)
        present = presence.get(pool.name, (False,) * (pages * ratio))
        if pool.hit_policy == TRAILING_PAGES:
            own = trailing_endpoints(present, pool.window_pages)
            legal = frozenset(e for e in range(pages + 1) if e * ratio in own)
        else:
            legal = frozenset(range(leading_run(present) // ratio + 1))
        out.append(
            PoolHit(
                pool.name,
                pool.hit_policy,
                pool.name in presence,
                leading_run(present) // ratio,
                Endpoints(pages, legal),
            )
        )
    return tuple(out)


def agreed_hit(
    group: PoolGroup,
    presence: Mapping[str, Sequence[bool]],
    pages: int,
    policy: HitPolicy | str = ALL_POOLS,
) -> GroupHit:
    """The hit a group can serve under `policy`: the largest endpoint legal in every required
    pool (R64). Not the minimum of per-pool maxima: TRAILING_PAGES endpoints are a set, and with
    {0,1,3} and {0,1,2} the agreed hit is 1, not 2 (SGLang #39147). Same inputs and errors as
    `pool_hits`; an unknown policy raises ConfigError."""
    policy = check_policy(policy)
    required = required_pools(group, policy)
    pools = pool_hits(group, presence, pages)
    needed = [p for p in pools if p.pool in required]
    bound = min((p.leading_run for p in needed if p.hit_policy == ALL_PAGES), default=pages)
    window_tokens = max(
        (
            q.window_pages * q.page_size
            for q in matched_pools(group)
            if q.hit_policy == TRAILING_PAGES and q.name not in required
        ),
        default=0,
    )
    result = GroupHit(policy, required, pages, bound, 0, 0, 0, pools)
    hit = largest_endpoint(result.mask(bound))
    hit_tokens = hit * group.anchor.page_size
    # Verify the hit is legal in every required pool and within the ALL_PAGES bound.
    assert hit <= bound and all(hit in p.endpoints.legal for p in needed), (hit, pools)
    return result._replace(
        hit=hit, hit_tokens=hit_tokens, recompute_tokens=min(hit_tokens, window_tokens)
    )


class PrefetchClamp(NamedTuple):
    """What a finished prefetch may publish, in anchor pages. Positions [0, published) go to
    the tree; `release` lists the positions [published, reserved) whose host slots the caller
    must free, so that no slot is left owned by nobody. `by_pool`: each clamping pool's count
    (0 for one not reported)."""

    published: int
    release: range
    by_pool: tuple[tuple[str, int], ...]


def prefetch_clamp(group: PoolGroup, completed: Mapping[str, int], reserved: int) -> PrefetchClamp:
    """Clamp a prefetch's publication to min(anchor, every backupable ALL_PAGES sidecar on the
    anchor's indices) (SGLang #30334). `completed[pool]` is the pages that landed, in the pool's
    own pages; `reserved` the anchor host slots the prefetch holds. A clamping pool missing from
    `completed` counts 0 (#37145), so everything it held is released (R66). Raises ConfigError
    for an unknown pool or a count outside 0..reserved (in the pool's pages)."""
    if not isinstance(reserved, int) or reserved < 0:
        raise ConfigError("reserved", f"a page count >= 0, got {reserved!r}")
    anchor = group.anchor
    for name, count in completed.items():
        ratio = anchor.page_size // _pool(group, name, f"completed.{name}").page_size
        if not isinstance(count, int) or not 0 <= count <= reserved * ratio:
            raise ConfigError(
                f"completed.{name}",
                f"pages in 0..{reserved * ratio} (what was reserved), got {count!r}",
            )
    clampers = [
        p.name
        for p in group.pools
        if p.name == anchor.name
        or (
            p.source == anchor.name
            and p.hit_policy == ALL_PAGES
            and p.backupable
            and p.role != STATE
        )
    ]
    by_pool = tuple((name, completed.get(name, 0)) for name in clampers)
    published = min(count for _, count in by_pool)
    return PrefetchClamp(published, range(published, reserved), by_pool)


class TrailingTail(NamedTuple):
    """A trailing pool's window against the hit, in the pool's own page positions.
    `needed`: the window the hit needs, [max(0, h - W), h) (its page hashes are the trailing
    keys); `keep`: held pages inside it; `release`: held pages outside it, which the caller
    frees; `missing`: needed pages not held (non-empty: this pool cannot serve the hit yet)."""

    needed: range
    keep: range
    release: tuple[int, ...]
    missing: tuple[int, ...]


def trailing_tail(group: PoolGroup, pool: str, held: range, hit: int) -> TrailingTail:
    """Split a pre-allocated trailing window `held` (pool pages, step 1) against the agreed
    `hit` (anchor pages). When another pool shortened the hit below the window it was
    allocated for, the held pages beyond the hit are released here, not lost (SGLang
    `_sync_trailing_keys`, #31679; R67). Raises ConfigError for a pool that is not TRAILING_PAGES,
    a held range that is not ascending from >= 0, or a negative hit."""
    spec = _pool(group, pool, "pool")
    if spec.hit_policy != TRAILING_PAGES:
        raise ConfigError(
            f"presets.{group.name}.{pool}.hit_policy",
            f"the tail is a TRAILING_PAGES pool's, not {spec.hit_policy}",
        )
    if held.step != 1 or held.start < 0 or held.stop < held.start:
        raise ConfigError("held", f"an ascending range of pages from >= 0, got {held!r}")
    if not isinstance(hit, int) or hit < 0:
        raise ConfigError("hit", f"an endpoint >= 0 in anchor pages, got {hit!r}")
    end = hit * group.ratio(spec.name)
    needed = range(max(0, end - spec.window_pages), end)
    low, high = max(needed.start, held.start), min(needed.stop, held.stop)
    keep = range(low, max(low, high))
    release = tuple(p for p in held if p not in needed)
    missing = tuple(p for p in needed if p not in held)
    # Verify every held page is kept or released, never both, never neither.
    assert sorted([*keep, *release]) == list(held), (keep, release, held)
    return TrailingTail(needed, keep, release, missing)


def _check_window(window: int) -> None:
    if not isinstance(window, int) or window < 1:
        raise ConfigError("window", f"a trailing window of >= 1 pages, got {window!r}")


def _check_presence(group: PoolGroup, presence: Mapping[str, Sequence[bool]], pages: int) -> None:
    """Check every input before anything is computed: names, roles and lengths."""
    if not isinstance(pages, int) or pages < 0:
        raise ConfigError("pages", f"anchor pages matched, >= 0, got {pages!r}")
    matched = {p.name for p in matched_pools(group)}
    for name, present in presence.items():
        field = f"presence.{name}"
        spec = _pool(group, name, field)
        if spec.role == STATE:
            raise ConfigError(
                field,
                f"a state pool is not matched: it follows its source "
                f"{spec.source!r}; report {spec.source!r} only",
            )
        if name not in matched:
            raise ConfigError(
                field, "a non-backupable pool is request-scoped and not matched; leave it out"
            )
        want = pages * group.ratio(spec.name)
        if len(present) != want:
            raise ConfigError(
                field,
                f"{len(present)} entries; {pages} anchor pages are {want} "
                f"of this pool's {spec.page_size}-token pages",
            )


def _pool(group: PoolGroup, name: str, field: str) -> PoolSpec:
    """The pool `name` of `group`; ConfigError naming `field` if the group has none."""
    for pool in group.pools:
        if pool.name == name:
            return pool
    raise ConfigError(
        field, f"no pool {name!r} in group {group.name!r}; pools: {[p.name for p in group.pools]}"
    )
