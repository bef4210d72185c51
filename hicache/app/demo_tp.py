"""`hicache demo --tp N`: the demo's workload on N tensor-parallel ranks, a process each.

    launcher (`hicache demo`)                rank r (hicache/distributed/processes.py)
    ---------------------------------------  ----------------------------------------------
    refuse the options N ranks cannot share  the demo's setup from the same arguments (the
    run_ranks(serve_rank, N) over gloo, or   same configuration: C0 compares fingerprints),
    shared memory (--tp-transport shm)
                                             its own device and temporary L3 file (both
                                             RANK_LOCAL); a CacheController over
                                             the transport's collectives serves it as the
                                             demo does (`demo_serve.serve`: invariants checked
                                             after every transition), then returns its
                                             report summary and its RankView
    rank 0's report, a line per rank, the    and every RANK_CHECK_EVERY admissions the
    cross-rank checks (I7, I8, I10, I11) over  ranks check each other (C7-C9: a divergence
    every rank's view; exit 1 on a violation   is an InvariantViolation on every rank)

A rank that raises ends the run: the others are broken out of their collective (RankFailed)
or time out after COLLECTIVE_TIMEOUT_S naming the rank that did not arrive, and the launcher
reports the root cause (exit 1; a rank's ConfigError is the configuration's: exit 2).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hicache.app.demo_serve import demo_setup, serve
from hicache.errors import ConfigError

if TYPE_CHECKING:
    from hicache.core.snapshot import RankView
    from hicache.distributed.wire import ProcessCollectives
    from hicache.invariants import Violation

COLLECTIVE_TIMEOUT_S = 60.0  # a rank missing from a collective this long is reported
RANK_CHECK_EVERY = 10  # admissions between the ranks' own cross-rank checks (C7-C9)
RUN_TIMEOUT_S = 1800.0  # the whole run; then every rank is terminated and reported
REFUSED = {  # option -> why N ranks cannot honour it, and what to do
    "trace": "--trace records one control plane's events: leave it out with --tp, or trace "
    "a single rank without --tp",
    "l3_path": "--l3-path names one file, but every rank keeps its own L3 file: leave it out "
    "with --tp (each rank then uses its own temporary file)",
    "prometheus": "--prometheus writes one cache's metrics: leave it out with --tp (--json "
    "writes every rank's summary)",
}


@dataclass(frozen=True)
class RankResult:
    """What a rank hands back: its report summary, its view and its collectives' cost."""

    rank: int
    summary: dict[str, object]
    view: RankView
    collectives: int
    collective_s: float  # seconds inside collectives (header, payload, arrival board)
    rank_checks: int = 0  # cross-rank checks (C7-C9) the rank made and passed during the run
    transport: str = "gloo"  # how the ranks met (processes.TRANSPORTS)


def run_tp(args: argparse.Namespace) -> int:
    """Serve the demo on `args.tp` ranks and print the report (module docstring); 0 when no
    rank and no cross-rank check found a violation. ConfigError for an option TP refuses."""
    from hicache.app.demo_report import format_report
    from hicache.distributed.processes import RankError, run_ranks
    from hicache.invariants import check_ranks

    for option, why in REFUSED.items():
        if getattr(args, option):
            raise ConfigError("tp", why)
    demo_setup(args)  # every ConfigError of the options, before any rank starts
    started = time.perf_counter()
    try:
        results: list[RankResult] = run_ranks(
            serve_rank,
            args.tp,
            (args,),
            timeout_s=RUN_TIMEOUT_S,
            collective_timeout_s=COLLECTIVE_TIMEOUT_S,
            transport=args.tp_transport,
        )
    except RankError as e:
        if e.kind == "ConfigError":  # the configuration's fault, not the run's
            raise ConfigError("tp", f"rank {e.rank}: {e.message}") from None
        raise
    violations = check_ranks([r.view for r in results])
    print(
        f"hicache demo --tp {args.tp}: rank 0's report, then a line per rank and the "
        "cross-rank checks\n"
    )
    print(format_report(results[0].summary))
    print()
    print("\n".join(tp_lines(results, violations, time.perf_counter() - started)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "ranks": [r.summary for r in results],
                    "cross_rank_violations": [str(v) for v in violations],
                },
                f,
                indent=2,
                default=str,
            )
    bad = [r for r in results if _violations(r) != 0]
    return 0 if not bad and not violations else 1


def serve_rank(
    rank: int, size: int, collectives: ProcessCollectives, args: argparse.Namespace
) -> RankResult:
    """Rank `rank`'s demo: `args`' setup on this rank's device, over `collectives`."""
    from hicache.controller.controller import CacheController
    from hicache.distributed.devices import bind_device, rank_device
    from hicache.distributed.rankview import rank_view

    setup = demo_setup(args)
    config = dataclasses.replace(
        setup.config,
        device=rank_device(setup.config.device, rank, size),
        rank_check_every=RANK_CHECK_EVERY,
    )
    bind_device(config.device)
    started = time.perf_counter()
    ctl = CacheController(config, collectives=collectives)
    draw = rank == 0 and not args.quiet and sys.stderr.isatty()  # one bar, and not in a log
    summary = serve(args, setup, ctl, started, progress=draw)
    summary["rank"] = rank
    return RankResult(
        rank,
        summary,
        rank_view(ctl),
        collectives.log.count,
        collectives.exchange_s,
        ctl.rank_checks,
        args.tp_transport,
    )


def tp_lines(results: list[RankResult], violations: list[Violation], wall_s: float) -> list[str]:
    """The report's tensor-parallel section: a line per rank, then the cross-rank checks."""
    from hicache.invariants import RANK_CHECKS

    first = results[0].summary
    lines = [
        f"Tensor parallelism: {len(results)} ranks over {results[0].transport}, preset "
        f"{first['config']['preset'] or 'mha'}, {wall_s:.1f} s"  # type: ignore[index]
    ]
    for r in results:
        s = r.summary
        hits = s["hit_tokens"]
        assert isinstance(hits, dict)  # Verify: the summary's hits are by tier
        per_call_us = 1e6 * r.collective_s / r.collectives if r.collectives else 0.0
        lines.append(
            f"  rank {r.rank}: {s['requests']:,} requests served; hit tokens "
            + ", ".join(f"{tier} {n:,}" for tier, n in hits.items())
            + f"; {s['invariants']['run']:,} invariant checks, "  # type: ignore[index]
            f"{_violations(r)} violations; {r.collectives:,} collectives "
            f"({per_call_us:,.0f} us each)"
        )
    lines.append(
        f"  during the run: {results[0].rank_checks} cross-rank checks over the "
        f"collectives (C7-C9, every {RANK_CHECK_EVERY} admissions), all passed"
    )
    checks = ", ".join(f"{c.id} {c.name}" for c in RANK_CHECKS)
    lines.append(
        f"  at the end: cross-rank checks ({checks}) over every rank's view: "
        f"{len(violations)} violations"
    )
    lines += [f"    {v}" for v in violations]
    return lines


def _violations(r: RankResult) -> int:
    inv = r.summary["invariants"]
    assert isinstance(inv, dict)  # Verify: the controller's invariant_checks status
    return int(inv["violations"])


__all__ = ["RankResult", "run_tp", "serve_rank", "tp_lines"]
