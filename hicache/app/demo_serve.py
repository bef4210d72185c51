"""The demo's setup and serving, shared by `hicache demo` (hicache/app/demo.py) and each rank of
`hicache demo --tp N` (hicache/app/demo_tp.py): the workload, capacities and configuration the
command line describes (`demo_setup`), and one controller serving it into the report's
summary (`serve`; the report itself is `hicache.app.demo_report`'s).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch-heavy: imported when the demo runs
    from hicache.app.demo_sizing import TierSizes
    from hicache.app.workload import RequestSpec
    from hicache.controller.config import CacheConfig
    from hicache.controller.controller import CacheController


@dataclass(frozen=True)
class DemoSetup:
    """What `args` describe: the workload, the tier capacities sized for it (where not
    given) and the configuration (every rank of `--tp` builds the same from the same args)."""

    workload: list[RequestSpec]
    sizes: TierSizes
    config: CacheConfig


def demo_setup(args: argparse.Namespace) -> DemoSetup:
    from hicache.app.demo_sizing import size_tiers
    from hicache.app.workload import shared_prefix_workload
    from hicache.controller.config import CacheConfig
    from hicache.dataplane.geometry import preset

    workload = shared_prefix_workload(args.requests, seed=args.seed)
    sizes = size_tiers(
        workload,
        preset(args.geometry).page_size,
        args.batch_size,
        l1_pages=args.l1_pages,
        l2_pages=args.l2_pages,
        l3_slots=args.l3_slots,
    )
    config = CacheConfig(
        geometry=args.geometry,
        l1_pages=sizes.l1_pages,
        l2_pages=sizes.l2_pages,
        l3_slots=sizes.l3_slots,
        device=args.device,
        l3_path=args.l3_path,
        backend=args.backend,
        policy=args.policy,
        write_policy=args.write_policy,
        promotion=not args.no_promotion,
        prefetch=not args.no_prefetch,
        check_mode=args.check_mode,
        io_threads=args.io_threads,
        l3_overwrite=args.l3_overwrite,
        pools=args.preset,
    )
    return DemoSetup(workload, sizes, config)


def serve(
    args: argparse.Namespace,
    setup: DemoSetup,
    ctl: CacheController,
    started: float,
    *,
    progress: bool,
) -> dict[str, object]:
    """Serve `setup`'s workload through `ctl` (built from `setup.config`), close it, and
    return the report's summary (wall time from `started`, a `time.perf_counter()`);
    `progress`: draw the progress bar."""
    from hicache.app.demo_report import DecisionTally
    from hicache.app.serving import ServingLoop

    workload, config = setup.workload, ctl.config
    tally = ctl.decisions = DecisionTally()  # before any admission: the log starts empty
    try:
        loop = ServingLoop(ctl, batch_size=args.batch_size)
        report = loop.run(workload, _progress_bar if progress else None)
        status = ctl.status()
    finally:
        ctl.close()
    summary = _summary(ctl, report, status, time.perf_counter() - started)
    summary["config"] = _config_echo(
        args, config, setup.sizes.sized, status["engine"], summary["device"]
    )
    summary["decision_reasons"] = dict(tally.by_reason)
    summary["verified_pool_bytes"] = dict(getattr(ctl.verifier, "bytes_checked", {}))
    longest = max(workload, key=lambda r: len(r.tokens))
    summary["longest_prompt"] = {
        "request_id": longest.request_id,
        "tokens": len(longest.tokens),
        "pages": -(-len(longest.tokens) // config.kv.page_size),
    }
    return summary


def _progress_bar(done: int, total: int) -> None:
    width = 30
    filled = width * done // total
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} requests")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def _config_echo(
    args: argparse.Namespace, config: object, sized: frozenset[str], engine: object, device: object
) -> dict[str, object]:
    """Every setting the run used (`engine`: the data plane's status; `device`: the one it
    resolved), as the report's Configuration section shows it."""
    from hicache.controller.config import CacheConfig

    assert isinstance(config, CacheConfig) and isinstance(engine, dict)
    return {
        "geometry": args.geometry,
        "geometry_fields": vars(config.kv),
        "preset": _preset_echo(config),
        "bytes_per_page": config.kv.bytes_per_page,
        "l1_pages": config.l1_pages,
        "l2_pages": config.l2_pages,
        "l3_slots": config.l3_slots,
        "sized": sorted(sized),
        "l3_path": config.l3_path,
        "write_policy": config.write_policy,
        "policy": config.policy,
        "check_mode": config.check_mode,
        "device": str(device),
        "backend": config.backend,
        "backends": engine["backends"],
        "seed": args.seed,
        "batch_size": args.batch_size,
        "requests": args.requests,
        "prefetch": config.prefetch,
        "promotion": config.promotion,
        "io_threads": config.io_threads,
    }


def _preset_echo(config: object) -> str:
    """The pool group line: for a group, the preset and its byte pools' bytes per anchor page;
    "" (no line) for the single-pool plane, whose report is unchanged."""
    from hicache.controller.config import CacheConfig
    from hicache.pools.presets import SINGLE_POOL

    assert isinstance(config, CacheConfig)
    if config.pools == SINGLE_POOL:
        return ""
    kept = config.group.backed_up()  # the pools L2 and L3 hold
    moved = [p for p in kept.pools if p.bytes_per_page]
    return (
        f"{config.pools}: {len(moved)} byte pools, {kept.value_bytes_per_anchor_page:,} B per "
        f"anchor page in all, {kept.bytes_per_anchor_page:,} on {kept.anchor.name}'s indices"
    )


def _summary(
    ctl: object, report: object, status: dict[str, object], wall_s: float
) -> dict[str, object]:
    from hicache.app.serving import LoopReport
    from hicache.controller.controller import CacheController

    assert isinstance(ctl, CacheController) and isinstance(report, LoopReport)
    m = ctl.metrics
    return {
        "device": str(ctl.byte_plane.device),
        "geometry": vars(ctl.config.kv),
        "policy": ctl.policy.name,
        "requests": report.requests,
        "admissions": report.admissions,
        "preemptions": m.preemptions,
        "wall_s": wall_s,
        "serving_s": report.wall_s,
        "requests_per_s": report.requests_per_s,
        "prompt_tokens": m.prompt_tokens,
        "token_shares": m.token_shares(),
        "hit_tokens": dict(m.hit_tokens),
        "recomputed_tokens": m.recomputed_tokens,
        "preempted_tokens": m.preempted_tokens,
        "decisions": dict(m.decisions),
        "policy_skips": m.policy_skips,
        "fallbacks": m.fallbacks,
        "restores": m.restores,
        "verified_pages": m.verified_pages,
        "evicted_pages": dict(m.evicted_pages),
        "promoted_pages": m.promoted_pages,
        "shared_load_back_pages": m.shared_load_back_pages,
        "dropped_tokens": dict(m.dropped_tokens),
        "l3_invalidated_pages": dict(m.l3_invalidated_pages),
        "transfers": {
            d: {
                "count": s.count,
                "failed": s.failed,
                "cancelled": s.cancelled,
                "bytes": s.bytes,
                "gib_per_s": s.gib_per_s,
            }
            for d, s in m.directions.items()
        },
        "decode_steps": report.decode_steps,
        "decode_overlap_s": report.decode_overlap_s,
        "prediction_error": ctl.decisions.summary(),
        "invariants": status["invariant_checks"],
        "tiers": status["tiers"],
    }
