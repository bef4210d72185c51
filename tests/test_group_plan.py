"""Planning one group transfer (groupplan.py): which byte pools move, where each pool's part
sits in the packed workspace, and which requests are refused before anything is issued. The
oracle recomputes the layout from each pool's own spec (its source, its bytes per page)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

from hicache.core.tiers import Direction
from hicache.dataplane.groupgeometry import GroupGeometry
from hicache.dataplane.groupplan import plan_group
from hicache.dataplane.grouppools import REGION_ALIGN, GroupDevicePool, GroupHostPool
from hicache.errors import InvalidPages
from hicache.pools import presets

CAP = 12


def rig(name: str) -> tuple[GroupGeometry, GroupDevicePool, GroupHostPool]:
    geometry = GroupGeometry.from_group(presets.group(name))
    pages = {s: CAP for s in geometry.sources}
    return (
        geometry,
        GroupDevicePool(geometry, pages, "cpu"),
        GroupHostPool(geometry, pages, pin=False),
    )


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(["dsv4-tiny", "mla-tiny", "dsv4"]),
    data=st.data(),
    d2h=st.booleans(),
)
def test_every_named_pool_and_its_derived_pools_move_in_table_order_aligned(
    name: str, data: st.DataObject, d2h: bool
) -> None:
    geometry, l1, l2 = rig(name)
    direction = Direction.D2H if d2h else Direction.H2D
    named = data.draw(st.sets(st.sampled_from(geometry.sources)))
    request = {}
    for source in sorted(named):
        n = data.draw(st.integers(0, 5))
        near = np.random.default_rng(n).choice(CAP, size=n, replace=False).astype(np.int64)
        far = np.arange(n, dtype=np.int64)
        request[source] = (near, far)
    plan = plan_group(direction, request, l1, l2)
    want, at = [], 0
    for p in geometry.pools:  # the oracle: each pool's spec, read directly
        if p.source in request and request[p.source][0].size:
            want.append((p.name, at))
            n = int(request[p.source][0].size)
            at += -(-(n * p.rows_per_page * p.row_bytes) // REGION_ALIGN) * REGION_ALIGN
    assert [(m.pool.name, m.packed_at) for m in plan.moves] == want
    assert plan.packed_bytes == at
    for m in plan.moves:
        near, far = request[m.pool.source]
        l1_ids, l2_ids = (near, far) if d2h else (far, near)
        assert np.array_equal(m.l1, l1_ids) and np.array_equal(m.l2, l2_ids)
        assert m.packed_at % REGION_ALIGN == 0
    assert plan.nbytes == sum(
        int(m.l1.size) * m.pool.rows_per_page * m.pool.row_bytes for m in plan.moves
    )


def test_a_pool_that_allocates_nothing_is_refused_by_name() -> None:
    geometry, l1, l2 = rig("dsv4-tiny")
    derived = next(p.name for p in geometry.pools if p.name not in geometry.sources)
    ok = np.arange(2, dtype=np.int64)
    with pytest.raises(InvalidPages, match=rf"\['{derived}'\] are not allocating pools"):
        plan_group(Direction.D2H, {derived: (ok, ok)}, l1, l2)
    with pytest.raises(InvalidPages, match="not allocating pools"):
        plan_group(Direction.H2D, {geometry.sources[0]: (ok, ok), "nope": (ok, ok)}, l1, l2)
