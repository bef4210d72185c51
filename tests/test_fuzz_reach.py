"""The fuzz machine's draws reach what issue 31 (item 4) named: prompts that diverge inside a
page, every knob of spec/config.md drawn or fixed with a reason, an L3 file damaged under
the engine (hicache/testing/tamper.py), and the reference model knowing what that damage
means. The zoo's `reach` mutants (tests/test_zoo.py) show each draw catches a bug."""

from __future__ import annotations

import os
import re
from dataclasses import fields, replace
from typing import Any

import pytest
from hypothesis import find, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from hicache.errors import ConfigError, CorruptSlot
from hicache.spec import SPEC_DIR
from hicache.testing import knobs
from hicache.testing.adapters.controller import Setup, cache_config, setups
from hicache.testing.draws import diverged, prompts
from hicache.testing.mutants import activate
from hicache.testing.protocol import PENDING, PageChange
from hicache.testing.reference import ABSENT, RESIDENT, Mismatch, ReferenceModel

PS = 4  # the machine's page size (tokens)


def spec_knobs() -> list[str]:
    """The knobs of spec/config.md's table, in its order."""
    text = (SPEC_DIR / "config.md").read_text(encoding="utf-8")
    return re.findall(r"^\| `(\w+)` \|", text, flags=re.MULTILINE)


def test_every_knob_of_the_spec_is_drawn_or_fixed_with_a_reason() -> None:
    """A new knob in spec/config.md fails here until knobs.py decides it."""
    names = spec_knobs()
    assert len(names) >= 19, names  # the table was read
    undecided = [k for k in names if k not in knobs.DRAWN and k not in knobs.FIXED]
    assert not undecided, f"knobs neither drawn nor fixed (hicache/testing/knobs.py): {undecided}"
    assert not set(knobs.DRAWN) & set(knobs.FIXED)
    assert set(knobs.DRAWN) | set(knobs.FIXED) <= set(names), "a knob the spec does not list"
    assert all(why for why in knobs.FIXED.values())


def _drawn(strategy: st.SearchStrategy[Setup], knob: str, value: Any) -> None:
    find(strategy, lambda s: getattr(s, knob) == value)  # NoSuchExample: never drawn


DRAWS: list[tuple[str, str, str, tuple[Any, ...]]] = [
    # (plane, pools, knob, the values each must be drawn)
    ("null", "mha", "policy", ("always", "never", "threshold")),
    ("null", "mha", "write_policy", ("write_through", "write_through_selective", "write_back")),
    ("null", "mha", "promotion", (True, False)),
    ("null", "mha", "prefetch", (True, False)),
    ("null", "mha", "load_back_overlap", ("share", "back_off")),
    ("null", "mha", "check_mode", ("off", "periodic 7")),
    ("cpu", "mha", "backend", ("auto", "torch", "triton")),
    ("cpu", "mha", "verify", (True, False)),
    ("cpu", "mha", "check_mode", ("every", "periodic 7")),
    ("null", "dsv4-tiny", "hit_policy", ("all_pools", "anchor_recompute_swa")),
]


@pytest.mark.parametrize(("plane", "pools", "knob", "values"), DRAWS)
def test_each_drawn_knob_takes_each_of_its_values(
    plane: str, pools: str, knob: str, values: tuple[Any, ...]
) -> None:
    assert knob in knobs.DRAWN
    for value in values:
        _drawn(setups(plane, pools=pools), knob, value)


def test_a_legal_value_left_out_is_said_why() -> None:
    """`policy` is drawn from every legal value but those LEFT_OUT names."""
    from hicache.policy.policies import POLICY_NAMES

    for name in POLICY_NAMES:
        if ("policy", name) not in knobs.LEFT_OUT:
            _drawn(setups("null"), "policy", name)


def test_the_setup_reaches_the_controller_config() -> None:
    """Every drawn knob that is a field of Setup is passed on to CacheConfig as drawn."""
    s = Setup(plane="cpu", backend="triton", prefetch=False, verify=False, io_threads=0)
    s = replace(s, policy="threshold", load_back_overlap="back_off", rank_check_every=3)
    cfg = cache_config(s, "cpu", None)
    for f in fields(Setup):
        if f.name in knobs.DRAWN:
            assert getattr(cfg, f.name) == getattr(s, f.name), f.name


