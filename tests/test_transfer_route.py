"""CacheConfig's `transfer_route` (spec/config.md): which route a controller's D2Hs and H2Ds
take (routes.route_requests), the pairs the configuration refuses, and the stateful fuzz,
which draws the knob, running every route's code on the cpu plane with restores verified
byte for byte."""

from __future__ import annotations

import collections
from collections.abc import Iterator

import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

from hicache.choices import TransferRoute
from hicache.controller.config import CacheConfig
from hicache.dataplane.bytepaths import GroupPath, OnePoolPath
from hicache.dataplane.dma import DeviceHostMover
from hicache.dataplane.engine import TransferEngine
from hicache.dataplane.geometry import preset
from hicache.dataplane.groupgeometry import one_pool
from hicache.dataplane.grouptransfer import GroupMover
from hicache.dataplane.routes import EVERY, MAPPED_ENV, PITCHED_ENV, route_choice
from hicache.errors import ConfigError
from hicache.pools.presets import group

# route -> (mapped on, every D2H mapped, pitched on, every small transfer pitched), on a CPU
EXPECTED = {
    TransferRoute.AUTO: (False, False, False, False),  # off the GPU: DMA unless asked
    TransferRoute.DMA: (False, False, False, False),
    TransferRoute.MAPPED: (True, True, False, False),
    TransferRoute.PITCHED: (False, False, True, True),
}


@pytest.fixture
def no_route_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(MAPPED_ENV, raising=False)
    monkeypatch.delenv(PITCHED_ENV, raising=False)
    yield


def one_pool_mover(engine: TransferEngine) -> DeviceHostMover:
    path = engine._path
    assert isinstance(path, OnePoolPath), type(path)
    return path.dma


def group_mover(engine: TransferEngine) -> GroupMover:
    path = engine._path
    assert isinstance(path, GroupPath), type(path)
    return path.mover


@pytest.mark.parametrize("route", list(TransferRoute))
def test_each_route_sets_the_single_pools_mover(no_route_env: None, route: TransferRoute) -> None:
    with TransferEngine(one_pool(preset("tiny")), 4, 4, 4, device="cpu", transfer_route=route) as e:
        dma = one_pool_mover(e)
        got = (dma.mapped_d2h, dma.mapped_every, dma.pitched, dma.pitched_every)
        assert got == EXPECTED[route], (route, dma.mapped_reason, dma.pitched_reason)


@pytest.mark.parametrize("route", [TransferRoute.DMA, TransferRoute.PITCHED])
def test_an_explicit_route_overrides_the_environment(
    monkeypatch: pytest.MonkeyPatch, route: TransferRoute
) -> None:
    """`dma` and `pitched` name the route: HICACHE_MAPPED_D2H=all does not put D2Hs back on
    the mapped route (`auto` would)."""
    monkeypatch.setenv(MAPPED_ENV, "all")
    with TransferEngine(one_pool(preset("tiny")), 4, 4, 4, device="cpu", transfer_route=route) as e:
        assert not one_pool_mover(e).mapped_d2h


def test_a_groups_mover_takes_mapped_and_refuses_pitched(no_route_env: None) -> None:
    dsv4 = group("dsv4-tiny")
    with TransferEngine(dsv4, 4, 4, 4, device="cpu", transfer_route="mapped") as e:
        mover = group_mover(e)
        assert mover.mapped_d2h and mover.mapped_every
    with TransferEngine(dsv4, 4, 4, 4, device="cpu", transfer_route="dma") as e:
        assert not group_mover(e).mapped_d2h
    with pytest.raises(ConfigError, match="transfer_route.*pitched"):
        TransferEngine(dsv4, 4, 4, 4, device="cpu", transfer_route="pitched")


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"transfer_route": "zero_copy"}, "transfer_route: one of auto, dma, mapped, pitched"),
        ({"transfer_route": "pitched", "pools": "dsv4-tiny"}, "transfer_route: 'dsv4-tiny'"),
        (
            {"transfer_route": "mapped", "device": "cuda", "backend": "torch"},
            "transfer_route: the mapped route on a GPU is a Triton kernel",
        ),
    ],
)
def test_the_configuration_refuses_a_route_it_cannot_run(
    fields: dict[str, str], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        CacheConfig(**fields)  # type: ignore[arg-type]


def test_a_route_asked_for_overrides_what_the_rule_prefers_not() -> None:
    """`prefer_not` (a size never measured) keeps the rule off, not a request or the
    environment; `why_not` (cannot run) refuses a request by name; EVERY and the
    environment's `all` mean every transfer."""

    def choice(requested: bool | str | None, prefer_not: str = "") -> tuple[bool, bool, str]:
        return route_choice(
            requested,  # type: ignore[arg-type]
            env="HICACHE_TEST_ROUTE",
            field="route",
            cuda=True,
            why_not="",
            on="on",
            prefer_not=prefer_not,
        )

    assert choice(None, "short rows") == (False, False, "off: short rows")
    assert choice(True, "short rows") == (True, False, "on")
    assert choice(EVERY, "short rows") == (True, True, "on")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HICACHE_TEST_ROUTE", "all")
        assert choice(None, "short rows") == (True, True, "on")
        assert choice(True) == (True, True, "on")
    with pytest.raises(ConfigError, match="route: cannot run here: no copy"):
        route_choice(EVERY, env="X", field="route", cuda=True, why_not="no copy", on="on")


@pytest.mark.parametrize(
    ("pools", "steps", "least"),
    [
        (
            "mha",
            1000,
            {"DeviceHostMover._enqueue_mapped": 10, "DeviceHostMover._enqueue_pitched": 10},
        ),
        ("dsv4-tiny", 400, {"GroupMover._enqueue_mapped": 10}),
    ],
)
def test_the_cpu_fuzz_runs_every_route_it_draws(
    monkeypatch: pytest.MonkeyPatch,
    no_route_env: None,
    pools: str,
    steps: int,
    least: dict[str, int],
) -> None:
    """The fuzz draws `transfer_route` on the planes with bytes: its runs issue mapped D2Hs
    and pitched transfers (off the GPU only when asked), with every restore verified byte
    for byte and the invariants and counters judged as for the DMA route."""
    from hicache.testing.runner import arguments, fuzz

    issued: collections.Counter[str] = collections.Counter()
    for name in least:
        cls_name, method = name.split(".")
        cls = {"DeviceHostMover": DeviceHostMover, "GroupMover": GroupMover}[cls_name]
        real = getattr(cls, method)

        def counted(
            self: object, *args: object, _real: object = real, _n: str = name, **kw: object
        ) -> object:
            issued[_n] += 1
            return _real(self, *args, **kw)  # type: ignore[operator]

        monkeypatch.setattr(cls, method, counted)
    result = fuzz(arguments(seed=1, steps=steps, plane="cpu", pools=pools))
    assert result.ok, result.text
    for name, n in least.items():
        assert issued[name] >= n, (
            f"the fuzz issued {issued[name]} x {name}: the route went untested"
        )
