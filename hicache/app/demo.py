"""`hicache demo`: serve a shared-prefix workload through all three tiers and show what
happened -- hits by tier, policy decisions, transfer bandwidths, invariant checks.

Defaults fit a 2-core CPU in well under a minute: the `tiny` geometry, CPU when there is no
GPU, a temporary L3 file, capacities sized from the workload (`hicache.app.demo_sizing`: L1 holds
the longest prompt and room for the batch, the working set is larger than L1 and L2, so
restores come from both lower tiers); invariants are checked after every transition and every
restored page is compared byte for byte with recomputation (the synthetic producer). The
report (`hicache.app.demo_report`) echoes the configuration; `--help` ends with its glossary.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Sequence
from typing import IO

from hicache.app.demo_serve import demo_setup, serve
from hicache.app.outputs import OUTPUT_FILE
from hicache.app.usage import UsageParser
from hicache.choices import WritePolicy
from hicache.distributed.processes import TRANSPORTS
from hicache.errors import ConfigError, HiCacheError, L3PathRefused

OPTION_OF_FIELD = {
    "l1_pages": "--l1-pages",
    "l2_pages": "--l2-pages",
    "l3_slots": "--l3-slots",
    "policy": "--policy",
    "write_policy": "--write-policy",
    "check_mode": "--check-mode",
    "device": "--device",
    "backend": "--backend",
    "geometry": "--geometry",
    "io_threads": "--io-threads",
    "pools": "--preset",
    "tp": "--tp",
}


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows each option's default, except None and off flags (their help says what happens),
    and keeps the glossary epilog's layout."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def parser() -> argparse.ArgumentParser:
    from hicache.app.demo_report import glossary_text

    p = UsageParser(
        prog="hicache demo",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=_HelpFormatter,
        epilog=glossary_text(),
    )
    p.add_argument(
        "--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available)"
    )
    p.add_argument(
        "--geometry", default="tiny", help="KV geometry preset: tiny, qwen3-4b, qwen3-8b"
    )
    p.add_argument(
        "--preset",
        default="mha",
        help=(
            "pool group: mha (the geometry's single KV pool), or a group whose every pool is "
            "moved, checked per pool and verified per pool: mla-tiny, dsv4-tiny (CPU sizes, "
            "4-token pages like the tiny geometry)"
        ),
    )
    p.add_argument(
        "--policy",
        default="always",
        help="restore or recompute: always (uses every tier), cost, never, threshold",
    )
    p.add_argument(
        "--write-policy",
        default=str(WritePolicy.WRITE_THROUGH),
        help=", ".join(WritePolicy.names()),
    )
    p.add_argument(
        "--l1-pages",
        type=int,
        default=None,
        help="L1 capacity in pages (default: the longest prompt + (batch size - 1) "
        "x the mean prompt)",
    )
    p.add_argument(
        "--l2-pages", type=int, default=None, help="L2 capacity in pages (default: 3/2 x L1)"
    )
    p.add_argument(
        "--l3-slots",
        type=int,
        default=None,
        help="L3 capacity in page slots (default: every distinct page of the workload)",
    )
    p.add_argument(
        "--l3-path",
        default=None,
        type=OUTPUT_FILE,
        help=(
            "L3 file (default: a temporary file that leaves nothing on disk). A new path is "
            "created (mode 0600) with a header; an existing one is used only if it is a hicache "
            "L3 file (its slots start empty: nothing from an earlier run is trusted). Any other "
            "existing file is refused and left unchanged; a symlink is never followed"
        ),
    )
    p.add_argument(
        "--l3-overwrite",
        action="store_true",
        help=(
            "let --l3-path replace an existing regular file that is not a hicache L3 file (its "
            "contents are lost, its mode becomes 0600); never a symlink, directory or device"
        ),
    )
    p.add_argument("--requests", type=int, default=120, help="requests in the workload")
    p.add_argument("--batch-size", type=int, default=4, help="live requests at most")
    p.add_argument("--seed", type=int, default=0, help="seed of the workload")
    p.add_argument("--check-mode", default="every", help="off, every, 'periodic N'")
    p.add_argument("--backend", default="auto", help="gather/scatter kernels: auto, triton, torch")
    p.add_argument("--io-threads", type=int, default=4, help="threads doing L3 file I/O")
    p.add_argument("--no-prefetch", action="store_true", help="restores block (no decode overlap)")
    p.add_argument("--no-promotion", action="store_true", help="do not keep L3 restores in L2")
    p.add_argument(
        "--json", default=None, type=OUTPUT_FILE, help="write the summary as JSON to this path"
    )
    p.add_argument(
        "--prometheus",
        default=None,
        type=OUTPUT_FILE,
        help="write the metrics in Prometheus text format",
    )
    p.add_argument(
        "--trace",
        default=None,
        type=OUTPUT_FILE,
        metavar="FILE",
        help=(
            "write the run's trace to FILE (NDJSON, spec/trace.md): the control plane's header "
            "line, then one line per event, the controller's close included; `hicache "
            "check-trace FILE` replays it"
        ),
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bar (it is drawn only when stderr is a terminal)",
    )
    p.add_argument(
        "--tp",
        type=int,
        default=1,
        help=(
            "tensor-parallel ranks: N > 1 serves the workload on N processes over gloo, each rank "
            "a cache of the same configuration (its own temporary L3 file) agreeing with the "
            "others at the points of spec/tp.toml; prints a line per rank and the cross-rank "
            "checks (I7, I8, I10, I11) (hicache/app/demo_tp.py)"
        ),
    )
    p.add_argument(
        "--tp-transport",
        choices=TRANSPORTS,
        default=TRANSPORTS[0],
        help=(
            "how the --tp ranks meet: gloo (torch.distributed), or shm (a shared-memory block: "
            "the ranks of one x86-64 host; a collective's own cost 22-29x lower than gloo's "
            "on two idle cores, benchmarks/results/2026-12-04-tp-agreement-2core/)"
        ),
    )
    return p


TP_MAX = 8
"""Most `--tp` ranks: one host's GPUs (8 on the largest common hosts); each rank is a process
of its own (about 150 MiB on the CPU)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; exit status 0, 1 when an invariant was violated or the run failed, 2 a
    usage error (one line on stderr naming the option; output paths are checked while the
    command line is parsed, before any work)."""
    p = parser()
    args = p.parse_args(list(argv) if argv is not None else None)
    if args.requests < 1:
        p.error(f"argument --requests: must be >= 1, got {args.requests}")
    if args.batch_size < 1:
        p.error(f"argument --batch-size: must be >= 1, got {args.batch_size}")
    if not 1 <= args.tp <= TP_MAX:
        p.error(
            f"argument --tp: ranks in 1..{TP_MAX} (a tensor-parallel group spans one "
            f"host's GPUs; each rank is a process of its own), got {args.tp}"
        )
    try:  # --tp refuses --trace (demo_tp.py): no file is made for it
        trace = open(args.trace, "w") if args.trace and args.tp == 1 else None
    except OSError as e:
        sys.stderr.write(
            f"hicache demo: --trace {args.trace}: {e.strerror}; choose a writable path\n"
        )
        return 2
    try:
        with trace or contextlib.nullcontext():
            return _run(args, trace) if args.tp == 1 else _run_tp(args)
    except L3PathRefused as e:
        todo = "choose another path" + (
            ", or pass --l3-overwrite to replace it" if e.overwrite_helps else ""
        )
        sys.stderr.write(f"hicache demo: --l3-path {e.path}: {e.reason}; left unchanged: {todo}\n")
        return 2
    except ConfigError as e:
        sys.stderr.write(
            f"hicache demo: {OPTION_OF_FIELD.get(e.field, e.field)}: {str(e).split(': ', 1)[-1]}\n"
        )
        return 2
    except HiCacheError as e:
        sys.stderr.write(f"hicache demo: {type(e).__name__}: {e}\n")
        return 1


def _run(args: argparse.Namespace, trace: IO[str] | None = None) -> int:
    """Serve the workload `args` describe and print the report; `trace`, when given, gets
    the control plane's header and then its every event."""
    from hicache.app.demo_report import format_report
    from hicache.controller.controller import CacheController
    from hicache.core.trace import NdjsonSink, Tracer

    setup = demo_setup(args)
    started = time.perf_counter()
    # The control plane hands the sink its header when built, so it leads the file.
    tracer = None if trace is None else Tracer(NdjsonSink(trace, engine="hicache demo"))
    ctl = CacheController(setup.config, tracer=tracer)
    draw = not args.quiet and sys.stderr.isatty()  # a log file gets no progress bar
    summary = serve(args, setup, ctl, started, progress=draw)
    print(format_report(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2, default=str)
    if args.prometheus:
        with open(args.prometheus, "w") as f:
            f.write(ctl.metrics.to_prometheus())
    violations = summary["invariants"]["violations"]  # type: ignore[index]
    return 0 if violations == 0 else 1


def _run_tp(args: argparse.Namespace) -> int:
    from hicache.app.demo_tp import run_tp

    return run_tp(args)


if __name__ == "__main__":
    raise SystemExit(main())
