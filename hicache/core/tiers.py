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

TIER_OF: dict[str, Tier] = {t.value: t for t in TIERS}
"""`Tier(name)` as one dict read (an Enum call runs two Python frames); `tier_of` keeps
`Tier`'s own answer, and error, for anything else."""


def tier_of(tier: object) -> Tier:
    """`Tier(tier)`, the common names read from `TIER_OF`."""
    try:
        return TIER_OF[tier]  # type: ignore[index]
    except (KeyError, TypeError):
        return Tier(tier)


def tier_index(tier: object) -> int:
    """`TIERS.index(Tier(tier))`, the common names read from `TIER_OF`."""
    try:
        return _TIER_INDEX[tier]  # type: ignore[index]
    except (KeyError, TypeError):
        return TIERS.index(Tier(tier))


_TIER_INDEX: dict[str, int] = {t.value: i for i, t in enumerate(TIERS)}

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


DIRECTION_OF: dict[str, Direction] = {d.value: d for d in Direction}


def direction_of(name: object) -> Direction:
    """`Direction(name)`, the four names read from `DIRECTION_OF` (`tier_of`'s reason)."""
    try:
        return DIRECTION_OF[name]  # type: ignore[index]
    except (KeyError, TypeError):
        return Direction(name)


_ENDS: dict[Direction, tuple[Tier, Tier]] = {
    Direction.D2H: (Tier.L1, Tier.L2),
    Direction.H2D: (Tier.L2, Tier.L1),
    Direction.H2S: (Tier.L2, Tier.L3),
    Direction.S2H: (Tier.L3, Tier.L2),
}
