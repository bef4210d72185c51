"""Fault injection: seeded per-site schedules, one-shot scripts and faults aimed at one op.
Zero cost when no injector is set: each site is `if faults is not None and faults.fire(SITE)`.

Every site is in `SITES` (the registry): where it is reached, what the caller sees, and the
planes that reach it, so a coverage gate can list the sites a run never reached
(`FaultInjector.unreached`). spec/faults.md is the normative page.

    site                  reached                                 what the caller sees
    --------------------  --------------------------------------  ---------------------------
    DEVICE_ALLOC          a device workspace allocation           D2H/H2D FAILED at issue
    PINNED_ALLOC          a pinned host allocation                D2H/H2D FAILED at issue
    D2H_COMPLETE          D2H completion is observed              FAILED
    H2D_COMPLETE          H2D completion is observed              FAILED
    IO_EIO                a pread/pwrite call                     FAILED (EIO)
    IO_ENOSPC             a pwrite call                           FAILED (ENOSPC)
    SHORT_READ            a preadv returns fewer bytes            resumed; FAILED if it persists
    SHORT_WRITE           a pwrite returns fewer bytes            resumed; FAILED if it persists
    CORRUPT_SLOT          a slot's bytes are flipped after write  S2H FAILED (checksum), a miss
    DELAY                 completion is observed late             PENDING for `delay_polls` polls
    ALLOC_L1/L2/L3        the controller reserves target pages    OutOfPages, as if the tier
                                                                  were full (nothing changed)
    CRASH_BEFORE_PUBLISH  a DONE completion, before `complete`    SimulatedCrash: close, reopen
    S2H_PARTIAL           an S2H's landing is observed (null      FAILED, with `landed`: the
                          planes)                                 pages each pool landed

Schedules. `FaultInjector.schedule(seed, enable_p, fire_p)`: each site is switched on for the
run with probability `enable_p`, then fires with probability `fire_p` each time it is
reached (`rates`). `once(site, n)`: the next n checks of a site fire. `aim(action, ...)`: the
next op matching a direction and request meets `action` (`Aim`), whatever the rates say.
All draws come from one `random.Random(seed)` in the order sites are reached: a run whose
sites are reached in the same order replays exactly.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from hicache.core.tiers import Direction, Tier
from hicache.errors import ConfigError, HiCacheError, TransferError


class FaultSite(str, enum.Enum):
    DEVICE_ALLOC = "DEVICE_ALLOC"
    PINNED_ALLOC = "PINNED_ALLOC"
    D2H_COMPLETE = "D2H_COMPLETE"
    H2D_COMPLETE = "H2D_COMPLETE"
    IO_EIO = "IO_EIO"
    IO_ENOSPC = "IO_ENOSPC"
    SHORT_READ = "SHORT_READ"
    SHORT_WRITE = "SHORT_WRITE"
    CORRUPT_SLOT = "CORRUPT_SLOT"
    DELAY = "DELAY"
    ALLOC_L1 = "ALLOC_L1"
    ALLOC_L2 = "ALLOC_L2"
    ALLOC_L3 = "ALLOC_L3"
    CRASH_BEFORE_PUBLISH = "CRASH_BEFORE_PUBLISH"
    S2H_PARTIAL = "S2H_PARTIAL"


Plane = Literal["real", "null"]
BOTH: tuple[Plane, ...] = ("real", "null")


class SiteInfo(NamedTuple):
    where: str  # the point in the code that consults the site
    effect: str  # what the caller observes when it fires
    planes: tuple[Plane, ...]  # data planes on which the site is reached


SITES: dict[FaultSite, SiteInfo] = {
    FaultSite.DEVICE_ALLOC: SiteInfo(
        "dma workspace (device)", "D2H/H2D FAILED at issue", ("real",)
    ),
    FaultSite.PINNED_ALLOC: SiteInfo(
        "dma workspace (pinned host)", "D2H/H2D FAILED at issue", ("real",)
    ),
    FaultSite.D2H_COMPLETE: SiteInfo("D2H completion observed", "FAILED", BOTH),
    FaultSite.H2D_COMPLETE: SiteInfo("H2D completion observed", "FAILED", BOTH),
    FaultSite.IO_EIO: SiteInfo("an L3 read or write", "H2S/S2H FAILED (EIO)", BOTH),
    FaultSite.IO_ENOSPC: SiteInfo("an L3 write", "H2S FAILED (ENOSPC)", BOTH),
    FaultSite.SHORT_READ: SiteInfo(
        "an L3 read", "resumed; S2H FAILED (UnreadableSlot) if it persists", BOTH
    ),
    FaultSite.SHORT_WRITE: SiteInfo("an L3 write", "resumed; H2S FAILED if it persists", ("real",)),
    FaultSite.CORRUPT_SLOT: SiteInfo(
        "an L3 write lands", "a later S2H of the slot FAILED (CorruptSlot)", BOTH
    ),
    FaultSite.DELAY: SiteInfo(
        "a transfer is issued", "completion observed `delay_polls` polls late", BOTH
    ),
    FaultSite.ALLOC_L1: SiteInfo("controller reserves L1 pages", "OutOfPages(L1)", BOTH),
    FaultSite.ALLOC_L2: SiteInfo("controller reserves L2 pages", "OutOfPages(L2)", BOTH),
    FaultSite.ALLOC_L3: SiteInfo("controller reserves L3 slots", "OutOfPages(L3)", BOTH),
    FaultSite.CRASH_BEFORE_PUBLISH: SiteInfo(
        "a DONE completion, before publication", "SimulatedCrash; close and reopen", BOTH
    ),
    FaultSite.S2H_PARTIAL: SiteInfo(
        "an S2H's landing is observed",
        "FAILED with `landed` (the pages each pool landed; a pool "
        "left out landed none): the clamp is published",
        ("null",),
    ),
}
ALLOC_SITES = {
    Tier.L1: FaultSite.ALLOC_L1,
    Tier.L2: FaultSite.ALLOC_L2,
    Tier.L3: FaultSite.ALLOC_L3,
}


def sites_for(plane: Plane) -> tuple[FaultSite, ...]:
    """The sites a run on `plane` can reach (what a coverage gate expects to see reached)."""
    return tuple(site for site, info in SITES.items() if plane in info.planes)


class SimulatedCrash(HiCacheError):
    """Injected (CRASH_BEFORE_PUBLISH): the process died after a transfer's bytes moved and
    before its completion was published. The controller refuses further use: close it (it
    quiesces the data plane and releases the L3 file) and open a new one, which starts
    empty (spec/faults.md, "A crash between a transfer and its publication")."""


Action = Literal["fail", "delay", "corrupt", "short_read", "partial", "alloc", "crash"]
ACTIONS: tuple[Action, ...] = (
    "fail",
    "delay",
    "corrupt",
    "short_read",
    "partial",
    "alloc",
    "crash",
)
READ_ACTIONS: tuple[Action, ...] = ("corrupt", "short_read", "partial")  # S2H only
ACTION_SITE: dict[Action, FaultSite | None] = {
    "fail": None,  # counted under the direction's completion site (below)
    "delay": FaultSite.DELAY,
    "corrupt": FaultSite.CORRUPT_SLOT,
    "short_read": FaultSite.SHORT_READ,
    "partial": FaultSite.S2H_PARTIAL,
    "alloc": None,  # counted under the target tier's ALLOC site
    "crash": FaultSite.CRASH_BEFORE_PUBLISH,
}
FAIL_SITE = {
    Direction.D2H: FaultSite.D2H_COMPLETE,
    Direction.H2D: FaultSite.H2D_COMPLETE,
    Direction.H2S: FaultSite.IO_EIO,
    Direction.S2H: FaultSite.IO_EIO,
}


@dataclass(frozen=True)
class Aim:
    """A fault aimed at the next op that matches: `direction` (None: any) issued for
    `request_id` (None: any, backups included). Actions:

    | action     | effect on that op                                                       |
    | ---------- | ----------------------------------------------------------------------- |
    | fail       | observed FAILED (TransferError) on the next poll                        |
    | delay      | observed `polls` polls after it finished                                |
    | corrupt    | S2H only: the first slot it reads is corrupt (CorruptSlot, a miss)      |
    | short_read | S2H only: its reads stay short (UnreadableSlot, a miss)                 |
    | partial    | S2H only: it stops with part of each pool landed (`landed`, drawn by    |
    |            | `landing`): the caller publishes the clamp of that (S2H_PARTIAL)        |
    | alloc      | its target reservation fails as if the tier were full (OutOfPages)      |
    | crash      | the process dies once its DONE is observed, before it is published      |
    """

    action: Action
    direction: Direction | None = None
    request_id: int | None = None
    polls: int = 3

    def matches(self, direction: Direction, request_id: int | None) -> bool:
        if self.direction is not None and self.direction is not direction:
            return False
        return self.request_id is None or self.request_id == request_id

    def site(self, direction: Direction) -> FaultSite:
        """The registry site this aimed fault counts under."""
        named = ACTION_SITE[self.action]
        if named is not None:
            return named
        if self.action == "alloc":
            return ALLOC_SITES[direction.target]
        return FAIL_SITE[direction]


@dataclass
class FaultInjector:
    """Fires sites by script (`once`), by aim (`aim`) or by probability (`rates`).

    Deterministic for a given `seed`. `reached` counts every check of a site, `fired` the
    checks that fired (aimed faults included, under their site).
    """

    seed: int = 0
    rates: dict[FaultSite, float] = field(default_factory=dict)
    delay_polls: int = 3
    _once: dict[FaultSite, int] = field(default_factory=dict)
    fired: dict[FaultSite, int] = field(default_factory=dict)
    reached: dict[FaultSite, int] = field(default_factory=dict)
    aims: list[Aim] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        for site, rate in self.rates.items():
            _check_rate(f"rates[{FaultSite(site).value}]", rate)

    @classmethod
    def schedule(
        cls,
        seed: int,
        enable_p: float = 0.5,
        fire_p: float = 0.05,
        sites: tuple[FaultSite, ...] = tuple(SITES),
        delay_polls: int = 3,
    ) -> FaultInjector:
        """A seeded per-site schedule: each of `sites` is switched on for the run with
        probability `enable_p`; a site that is on fires with probability `fire_p` each time
        it is reached. ConfigError for a probability outside [0, 1]."""
        _check_rate("enable_p", enable_p)
        _check_rate("fire_p", fire_p)
        pick = random.Random(f"schedule:{seed}")  # apart from the firing draws
        rates = {site: fire_p for site in sites if pick.random() < enable_p}
        return cls(seed=seed, rates=rates, delay_polls=delay_polls)

    def once(self, site: FaultSite, times: int = 1) -> FaultInjector:
        """Make the next `times` checks of `site` fire."""
        self._once[site] = self._once.get(site, 0) + times
        return self

    def aim(
        self,
        action: Action,
        *,
        direction: Direction | None = None,
        request_id: int | None = None,
        polls: int = 3,
    ) -> FaultInjector:
        """Aim `action` at the next op matching `direction` and `request_id` (see `Aim`).
        ConfigError for an unknown action, or corrupt/short_read/partial aimed at a direction
        other than S2H."""
        if action not in ACTIONS:
            raise ConfigError("aim.action", f"one of {', '.join(ACTIONS)}; got {action!r}")
        if action in READ_ACTIONS and direction is not Direction.S2H:
            raise ConfigError(
                "aim.direction", f"{action} is a fault of an L3 read: aim it at Direction.S2H"
            )
        self.aims.append(Aim(action, direction, request_id, polls))
        return self

    def aimed(self, direction: Direction, request_id: int | None) -> Aim | None:
        """The first aim matching an op being issued (removed and counted), or None."""
        for i, aim in enumerate(self.aims):
            if aim.matches(direction, request_id):
                del self.aims[i]
                site = aim.site(direction)
                self.reached[site] = self.reached.get(site, 0) + 1
                self.fired[site] = self.fired.get(site, 0) + 1
                return aim
        return None

    def fire(self, site: FaultSite) -> bool:
        """Whether the fault at `site` happens now (and count it)."""
        self.reached[site] = self.reached.get(site, 0) + 1
        hit = False
        if self._once.get(site, 0) > 0:
            self._once[site] -= 1
            hit = True
        elif site in self.rates and self._rng.random() < self.rates[site]:
            hit = True
        if hit:
            self.fired[site] = self.fired.get(site, 0) + 1
        return hit

    def landing(self, pages: Mapping[str, int]) -> dict[str, int]:
        """S2H_PARTIAL's per-pool report for an S2H of `pages[pool]` pages per pool (each in
        the pool's own pages), drawn from a generator of its own, seeded by `seed` and by
        how many site checks this injector has made (so reports differ with the run's
        history, and drawing one leaves the sites' draws as they were): one pool, drawn,
        stopped after a drawn 0..pages[pool] of its pages, every other pool landed all of
        its own; with probability 1/4 the stopped pool is left out of the report instead (it
        counts as none landed: F12). A sidecar that stopped before the anchor is F11."""
        report = dict(pages)
        if not report:
            return report
        rng = random.Random(f"landing:{self.seed}:{sum(self.reached.values())}")
        pool = sorted(report)[rng.randrange(len(report))]
        if rng.random() < 0.25:
            del report[pool]
        else:
            report[pool] = rng.randint(0, report[pool])
        return report

    def unreached(self, plane: Plane) -> list[FaultSite]:
        """Sites `plane` can reach that this run never checked (the coverage gate's list)."""
        return [site for site in sites_for(plane) if not self.reached.get(site)]


def completion_fault(faults: FaultInjector | None, direction: Direction) -> TransferError | None:
    """Draw a D2H/H2D transfer's completion site (D2H_COMPLETE, H2D_COMPLETE) as its landing
    is observed: the TransferError it fails with when the site fires, else None."""
    site = FaultSite.D2H_COMPLETE if direction is Direction.D2H else FaultSite.H2D_COMPLETE
    if faults is None or not faults.fire(site):
        return None
    return TransferError(
        f"{direction}: completion failed ({site.value} injected); release the target pages"
    )


def _check_rate(name: str, p: float) -> None:
    if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.0 <= p <= 1.0:
        raise ConfigError(name, f"a probability in [0, 1], got {p!r}")
