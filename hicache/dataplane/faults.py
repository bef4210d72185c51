"""Fault injection sites (tests now, the fuzzer later). Zero cost when no injector is set:
each site is `if faults is not None and faults.fire(SITE, ...)`.

    site              where it fires                          what the transfer reports
    ----------------  --------------------------------------  -------------------------------
    DEVICE_ALLOC      a device workspace allocation          TransferError at issue
    PINNED_ALLOC      a pinned host allocation               TransferError at issue
    D2H_COMPLETE      D2H completion is observed              FAILED
    H2D_COMPLETE      H2D completion is observed              FAILED
    IO_EIO            a pread/pwrite call                     FAILED (EIO)
    IO_ENOSPC         a pwrite call                           FAILED (ENOSPC)
    SHORT_READ        a preadv returns fewer bytes            resumed; FAILED if it persists
    SHORT_WRITE       a pwrite returns fewer bytes            resumed; FAILED if it persists
    CORRUPT_SLOT      a slot's bytes are flipped after write  S2H FAILED (checksum), a miss
    DELAY             completion is observed late             PENDING for `delay_polls` polls
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field


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


@dataclass
class FaultInjector:
    """Fires sites by script (`once`: the next N firings of a site) or by probability.

    Deterministic for a given `seed`. `fired` counts what actually fired, per site.
    """

    seed: int = 0
    rates: dict[FaultSite, float] = field(default_factory=dict)
    delay_polls: int = 3
    _once: dict[FaultSite, int] = field(default_factory=dict)
    fired: dict[FaultSite, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def once(self, site: FaultSite, times: int = 1) -> "FaultInjector":
        """Make the next `times` checks of `site` fire."""
        self._once[site] = self._once.get(site, 0) + times
        return self

    def fire(self, site: FaultSite) -> bool:
        """Whether the fault at `site` happens now (and count it)."""
        hit = False
        if self._once.get(site, 0) > 0:
            self._once[site] -= 1
            hit = True
        elif site in self.rates and self._rng.random() < self.rates[site]:
            hit = True
        if hit:
            self.fired[site] = self.fired.get(site, 0) + 1
        return hit
