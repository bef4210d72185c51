"""`hicache demo`: serve a shared-prefix workload through all three tiers and show what
happened -- hits by tier, policy decisions, transfer bandwidths, invariant checks.

Defaults fit a 2-core CPU in well under a minute: the `tiny` geometry, CPU when there is no
GPU, a temporary L3 file, a working set larger than L1 (and L2), so restores come from both
lower tiers; invariants are checked after every transition and every restored page is
compared byte for byte with recomputation (the synthetic producer).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import NoReturn, Sequence

from hicache.errors import ConfigError, HiCacheError, L3PathRefused

OPTION_OF_FIELD = {
    "l1_pages": "--l1-pages", "l2_pages": "--l2-pages", "l3_slots": "--l3-slots",
    "policy": "--policy", "write_policy": "--write-policy", "check_mode": "--check-mode",
    "device": "--device", "backend": "--backend", "geometry": "--geometry", "io_threads": "--io-threads",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"hicache demo: {message}\n")
        raise SystemExit(2)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="hicache demo", description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available)")
    p.add_argument("--geometry", default="tiny", help="KV geometry preset: tiny, qwen3-4b, qwen3-8b")
    p.add_argument("--policy", default="always",
                   help="always (default here: every tier is exercised), cost, never, threshold")
    p.add_argument("--write-policy", default="write_through",
                   help="write_through, write_through_selective, write_back")
    p.add_argument("--l1-pages", type=int, default=160)
    p.add_argument("--l2-pages", type=int, default=256)
    p.add_argument("--l3-slots", type=int, default=1024)
    p.add_argument("--l3-path", default=None, help=(
        "L3 file (default: a temporary file that leaves nothing on disk). A new path is "
        "created (mode 0600) with a header; an existing one is used only if it is a hicache "
        "L3 file (its slots start empty: nothing from an earlier run is trusted). Any other "
        "existing file is refused and left unchanged; a symlink is never followed"))
    p.add_argument("--l3-overwrite", action="store_true", help=(
        "let --l3-path replace an existing regular file that is not a hicache L3 file (its "
        "contents are lost, its mode becomes 0600); never a symlink, directory or device"))
    p.add_argument("--requests", type=int, default=120, help="requests in the workload")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check-mode", default="every", help="off, every, 'periodic N'")
    p.add_argument("--backend", default="auto", help="gather/scatter kernels: auto, triton, torch")
    p.add_argument("--io-threads", type=int, default=4)
    p.add_argument("--no-prefetch", action="store_true", help="restores block (no decode overlap)")
    p.add_argument("--no-promotion", action="store_true", help="do not keep L3 restores in L2")
    p.add_argument("--json", default=None, help="write the summary as JSON to this path")
    p.add_argument("--prometheus", default=None, help="write the metrics in Prometheus text format")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(list(argv) if argv is not None else None)
    if args.requests < 1:
        parser().error(f"argument --requests: must be >= 1, got {args.requests}")
    if args.batch_size < 1:
        parser().error(f"argument --batch-size: must be >= 1, got {args.batch_size}")
    try:
        return _run(args)
    except L3PathRefused as e:
        todo = "choose another path" + (", or pass --l3-overwrite to replace it"
                                        if e.overwrite_helps else "")
        sys.stderr.write(f"hicache demo: --l3-path {e.path}: {e.reason}; left unchanged: {todo}\n")
        return 2
    except ConfigError as e:
        sys.stderr.write(f"hicache demo: {OPTION_OF_FIELD.get(e.field, e.field)}: {str(e).split(': ', 1)[-1]}\n")
        return 2
    except HiCacheError as e:
        sys.stderr.write(f"hicache demo: {type(e).__name__}: {e}\n")
        return 1


def _run(args: argparse.Namespace) -> int:
    from hicache.controller.config import CacheConfig
    from hicache.controller.controller import CacheController
    from hicache.serving import ServingLoop
    from hicache.workload import shared_prefix_workload

    config = CacheConfig(
        geometry=args.geometry, l1_pages=args.l1_pages, l2_pages=args.l2_pages, l3_slots=args.l3_slots,
        device=args.device, l3_path=args.l3_path, backend=args.backend, policy=args.policy,
        write_policy=args.write_policy, promotion=not args.no_promotion, prefetch=not args.no_prefetch,
        check_mode=args.check_mode, io_threads=args.io_threads, l3_overwrite=args.l3_overwrite,
    )
    started = time.perf_counter()
    ctl = CacheController(config)
    try:
        workload = shared_prefix_workload(args.requests, seed=args.seed)
        loop = ServingLoop(ctl, batch_size=args.batch_size)
        report = loop.run(workload, None if args.quiet else _progress_bar)
        status = ctl.status()
    finally:
        ctl.close()
    summary = _summary(ctl, report, status, time.perf_counter() - started)
    print(_table(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2, default=str)
    if args.prometheus:
        with open(args.prometheus, "w") as f:
            f.write(ctl.metrics.to_prometheus())
    violations = summary["invariants"]["violations"]  # type: ignore[index]
    return 0 if violations == 0 else 1


def _progress_bar(done: int, total: int) -> None:
    width = 30
    filled = width * done // total
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} requests")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def _summary(ctl: object, report: object, status: dict[str, object], wall_s: float) -> dict[str, object]:
    from hicache.controller.controller import CacheController
    from hicache.serving import LoopReport

    assert isinstance(ctl, CacheController) and isinstance(report, LoopReport)
    m = ctl.metrics
    return {
        "device": str(ctl.engine.device), "geometry": vars(ctl.config.kv), "policy": ctl.policy.name,
        "requests": report.requests, "wall_s": wall_s, "requests_per_s": report.requests_per_s,
        "prompt_tokens": m.prompt_tokens, "hit_tokens": dict(m.hit_tokens),
        "recomputed_tokens": m.recomputed_tokens, "decisions": dict(m.decisions),
        "policy_skips": m.policy_skips, "fallbacks": m.fallbacks, "restores": m.restores,
        "verified_pages": m.verified_pages, "evictions": dict(m.evictions), "promotions": m.promotions,
        "dropped_tokens": dict(m.dropped_tokens),
        "transfers": {d: {"count": s.count, "failed": s.failed, "bytes": s.bytes, "gib_per_s": s.gib_per_s}
                      for d, s in m.directions.items()},
        "decode_steps": report.decode_steps, "decode_overlap_s": report.decode_overlap_s,
        "preemptions": report.preemptions,
        "prediction_error": ctl.decisions.summary(),
        "invariants": status["invariant_checks"], "tiers": status["tiers"],
    }


def _table(s: dict[str, object]) -> str:
    hits = s["hit_tokens"]
    assert isinstance(hits, dict)
    prompt = max(1, int(s["prompt_tokens"]))  # type: ignore[call-overload]
    lines = [
        f"hicache demo: {s['requests']} requests on {s['device']} in {float(s['wall_s']):.1f} s "  # type: ignore[arg-type]
        f"({float(s['requests_per_s']):.1f} req/s), policy {s['policy']}",  # type: ignore[arg-type]
        "",
        "| tokens | count | share of prompt tokens |",
        "| --- | --- | --- |",
    ]
    for tier in ("L1", "L2", "L3"):
        lines.append(f"| hit in {tier} | {hits[tier]:,} | {hits[tier] / prompt:.1%} |")
    rec = int(s["recomputed_tokens"])  # type: ignore[call-overload]
    lines.append(f"| recomputed | {rec:,} | {rec / prompt:.1%} |")
    lines += ["", "| decision | count |", "| --- | --- |"]
    decisions = s["decisions"]
    assert isinstance(decisions, dict)
    lines += [f"| {k} | {v} |" for k, v in sorted(decisions.items())]
    lines += ["", "| transfer | count | failed | MiB | MiB/s (steady) |", "| --- | --- | --- | --- | --- |"]
    transfers = s["transfers"]
    assert isinstance(transfers, dict)
    for d, t in transfers.items():
        lines.append(f"| {d} | {t['count']} | {t['failed']} | {t['bytes'] / 2**20:.1f} | {t['gib_per_s'] * 1024:.1f} |")
    inv = s["invariants"]
    assert isinstance(inv, dict)
    lines += [
        "",
        f"restores {s['restores']}, restored pages verified byte for byte {s['verified_pages']}, "
        f"fallbacks {s['fallbacks']}, policy skips {s['policy_skips']}, evictions {s['evictions']}",
        f"decode steps {s['decode_steps']}, decode overlapped with restores "
        f"{float(s['decode_overlap_s']) * 1e3:.1f} ms, dropped tokens {s['dropped_tokens']}, "  # type: ignore[arg-type]
        f"preemptions {s['preemptions']}",
        f"invariant checks run {inv['run']}, violations {inv['violations']}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
