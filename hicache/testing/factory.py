"""The adapter factory: how `hicache fuzz --adapter` and `hicache vectors run --adapter` build
an engine. One protocol for both commands:

    factory(config: EngineConfig) -> CacheUnderTest

`--adapter module:factory` names a callable of one argument in an importable module (the
current directory is importable, as with `python -m`). For each run (the fuzz) or case (the
vectors) the factory gets an `EngineConfig` and returns a fresh engine behind the
`CacheUnderTest` protocol (protocol.py), or raises `UnsupportedConfig` for a configuration its
engine cannot take: the vectors then skip the case, and the fuzz never draws that shape.

    field           meaning                                   the fuzz draws       vectors
    --------------  ----------------------------------------  -------------------  ----------
    page_size       tokens per page                           4                    the case's
    capacities      pages per tier the engine must have:      L1 alone (8..12),    the case's
                    {"L1": n}, {"L1": n, "L2": m}, or          or L1 7..12, L2
                    {"L1": n, "L2": m, "L3": k} (L3: slots)    3..12 (, L3 2..16)
    write_policy    spec/policies.md's names                  each of the three    the case's
    restore_policy  spec/policies.md's names                  always               always
    promotion       an L3 restore's promoted L2 copies stay    true or false        the case's
    plane           null: no bytes; cpu, cuda: real bytes     `--plane`            null

Before its runs the fuzz builds one engine of each shape (`SHAPES`: L1 alone; three tiers
under each write policy, promotion on and off; L1 and L2 under each write policy) and closes
it, to learn which the factory takes; it then draws every configuration of those shapes, so a
factory takes all of a shape or none of it. A factory that is not what this protocol asks is
a usage error, `AdapterError` (exit status 2, one line naming the hook): a module that cannot
be imported, a name that is missing or not callable, a callable that does not take one
argument, a call that raises anything but a `HiCacheError`, or a result that lacks a
`CacheUnderTest` member.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from hicache.choices import EnumField, RestorePolicy, WritePolicy, check
from hicache.controller.config import WRITE_POLICIES
from hicache.core.tiers import TIERS as TIER_ENUM
from hicache.errors import ConfigError, HiCacheError
from hicache.testing.protocol import CacheUnderTest

TIERS = tuple(str(t) for t in TIER_ENUM)  # "L1", "L2", "L3"
Factory = Callable[["EngineConfig"], CacheUnderTest]


@dataclass(frozen=True)
class EngineConfig:
    """What a factory builds an engine with (the module docstring's table; a vector case's
    `config`, spec/vectors.md "Configuration"). `capacities`: pages per tier, in tier order,
    for the tiers the engine must have (`tiers`)."""

    page_size: int
    capacities: dict[str, int] = field(default_factory=dict)
    write_policy: EnumField[WritePolicy] = EnumField(WritePolicy.WRITE_THROUGH)
    restore_policy: EnumField[RestorePolicy] = EnumField(RestorePolicy.ALWAYS)
    promotion: bool = True
    plane: str = "null"

    def __post_init__(self) -> None:
        # The policies' strings become their enums as they are set; a bad one: ConfigError.
        check(self, "write_policy", "restore_policy")

    @property
    def tiers(self) -> tuple[str, ...]:
        return tuple(t for t in TIERS if t in self.capacities)

    @property
    def l1_prompt_pages(self) -> int | None:
        """The most pages one prompt may take: L1's capacity (None: no L1 capacity given)."""
        return self.capacities.get("L1")


class UnsupportedConfig(HiCacheError):
    """A factory cannot build an engine for a configuration (another page size, fewer tiers, a
    policy it lacks): the vectors report the case as skipped; the fuzz leaves the shape out."""


class AdapterError(ConfigError):
    """`--adapter` names something that is not a factory of this protocol; the message says
    which hook is wrong and what it must be (the commands print it as one line, exit 2)."""

    def __init__(self, spec: str, problem: str) -> None:
        super().__init__("--adapter", f"{spec}: {problem}")


PROTOCOL = "factory(config: EngineConfig) -> CacheUnderTest (hicache/testing/factory.py)"
"""What an error about a factory says the hook must be."""

MEMBERS = tuple(
    sorted(
        {n for n, v in vars(CacheUnderTest).items() if not n.startswith("_") and callable(v)}
        | set(CacheUnderTest.__annotations__)
    )
)
"""The names a `CacheUnderTest` has: its methods and its data members (page_size, tiers)."""

SHAPES = (
    (EngineConfig(4, {"L1": 8}),)
    + tuple(
        EngineConfig(4, {"L1": 10, "L2": 8, "L3": 12}, policy, "always", promotion)
        for policy in WRITE_POLICIES
        for promotion in (True, False)
    )
    + tuple(EngineConfig(4, {"L1": 10, "L2": 8}, policy) for policy in WRITE_POLICIES)
)
"""One configuration of every shape the fuzz draws (hicache/testing/draws.py: `configs`). The
two-tier shapes (L1 and L2, no last tier to restore from: promotion does not apply) come last,
so a factory that refuses them draws exactly what it drew before they existed."""


