"""The reference model's `tier_closure` knob (spec/invariants.md S6): "tier", each tier closed
under ancestors on its own (the spec's, and the default), or "hierarchy", a parent RESIDENT in
a tier above counting as held (SGLang's HiCache under write-back reclaims host copies of
device-resident pages in no leaf order)."""

from __future__ import annotations

import pytest

from hicache.errors import HiCacheError
from hicache.testing.protocol import PageChange
from hicache.testing.reference import Mismatch, ReferenceModel

PS = 4
P1, P2 = (1, 2, 3, 4), (1, 2, 3, 4, 5, 6, 7, 8)


def _model(closure: str) -> ReferenceModel:
    """Both pages RESIDENT in L1 and in L2."""
    model = ReferenceModel(PS, ("L1", "L2"), tier_closure=closure)
    model.apply([PageChange(t, p, "RESIDENT") for t in ("L1", "L2") for p in (P1, P2)])
    return model


def test_the_spec_closure_rejects_an_l2_parent_gone_under_its_child() -> None:
    with pytest.raises(Mismatch, match="S6"):
        _model("tier").apply([PageChange("L2", P1, "ABSENT")])


def test_the_hierarchy_closure_accepts_it_while_l1_holds_the_parent() -> None:
    model = _model("hierarchy")
    model.apply([PageChange("L2", P1, "ABSENT")])  # L1 still holds P1
    assert model.hits(P2 + (9,)) == {"L1": 8, "L2": 0}


def test_the_hierarchy_closure_rejects_the_parent_leaving_every_tier_above_the_child() -> None:
    model = _model("hierarchy")
    model.apply([PageChange("L2", P1, "ABSENT"), PageChange("L1", P2, "ABSENT")])
    with pytest.raises(Mismatch, match="S6"):  # P2 left in L2 alone, P1 nowhere at or above it
        model.apply([PageChange("L1", P1, "ABSENT")])


def test_the_hierarchy_closure_rejects_a_child_stored_under_no_parent() -> None:
    model = ReferenceModel(PS, ("L1", "L2"), tier_closure="hierarchy")
    with pytest.raises(Mismatch, match="S6"):
        model.apply([PageChange("L2", P2, "RESIDENT")])


def test_an_unknown_closure_is_refused() -> None:
    with pytest.raises(HiCacheError, match="tier_closure"):
        ReferenceModel(PS, ("L1", "L2"), tier_closure="loose")
