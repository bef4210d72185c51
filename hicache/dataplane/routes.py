"""How one D2H/H2D transfer is cut up: its route (which pages go by direct DMA, which through
host staging), its chunks, the direct DMAs per chunk, and where each chunk's indices sit.
Pure planning: numpy and lists only, no device work (the mover in dma.py issues the plan).

Routes (`plan_route`). The packed device buffer is private, so the mover picks the order of
pages in it: sorted by L2 page, so every run of consecutive L2 pages (in whatever order the
caller listed them) is one slice of the buffer and one slice of the pool -- one DMA. A run
of fewer than DIRECT_MIN_BYTES goes through host staging (when at least two such runs exist:
staging one run would save no DMA). Why a threshold: every DMA pays a fixed cost, so a
short run moves slowly on its own, while staging moves bytes through the one thread that
issues and polls every transfer; from DIRECT_MIN_BYTES up a direct DMA wins, far below it the
per-DMA cost and the Python issue cost (one `copy_` per run) make one staged DMA cheaper.
Staged pages sit first in the buffer for D2H (their host copies run on polls while the direct
DMAs still copy) and last for H2D (the CPU packs them while the direct DMAs copy).

Chunks (`chunk_bounds`). A DMA cannot start before its bytes are packed, so unchunked the
whole gather is exposed before the DMA. Chunk k+1's gather runs while chunk k's DMAs copy, so
only the first gather is exposed. Sizes double from FIRST_CHUNK_BYTES: a first chunk must be
long enough that its DMA outlasts issuing the next chunk (a kernel launch, an event, a wait,
its DMA calls), or the copy engine idles between chunks; and short enough that its exposed
gather is small. The schedule stays DMA-bound while packing outruns the DMA. H2D runs the
sizes in descending order (the exposed tail is the smallest chunk's scatter). Up to
SINGLE_CHUNK_MAX_BYTES a transfer is one chunk: one gather + one DMA, whose exposed gather is
a few percent of the DMA at the row kernel's speed (`single_chunk_max_bytes=0` chunks every
size, and the transfer benchmark measures both). An H2D of one run of L2 pages is the
exception (RUN_H2D_SINGLE_MAX_BYTES = 0: chunked at every size above the first chunk): its
scatter cannot start before its DMA ends, so unchunked the whole scatter is exposed after the
DMA, and the host issues the second chunk while the first copies; 350 Qwen3-8B tokens (22
pages, chunks of 14 and 8) measured 1.0-1.7 points over one chunk in four rounds on one H100
host. A fragmented H2D stays one chunk (chunked, its runs' DMAs split into more driver calls:
no better in the same rounds). A fixed `chunk_pages` overrides every rule.
The measurements behind the three constants: benchmarks/results/HISTORY.md.

Mapped (`mapped_plan`). Where the GPU addresses L2 in place (pinned host memory, mapped), a
D2H need not pack at all: one kernel writes every L1 row straight into its L2 page, whatever
the pages' order (kernels/triton_mapped.py). No packed buffer, no chunks, no DMA: the plan is
the index buffer's layout -- the L1 pages at 0, the L2 pages at the first aligned slot after
them -- and the number of L2 runs (for the counters). A D2H whose L2 pages are one run goes
by DMA all the same: one DMA from a packed buffer needs no per-run issue, and the copy
engine leaves the SMs to the model (two H100 hosts, 22 Qwen3-8B pages in one run: 87.9-90.3%
of the pinned copy by DMA, 80.2-92.0% mapped; fragmented, 22 pages: 75.2-84.2% by DMA,
77.5-92.2% mapped; benchmarks/results/2026-12-07-session26-h100/).

Pitched (`pitched_plan`). A page is 2 x layers rows (one per K/V and layer): contiguous in its
L2 page, one row per layer block in L1, `l1_pages` rows apart. One `cudaMemcpy2DAsync` moves
them all (copy2d.py): the DMA reads or writes L1 in place, so a small transfer needs no
kernel, no packed buffer, no index upload, and the copy engine starts after the first call.
The cost is one driver call per page (~14 us of the issuing thread on a slow host; an H100
moves a 2.25 MiB page in ~43 us, so the engine stays ahead), and a 2D copy of 32 KiB rows runs
a few points under one contiguous copy. So an H2D goes pitched when its L2 pages are not one
run in order (one run is one DMA into the packed buffer), it has at most PITCHED_MAX_PAGES
pages, and its rows are at least PITCHED_MIN_ROW_BYTES; a D2H stays mapped (or packed), which
measured as well or better in the mover (the probe alone put pitched ahead). Qwen3-8B pages
(32 KiB rows), end to end against one pinned copy of the same bytes, H100 hosts:

    22 fragmented pages   probe (host 1)     mover (host 2)   mover (host 3, 18 runs)
    D2H pitched           94.9%              83.3%            78.6%
    D2H mapped / packed   91.2% (SMs) / -    84.9 / 84.5%     81.1 / 78.6%
    H2D pitched           91.5%              84.9%            83.7%
    H2D packed            - (75.7%: a mover  63.1%            82.7%
                          an hour earlier)

One run of 22 pages (host 2): pitched 85.7 / 87.6% against one DMA 90.3 / 91.6%. At 63
fragmented pages the hosts disagree (H2D pitched 93.9 vs packed 87.0% on host 1, 84.5 vs 88.0%
on host 2): above 32 pages the other routes stay. Shorter rows were not measured: they stay on
the other routes too (benchmarks/zero_copy.py; benchmarks/results/2026-12-07-session27-h100/).

Index slots (`index_slots`). Chunk k's L1 indices are one slice of the uploaded index
buffer, handed to the gather/scatter kernel as a pointer. Triton compiles one kernel per
pointer alignment (16-byte divisible or not), so a slice starting at an odd int64 would be a
second kernel, compiled and loaded on its first use -- inside the issuing call, where loading
a module waits for the device to drain (the caller's queued work): the issue blocks. Every
chunk's slice therefore starts at a multiple of INDEX_ALIGN entries (16 bytes); the gaps
(at most one entry per chunk) are never read.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import numpy as np

from hicache.choices import TransferRoute
from hicache.core.pages import Pages
from hicache.errors import ConfigError

FIRST_CHUNK_BYTES = 16 << 20  # first chunk of the doubling schedule (rounded up to whole pages)
SINGLE_CHUNK_MAX_BYTES = 64 << 20  # transfers up to this size are one gather + DMAs, unchunked
RUN_H2D_SINGLE_MAX_BYTES = 0  # ...except an H2D of one L2 run: chunked at any size
DIRECT_MIN_BYTES = 256 << 10  # smallest run of consecutive L2 pages moved by its own DMA
INDEX_ALIGN = 2  # int64 entries per 16 bytes: every chunk's index slice starts aligned
SMALL_ROUTE_PAGES = 64  # routes up to this many pages are planned on Python lists (faster)
# "0": every D2H by DMA; "1": mapped also on CPU (by the rule); "all": every D2H mapped
MAPPED_ENV = "HICACHE_MAPPED_D2H"
PITCHED_MAX_PAGES = 32  # fragmented H2Ds up to this many pages go pitched (2D DMAs)
PITCHED_MIN_ROW_BYTES = 32 << 10  # ...when a row (one layer's K or V of a page) is this long
# "0": no pitched transfers; "1": pitched also on CPU (copy2d.host_copy2d, for the fuzz);
# "all": every transfer up to PITCHED_MAX_PAGES, D2H and one run of L2 pages in order too
PITCHED_ENV = "HICACHE_PITCHED_DMA"
# a route's setting: every transfer it can move (the environment's "all")
EVERY: Literal["every"] = "every"
RouteRequest = bool | Literal["every"] | None
"""A mover's setting of one optional route (`route_choice`): None, the environment and the
rule decide; False off; True on where the rule takes it; EVERY on for every transfer it can
move, one run of L2 pages too. True and EVERY raise ConfigError where the route cannot run."""

Bounds = list[tuple[int, int]]


def chunk_bounds(
    n_pages: int,
    bytes_per_page: int,
    chunk_pages: int | None = None,
    *,
    descending: bool = False,
    first_bytes: int = FIRST_CHUNK_BYTES,
    single_max_bytes: int = SINGLE_CHUNK_MAX_BYTES,
) -> Bounds:
    """[lo, hi) page ranges covering 0..n_pages in order. `chunk_pages` None: one chunk up to
    `single_max_bytes`, else sizes doubling from ceil(first_bytes / bytes_per_page) pages (the
    last takes what is left); a number: fixed chunks. `descending` reverses the sizes."""
    if chunk_pages is None and n_pages * bytes_per_page <= single_max_bytes:
        return [(0, n_pages)] if n_pages > 0 else []
    size = chunk_pages if chunk_pages is not None else max(1, -(-first_bytes // bytes_per_page))
    sizes: list[int] = []
    left = n_pages
    while left > 0:
        sizes.append(min(size, left))
        left -= sizes[-1]
        size = size if chunk_pages is not None else 2 * size
    if descending:
        sizes.reverse()
    bounds, lo = [], 0
    for s in sizes:
        bounds.append((lo, lo + s))
        lo += s
    return bounds


class Run(NamedTuple):
    """Packed positions [lo, hi) <-> L2 pages l2_first .. l2_first + (hi - lo) - 1: one DMA."""

    lo: int
    hi: int
    l2_first: int


@dataclass(frozen=True)
class Route:
    """Where each page of one transfer sits in the packed buffer, and how it reaches L2.

    Packed position p moves the caller's pair `order[p]` (None: p itself). Positions in a
    `direct` run are DMA'd straight to/from the L2 pool; positions [staged_lo, staged_hi) go
    through pinned host staging, their L2 pages being `l2_staged` (in packed order).
    """

    order: Pages | None
    direct: list[Run]
    staged_lo: int
    staged_hi: int
    l2_staged: Pages
    runs: int  # runs of consecutive L2 pages, direct and staged (1: one slice of the pool)

    @property
    def staged_pages(self) -> int:
        return self.staged_hi - self.staged_lo

    @property
    def kind(self) -> str:
        """'direct' (no host copy), 'staged' (all through staging), or 'mixed'."""
        if not self.staged_pages:
            return "direct"
        return "mixed" if self.direct else "staged"


def is_run(ids: Pages) -> bool:
    """Are `ids` (n >= 1) consecutive pages in increasing order, one slice of a pool? On a
    list up to SMALL_ROUTE_PAGES (a list compare beats numpy's fixed costs there)."""
    n = int(ids.size)
    if n <= SMALL_ROUTE_PAGES:
        xs: list[int] = ids.tolist()
        return xs == list(range(xs[0], xs[0] + n))
    return bool((np.diff(ids) == 1).all())


def route_choice(
    requested: RouteRequest,
    *,
    env: str,
    field: str,
    cuda: bool,
    why_not: str,
    on: str,
    prefer_not: str = "",
) -> tuple[bool, bool, str]:
    """(on, every, why) for one of a mover's optional routes. `requested`: the mover's setting
    `field` (RouteRequest; None: environment variable `env` decides -- "0" off, "1" on also
    off the GPU, "all" on and taken by every transfer it can move, also under True);
    `why_not`: what keeps it from running here ("" when it can), ConfigError when asked for
    by name; `prefer_not`: why the rule leaves it off here although it could run (a size
    never measured), which only a request or the environment overrides; `on`: the reason
    when it is on. Off the GPU it stays off unless asked."""
    value = os.environ.get(env, "")
    if requested is False or (requested is None and value == "0"):
        return False, False, f"off ({field}=False or {env}=0)"
    if why_not:
        if requested:
            raise ConfigError(field, f"cannot run here: {why_not}")
        return False, False, f"off: {why_not}"
    asked = requested is not None or value in ("1", "all")
    if not cuda and not asked:
        return False, False, f"off: CPU moves by DMA unless asked ({env}=1)"
    if prefer_not and not asked:
        return False, False, f"off: {prefer_not}"
    return True, requested == EVERY or value == "all", on


GROUP_NOT_PITCHED = (
    "a pool group moves by DMA or mapped (auto, dma or mapped): the pitched route's 2D copy "
    "is one typed pool's page"
)


def route_requests(route: TransferRoute) -> tuple[RouteRequest, RouteRequest]:
    """The movers' settings (`mapped_d2h`, `pitched`) of CacheConfig's `transfer_route`:
    `auto` leaves both to the rule and the environment; `dma` turns both off; `mapped` takes
    every D2H mapped and no transfer pitched; `pitched` every transfer of up to
    PITCHED_MAX_PAGES pages pitched and no D2H mapped."""
    return {
        TransferRoute.AUTO: (None, None),
        TransferRoute.DMA: (False, False),
        TransferRoute.MAPPED: (EVERY, False),
        TransferRoute.PITCHED: (False, EVERY),
    }[route]


def mapped_choice(
    requested: RouteRequest, *, cuda: bool, why_not: str, on: str
) -> tuple[bool, bool, str]:
    """`route_choice` of the mapped D2H (`mapped_d2h`, MAPPED_ENV; "all": every D2H, one run
    of L2 pages too)."""
    return route_choice(
        requested, env=MAPPED_ENV, field="mapped_d2h", cuda=cuda, why_not=why_not, on=on
    )


def count_runs(ids: Pages) -> int:
    """Runs of consecutive pages among `ids` (n >= 1) once sorted: 1 for one slice of a pool."""
    n = int(ids.size)
    if n <= SMALL_ROUTE_PAGES:
        xs: list[int] = sorted(ids.tolist())
        return 1 + sum(b != a + 1 for a, b in itertools.pairwise(xs))
    return 1 + int(np.count_nonzero(np.diff(np.sort(ids)) != 1))


def plan_route(
    l2_ids: Pages, bytes_per_page: int, direct_min_bytes: int, *, staged_first: bool
) -> Route:
    """The route of a transfer touching L2 pages `l2_ids` (n >= 1; may repeat for H2D).

    Pages are sorted by L2 page (stable) and cut into runs of consecutive pages; runs of
    fewer than `direct_min_bytes` are staged when there are at least two of them. Staged
    positions come first when `staged_first`, else last. O(n log n): up to
    SMALL_ROUTE_PAGES pages on Python lists (`_route_small`), above that in numpy
    (`_route_numpy`); both give the same route."""
    n = int(l2_ids.size)
    first = int(l2_ids[0])
    if is_run(l2_ids):  # one slice already in order: the hot path
        end = 0 if staged_first else n
        return Route(None, [Run(0, n, first)], end, end, l2_ids[:0], runs=1)
    route = _route_small if n <= SMALL_ROUTE_PAGES else _route_numpy
    return route(l2_ids, bytes_per_page, direct_min_bytes, staged_first=staged_first)


def _route_small(
    l2_ids: Pages, bytes_per_page: int, direct_min_bytes: int, *, staged_first: bool
) -> Route:
    """`plan_route` on Python lists: a few dozen numpy calls on a short array cost more of the
    issuing thread than the loop (a 22-page fragmented route: ~65 -> ~17 us on a 2-core VM)."""
    ids = l2_ids.tolist()
    n = len(ids)
    order = sorted(range(n), key=ids.__getitem__)  # stable, as argsort(kind="stable")
    cuts = [i for i in range(1, n) if ids[order[i]] != ids[order[i - 1]] + 1]
    bounds = list(zip([0, *cuts], [*cuts, n]))
    small = [(b - a) * bytes_per_page < direct_min_bytes for a, b in bounds]
    if sum(small) < 2:  # staging a single run would save no DMA
        small = [False] * len(bounds)
    staged: list[int] = []
    direct_order: list[int] = []
    direct: list[Run] = []
    n_staged = sum(b - a for (a, b), s in zip(bounds, small) if s)
    lo = n_staged if staged_first else 0
    for (a, b), s in zip(bounds, small):
        if s:
            staged.extend(order[a:b])
        else:
            direct_order.extend(order[a:b])
            direct.append(Run(lo, lo + b - a, ids[order[a]]))
            lo += b - a
    parts = staged + direct_order if staged_first else direct_order + staged
    staged_lo = 0 if staged_first else n - n_staged
    staged_ids = [ids[i] for i in staged]
    return Route(
        np.array(parts, dtype=np.int64),
        direct,
        staged_lo,
        staged_lo + n_staged,
        np.array(staged_ids, dtype=np.int64),
        runs=len(bounds),
    )


def _route_numpy(
    l2_ids: Pages, bytes_per_page: int, direct_min_bytes: int, *, staged_first: bool
) -> Route:
    """`plan_route` in numpy: for long transfers, where the per-page Python loop would cost
    more than numpy's fixed costs."""
    n = int(l2_ids.size)
    order = np.argsort(l2_ids, kind="stable")
    ids = l2_ids[order]
    starts = np.flatnonzero(np.concatenate(([True], np.diff(ids) != 1)))
    lengths = np.diff(np.append(starts, n))
    small = lengths * bytes_per_page < direct_min_bytes
    if np.count_nonzero(small) < 2:  # staging a single run would save no DMA
        small[:] = False
    staged_mask = np.repeat(small, lengths)
    staged_order, direct_order = order[staged_mask], order[~staged_mask]
    n_staged = int(staged_order.size)
    base = n_staged if staged_first else 0
    direct_lengths = lengths[~small]
    direct_lo = base + np.cumsum(direct_lengths) - direct_lengths
    direct = [
        Run(lo, lo + k, f)
        for lo, k, f in zip(
            direct_lo.tolist(), direct_lengths.tolist(), ids[starts[~small]].tolist()
        )
    ]
    parts = (staged_order, direct_order) if staged_first else (direct_order, staged_order)
    staged_lo = 0 if staged_first else n - n_staged
    # Verify every position is moved exactly once: a gap or overlap would lose or mix pages.
    assert sum(r.hi - r.lo for r in direct) + n_staged == n, (direct, n_staged, n)
    return Route(
        np.concatenate(parts),
        direct,
        staged_lo,
        staged_lo + n_staged,
        l2_ids[staged_order],
        runs=int(starts.size),
    )


def split_runs(runs: list[Run], bounds: Bounds) -> list[list[Run]]:
    """Per chunk of `bounds`, the pieces of `runs` (sorted, disjoint) inside it: a run that
    spans chunks becomes one DMA per chunk, so no DMA waits for a later chunk's gather."""
    if len(bounds) == 1 and all(bounds[0][0] <= r.lo and r.hi <= bounds[0][1] for r in runs):
        return [list(runs)]  # one chunk holding every run (a short transfer): nothing to cut
    out: list[list[Run]] = []
    k = 0
    for lo, hi in bounds:
        here: list[Run] = []
        while k < len(runs) and runs[k].lo < hi:
            r = runs[k]
            if lo <= r.lo and r.hi <= hi:  # whole in this chunk (most runs of a fragmented one)
                here.append(r)
                k += 1
                continue
            a, b = max(r.lo, lo), min(r.hi, hi)
            if a < b:
                here.append(Run(a, b, r.l2_first + a - r.lo))
            if r.hi > hi:
                break  # the rest of this run belongs to the next chunk
            k += 1
        out.append(here)
    return out


def aligned(entries: int) -> int:
    """`entries` rounded up to a multiple of INDEX_ALIGN: where the next 16-byte slot starts."""
    return -(-entries // INDEX_ALIGN) * INDEX_ALIGN


def index_slots(bounds: Bounds) -> list[int]:
    """Per chunk of `bounds`, where its indices start in the index buffers: in order, each at
    a multiple of INDEX_ALIGN, right after the previous chunk's (see the module docstring)."""
    at: list[int] = []
    end = 0
    for lo, hi in bounds:
        start = aligned(end)
        at.append(start)
        end = start + hi - lo
    return at


@dataclass(frozen=True)
class DmaPlan:
    """How one D2H/H2D transfer is issued: its route, its chunks, per chunk the direct DMAs
    (`pieces`) and the start of its index slice (`index_at`, from `index_slots`). `str()` is
    the one-line summary benchmarks report per case."""

    route: Route
    bounds: Bounds
    pieces: list[list[Run]]
    index_at: list[int] = field(default_factory=list)  # empty: computed from `bounds`
    mapped: bool = False  # one mapped copy (module docstring): no packing, no DMA
    pitched: bool = False  # one 2D DMA per page (module docstring): no packing, no index

    def __post_init__(self) -> None:
        if not self.index_at:
            object.__setattr__(self, "index_at", index_slots(self.bounds))
        # Verify one slot per chunk: a chunk without its own slice would read another's pages.
        assert len(self.index_at) == len(self.bounds), (self.index_at, self.bounds)

    @property
    def index_len(self) -> int:
        """Entries the index buffers need: the last chunk's slot end (n when unpadded); a
        mapped plan's L2 pages end (`slots_at` + n)."""
        if not self.bounds or self.pitched:
            return 0
        lo, hi = self.bounds[-1]
        if self.mapped:
            return self.slots_at + hi - lo
        return self.index_at[-1] + hi - lo

    @property
    def slots_at(self) -> int:
        """Where a mapped plan's L2 pages start in the index buffers: the first aligned slot
        after its L1 pages."""
        return aligned(self.bounds[-1][1]) if self.bounds else 0

    def fill_mapped(self, l1_ids: Pages, l2_ids: Pages, out: Pages) -> None:
        """A mapped plan's index entries into `out`: L1 pages at 0, L2 pages at `slots_at`,
        both in the caller's order (pairs stay pairs)."""
        n, at = int(l1_ids.size), self.slots_at
        np.copyto(out[:n], l1_ids)
        np.copyto(out[at : at + n], l2_ids)

    def fill_index(self, l1_ids: Pages, out: Pages) -> None:
        """Write the caller's L1 pages (`l1_ids`, the caller's order) into `out` (at least
        `index_len` entries) in packed order, each chunk at its slot; gaps are left as is."""
        n, order = int(l1_ids.size), self.route.order
        if self.index_len == n:  # no gaps: one chunk, or chunks ending on aligned positions
            if order is None:
                np.copyto(out[:n], l1_ids)
            else:
                np.take(l1_ids, order, out=out[:n])
            return
        packed = l1_ids if order is None else l1_ids[order]
        for (lo, hi), at in zip(self.bounds, self.index_at):
            out[at : at + hi - lo] = packed[lo:hi]

    def staged_in(self, lo: int, hi: int) -> tuple[int, int]:
        """The staged positions of chunk [lo, hi), as rows [a, b) of the staging buffer."""
        r = self.route
        return max(lo, r.staged_lo) - r.staged_lo, min(hi, r.staged_hi) - r.staged_lo

    @property
    def dmas(self) -> int:
        """DMAs issued: the direct pieces, and one per chunk holding staged pages (none for
        a mapped plan; one per page for a pitched one)."""
        if self.pitched:
            return self.bounds[-1][1] if self.bounds else 0
        staged = sum(a < b for a, b in (self.staged_in(lo, hi) for lo, hi in self.bounds))
        return sum(map(len, self.pieces)) + staged

    def __str__(self) -> str:
        r = self.route
        if self.mapped:
            return f"mapped: {r.runs} runs, 1 launch, 0 DMAs"
        if self.pitched:
            return f"pitched: {r.runs} runs, {self.dmas} 2D DMAs"
        staged = f", {r.staged_pages} pages staged" if r.staged_pages else ""
        return f"{r.kind}: {r.runs} runs, {len(self.bounds)} chunks, {self.dmas} DMAs{staged}"


def mapped_plan(l2_ids: Pages) -> DmaPlan:
    """The plan of a mapped D2H of `l2_ids` (n >= 1): one launch over every page, the L1 and
    L2 pages side by side in the index buffers (module docstring)."""
    n = int(l2_ids.size)
    route = Route(None, [], 0, 0, l2_ids[:0], runs=count_runs(l2_ids))
    return DmaPlan(route, [(0, n)], [[]], mapped=True)


def pitched_plan(l2_ids: Pages) -> DmaPlan:
    """The plan of a pitched D2H/H2D of `l2_ids` (n >= 1): one 2D DMA per page, in the
    caller's order (module docstring); the L2 runs are counted for the counters (the caller
    has already asked `is_run`)."""
    n = int(l2_ids.size)
    route = Route(None, [], 0, 0, l2_ids[:0], runs=count_runs(l2_ids))
    return DmaPlan(route, [(0, n)], [[]], pitched=True)
