"""Model-checker configurations: the small planes `hicache model-check` explores, and the
counts each is expected to give (the manifest, hicache/oracle/modelcheck/configs.toml).

A configuration fixes everything the search may choose from:

    field          meaning
    -------------  --------------------------------------------------------------------------
    page_size      tokens per page
    capacities     pages per tier (L1, L2, L3); 2-4 keeps the search exhaustive in seconds
    prompts        the prompts a request may begin with (token ids)
    requests       request ids 0 .. requests-1, each live at most once at a time
    per_request    false: every request may begin every prompt (request ids are symmetric);
                   true: request i begins prompts[i] only (no request symmetry)
    faults         `fail(op)` is an action (a transfer completes in failure)
    aborts         `cancel(op)` is an action (an abort, a drain, a cancelled restore)
    pools          the tiers' pool group preset ("mha": one pool; "dsv4-tiny": anchor pages
                   with a side pool following each, I9 checked); its anchor page size must
                   be `page_size`
    pool_capacities  a side pool's pages in a tier, {L2 = {swa = 1}} (default: the tier's
                   capacity * the pool's ratio, so the pool never binds)
    ranks          simulated tensor-parallel ranks (default 1: the one-plane search; 2-3: the
                   TP model, tpsearch.py: each rank its own plane, C2, C4 and C5 across
                   them, faults and aborts always on)
    ci             explored by the test suite (tests/test_modelcheck*.py)
    expected       states, edges, depth the search must report (a changed count is a
                   changed machine: update it only with a reason in the commit)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hicache.errors import ConfigError
from hicache.pools.presets import SINGLE_POOL
from hicache.spec import load_toml

CONFIGS_TOML = Path(__file__).with_name("configs.toml")
"""The shipped manifest of configurations and their expected counts."""


@dataclass(frozen=True)
class Expected:
    """What a configuration's search must report: distinct states, edges (successful action
    applications, self-loops included) and the BFS depth of the deepest state."""

    states: int
    edges: int
    depth: int


@dataclass(frozen=True)
class ModelConfig:
    """One configuration (see the module docstring for each field)."""

    name: str
    page_size: int
    capacities: tuple[int, int, int]
    prompts: tuple[tuple[int, ...], ...]
    requests: int
    per_request: bool = False
    faults: bool = True
    aborts: bool = True
    pools: str = SINGLE_POOL
    pool_capacities: tuple[tuple[str, str, int], ...] = ()  # (tier, pool, pages)
    ranks: int = 1
    ci: bool = False
    expected: Expected | None = None

    def prompts_for(self, request_id: int) -> tuple[int, ...]:
        """Indices into `prompts` that request `request_id` may begin with."""
        if self.per_request:
            return (request_id,)
        return tuple(range(len(self.prompts)))

    @property
    def symmetric_requests(self) -> bool:
        """Whether request ids are interchangeable: every request may begin the same prompts
        (and the actions treat ids alike), so renaming requests maps runs onto runs."""
        return not self.per_request or len(set(self.prompts[: self.requests])) <= 1


def load_configs(path: Path = CONFIGS_TOML) -> dict[str, ModelConfig]:
    """Every configuration of the manifest at `path`, by name. ConfigError naming the entry
    and field when one is malformed."""
    table = load_toml(path)
    out: dict[str, ModelConfig] = {}
    for entry in table.get("config", []):
        cfg = _parse(entry)
        if cfg.name in out:
            raise ConfigError(f"config {cfg.name}", f"named twice in {path}")
        out[cfg.name] = cfg
    return out


def get_config(name: str, path: Path = CONFIGS_TOML) -> ModelConfig:
    """The configuration `name`; ConfigError listing the known names otherwise."""
    configs = load_configs(path)
    if name not in configs:
        raise ConfigError(
            "--config", f"{name!r} is not a configuration; known: {', '.join(configs)}"
        )
    return configs[name]


def _parse(entry: Mapping[str, Any]) -> ModelConfig:
    name = str(entry.get("name", "?"))
    known = {
        "name",
        "page_size",
        "capacities",
        "prompts",
        "requests",
        "per_request",
        "faults",
        "aborts",
        "pools",
        "pool_capacities",
        "ranks",
        "ci",
        "expected",
        "doc",
    }
    extra = sorted(set(entry) - known)
    if extra:
        raise ConfigError(f"config {name}", f"unknown fields {extra}; known: {sorted(known)}")
    try:
        caps = tuple(int(c) for c in entry["capacities"])
        prompts = tuple(tuple(int(t) for t in p) for p in entry["prompts"])
        exp = entry.get("expected")
        cfg = ModelConfig(
            name=name,
            page_size=int(entry["page_size"]),
            capacities=(caps[0], caps[1], caps[2]),
            prompts=prompts,
            requests=int(entry["requests"]),
            per_request=bool(entry.get("per_request", False)),
            faults=bool(entry.get("faults", True)),
            aborts=bool(entry.get("aborts", True)),
            pools=str(entry.get("pools", SINGLE_POOL)),
            pool_capacities=tuple(
                (str(tier), str(pool), int(n))
                for tier, sizes in entry.get("pool_capacities", {}).items()
                for pool, n in sizes.items()
            ),
            ranks=int(entry.get("ranks", 1)),
            ci=bool(entry.get("ci", False)),
            expected=None
            if exp is None
            else Expected(int(exp["states"]), int(exp["edges"]), int(exp["depth"])),
        )
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise ConfigError(
            f"config {name}",
            f"missing or malformed field ({e!r}); see hicache/oracle/modelcheck/config.py",
        ) from None
    if (
        len(caps) != 3
        or min(caps) < 1
        or cfg.page_size < 1
        or cfg.requests < 1
        or cfg.ranks < 1
        or not prompts
        or any(len(p) < 2 for p in prompts)
    ):
        raise ConfigError(
            f"config {name}",
            "need 3 positive capacities, page_size >= 1, requests >= 1, ranks >= 1 "
            "and prompts of at least 2 tokens",
        )
    if cfg.ranks > 1 and not (cfg.faults and cfg.aborts):
        raise ConfigError(
            f"config {name}",
            "the TP model (ranks > 1) always has faults and aborts: its drain is shown by "
            "cancels, and each rank's faults are the point; leave both out",
        )
    if cfg.per_request and len(prompts) < cfg.requests:
        raise ConfigError(
            f"config {name}", f"per_request needs one prompt per request ({cfg.requests})"
        )
    return cfg
