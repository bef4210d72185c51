"""Mutants of the data plane's routes (hicache/dataplane/routes.py, dma.py): bugs in how one
D2H or H2D is cut up and issued, each on a path the fuzz reaches only by its route, chunk,
placement and direct-run draws (`Setup.transfer_route`, `chunk_pages`, `placement`,
`direct_min_pages`: hicache/testing/adapters/controller.py).

    name                 reached by                  what is broken
    -------------------  --------------------------  -----------------------------------------
    route-mixed-overlap  a fragmented D2H with runs  a D2H's direct runs are placed from
                         of both kinds (`half_spread` packed position 0, over its staged
                         + direct_min_pages 2)       pages: both copies read one half
    route-h2d-staged-    a fragmented H2D with runs  an H2D's staged pages are placed from
      overlap            of both kinds (as above,    packed position 0, over its direct
                         and an H2D of 4+ pages)     runs: both copies write one half
    chunk-one-slot       chunk_pages drawn           every chunk's L1 indices at slot 0: each
                                                     chunk overwrites the last one's, a gather
                                                     or scatter reads another chunk's pages
    mapped-l1-from-l2    transfer_route mapped       the mapped D2H's L1 pages are its L2
                                                     pages: it copies the wrong L1 rows
    pitched-short-page   transfer_route pitched      a pitched copy moves one row short: a
                                                     page's last layer's V never arrives

Before those draws, the fuzz's transfers were one run of L2 pages in order, unchunked, by the
DMA route (best fit, and the machine's pages far below the 256 KiB direct-run size): none of
these paths ran. A mixed route needs four pages or more (two runs staged, one of two pages
direct); the machine's H2Ds reach that in `restore_from_l3`'s prompts of 4-5 pages, rarely
(route-h2d-staged-overlap: 1 of 5 seeds in 2,000 steps). Registered in
`hicache.testing.mutants`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

from hicache.testing.mutants.base import Mutant, swapped


def _mixed_routes_rewritten(
    d2h: bool, rewrite: Callable[[Any], Any]
) -> contextlib.AbstractContextManager[None]:
    """`routes._route_small` with `rewrite` applied to every mixed route (direct runs and
    staged pages both present) of a D2H (staged first) or, `d2h` False, of an H2D; other
    routes unchanged (in an all-staged or all-direct route there is nothing to overlap)."""
    from hicache.dataplane import routes

    real = routes._route_small

    def route_small(l2_ids: Any, bpp: int, direct_min: int, *, staged_first: bool) -> Any:
        r = real(l2_ids, bpp, direct_min, staged_first=staged_first)
        mixed = bool(r.direct) and r.staged_pages > 0
        return rewrite(r) if mixed and staged_first is d2h else r

    return swapped(routes, "_route_small", route_small)


def _route_mixed_overlap() -> contextlib.AbstractContextManager[None]:
    """A staged-first route (a D2H's) places its direct runs from packed position 0, not
    after the staged pages: in a mixed route a direct run and the staged pages share packed
    positions, so one of them moves the other's bytes."""
    from hicache.dataplane.routes import Run

    def rewrite(r: Any) -> Any:
        shift = r.staged_pages
        direct = [Run(x.lo - shift, x.hi - shift, x.l2_first) for x in r.direct]
        return dataclasses.replace(r, direct=direct)

    return _mixed_routes_rewritten(d2h=True, rewrite=rewrite)


def _route_h2d_staged_overlap() -> contextlib.AbstractContextManager[None]:
    """A direct-first route (an H2D's) places its staged pages from packed position 0, not
    after the direct runs: in a mixed route the staged pages' scatter and a direct run's
    DMA share packed positions, so one of them lands the other's bytes."""
    return _mixed_routes_rewritten(
        d2h=False, rewrite=lambda r: dataclasses.replace(r, staged_lo=0, staged_hi=r.staged_pages)
    )


def _chunk_one_slot() -> contextlib.AbstractContextManager[None]:
    """Every chunk's index slice starts at slot 0 (routes.index_slots)."""
    from hicache.dataplane import routes

    def index_slots(bounds: Any) -> list[int]:
        return [0] * len(bounds)

    return swapped(routes, "index_slots", index_slots)


def _mapped_l1_from_l2() -> contextlib.AbstractContextManager[None]:
    """A mapped plan writes the L2 pages where its L1 pages belong (`DmaPlan.fill_mapped`)."""
    import numpy as np

    from hicache.dataplane.routes import DmaPlan

    def fill_mapped(self: Any, l1_ids: Any, l2_ids: Any, out: Any) -> None:
        n, at = int(l2_ids.size), self.slots_at
        np.copyto(out[:n], l2_ids)
        np.copyto(out[at : at + n], l2_ids)

    return swapped(DmaPlan, "fill_mapped", fill_mapped)


def _pitched_short_page() -> contextlib.AbstractContextManager[None]:
    """Each pitched 2D copy moves one row fewer than the page has (dma.copy_pages)."""
    from hicache.dataplane import dma

    real = dma.__dict__["copy_pages"]  # dma.py imports it from copy2d.py

    def copy_pages(copy2d: Any, *args: Any, **kw: Any) -> None:
        def short(d: int, dp: int, s: int, sp: int, w: int, h: int, st: int) -> None:
            copy2d(d, dp, s, sp, w, h - 1, st)

        real(short, *args, **kw)

    return swapped(dma, "copy_pages", copy_pages)


ZOO: tuple[Mutant, ...] = (
    Mutant(
        "route-mixed-overlap",
        "-",
        "routes._route_small",
        "a D2H's direct runs sit from packed position 0, over its staged pages",
        _route_mixed_overlap,
    ),
    Mutant(
        "route-h2d-staged-overlap",
        "-",
        "routes._route_small",
        "an H2D's staged pages sit from packed position 0, over its direct runs",
        _route_h2d_staged_overlap,
    ),
    Mutant(
        "chunk-one-slot",
        "-",
        "routes.index_slots",
        "every chunk's L1 indices at slot 0: a chunk gathers or scatters another's pages",
        _chunk_one_slot,
    ),
    Mutant(
        "mapped-l1-from-l2",
        "-",
        "DmaPlan.fill_mapped",
        "a mapped D2H reads its L1 pages from its L2 page list",
        _mapped_l1_from_l2,
    ),
    Mutant(
        "pitched-short-page",
        "-",
        "dma.copy_pages",
        "a pitched copy moves one row short: a page's last row never arrives",
        _pitched_short_page,
    ),
)
