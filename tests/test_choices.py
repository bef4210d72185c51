"""The enumerated knobs (hicache/choices.py): a user passes the string, the code holds the
member, and what is printed or written is the string it always was."""

from __future__ import annotations

import json
import pickle
from dataclasses import replace

import pytest

from hicache.choices import HitPolicy, LoadBackOverlap, RestorePolicy, WritePolicy
from hicache.controller.config import CHOICES, CacheConfig
from hicache.errors import ConfigError
from hicache.testing.adapters.controller import Setup
from hicache.testing.factory import EngineConfig

KNOBS = {
    "write_policy": WritePolicy,
    "policy": RestorePolicy,
    "load_back_overlap": LoadBackOverlap,
    "hit_policy": HitPolicy,
}


@pytest.mark.parametrize("knob", KNOBS)
def test_a_string_becomes_the_member_once_at_the_boundary(knob: str) -> None:
    enum = KNOBS[knob]
    assert tuple(CHOICES[knob]) == tuple(enum)  # the legal values: the enum's, in order
    for name in enum.names():
        value = getattr(CacheConfig(**{knob: name}), knob)  # type: ignore[arg-type]
        assert value is enum(name) and value == name
    assert getattr(CacheConfig(), knob) is next(iter(enum))  # the default is a member too


@pytest.mark.parametrize("knob", KNOBS)
def test_a_bad_name_is_a_config_error_naming_the_legal_values(knob: str) -> None:
    with pytest.raises(ConfigError) as e:
        CacheConfig(**{knob: "later"})  # type: ignore[arg-type]
    assert e.value.field == knob
    assert all(name in str(e.value) for name in KNOBS[knob].names())


def test_printed_and_written_as_the_string() -> None:
    c = CacheConfig(write_policy="write_back", policy="never", load_back_overlap="back_off")
    assert "write_policy='write_back'" in repr(c) and "policy='never'" in repr(c)
    assert f"{c.write_policy}" == str(c.write_policy) == "write_back"
    written = json.loads(json.dumps(c.fingerprint(), default=str))
    assert written["write_policy"] == "write_back" and written["load_back_overlap"] == "back_off"
    assert pickle.loads(pickle.dumps(c)) == c
    assert replace(c, write_policy="write_through").write_policy is WritePolicy.WRITE_THROUGH


def test_the_machine_and_factory_configs_convert_too() -> None:
    s = Setup(write_policy="write_back", policy="never", hit_policy="anchor_recompute_swa")
    assert s.write_policy is WritePolicy.WRITE_BACK and s.policy is RestorePolicy.NEVER
    assert s.hit_policy is HitPolicy.ANCHOR_RECOMPUTE_SWA
    # The machine seeds its faults from repr(setup): the repr is the one strings gave.
    assert "write_policy='write_back', policy='never'" in repr(s)
    e = EngineConfig(4, {"L1": 8}, "write_back", "threshold")
    assert e.write_policy is WritePolicy.WRITE_BACK
    assert e.restore_policy is RestorePolicy.THRESHOLD
    with pytest.raises(ConfigError, match="restore_policy: one of cost, always"):
        EngineConfig(4, {"L1": 8}, restore_policy="later")
