"""Real processes: spawn N ranks on gloo, run one function on each, return every result.

    results = run_ranks(fn, 2, (x,), timeout_s=120.0, collective_timeout_s=30.0,
                        transport="gloo")       # or "shm": the ranks meet in shared memory
    # fn(rank, size, collectives, x) in each rank's own process; the results by rank

    launcher (this process)                      rank r (a "spawn" child)
    -------------------------------------------  -------------------------------------------
    a TCPStore on a free localhost port: the     its client; gloo over the prefix "gloo/",
    rendezvous and the arrival board "board/";   and its collectives: TorchCollectives over
    with "shm", the block (shm.py)               gloo (torchdist.py) or SharedMemoryCollectives
                                                 over the block (shm.py), "board/" for both
    start N ranks, wait for N reports, at most   report ("ok", r, pickled result), or ("error",
    `timeout_s` in all; a rank that died gets    r, type, message) and `failed/r` on the board
    `failed/r` (and its flag in the block)       (and its flag in the block)
    end every rank; unlink the block; raise      an ok rank waits (at most the collective
    the root cause:                              timeout) for every rank to report before it
      RankError     a rank that died, else the   exits: no peer's op meets a closed connection
                    lowest that raised (not a
                    RankFailed)
      RanksTimedOut the overall timeout passed

Each rank runs torch with `threads` intra-op threads (RANK_THREADS, one, by default). Why one:
a rank's own CPU work is Python bookkeeping around small tensor ops, and intra-op threads
left over from those ops spin on the cores gloo's threads need -- on a 16-core H100 host, two
ranks of 8 threads each made a gloo agreement cost 941-996 us against 223-256 us for the same
protocol timed alone; with one thread, 266-268 us, and the ranks' work between collectives
did not slow (1,841-1,856 us against 1,940-2,009; benchmarks/tp_agreement_overhead.py
--rank-threads).

`fn` and its arguments and result must be picklable (`fn` a module-level function: each rank
imports it anew). A rank's collective gives up after `collective_timeout_s` (the gloo op
timeout, or the shared-memory wait's): a stuck rank is reported by the others as a
CollectiveTimeout, never a hang. Gloo's process group is made with either transport: `fn` may
use torch.distributed itself (benchmarks/tp_agreement_overhead.py times bare all_gathers on it).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import sys
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from multiprocessing.process import BaseProcess
from typing import Any

from hicache.errors import ConfigError, HiCacheError

HOST = "127.0.0.1"  # every rank runs on this machine
POLL_S = 0.1  # the launcher re-checks its ranks' liveness this often
DEAD_GRACE_S = 1.0  # a rank that exited unreported is dead once its report is this late
JOIN_S = 5.0  # a rank gets this long to exit on its own before it is terminated
ROOT_CAUSE_LAST = ("RankFailed",)  # errors that are another rank's consequence, not a cause
DIED = "died"  # a rank's kind when it exited without a report: a root cause before any error
# (its peers' CollectiveTimeouts -- gloo sees the closed connection at once -- follow from it)
TRANSPORTS = ("gloo", "shm")  # TorchCollectives (torchdist.py), SharedMemoryCollectives (shm.py)
RANK_THREADS = 1  # torch intra-op threads per rank (module docstring says why)


class RankError(HiCacheError):
    """Rank `rank` raised `kind` (`message`), or died (`kind` "died"); `others`: what the
    other ranks reported meanwhile, by rank ("type: message"). `error`: the error rank `rank`
    raised, as itself (also the RankError's `__cause__`), or None when it died or its error
    did not pickle."""

    def __init__(
        self,
        rank: int,
        kind: str,
        message: str,
        others: dict[int, str],
        error: BaseException | None = None,
    ) -> None:
        self.rank, self.kind, self.message, self.others = rank, kind, message, dict(others)
        self.error = error
        rest = "; ".join(f"rank {r}: {why}" for r, why in sorted(others.items()))
        super().__init__(
            f"rank {rank} raised {kind}: {message}" + (f" (then {rest})" if rest else "")
        )


class RanksTimedOut(HiCacheError):
    """The ranks `missing` had not reported after `timeout_s` seconds; `last`: where each
    rank was last, by the arrival board (rank -> (collective number, point))."""

    def __init__(
        self, missing: Sequence[int], timeout_s: float, last: dict[int, tuple[int, str]]
    ) -> None:
        self.missing, self.timeout_s, self.last = tuple(missing), timeout_s, dict(last)
        where = ", ".join(f"rank {r} at #{s} {p}" for r, (s, p) in sorted(last.items()))
        super().__init__(
            f"rank(s) {list(missing)} did not finish within {timeout_s:g} s (last "
            f"seen: {where or 'no collective'}); they were terminated: give a "
            "longer timeout, or find where the rank waits outside a collective"
        )


def run_ranks(
    fn: Callable[..., Any],
    size: int,
    args: tuple[object, ...] = (),
    *,
    timeout_s: float = 120.0,
    collective_timeout_s: float = 30.0,
    transport: str = "gloo",
    threads: int = RANK_THREADS,
) -> list[Any]:
    """`fn(rank, size, collectives, *args)` on `size` spawned ranks; their results by rank.
    `transport` (TRANSPORTS): how the collectives meet; `threads`: each rank's torch
    intra-op threads (module docstring). Raises RankError (the root cause: the
    lowest rank's error that is not a consequence of another's) or RanksTimedOut; every rank
    has ended, and the shared-memory block is gone, when it returns or raises."""
    from torch._C._distributed_c10d import TCPStore  # torch.distributed's, not re-exported
    from torch.distributed.distributed_c10d import PrefixStore

    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ConfigError("tp", f"ranks: an integer >= 1, got {size!r}")
    if not timeout_s > 0 or not collective_timeout_s > 0:
        raise ConfigError(
            "tp.timeout_s", f"> 0 seconds, got {timeout_s!r} and {collective_timeout_s!r}"
        )
    if transport not in TRANSPORTS:
        raise ConfigError("tp.transport", f"one of {', '.join(TRANSPORTS)}, got {transport!r}")
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ConfigError("tp.threads", f"intra-op threads per rank: >= 1, got {threads!r}")
    from hicache.distributed.shm import ShmBlock
    from hicache.distributed.wire import mark_failed, read_board

    ctx = multiprocessing.get_context("spawn")
    store = TCPStore(
        HOST,
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=collective_timeout_s),
    )
    board = PrefixStore("board/", store)
    block = ShmBlock.create(size) if transport == "shm" else None

    def dead(rank: int, why: str) -> None:  # tell the ranks waiting for it at once
        mark_failed(board, rank, why)
        if block is not None:
            block.mark_dead(rank)

    reports: multiprocessing.Queue[tuple[Any, ...]] = ctx.Queue()
    procs = [
        ctx.Process(
            target=_rank_main,
            name=f"hicache-rank{r}",
            daemon=True,
            args=(
                r,
                size,
                store.port,
                collective_timeout_s,
                block and block.name,
                threads,
                fn,
                args,
                reports,
            ),
        )
        for r in range(size)
    ]
    got: dict[int, tuple[Any, ...]] = {}
    try:
        for p in procs:
            p.start()
        got = _collect(procs, reports, time.monotonic() + timeout_s, collective_timeout_s, dead)
    finally:
        _end(procs, set(got))
        if block is not None:
            block.unlink()
    missing = [r for r in range(size) if r not in got]
    if missing and not any(g[0] == "error" for g in got.values()):
        raise RanksTimedOut(missing, timeout_s, read_board(board, size)[0])
    errors: dict[int, tuple[str, str]] = {
        r: (g[1], g[2]) for r, g in got.items() if g[0] == "error"
    }
    if errors:
        root = min(errors, key=lambda r: (errors[r][0] != DIED, errors[r][0] in ROOT_CAUSE_LAST, r))
        others = {r: f"{k}: {m}" for r, (k, m) in errors.items() if r != root}
        others.update({r: "did not report (terminated)" for r in missing})
        error = _unpickled(got[root][3] if len(got[root]) > 3 else None)  # none if it died
        raise RankError(root, *errors[root], others, error=error) from error
    return [pickle.loads(got[r][1]) for r in range(size)]


def _unpickled(pickled: bytes | None) -> BaseException | None:
    """A rank's error from its report (`_pickled`'s bytes, or None), or None if it does not
    load here."""
    try:
        error = pickle.loads(pickled) if pickled is not None else None
    except Exception:  # the report's type and message still say what it was
        return None
    return error if isinstance(error, BaseException) else None


def _collect(
    procs: Sequence[BaseProcess],
    reports: multiprocessing.Queue[tuple[Any, ...]],
    deadline: float,
    collective_timeout_s: float,
    dead: Callable[[int, str], None],
) -> dict[int, tuple[Any, ...]]:
    """Every rank's report (rank -> ("ok", pickled) or ("error", type, message)) until all
    reported or `deadline`; after a first error, the others get one collective timeout more
    (they learn of it from the board, or time out). A rank that exited unreported "died",
    and `dead(rank, why)` tells the others."""
    got: dict[int, tuple[Any, ...]] = {}
    dead_since: dict[int, float] = {}
    while len(got) < len(procs) and time.monotonic() < deadline:
        try:
            kind, rank, *rest = reports.get(timeout=POLL_S)
            got[rank] = (kind, *rest)
            if kind == "error":
                deadline = min(deadline, time.monotonic() + collective_timeout_s + JOIN_S)
            continue
        except queue.Empty:
            pass
        now = time.monotonic()
        for r, p in enumerate(procs):
            if r not in got and p.exitcode is not None:
                if now - dead_since.setdefault(r, now) > DEAD_GRACE_S:
                    why = f"exited with code {p.exitcode} without a report"
                    got[r] = ("error", DIED, why)
                    dead(r, f"died: {why}")
                    deadline = min(deadline, now + collective_timeout_s + JOIN_S)
    return got


def _end(procs: Sequence[BaseProcess], reported: set[int]) -> None:
    """Let each rank that reported exit, then terminate (and at last kill) what still runs."""
    stop = time.monotonic() + JOIN_S
    for r, p in enumerate(procs):
        if r in reported:
            p.join(max(0.0, stop - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(JOIN_S)
        if p.is_alive():
            p.kill()
            p.join()


def _pickled(e: BaseException) -> bytes | None:
    """`e` pickled, without its traceback and chain (they hold frames), or None."""
    try:
        return pickle.dumps(e.with_traceback(None))
    except Exception:  # an error that does not pickle is reported by text
        return None


def _rank_main(
    rank: int,
    size: int,
    port: int,
    collective_timeout_s: float,
    block: str | None,
    threads: int,
    fn: Callable[..., Any],
    args: tuple[object, ...],
    reports: multiprocessing.Queue[tuple[Any, ...]],
) -> None:
    """One rank (module docstring): join gloo, meet over gloo or the shared-memory `block`,
    run `fn`, report, wait for the others."""
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import TCPStore
    from torch.distributed.distributed_c10d import PrefixStore

    from hicache.distributed.shm import SharedMemoryCollectives
    from hicache.distributed.torchdist import TorchCollectives
    from hicache.distributed.wire import ProcessCollectives, mark_failed

    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # localhost only: no hostname lookup
    torch.set_num_threads(threads)  # one by default: spinning threads slow gloo (docstring)
    timeout = timedelta(seconds=collective_timeout_s)
    store = TCPStore(HOST, port, is_master=False, timeout=timeout)
    board = PrefixStore("board/", store)
    coll: ProcessCollectives | None = None
    try:
        dist.init_process_group(
            "gloo", store=PrefixStore("gloo/", store), rank=rank, world_size=size, timeout=timeout
        )
        coll = (
            TorchCollectives(board)
            if block is None
            else SharedMemoryCollectives(block, rank, size, board, collective_timeout_s)
        )
        result = pickle.dumps(fn(rank, size, coll, *args))
    except BaseException as e:  # every rank's outcome is reported
        why = f"{type(e).__name__}: {e}"
        if coll is not None:
            coll.mark_failed(why)  # the board, and the shared-memory flag where there is one
        else:
            mark_failed(board, rank, why)
        reports.put(("error", rank, type(e).__name__, str(e), _pickled(e)))
        store.set(f"end/{rank}", "error")
        return  # at once: the others learn of it from the board (or the flag), or time out
    finally:
        if isinstance(coll, SharedMemoryCollectives):
            coll.close()
    reports.put(("ok", rank, result))
    store.set(f"end/{rank}", "ok")
    try:  # longer than a collective: a peer still in one reports before this gives up
        store.wait([f"end/{r}" for r in range(size)], timeout + timedelta(seconds=JOIN_S))
    except RuntimeError:
        pass  # a rank is stuck: the launcher terminates it
    dist.destroy_process_group()


__all__ = ["TRANSPORTS", "RankError", "RanksTimedOut", "run_ranks"]
