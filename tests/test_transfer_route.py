"""CacheConfig's `transfer_route` and `chunk_pages` (spec/config.md): which route a
controller's D2Hs and H2Ds take (routes.route_requests) and how they are chunked, the values
the configuration refuses, and the stateful fuzz, which draws both knobs, running every
route's code and chunked transfers on the cpu plane with restores verified byte for byte."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterator

import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

from hicache.choices import TransferRoute
from hicache.controller.config import CacheConfig
from hicache.core.pages import Pages, spread
from hicache.core.tiers import Direction
from hicache.dataplane.bytepaths import GroupPath, OnePoolPath
from hicache.dataplane.dma import DeviceHostMover
from hicache.dataplane.engine import TransferEngine
from hicache.dataplane.geometry import preset
from hicache.dataplane.groupgeometry import one_pool
from hicache.dataplane.grouptransfer import GroupMover
from hicache.dataplane.routes import EVERY, MAPPED_ENV, PITCHED_ENV, DmaPlan, route_choice
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
        ({"chunk_pages": 0}, "chunk_pages: None or an integer >= 1, got 0"),
        ({"chunk_pages": True}, "chunk_pages: None or an integer >= 1, got True"),
        ({"chunk_pages": 2, "pools": "dsv4-tiny"}, "chunk_pages: 'dsv4-tiny'"),
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


def test_the_fuzz_asks_for_no_mapped_kernel_the_interpreter_cannot_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where Triton's interpreter cannot run the mapped kernel (`interpreted_mapped`), a
    drawn mapped route with Triton's kernels on the cpu plane moves by DMA (the mover would
    refuse it by name); with torch's kernels it stays mapped (torch's definition runs)."""
    from hicache.testing.adapters import controller

    assert controller.interpreted_mapped() == ""  # this environment runs it
    monkeypatch.setattr(controller, "interpreted_mapped", lambda: "planted")
    s = controller.Setup(plane="cpu", backend="triton", transfer_route="mapped")
    assert s.route is TransferRoute.DMA
    assert dataclasses.replace(s, backend="torch").route is TransferRoute.MAPPED
    assert dataclasses.replace(s, plane="cuda").route is TransferRoute.MAPPED


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


def counting(monkeypatch: pytest.MonkeyPatch, cls: type, method: str) -> list[object]:
    """`cls.method` counted: one entry per call (its first argument after self)."""
    calls: list[object] = []
    real = getattr(cls, method)

    def counted(self: object, *args: object, **kw: object) -> object:
        calls.append(args[0] if args else None)
        return real(self, *args, **kw)

    monkeypatch.setattr(cls, method, counted)
    return calls


@pytest.mark.parametrize(
    ("pools", "route", "cls", "method"),
    [
        ("mha", TransferRoute.MAPPED, DeviceHostMover, "_enqueue_mapped"),
        ("mha", TransferRoute.PITCHED, DeviceHostMover, "_enqueue_pitched"),
        ("dsv4-tiny", TransferRoute.MAPPED, GroupMover, "_enqueue_mapped"),
    ],
)
def test_the_cpu_fuzz_runs_clean_on_each_route(
    monkeypatch: pytest.MonkeyPatch,
    no_route_env: None,
    pools: str,
    route: TransferRoute,
    cls: type,
    method: str,
) -> None:
    """Every run of the machine on `route` (the draw narrowed to it; test_fuzz_reach checks
    that `setups` draws every route): its transfers take the route, with every restore
    verified byte for byte and the invariants and counters judged as for the DMA route."""
    from hicache.testing.adapters import controller
    from hicache.testing.runner import arguments, fuzz

    assert route in controller.transfer_routes(pools)
    monkeypatch.setattr(controller, "transfer_routes", lambda pools: (route,))
    calls = counting(monkeypatch, cls, method)
    result = fuzz(arguments(seed=1, steps=400, plane="cpu", pools=pools))
    assert result.ok, result.text
    assert len(calls) >= 20, f"{len(calls)} x {cls.__name__}.{method}: the route went untested"
    if route is TransferRoute.PITCHED:  # both directions: every small transfer goes pitched
        assert {str(d) for d in calls} == {"D2H", "H2D"}, calls


