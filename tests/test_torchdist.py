"""Ranks as processes (hicache/distributed/processes.py, demo_tp.py), over each transport:
gloo (torchdist.py) and shared memory (shm.py). Two ranks agree, a mismatched call is a
CollectiveMismatch naming both calls, a skipped collective a CollectiveTimeout naming the
missing rank and the point within the timeout, a rank that raises, dies or hangs a typed error
in the launcher, no shared-memory block outlives a run, and `hicache demo --tp 2` runs.

Each test spawns two processes (a few seconds of start-up on a 2-core machine: torch is
imported anew in each); the rank functions are module-level so that each rank can import them.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from hicache.app import demo  # noqa: E402
from hicache.distributed.collectives import (  # noqa: E402
    CollectiveError,
    Collectives,
    CollectiveTimeout,
)
from hicache.distributed.processes import (  # noqa: E402
    RANK_THREADS,
    TRANSPORTS,
    RankError,
    RanksTimedOut,
    run_ranks,
)
from hicache.distributed.shm import TSO_MACHINES  # noqa: E402
from hicache.distributed.wire import INLINE_VALUES  # noqa: E402
from hicache.errors import ConfigError  # noqa: E402

pytestmark = pytest.mark.torch
ON_TSO = platform.machine() in TSO_MACHINES
transports = pytest.mark.parametrize(
    "transport",
    [
        pytest.param(t, marks=pytest.mark.skipif(t == "shm" and not ON_TSO, reason="x86-64 only"))
        for t in TRANSPORTS
    ],
)
TIMEOUT_S = 3.0  # each collective's: a missing rank is reported after this
Agreed = tuple[
    tuple[int, ...],
    tuple[tuple[int, ...], ...],
    tuple[int, ...],
    tuple[int, ...],
    str,
    int,
    list[str],
]


def _agree_then_mismatch(rank: int, size: int, c: Collectives) -> Agreed:
    """Agree four times (no values; more than fit in the header's row), then meet with another
    point, another length, a payload in the row against one of its own: each mismatch is
    caught on both ranks and returned."""
    low = c.all_reduce_min("reserve", [rank + 1])
    gathered = c.all_gather("admit_choice", [10 * rank + 7])
    empty = c.all_reduce_min("completion", [])
    long = c.all_reduce_min("serve", [1 - rank] * (INLINE_VALUES + 4))
    digest, count = c.log.digest, c.log.count
    caught = []
    for by_rank in (
        (("serve", [1]), ("reserve", [1, 2, 3, 4])),  # another point
        (("completion", [1, 2, 3]), ("completion", [1, 2])),  # another length
        (
            ("serve", [1] * 3),  # one row, or a payload of its own
            ("serve", [1] * (INLINE_VALUES + 1)),
        ),
    ):
        point, values = by_rank[rank]
        try:
            c.all_reduce_min(point, values)
        except CollectiveError as e:
            caught.append(f"{type(e).__name__}: {e}")
    return low, gathered, empty, long, digest, count, caught


def _skip_second(rank: int, size: int, c: Collectives) -> None:
    """Rank 1 makes one collective fewer (a conditional collective, F16) and returns."""
    c.all_reduce_min("reserve", [1])
    if rank == 0:
        c.all_reduce_min("reserve", [1])


def _rank1_raises(rank: int, size: int, c: Collectives) -> None:
    if rank == 1:
        raise ValueError("rank 1's own bug")
    c.all_reduce_min("reserve", [1])


def _rank1_dies(rank: int, size: int, c: Collectives) -> None:
    if rank == 1:
        os._exit(9)  # no report, no board entry: only the launcher can tell the others
    c.all_reduce_min("reserve", [1])


def _hang(rank: int, size: int, c: Collectives) -> None:
    time.sleep(600)


def _check_then_diverge(rank: int, size: int, c: Collectives) -> int:
    """Serve one request and check (C7-C9: passes), then rank 1 alone ends it and every rank
    checks again: the views are gathered and I7 raises on both ranks."""
    from hicache.controller.config import CacheConfig
    from hicache.controller.controller import CacheController

    ctl = CacheController(
        CacheConfig(device="cpu", l1_pages=16, l2_pages=16, l3_slots=32, io_threads=0),
        collectives=c,
    )
    ctl.admit(1, list(range(1, 18)))
    ctl.prefill(1)
    ctl.check_ranks()
    passed = ctl.rank_checks
    if rank == 1:
        ctl.finish(1)
    ctl.check_ranks()
    return passed


def test_processes_check_each_other_and_a_divergence_is_an_invariant_violation() -> None:
    with pytest.raises(RankError) as failed:
        run_ranks(_check_then_diverge, 2, collective_timeout_s=30.0, timeout_s=90)
    e = failed.value
    assert e.rank == 0 and e.kind == "InvariantViolation"  # the lowest rank: the root cause
    assert "I7 rank_agreement" in e.message and "rank 1's requests differ" in e.message
    assert e.others[1].startswith("InvariantViolation: ")  # rank 1 found the same


@transports
def test_two_ranks_agree_and_a_mismatch_names_both_calls(transport: str) -> None:
    results = run_ranks(
        _agree_then_mismatch, 2, collective_timeout_s=TIMEOUT_S, timeout_s=60, transport=transport
    )
    for low, gathered, empty, long, _, count, _ in results:
        assert low == (1,) and gathered == ((7,), (17,)) and empty == ()
        assert long == (0,) * (INLINE_VALUES + 4) and count == 4
    assert results[0][4] == results[1][4]  # the same log (I10)
    for caught in (results[0][6], results[1][6]):
        point, length, inline = caught
        assert point.startswith("CollectiveMismatch: collective #4 differs across ranks")
        assert "rank 0: serve all_reduce_min int64[1]" in point
        assert "rank 1: reserve all_reduce_min int64[4]" in point
        assert "collective #5" in length
        assert "rank 0: completion all_reduce_min int64[3]" in length
        assert "rank 1: completion all_reduce_min int64[2]" in length
        assert "collective #6" in inline
        assert "rank 0: serve all_reduce_min int64[3]" in inline
        assert f"rank 1: serve all_reduce_min int64[{INLINE_VALUES + 1}]" in inline


@transports
def test_a_skipped_collective_is_a_timeout_naming_the_missing_rank_and_the_point(
    transport: str,
) -> None:
    started = time.monotonic()
    with pytest.raises(RankError) as failed:
        run_ranks(
            _skip_second, 2, collective_timeout_s=TIMEOUT_S, timeout_s=60, transport=transport
        )
    e = failed.value
    assert e.rank == 0 and e.kind == "CollectiveTimeout"
    assert "collective #1 (reserve)" in e.message and "rank(s) [1] did not arrive" in e.message
    assert "rank 1 at #0 reserve" in e.message  # where the missing rank was last
    assert time.monotonic() - started < 30  # the timeout's seconds, not a hang
    # The root cause's own error, typed, with its fields, is the RankError's cause.
    assert isinstance(e.error, CollectiveTimeout) and e.__cause__ is e.error
    assert (e.error.seq, e.error.point, e.error.missing) == (1, "reserve", (1,))


@transports
def test_a_rank_that_raises_is_the_root_cause_the_others_are_broken_out(transport: str) -> None:
    with pytest.raises(RankError) as failed:
        run_ranks(_rank1_raises, 2, collective_timeout_s=30.0, timeout_s=60, transport=transport)
    e = failed.value
    assert (e.rank, e.kind, e.message) == (1, "ValueError", "rank 1's own bug")
    assert isinstance(e.error, ValueError) and str(e.error) == "rank 1's own bug"
    assert e.others[0].startswith("RankFailed: rank 1 failed (ValueError: rank 1's own bug)")


@transports
def test_a_rank_that_dies_is_the_root_cause_and_the_other_stops_before_its_timeout(
    transport: str,
) -> None:
    started = time.monotonic()
    with pytest.raises(RankError) as failed:
        run_ranks(_rank1_dies, 2, collective_timeout_s=30.0, timeout_s=60, transport=transport)
    e = failed.value
    assert e.rank == 1 and e.kind == "died" and "exited with code 9" in e.message
    assert e.others[0].startswith(("RankFailed: rank 1 failed (died", "CollectiveTimeout"))
    assert time.monotonic() - started < 20  # the launcher's notice, not the 30 s timeout


@pytest.mark.skipif(not ON_TSO or not Path("/dev/shm").is_dir(), reason="POSIX shm on x86-64")
def test_no_shared_memory_block_outlives_a_run() -> None:
    """Judged on the blocks this launcher names (`block_prefix`), not on all of /dev/shm:
    another process (a second suite, an xdist worker, multiprocessing's semaphores) may
    create and remove files there meanwhile, as the stranger block below does."""
    from multiprocessing.shared_memory import SharedMemory

    from hicache.distributed.shm import ShmBlock, block_prefix

    ours = block_prefix()
    probe = ShmBlock.create(2)  # Verify the launcher's blocks carry the prefix judged below.
    assert probe.name.startswith(ours), probe.name
    probe.unlink()
    stranger = SharedMemory(create=True, size=64)  # someone else's, alive across the runs
    try:
        run_ranks(
            _agree_then_mismatch, 2, collective_timeout_s=TIMEOUT_S, timeout_s=60, transport="shm"
        )
        with pytest.raises(RankError):
            run_ranks(_rank1_dies, 2, collective_timeout_s=30.0, timeout_s=60, transport="shm")
        assert [name for name in os.listdir("/dev/shm") if name.startswith(ours)] == []
    finally:
        stranger.close()
        stranger.unlink()


def test_an_unknown_transport_is_refused() -> None:
    with pytest.raises(ConfigError, match="tp.transport: one of gloo, shm, got 'nccl'"):
        run_ranks(_hang, 2, transport="nccl")
    with pytest.raises(ConfigError, match="tp.threads: intra-op threads per rank: >= 1, got 0"):
        run_ranks(_hang, 2, threads=0)


def _intra_op_threads(rank: int, size: int, c: Collectives) -> int:
    import torch

    return torch.get_num_threads()


def test_ranks_run_one_intra_op_thread_unless_told() -> None:
    """Spinning intra-op threads slow every gloo agreement (processes.py says by how much):
    a rank runs RANK_THREADS of them, whatever the machine's cores, or `threads`."""
    assert RANK_THREADS == 1
    assert run_ranks(_intra_op_threads, 2, timeout_s=60) == [1, 1]
    assert run_ranks(_intra_op_threads, 2, timeout_s=60, threads=3) == [3, 3]


def test_ranks_that_hang_outside_a_collective_are_terminated_at_the_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(RanksTimedOut) as failed:
        run_ranks(_hang, 2, collective_timeout_s=TIMEOUT_S, timeout_s=6)
    assert failed.value.missing == (0, 1)
    assert time.monotonic() - started < 20


@transports
@pytest.mark.parametrize("preset", ["mha", "dsv4-tiny"])  # sharded; replicated (rank 0's L3)
def test_demo_tp_2_serves_on_two_ranks_with_no_violation(
    capsys: pytest.CaptureFixture[str], transport: str, preset: str
) -> None:
    assert (
        demo.main(
            [
                "--tp",
                "2",
                "--device",
                "cpu",
                "--requests",
                "40",
                "--quiet",
                "--tp-transport",
                transport,
                "--preset",
                preset,
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert f"Tensor parallelism: 2 ranks over {transport}, preset {preset}" in out
    hits = []
    for rank in (0, 1):
        line = next(li for li in out.splitlines() if li.startswith(f"  rank {rank}: "))
        assert "40 requests served" in line and " 0 violations" in line
        hits.append(line.split("hit tokens ")[1].split(";")[0])
    assert hits[0] == hits[1] and not hits[0].endswith("L3 0")  # L3 hits: from rank 0's copy
    assert "during the run: 3 cross-rank checks over the collectives" in out
    assert "cross-rank checks (I7 rank_agreement" in out
    assert out.rstrip().endswith("0 violations")


def test_demo_tp_refuses_what_ranks_cannot_share(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--tp", "2", "--trace", "unused.ndjson"]) == 2
    err = capsys.readouterr().err
    assert "hicache demo: --tp: --trace records one control plane's events" in err
