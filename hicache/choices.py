"""The knobs that are one of a few names: each a `StrEnum`, its legal values listed here once.

    enum             CacheConfig knob     values (spec/config.md)
    ---------------  -------------------  ------------------------------------------------
    WritePolicy      write_policy         write_through, write_through_selective, write_back
    RestorePolicy    policy               cost, always, never, threshold
    LoadBackOverlap  load_back_overlap    share, back_off
    HitPolicy        hit_policy           all_pools, anchor_recompute_swa
    TransferRoute    transfer_route       auto, dma, mapped, pitched

A member *is* its name (`StrEnum`): it compares equal to the string, is written to JSON and
formatted as the string, and its repr is the string's, so messages, reproducers and files
say exactly what they said when these were plain strings. The user still passes the string
(`CacheConfig(write_policy="write_back")`, `--write-policy write_back`); a config class
converts it once, where it is built (`EnumField`: a dataclass field that converts), and the
code behind it compares members. A name that is none of the values stays as given until the
class's own check refuses it with ConfigError naming the legal values (`check`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Generic, Self, TypeVar, overload

from hicache.errors import ConfigError


class ConfigEnum(StrEnum):
    """A knob's legal names; a member's repr is its string's (`'write_back'`)."""

    def __repr__(self) -> str:
        return repr(self.value)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The legal values, in declaration order, as plain strings."""
        return tuple(m.value for m in cls)

    @classmethod
    def parse(cls, knob: str, value: object) -> Self:
        """`value` as a member; ConfigError naming `knob` and the legal values if it is none."""
        try:
            return cls(value)  # type: ignore[arg-type]  # any value: refused below
        except (ValueError, TypeError):
            raise ConfigError(knob, f"one of {', '.join(cls.names())}; got {value!r}") from None


E = TypeVar("E", bound=ConfigEnum)


class WritePolicy(ConfigEnum):
    """When a node's L1 pages are backed up to L2 (spec/policies.md, "Write policies")."""

    WRITE_THROUGH = "write_through"
    WRITE_THROUGH_SELECTIVE = "write_through_selective"
    WRITE_BACK = "write_back"


class RestorePolicy(ConfigEnum):
    """Restore or recompute a lower tier's hit (spec/policies.md, "Restore policies")."""

    COST = "cost"
    ALWAYS = "always"
    NEVER = "never"
    THRESHOLD = "threshold"


class LoadBackOverlap(ConfigEnum):
    """A load-back that overlaps one in flight: share it, or back off (SGLang's guard 3)."""

    SHARE = "share"
    BACK_OFF = "back_off"


class HitPolicy(ConfigEnum):
    """A pool group's hit policy (spec/pools.md, "Hits across pools")."""

    ALL_POOLS = "all_pools"
    ANCHOR_RECOMPUTE_SWA = "anchor_recompute_swa"


class TransferRoute(ConfigEnum):
    """How a D2H or H2D between L1 and L2 moves its pages (spec/lifecycle.md, the D2H and
    H2D transitions; hicache/dataplane/routes.py, `route_requests`)."""

    AUTO = "auto"  # per transfer the measured rule: mapped D2Hs, pitched small H2Ds
    DMA = "dma"  # a packed device buffer and DMAs only
    MAPPED = "mapped"  # every D2H one mapped copy into L2 in place; H2Ds by DMA
    PITCHED = "pitched"  # every transfer of up to PITCHED_MAX_PAGES pages a 2D DMA per page


class EnumField(Generic[E]):
    """A dataclass field holding a member of one `ConfigEnum`, set from the member or its
    string (the legal string becomes the member as it is set)::

        @dataclass(frozen=True)
        class Config:
            write_policy: EnumField[WritePolicy] = EnumField(WritePolicy.WRITE_THROUGH)

    `Config(write_policy="write_back").write_policy is WritePolicy.WRITE_BACK`. A value that
    is no member is kept as given, for the class's `__post_init__` to refuse (`check`), so a
    config's checks run in the order they always did."""

    def __init__(self, default: E) -> None:
        self.default = default
        self.cls: type[E] = type(default)
        self.attr = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.attr = "_" + name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> E: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> E: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> E:
        if obj is None:  # the class's: dataclasses reads the field's default here
            return self.default
        value: E = obj.__dict__[self.attr]
        return value

    def __set__(self, obj: object, value: E | str) -> None:
        try:
            value = self.cls(value)
        except (ValueError, TypeError):
            pass  # refused by the owner's check, naming the knob
        object.__setattr__(obj, self.attr, value)


def check(obj: object, *knobs: str) -> None:
    """ConfigError naming the first of `knobs` (fields of `obj` made with `EnumField`) whose
    value is no member of its enum, and that enum's legal values."""
    for knob in knobs:
        field = next(c.__dict__[knob] for c in type(obj).__mro__ if knob in c.__dict__)
        assert isinstance(field, EnumField), f"{knob} is not an EnumField"
        field.cls.parse(knob, getattr(obj, knob))
