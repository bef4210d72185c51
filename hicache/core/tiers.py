"""Tiers and transfer directions: the two small vocabularies every module shares.

tier  where                      reached by
----  -------------------------  ------------------------------
L1    GPU memory (attention)     --
L2    pinned host, page-major    PCIe DMA (D2H / H2D)
L3    local file, fixed slots    pwrite / preadv (H2S / S2H)
"""

from __future__ import annotations

import enum


class Tier(str, enum.Enum):
    L1 = "L1"
    L2 = "L2"
    L3 = "L3"

    # The plain string ("L1"): str's own __str__ skips the enum's `value` descriptor, which
    # matters on the checker's hot path (a tier name per node per check).
    __str__ = str.__str__


TIERS: tuple[Tier, ...] = (Tier.L1, Tier.L2, Tier.L3)

MAX_PAGES = 1 << 24
"""Most pages one tier's table holds (16,777,216: about 150 MB of ownership and generation
arrays). A reference checks behaviour, not size: a trace, a vector case or a configuration
asking for more is refused with a typed error rather than allocating until memory runs out."""


class Direction(str, enum.Enum):
    """A transfer direction: which tier it reads (source) and which it fills (target)."""

    D2H = "D2H"  # L1 -> L2 (backup)
    H2D = "H2D"  # L2 -> L1 (restore, "load back")
    H2S = "H2S"  # L2 -> L3 (backup)
    S2H = "S2H"  # L3 -> L2 (restore, "promotion")

    @property
    def source(self) -> Tier:
        return _ENDS[self][0]

    @property
    def target(self) -> Tier:
        return _ENDS[self][1]

    def __str__(self) -> str:
        return self.value


_ENDS: dict[Direction, tuple[Tier, Tier]] = {
    Direction.D2H: (Tier.L1, Tier.L2),
    Direction.H2D: (Tier.L2, Tier.L1),
    Direction.H2S: (Tier.L2, Tier.L3),
    Direction.S2H: (Tier.L3, Tier.L2),
}
