"""The eviction rules of spec/eviction.md in the fuzz machine's reference model, and the
refusals the protocol asks: a cache that breaks them is caught by the fuzz and by the
conformance vectors alike (a cache that passed the fuzz used to fail four one-tier vectors:
l1_eviction for freeing pages where the spec frees nodes, l1_refused for a KeyError)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="needs torch (the controller): pip install -e '.[data]'")

from hicache.errors import HiCacheError
from hicache.oracle.vectors import generate, run
from hicache.oracle.vectors.adapters import controller
from hicache.testing import Admission, EngineConfig, PageChange, UnsupportedConfig
from hicache.testing.adapters.lru import LRUCache, _one_tier
from hicache.testing.evictorder import OneTierTree
from hicache.testing.reference import Mismatch, ReferenceModel, verify_refused
from hicache.testing.runner import arguments, fuzz
from hicache.testing.template import Adapter, Node, TinyEngine

PS = 4


@pytest.fixture(scope="module")
def l1_vectors(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("vectors") / "v"
    generate.generate(directory, 2, 0, ["l1_hit_miss", "l1_sharing", "l1_eviction", "l1_refused"])
    return directory


def judged(factory: str, vectors: Path, steps: int = 2000) -> tuple[str, list[str]]:
    """The fuzz's error line (empty: it passed) and the vector cases that failed."""
    result = fuzz(arguments(seed=1, steps=steps, adapter=f"{__name__}:{factory}"))
    error = "" if result.ok else next(x for x in result.text.splitlines() if x.startswith("error:"))
    failed = [v.name for v in run.run_dir(vectors, globals()[factory]) if v.status == "FAIL"]
    return error, failed


