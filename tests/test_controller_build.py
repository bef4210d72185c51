"""The controller's parts (hicache/controller/build.py): built in an order in which each part
refers only to parts above it, none to the controller -- no callback into the facade, no weak
proxy of it -- so the parts form no reference cycle through which a dropped controller's data
plane would outlive it."""

from __future__ import annotations

import dataclasses
import gc
import types
import weakref
from collections.abc import Iterable

from hicache.controller.build import Parts, build_parts
from hicache.controller.config import CacheConfig
from hicache.controller.controller import CacheController
from hicache.dataplane.handles import NullHandle
from hicache.dataplane.null import NullEngine

PROMPT = tuple(range(100, 124))
PROXIES = (weakref.ProxyType, weakref.CallableProxyType)


def _config() -> CacheConfig:
    return CacheConfig(l1_pages=16, l2_pages=32, l3_slots=64, policy="always")


def _reachable(roots: Iterable[object], skip: Iterable[object] = ()) -> list[object]:
    """Every object `roots` hold, directly or through others: instances, containers, bound
    methods and closures (classes, modules, a function's globals and `skip` are not
    followed)."""
    seen: dict[int, object] = {id(o): o for o in skip}
    stack = list(roots)
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, (type, types.ModuleType)):
            continue
        seen[id(o)] = o
        if isinstance(o, types.FunctionType):
            stack.extend(cell.cell_contents for cell in o.__closure__ or ())
            continue
        stack.extend(gc.get_referents(o))
    return list(seen.values())


def _serve(c: CacheController, engine: NullEngine, rid: int) -> None:
    c.admit(rid, PROMPT)
    for _ in range(50):
        c.tick()
        if c.ready(rid) and not c.handles:
            break
        for handle in engine.pending():
            assert isinstance(handle, NullHandle)
            handle.finish(True)
    c.prefill(rid)
    c.finish(rid)


def test_no_part_reaches_the_controller_or_a_proxy_of_it() -> None:
    cfg = _config()
    engine = NullEngine(cfg.kv, cfg.l1_pages, cfg.l2_pages, cfg.l3_slots)
    c = CacheController(cfg, engine=engine)
    _serve(c, engine, 1)
    parts = [c.cp, c.transfers, c.stager, c.evictor, c.ranks, c.hooks, c.l3, c.backups]
    for o in _reachable(parts):
        assert o is not c, "a part refers to the controller"
        assert not isinstance(o, PROXIES), f"a part holds a weak proxy: {o!r}"
    c.close()


def test_each_part_refers_only_to_parts_built_before_it() -> None:
    cfg = _config()
    p = build_parts(cfg, engine=NullEngine(cfg.kv, cfg.l1_pages, cfg.l2_pages, cfg.l3_slots))
    names = [f.name for f in dataclasses.fields(Parts) if f.name != "tagged"]  # (the plane's)
    order = {id(getattr(p, name)): i for i, name in enumerate(names)}
    # The control plane's observers of removed nodes (the backup planner's) are its
    # subscribers, told of a removal, not parts it calls: that cycle holds no data plane.
    observers = [p.cp.on_remove]
    for i, name in enumerate(names):
        later = {
            names[order[id(o)]]
            for o in _reachable([getattr(p, name)], skip=observers)
            if order.get(id(o), -1) > i
        }
        assert not later, f"{name} refers to {sorted(later)}, built after it"
    p.plane.engine.close()