def load_factory(spec: str) -> Factory:
    """`module:name` -> the factory it names, the current directory importable first.
    AdapterError saying what is wrong."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise AdapterError(spec, f"give module:factory, a {PROTOCOL}")
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.insert(0, cwd)  # what `python -m` does: a module beside you is importable
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and module_name.startswith(e.name):
            raise AdapterError(
                spec,
                f"no module {module_name} here ({cwd}) or on the path; run from the "
                f"directory that holds {module_name.replace('.', '/')}.py, or install it",
            ) from None
        raise AdapterError(
            spec, f"{module_name} imports {e.name}, which is not installed"
        ) from None
    except Exception as e:  # the module's own code failed: say so in one line
        raise AdapterError(
            spec, f"importing {module_name} raised {type(e).__name__}: {e}"
        ) from None
    factory = getattr(module, name, None)
    if factory is None:
        raise AdapterError(spec, f"{module_name} has no {name!r}; define a {PROTOCOL}")
    if not callable(factory):
        raise AdapterError(
            spec, f"{module_name}.{name} = {factory!r:.40} is not callable: define a {PROTOCOL}"
        )
    _verify_one_argument(spec, factory)
    return factory  # type: ignore[no-any-return]


def _verify_one_argument(spec: str, factory: Callable[..., object]) -> None:
    """AdapterError unless `factory` can be called with one positional argument."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return  # a builtin or C callable: its call will tell
    try:
        signature.bind(None)
    except TypeError:
        raise AdapterError(
            spec, f"{_name(factory)}{signature} does not take one argument: a {PROTOCOL}"
        ) from None


def build(factory: Factory, config: EngineConfig, spec: str = "the factory") -> CacheUnderTest:
    """`factory(config)`, checked to be a `CacheUnderTest`. UnsupportedConfig and other
    HiCacheErrors (the engine refused to be built) pass through; anything else the call
    raises, and a result without the protocol's members, is an AdapterError."""
    try:
        engine = factory(config)
    except HiCacheError:
        raise
    except Exception as e:  # a factory of another protocol (e.g. int(config)): a usage error
        raise AdapterError(
            spec,
            f"{_name(factory)}({config}) raised {type(e).__name__}: {e}; a {PROTOCOL} "
            "builds the engine the config describes",
        ) from None
    missing = [m for m in MEMBERS if not hasattr(engine, m)]
    wrong = [m for m in MEMBERS if m not in missing and m not in ("page_size", "tiers")]
    wrong = [m for m in wrong if not callable(getattr(engine, m))]
    if missing or wrong:
        what = (f"lacks {', '.join(missing)}" if missing else "") + (
            f"{'; ' if missing else ''}has {', '.join(wrong)} not callable" if wrong else ""
        )
        raise AdapterError(
            spec,
            f"{_name(factory)} returned <{type(engine).__name__}>, which {what}: a "
            "CacheUnderTest has every method of hicache/testing/protocol.py",
        )
    return engine


def shapes_taken(factory: Factory, spec: str, plane: str) -> list[EngineConfig]:
    """The configurations of SHAPES (on `plane`) the factory builds an engine for (each built
    once and closed). AdapterError when it takes none, or builds one of another page size
    or with fewer tiers than asked."""
    taken, refusals = [], []
    for shape in SHAPES:
        config = replace(shape, plane=plane)
        try:
            engine = build(factory, config, spec)
        except UnsupportedConfig as e:
            refusals.append(f"{'+'.join(config.tiers)}: {e}")
            continue
        except AdapterError:
            raise
        except HiCacheError as e:
            raise AdapterError(
                spec, f"{_name(factory)}({config}) raised {type(e).__name__}: {e}"
            ) from None
        try:
            if engine.page_size != config.page_size or not set(config.tiers) <= set(engine.tiers):
                raise AdapterError(
                    spec,
                    f"{_name(factory)} built page size {engine.page_size}, tiers "
                    f"{list(engine.tiers)} for page size {config.page_size}, tiers "
                    f"{list(config.tiers)}",
                )
        finally:
            engine.close()
        taken.append(config)
    if not taken:
        raise AdapterError(
            spec,
            f"{_name(factory)} raised UnsupportedConfig for every shape the fuzz draws "
            f"({'; '.join(dict.fromkeys(refusals))}); it needs L1 alone, L1 and L2, or L1, "
            f"L2 and L3 of {SHAPES[0].page_size}-token pages",
        )
    return taken


def _name(factory: Callable[..., object]) -> str:
    return f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', factory)}"