def test_the_controller_hands_both_knobs_to_its_mover(no_route_env: None) -> None:
    from hicache.controller.controller import CacheController

    config = CacheConfig(device="cpu", transfer_route="pitched", chunk_pages=2, l3_slots=8)
    ctl = CacheController(config)
    try:
        engine = ctl.engine
        assert isinstance(engine, TransferEngine)
        m = one_pool_mover(engine)
        assert (m.chunk_pages, m.pitched_every, m.mapped_d2h) == (2, True, False)
    finally:
        ctl.close()


def test_the_cpu_fuzz_runs_chunked_and_fragmented_transfers(
    monkeypatch: pytest.MonkeyPatch, no_route_env: None
) -> None:
    """Runs with fixed chunks of 2 pages and the `spread` placement (the draws narrowed to
    them): at the machine's sizes the reference's schedule is one chunk, and with best fit
    alone none of the machine's transfers was more than one run of L2 pages, so these are
    what put chunk k+1's DMA beside chunk k's gather or scatter, and pages sorted into runs
    and staged through host memory, under the machine's cancels and faults."""
    from hicache.testing.adapters import controller
    from hicache.testing.runner import arguments, fuzz

    assert 2 in controller.CHUNKINGS and "spread" in controller.PLACEMENTS
    monkeypatch.setattr(controller, "CHUNKINGS", (2,))
    monkeypatch.setattr(controller, "PLACEMENTS", {"spread": spread})
    monkeypatch.setattr(controller, "transfer_routes", lambda pools: (TransferRoute.DMA,))
    seen: collections.Counter[str] = collections.Counter()
    real = DeviceHostMover.plan

    def plan(self: DeviceHostMover, direction: Direction, l2_ids: Pages) -> DmaPlan:
        p = real(self, direction, l2_ids)
        seen[f"{direction} chunked"] += len(p.bounds) > 1
        seen[f"{direction} fragmented"] += p.route.runs > 1
        seen["staged"] += p.route.staged_pages > 0
        return p

    monkeypatch.setattr(DeviceHostMover, "plan", plan)
    result = fuzz(arguments(seed=1, steps=400, plane="cpu"))
    assert result.ok, result.text
    least = {"D2H chunked": 20, "H2D chunked": 2, "D2H fragmented": 10, "H2D fragmented": 2}
    least |= {"staged": 10}
    assert all(seen[k] >= n for k, n in least.items()), seen


@pytest.mark.parametrize(
    ("direct_min_pages", "placement", "kind", "least"),
    [
        (2, "half_spread", "mixed", 5),  # runs of 2+ pages by their own DMA, single ones staged
        (0, "spread", "direct", 20),  # every run of a fragmented transfer its own DMA
    ],
)
def test_the_cpu_fuzz_runs_fragmented_transfers_direct_and_mixed(
    monkeypatch: pytest.MonkeyPatch,
    no_route_env: None,
    direct_min_pages: int,
    placement: str,
    kind: str,
    least: int,
) -> None:
    """The draws narrowed to one direct-run size (DIRECT_RUNS) and placement: at the mover's
    default (256 KiB) every run of the machine's tiny pages is short, so a fragmented
    transfer went all through host staging; these put several direct DMAs in one transfer,
    and direct runs beside staged pages in one packed buffer (before these draws, seed 1's
    1,000 default cpu-plane steps planned no fragmented direct transfer, and one mixed)."""
    from hicache.testing.adapters import controller
    from hicache.testing.runner import arguments, fuzz

    assert direct_min_pages in controller.DIRECT_RUNS and placement in controller.PLACEMENTS
    monkeypatch.setattr(controller, "DIRECT_RUNS", (direct_min_pages,))
    monkeypatch.setattr(controller, "PLACEMENTS", {placement: controller.PLACEMENTS[placement]})
    monkeypatch.setattr(controller, "transfer_routes", lambda pools: (TransferRoute.DMA,))
    seen: collections.Counter[str] = collections.Counter()
    real = DeviceHostMover.plan

    def plan(self: DeviceHostMover, direction: Direction, l2_ids: Pages) -> DmaPlan:
        p = real(self, direction, l2_ids)
        assert self.direct_min_bytes == direct_min_pages * self.bytes_per_page
        seen[p.route.kind] += p.route.runs > 1
        return p

    monkeypatch.setattr(DeviceHostMover, "plan", plan)
    result = fuzz(arguments(seed=3, steps=400, plane="cpu"))
    assert result.ok, result.text
    assert seen[kind] >= least, seen