def test_a_diverged_prompt_shares_exactly_its_cut() -> None:
    whole = tuple(range(100, 120))
    assert diverged(whole, None) == whole
    assert diverged(whole, (len(whole), 0)) == whole  # a cut past the end changes nothing
    for at in (1, 5, 7, 19):
        one, two = diverged(whole, (at, 0)), diverged(whole, (at, 1))
        assert len(one) == len(whole) and one[:at] == whole[:at] and one[at] != whole[at]
        assert one != two and one[at] != two[at]
        assert diverged(whole[:-3] + (5, 6, 7), (at, 0))[: len(whole) - 3] == one[:-3]


def _shared(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def test_two_drawn_prompts_diverge_inside_a_page() -> None:
    """Two prompts whose shared run ends inside a page both cover: before `diverged`, every
    two drawn prompts diverged on a page start (NoSuchExample)."""

    def inside_a_page(ab: tuple[tuple[int, ...], tuple[int, ...]]) -> bool:
        a, b = ab
        n = _shared(a, b)
        return n >= PS and n % PS != 0 and min(len(a), len(b)) >= (n // PS + 1) * PS

    find(st.tuples(prompts(PS), prompts(PS)), inside_a_page)


def test_interpreter_is_set_while_a_user_lives_and_restored_after() -> None:
    before = os.environ.get(knobs.INTERPRETER)
    assert knobs.needs_interpreter("triton", None) and knobs.needs_interpreter("triton", "cpu")
    assert not knobs.needs_interpreter("triton", "cuda") and not knobs.needs_interpreter(
        "auto", "cpu"
    )
    knobs.interpreter_on()
    knobs.interpreter_on()
    knobs.interpreter_off()
    assert os.environ.get(knobs.INTERPRETER) == "1"
    knobs.interpreter_off()
    assert os.environ.get(knobs.INTERPRETER) == before
    with pytest.raises(AssertionError):
        knobs.interpreter_off()


def test_an_adapter_whose_controller_fails_to_close_gives_the_interpreter_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run that failed inside the controller (its close raises) must not leave
    TRITON_INTERPRET set, nor its L3 directory, for the runs after it in the process."""
    pytest.importorskip("torch")
    from hicache.testing.adapters.controller import ControllerAdapter

    users, before = knobs._users[0], os.environ.get(knobs.INTERPRETER)
    adapter = ControllerAdapter(Setup(plane="cpu", backend="triton"))
    assert adapter.interpreted and knobs._users[0] == users + 1
    directory = adapter.dir
    assert directory is not None

    def broken() -> None:
        raise RuntimeError("the controller broke while closing")

    monkeypatch.setattr(adapter, "_close_controller", broken)
    with pytest.raises(RuntimeError, match="broke while closing"):
        adapter.close()
    assert knobs._users[0] == users and os.environ.get(knobs.INTERPRETER) == before
    assert adapter.dir is None and not os.path.exists(directory.name)


# -- the L3 file damaged under the engine -------------------------------------------------


def _held_adapter() -> Any:
    """A CPU-plane controller adapter whose L3 holds two prompts' pages (write-through)."""
    torch = pytest.importorskip("torch")
    del torch
    from hicache.testing.adapters.controller import ControllerAdapter
    from hicache.testing.tamper import held_l3_pages

    adapter = ControllerAdapter(
        Setup(plane="cpu", write_policy="write_through", check_mode="every")
    )
    for rid, first in ((1, 100), (2, 200)):
        adapter.submit(rid, tuple(range(first, first + 3 * PS + 1)))
        assert adapter.prefill(rid)
        adapter.finish(rid)
    adapter.drain()
    adapter.changes()  # the adapter learns each node's prefix from the events
    assert len(held_l3_pages(adapter)) >= 2
    return adapter


@pytest.mark.parametrize("how", ["flip", "copy", "takeover"])
def test_a_tampered_slot_fails_its_checksum(how: str) -> None:
    from hicache.testing.tamper import held_l3_pages, tamper_l3

    adapter = _held_adapter()
    try:
        held = held_l3_pages(adapter)
        slot, prefix = held[1]
        damaged = tamper_l3(adapter, how, slot, 3)
        assert prefix in damaged
        assert len(damaged) == (len(held) if how == "takeover" else 1)
        l3 = adapter.ctl.byte_plane.l3
        data = memoryview(os.pread(l3.fd, l3.bytes_per_page, l3.offset(slot)))
        with pytest.raises(CorruptSlot):
            l3.verify(slot, data)
        if how == "copy":  # the zoo's l3-any-checksum takes another slot's page as its own
            with activate("l3-any-checksum"):
                l3.verify(slot, data)
    finally:
        adapter.close()


def test_a_rewritten_header_damages_no_page_and_bad_kinds_are_refused() -> None:
    from hicache.testing.tamper import held_l3_pages, tamper_l3

    adapter = _held_adapter()
    try:
        slot, _ = held_l3_pages(adapter)[0]
        assert tamper_l3(adapter, "header", slot, 0) == []
        l3 = adapter.ctl.byte_plane.l3
        l3.verify(slot, memoryview(os.pread(l3.fd, l3.bytes_per_page, l3.offset(slot))))
        with pytest.raises(ConfigError):
            tamper_l3(adapter, "shred", slot, 0)
    finally:
        adapter.close()


def test_the_reference_refuses_a_restore_from_a_damaged_copy() -> None:
    page = tuple(range(PS))
    model = ReferenceModel(PS, ("L1", "L2", "L3"))
    model.apply([PageChange("L3", page, PENDING), PageChange("L3", page, RESIDENT)])
    model.l3_damaged([page])
    model.apply([PageChange("L2", page, PENDING)])
    with pytest.raises(Mismatch, match="damaged"):
        model.apply([PageChange("L2", page, RESIDENT)])
    # The copy left L3: a later backup writes a fresh one, which may be restored.
    model = ReferenceModel(PS, ("L1", "L2", "L3"))
    model.apply([PageChange("L3", page, PENDING), PageChange("L3", page, RESIDENT)])
    model.l3_damaged([page])
    model.apply([PageChange("L3", page, ABSENT), PageChange("L3", page, PENDING)])
    model.apply([PageChange("L3", page, RESIDENT), PageChange("L2", page, PENDING)])
    model.apply([PageChange("L2", page, RESIDENT)])


# -- TP ranks that differ where a rank may ------------------------------------------------


def _drawn_tp(strategy: Any, every: int) -> None:
    find(strategy, lambda s: s.base.rank_check_every == every)


def test_tp_ranks_draw_their_own_rank_local_knobs() -> None:
    """Half of the TP runs give ranks their own check_mode (and, with bytes, verify and one
    rank's Triton): before `tp_setups`, every rank had the base setup (NoSuchExample)."""
    from hicache.controller.config import CacheConfig
    from hicache.testing.adapters.tp import tp_setups

    def differ(s: Any, knob: str) -> bool:
        return len({getattr(s.rank(r), knob) for r in range(s.size)}) > 1

    find(tp_setups("null", "mha", (2, 3)), lambda s: differ(s, "check_mode"))
    on_cpu = tp_setups("cpu", "dsv4-tiny", (2,))
    find(on_cpu, lambda s: differ(s, "verify"))
    find(on_cpu, lambda s: differ(s, "backend"))
    for every in (0, 1, 3):
        _drawn_tp(tp_setups("null", "mha", (2,)), every)

    def only_rank_local_differ(s: Any) -> bool:
        ranks = [cache_config(s.rank(r), "cpu", None) for r in range(s.size)]
        return all(a.fingerprint() == ranks[0].fingerprint() for a in ranks)

    # C0 holds every other field equal; at most one rank runs the (thread-unsafe) interpreter.
    few = settings(max_examples=40, database=None)
    with pytest.raises(NoSuchExample):
        find(on_cpu, lambda s: not only_rank_local_differ(s), settings=few)
    with pytest.raises(NoSuchExample):
        triton = "triton"
        find(
            on_cpu,
            lambda s: sum(s.rank(r).kernels == triton for r in range(s.size)) > 1,
            settings=few,
        )
    assert {"check_mode", "verify", "backend"} <= set(CacheConfig.RANK_LOCAL)