class TypedLRU(LRUCache):
    """The page-by-page LRU cache with typed refusals: its eviction is all that is wrong."""

    def __init__(self, capacity: int, page_size: int) -> None:
        super().__init__(capacity, page_size)
        self.served: set[int] = set()

    def submit(self, request_id: int, tokens: Sequence[int]) -> Any:
        if not tokens or -(-len(tokens) // self.page_size) > self.capacity:
            raise HiCacheError(f"{len(tokens)} tokens: none, or more than L1 holds")
        return super().submit(request_id, tokens)

    def prefill(self, request_id: int) -> bool:
        if request_id not in self.requests or request_id in self.served:
            raise HiCacheError(f"request {request_id} is not live, or served already")
        if not super().prefill(request_id):
            return False
        self.served.add(request_id)
        return True

    def finish(self, request_id: int) -> None:
        if request_id not in self.requests:
            raise HiCacheError(f"request {request_id} is not live")
        super().finish(request_id)
        self.served.discard(request_id)

    def restart(self) -> None:
        super().restart()
        self.served.clear()


def typed_lru(config: EngineConfig) -> TypedLRU:
    return TypedLRU(*_one_tier(config))


class NewestFirst(TinyEngine):
    """Evicts whole leaves, but the most recently used first."""

    def first(self, leaves: list[Node]) -> Node:
        return max(leaves, key=lambda n: (n.last_access, n.id))


class NewestFirstAdapter(Adapter):
    def restart(self) -> None:
        super().restart()
        self.engine = NewestFirst(self.capacity, self.page_size)


def newest_first(config: EngineConfig) -> Adapter:
    return NewestFirstAdapter(*_one_tier(config))


def test_a_page_by_page_lru_is_caught_by_the_fuzz_and_by_the_vectors(l1_vectors: Path) -> None:
    """Before: `hicache fuzz --adapter ...lru:lru_adapter` passed, and the same cache failed
    l1_eviction. It frees the least recently used *page*: the first page of a prompt whose
    later pages stay (the tier no longer closed under ancestors, S6)."""
    error, failed = judged("typed_lru", l1_vectors)
    assert "gone while the page after it stays (spec/invariants.md S6" in error, error
    assert failed and all(f.startswith("l1_eviction") for f in failed), failed


def test_evicting_the_newest_leaf_first_is_caught_by_both(l1_vectors: Path) -> None:
    error, failed = judged("newest_first", l1_vectors)
    assert "L1 eviction: whole nodes, the least recently used unlocked leaf first" in error
    assert failed and all(f.startswith("l1_eviction") for f in failed), failed


def test_an_untyped_refusal_is_caught_by_both(l1_vectors: Path) -> None:
    """The plain LRU raises KeyError for a request that is not live (l1_refused's finding),
    and accepts an empty prompt."""
    cache = LRUCache(8, PS)
    with pytest.raises(Mismatch, match="the refusal's type: engine 'KeyError: 5'"):
        verify_refused(cache, "finish of ended request 5", lambda: cache.finish(5))
    error, failed = judged("lru_adapter", l1_vectors)
    assert "submit of an empty prompt: refused: engine 'accepted'" in error, error
    assert {f.split("-")[0] for f in failed} == {"l1_eviction", "l1_refused"}, failed


def lru_adapter(config: EngineConfig) -> LRUCache:
    return LRUCache(*_one_tier(config))


def test_a_refused_call_that_reports_a_change_is_caught() -> None:
    class Leaky(Adapter):
        def finish(self, request_id: int) -> None:
            if request_id not in self.requests:
                self.engine.changed.append(PageChange("L1", tuple(range(PS)), "ABSENT"))
            super().finish(request_id)

    cache = Leaky(8, PS)
    with pytest.raises(Mismatch, match="page changes of a refused finish"):
        verify_refused(cache, "finish of ended request 5", lambda: cache.finish(5))


class L1View:
    """hicache's controller seen as a one-tier engine: its L1 changes only, never ticked, no
    faults (so its L1 eviction order is what the model judges)."""

    tiers = ("L1",)

    def __init__(self, inner: Any) -> None:
        self.inner, self.page_size = inner, inner.page_size

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def has_work(self) -> bool:
        return False

    def pending_ops(self) -> list[int]:
        return []

    def tick(self) -> None: ...

    def drain(self) -> None: ...

    def set_faults(self, schedule: Any) -> None: ...

    def aim(self, action: str, tier: str) -> None: ...

    def damage_storage(self, how: str) -> None: ...

    def changes(self) -> list[PageChange]:
        return [c for c in self.inner.changes() if c.tier == "L1"]


def controller_l1(config: EngineConfig) -> L1View:
    if config.tiers != ("L1",):
        raise UnsupportedConfig("L1 alone")
    return L1View(controller(config))


def test_the_reference_controller_as_one_tier_agrees_with_the_eviction_model() -> None:
    """The model's tree (evictorder.py) is built from the spec, not from hicache's tree: the
    controller, evicting through its one loop, must agree with it."""
    result = fuzz(arguments(seed=3, steps=1500, adapter=f"{__name__}:controller_l1"))
    assert result.ok, result.text[-1500:]


def test_a_split_match_makes_two_nodes_and_the_older_leaf_goes_first() -> None:
    """spec/tree.md's example in the model: A's node is split where B's match ends; B's new
    leaf is newer than A's lower part, so one page of pressure frees A's lower part."""
    model = ReferenceModel(PS, ("L1",))
    a = tuple(range(8)) + (99,)
    b = a[:4] + (50, 51, 52, 53, 54)
    model.admit(1, a, _admission(0))
    model.apply([PageChange("L1", a[:4], "RESIDENT"), PageChange("L1", a[:8], "RESIDENT")])
    model.prefilled(1, 8, 8)
    model.finished(1)
    model.admit(2, b, _admission(4))
    model.apply([PageChange("L1", b[:8], "RESIDENT")])
    model.prefilled(2, 8, 8)
    model.finished(2)
    assert model.tree is not None and len({id(n) for n in model.tree.owner.values()}) == 3
    with pytest.raises(Mismatch, match=r"first the node of 8-token prefix \(0\.\.7\)"):
        model.apply([PageChange("L1", b[:8], "ABSENT")], evict_want=1)


def test_evict_n_frees_nodes_until_n_pages_and_no_more() -> None:
    tree = OneTierTree(PS)
    tree.admitted(())
    tree.batch([], [tuple(range(4)), tuple(range(8))], served=())
    tree.batch([], [(9, 9, 9, 9)], served=())
    with pytest.raises(Exception, match=r"evict\(L1, 1\) freed more after 2 pages"):
        tree.batch([tuple(range(4)), tuple(range(8)), (9, 9, 9, 9)], [], served=(), want=1)
    with pytest.raises(Exception, match=r"evict\(L1, 3\) freed 2 pages with a leaf left"):
        tree.batch([tuple(range(4)), tuple(range(8))], [], served=(), want=3)
    tree.batch([tuple(range(4)), tuple(range(8)), (9, 9, 9, 9)], [], served=(), want=3)
    assert tree.owner == {}


def test_a_tier_with_a_hole_in_a_prefix_is_refused_in_every_tier() -> None:
    model = ReferenceModel(PS, ("L1", "L2", "L3"))
    with pytest.raises(Mismatch, match="L2 page of a 8-token prefix held without the page"):
        model.apply([PageChange("L2", tuple(range(8)), "PENDING")])
    model = ReferenceModel(PS, ("L1", "L2", "L3"))
    # One transfer fills a parent-first chain: PENDING under PENDING is fine.
    model.apply([PageChange("L3", p, "PENDING") for p in (tuple(range(4)), tuple(range(8)))])


def test_a_hash_keyed_tier_may_hold_an_orphan() -> None:
    """A tier the engine declares hash-keyed holds a page without its parent (S6's
    exception); the hit there is still the leading run, and the other tiers stay closed."""
    model = ReferenceModel(PS, ("L1", "L2", "L3"), hash_keyed_tiers=("L2", "L3"))
    orphan = tuple(range(8))
    model.apply([PageChange("L3", orphan, "RESIDENT"), PageChange("L2", orphan, "PENDING")])
    assert model.hits(orphan + (9,)) == {"L1": 0, "L2": 0, "L3": 0}
    model.apply([PageChange("L3", orphan[:4], "RESIDENT")])
    assert model.hits(orphan + (9,))["L3"] == 8
    model.apply([PageChange("L3", orphan[:4], "ABSENT")])  # a parent leaves first: legal
    with pytest.raises(Mismatch, match="L1 page of a 8-token prefix held without the page"):
        model.apply([PageChange("L1", orphan, "RESIDENT")])


def test_a_persistent_tier_keeps_its_resident_pages_across_a_restart() -> None:
    """A restart forgets every tier but a persistent one's RESIDENT pages; the digests
    first served stay the judge of what a surviving copy serves."""
    model = ReferenceModel(PS, ("L1", "L2", "L3"), persistent_tiers=("L3",))
    kept, lost = tuple(range(4)), tuple(range(8))
    model.apply([PageChange(t, kept, "RESIDENT") for t in ("L1", "L2", "L3")])
    model.apply([PageChange("L3", lost, "PENDING")])
    model.restart()
    assert model.pages == {"L1": {}, "L2": {}, "L3": {kept: "RESIDENT"}}
    assert model.hits(lost + (9,)) == {"L1": 0, "L2": 0, "L3": 4}
    plain = ReferenceModel(PS, ("L1", "L2", "L3"))
    plain.apply([PageChange("L3", kept, "RESIDENT")])
    plain.restart()
    assert plain.pages["L3"] == {}


def _admission(hit: int) -> Admission:
    return Admission({"L1": hit}, hit)
