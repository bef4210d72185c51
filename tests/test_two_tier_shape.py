"""The fuzz's two-tier shapes (L1 and L2, no L3: an engine with one offload tier, such as
vLLM's CPU offloading) and the reference's `duplicate_copies` knob (spec/tree.md, "Duplicate
copies"): what an engine keyed by block hash needs to be judged, general to any engine."""

from __future__ import annotations

from hypothesis import find, settings
from hypothesis.errors import NoSuchExample

from hicache.testing import Admission, EngineConfig, PageChange
from hicache.testing.draws import configs
from hicache.testing.factory import SHAPES, shapes_taken
from hicache.testing.reference import ReferenceModel
from hicache.testing.template import Adapter, factory

PS = 4


def test_two_tier_shapes_come_last_so_other_factories_draw_what_they_drew() -> None:
    """Appended after every older shape: a factory refusing them keeps its shape list (and
    with it every seeded run it drew before)."""
    two = [i for i, c in enumerate(SHAPES) if c.tiers == ("L1", "L2")]
    assert two == list(range(len(SHAPES) - len(two), len(SHAPES))) and len(two) == 3
    assert {SHAPES[i].write_policy for i in two} == {
        "write_through",
        "write_through_selective",
        "write_back",
    }


def test_a_two_tier_factory_is_drawn_two_tier_configs_without_l3() -> None:
    asked: list[tuple[str, ...]] = []

    def two_tier(config: EngineConfig) -> Adapter:
        asked.append(config.tiers)
        if config.tiers != ("L1", "L2"):
            from hicache.testing import UnsupportedConfig

            raise UnsupportedConfig("two tiers only")
        engine = factory(EngineConfig(config.page_size, {"L1": config.capacities["L1"]}))
        engine.tiers = ("L1", "L2")  # a stand-in: the shape probe checks the tiers only
        return engine

    taken = shapes_taken(two_tier, "test:two_tier", "null")
    assert [c.tiers for c in taken] == [("L1", "L2")] * 3
    drawn = find(configs(taken), lambda c: True, settings=settings(database=None))
    assert set(drawn.capacities) == {"L1", "L2"}
    with __import__("pytest").raises(NoSuchExample):
        find(configs(taken), lambda c: "L3" in c.capacities, settings=settings(database=None))


def _loading_page_0(duplicate_copies: bool) -> ReferenceModel:
    """Request 1 loads page 0 (PENDING in L1); request 2, the same prompt, admitted with no
    hit, is about to be served."""
    model = ReferenceModel(PS, ("L1", "L2"), duplicate_copies=duplicate_copies)
    page = tuple(range(PS))
    model.apply([PageChange("L2", page, "RESIDENT")])
    prompt = page + (99,)
    model.admit(1, prompt, Admission({"L1": 0, "L2": PS}, 0))
    model.apply([PageChange("L1", page, "PENDING")])
    model.admit(2, prompt, Admission({"L1": 0, "L2": PS}, 0))
    return model


def test_a_page_being_loaded_cuts_cached_len_unless_l1_takes_duplicate_copies() -> None:
    """Without the knob the spec's rule: request 2 stops at the page request 1 is loading
    (0 tokens); with it, request 2 serves the copy it computed (the whole page)."""
    assert _loading_page_0(False).expected_after_prefill(2) == 0
    model = _loading_page_0(True)
    assert model.expected_after_prefill(2) == PS
    model.apply([PageChange("L1", tuple(range(PS)), "RESIDENT")])  # its copy, cached
    model.prefilled(2, PS, PS)
