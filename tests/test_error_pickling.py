"""hicache's typed errors pickle with their fields (hicache/errors.py): a rank's error
crosses to the launcher of hicache/distributed/processes.py as itself."""

from __future__ import annotations

import pickle
from typing import TypeVar

from hicache.distributed.collectives import CollectiveMismatch, CollectiveTimeout, Entry, RankFailed
from hicache.errors import ConfigError, HiCacheError, InvariantViolation

E = TypeVar("E", bound=HiCacheError)


def roundtrip(e: E) -> E:
    back: E = pickle.loads(pickle.dumps(e))
    assert type(back) is type(e) and str(back) == str(e) and back.__dict__ == e.__dict__
    return back


def test_errors_whose_constructors_take_fields_pickle_as_themselves() -> None:
    timeout = roundtrip(CollectiveTimeout(3, "reserve", [1], {0: (3, "reserve")}, why="timed out"))
    assert isinstance(timeout, CollectiveTimeout) and timeout.missing == (1,)
    calls = {0: Entry("serve", "all_reduce_min", 1), 1: Entry("reserve", "all_reduce_min", 4)}
    assert isinstance(roundtrip(CollectiveMismatch(4, calls)), CollectiveMismatch)
    assert roundtrip(RankFailed(1, "died")).args == RankFailed(1, "died").args
    config = roundtrip(ConfigError("tp.transport", "one of gloo, shm"))
    assert isinstance(config, ValueError) and config.field == "tp.transport"
    roundtrip(InvariantViolation(("I7 rank_agreement",), "the cross-rank check"))
