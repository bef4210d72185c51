"""Which of `CacheConfig`'s knobs the controller's fuzz machine draws, and why the rest are fixed.

Every knob of spec/config.md is in exactly one of two tables: `DRAWN` (the machine's setup
draws it, on the planes named) or `FIXED` (one value per machine, and why).
tests/test_fuzz_reach.py reads the spec's table and fails when a knob is in neither, so a
new knob must be decided here; it also draws setups and fails when a knob said to be drawn
takes one value only.

    knob                drawn on        values (hicache/testing/adapters/controller.py)
    ------------------  --------------  ---------------------------------------------------
    l1_pages ...        every plane     tight: L1 holds the longest prompt and a little more
    backend             cpu, cuda       auto, torch, triton (on CPU: Triton's interpreter,
                                        TRITON_INTERPRET=1 while such an adapter lives);
                                        TP ranks: torch, one rank's triton (rank-local)
    transfer_route      cpu, cuda       auto, dma, mapped, pitched (a group: not pitched);
                                        off the GPU auto is dma, so mapped and pitched run
                                        those routes' code on the cpu plane; mapped with
                                        torch kernels on cuda runs as dma (`Setup.route`)
    chunk_pages         cpu, cuda       None (2 in 5), 1, 2, 3 (a single pool: a group's
                                        transfers are not chunked); at the machine's sizes
                                        None is one chunk
    policy              every plane     always (5 in 8), never (2 in 8), threshold
    write_policy        every plane     each
    promotion           every plane     True, False
    prefetch            every plane     True (4 in 5), False: admit blocks
    check_mode          every plane     the plane's usual mode twice as often, or periodic;
                                        TP ranks: each its own (off, every, periodic 3)
    verify              cpu, cuda       True (3 in 4), False (restored bytes then judged by
                                        I4 and the served digests alone); TP ranks: each
                                        its own
    layerwise           cpu, cuda       True, False (a single pool: a group's H2D has no
                                        layer gate)
    load_back_overlap   every plane     share (4 in 5), back_off
    hit_policy          a window group  all_pools, anchor_recompute_swa
    l1_window_pages     a window group  None, or fewer windows than pages
    rank_check_every    TP machines     0 (twice as often), 1, 3

The TP machines (hicache/testing/adapters/tp.py, `tp_setups`) draw, half of the time, each
rank's own check_mode, verify and backend (of CacheConfig.RANK_LOCAL, what a rank may set for
itself; device, l3_path and io_threads stay the plane's); the other fields, capacities too, are
in C0's fingerprint (spec/tp.md): ranks that differ there are refused at startup, so a rank
with less room is a refusal (tests/test_tp.py), not a run.

`needs_interpreter`, `interpreter_on` and `interpreter_off` keep TRITON_INTERPRET set while
an adapter runs Triton on a CPU (Triton reads it at each launch: hicache/kernels/
triton_rows.py), and put it back when the last such adapter closes.
"""

from __future__ import annotations

import os
import threading

DRAWN: dict[str, str] = {
    "l1_pages": "every plane",
    "l2_pages": "every plane",
    "l3_slots": "every plane",
    "backend": "planes with bytes",
    "transfer_route": "planes with bytes (pitched: single pool)",
    "chunk_pages": "planes with bytes, single pool",
    "policy": "every plane",
    "write_policy": "every plane",
    "promotion": "every plane",
    "prefetch": "every plane",
    "check_mode": "every plane",
    "verify": "planes with bytes",
    "layerwise": "planes with bytes, single pool",
    "load_back_overlap": "every plane",
    "hit_policy": "a group with a trailing side pool",
    "l1_window_pages": "a group with a trailing side pool",
    "rank_check_every": "the TP machines",
}
"""Knob -> where the machine draws it."""

FIXED: dict[str, str] = {
    "geometry": "tiny: the machine's prompts are 4-token pages, and tiny is the one preset "
    "of 4-token pages",
    "device": "the plane's (`--plane`): cpu, or cuda (a TP rank on its own GPU when there "
    "is one per rank)",
    "l3_path": "an explicit path on a single pool with bytes (the `damage` rule removes it "
    "and `l3_refuses_a_second_opener` opens it again); None on the null plane (no file) and "
    "for a group (temporary files: l3_path must be unset)",
    "l3_overwrite": "True: a restart reopens a path that `damage` cut to 3 bytes, which is "
    "no longer an L3 header",
    "pools": "the machine's (`--pools`): each group is its own machine",
    "io_threads": "0, the deterministic schedule (L3 I/O in issue order at the next poll): "
    "with I/O threads, when a read or write ends and the order in which threads reach a "
    "fault site follow the host's load, so a seed would not replay its run -- on a loaded "
    "host Hypothesis saw one seed's draws change and failed the run as flaky "
    "(FlakyStrategyDefinition). Threaded I/O is tests/test_controller_fuzz.py's, "
    "tests/test_storage.py's and tests/test_deterministic_io.py's",
    "quiesce_timeout_s": "its default: the machine's transfers go quiet at once (the null "
    "plane) or within one I/O piece, so the bound is never reached; hardware that never "
    "goes quiet is tests/test_quiesce_timeout.py's",
}
"""Knob -> why the machine fixes it."""

LEFT_OUT: dict[tuple[str, str], str] = {
    ("policy", "cost"): "its choices follow measured transfer times, so a seed would not "
    "replay the same run",
}
"""(knob, value) -> why a legal value of a drawn knob that is one of a list is never drawn."""

INTERPRETER = "TRITON_INTERPRET"
_lock = threading.Lock()
_users = [0]
_saved: list[str | None] = [None]


def needs_interpreter(backend: str, device: str | None) -> bool:
    """Whether `backend` on `device` runs Triton's interpreter (Triton on a CPU)."""
    return backend == "triton" and (device or "cpu") == "cpu"


def interpreter_on() -> None:
    """One more adapter runs Triton on a CPU: TRITON_INTERPRET=1 until its `interpreter_off`
    (the first saves what the environment held). Thread safe: TP ranks build in threads."""
    with _lock:
        if _users[0] == 0:
            _saved[0] = os.environ.get(INTERPRETER)
            os.environ[INTERPRETER] = "1"
        _users[0] += 1


def interpreter_off() -> None:
    """An adapter of `interpreter_on` closed: the last one puts the environment back."""
    with _lock:
        # Verify every off has its on: an extra one would restore the variable under a user.
        assert _users[0] > 0, "interpreter_off without interpreter_on"
        _users[0] -= 1
        if _users[0] == 0:
            if _saved[0] is None:
                os.environ.pop(INTERPRETER, None)
            else:
                os.environ[INTERPRETER] = _saved[0]
