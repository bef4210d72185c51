"""The streams hicache owns (ownstreams.py) without a GPU: the lending bookkeeping, and the CPU
plane's "no streams"."""

from __future__ import annotations

import gc
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

import torch

from hicache.dataplane.ownstreams import Lender
from hicache.dataplane.streams import Streams


class _Owner:
    """Anything that takes weak references can own a stream."""


def _counting() -> tuple[Lender[tuple[int, int]], list[tuple[int, int]]]:
    made: list[tuple[int, int]] = []

    def make(index: int) -> tuple[int, int]:
        made.append((index, len(made)))
        return made[-1]

    return Lender(make), made


def test_a_stream_goes_to_one_live_owner_then_back_when_the_owner_is_gone() -> None:
    lender, made = _counting()
    owners = [_Owner() for _ in range(5)]
    lent = [lender.lend(o, 0) for o in owners]
    assert len(set(lent)) == 5 and lender.made == 5 and lender.idle(0) == 0
    gone = lent[2]
    del owners[2]
    gc.collect()
    assert lender.idle(0) == 1
    late = _Owner()
    assert lender.lend(late, 0) == gone, "a stream given back is lent again, not a new one"
    assert lender.made == 5 and lender.idle(0) == 0
    other = _Owner()
    assert lender.lend(other, 1)[0] == 1, "another device's streams are its own"
    assert lender.made == 6 and len(made) == 6


def test_owners_lending_from_many_threads_never_share() -> None:
    lender, _ = _counting()
    owners = [_Owner() for _ in range(64)]
    got: list[tuple[int, int]] = []
    lock = threading.Lock()

    def take(chunk: list[_Owner]) -> None:
        for o in chunk:
            s = lender.lend(o, 0)
            with lock:
                got.append(s)

    threads = [threading.Thread(target=take, args=(owners[k::8],)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 64 and len(set(got)) == 64


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 7)), max_size=60))
def test_live_owners_never_share_and_no_more_are_made_than_were_ever_live(
    steps: list[tuple[bool, int]],
) -> None:
    """A random run of "lend to a new owner" (True) and "drop live owner k" (False): every
    live owner's stream is its own, and the lender made as many as were ever live at once."""
    lender, _ = _counting()
    live: list[tuple[_Owner, tuple[int, int]]] = []
    most = 0
    for new, k in steps:
        if new:
            owner = _Owner()
            live.append((owner, lender.lend(owner, 0)))
            del owner
        elif live:
            live.pop(k % len(live))  # its last reference: given back at once (CPython)
        most = max(most, len(live))
        assert len({s for _, s in live}) == len(live)
    assert lender.made == most


def test_the_cpu_plane_has_no_streams() -> None:
    s = Streams(torch.device("cpu"))
    assert (s.compute, s.d2h, s.h2d, s.ids()) == (None, None, None, None)
    assert s.current() is None and s.how.startswith("none")


def test_release_gives_an_owners_streams_back_once_before_it_is_gone() -> None:
    """A closed mover gives its streams back at `release`; its death later gives nothing more
    back (each stream is lent to one owner at a time, so twice back would lend it twice)."""
    lender, _ = _counting()
    closed, other = _Owner(), _Owner()
    mine = {lender.lend(closed, 0) for _ in range(3)}
    theirs = lender.lend(other, 0)
    lender.release(closed)
    assert lender.idle(0) == 3
    lender.release(closed)  # idempotent
    assert lender.idle(0) == 3
    later = _Owner()
    assert {lender.lend(later, 0) for _ in range(3)} == mine and lender.idle(0) == 0
    del closed
    gc.collect()
    assert lender.idle(0) == 0, "a released owner's death gave a stream back twice"
    assert theirs not in mine and lender.made == 4
