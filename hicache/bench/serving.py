"""Restore vs recompute through the whole controller, with the model producer on a GPU.

    hicache bench serving --out DIR [--presets qwen3-8b qwen3-4b] [--mode eager|graphs|compile]

Two experiments per preset:
  latency   a prompt = a cached prefix of N tokens + one new page; time from admission until
            its prefill is done (`torch.cuda.synchronize`), with the prefix forced to come
            from: nowhere (recompute, policy `never`), L2 (L1 copy evicted, policy `always`),
            L3 (L1 and L2 copies evicted, `always`), and as the `cost` policy decides (L1 copy
            evicted: it chooses among recompute, L2 and L3).
  stress    8 prefixes x 350 tokens, 80 requests, batch 1, through the serving loop; L1 holds
            2 prefixes, so the rest come from L2 (or, with L2 holding 2 as well, from L3).
            Requests per second for recompute / L2 / L3 / cost.
Invariant checks are off here (they are the tests' job; here they would be timed).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from hicache.app.outputs import OUTPUT_DIR
from hicache.app.serving import ServingLoop
from hicache.app.workload import repeated_prefix_workload
from hicache.bench import BenchParser, no_cuda
from hicache.controller.config import CacheConfig
from hicache.controller.controller import CacheController
from hicache.policy import Decision
from hicache.producers.model import ModelProducer

LENGTHS = (350, 1000, 2000, 3500)
PATHS = ("recompute", "L2", "L3", "cost")


def _controller(producer: ModelProducer, policy: str, l1: int, l2: int, l3: int) -> CacheController:
    cfg = CacheConfig(
        geometry=producer.geometry,
        l1_pages=l1,
        l2_pages=l2,
        l3_slots=l3,
        device=str(producer.device),
        policy=policy,
        check_mode="off",
        verify=False,
    )
    return CacheController(cfg, producer)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _serve(ctl: CacheController, rid: int, tokens: Sequence[int]) -> tuple[float, Decision]:
    """Seconds from admission to prefill done, and the policy's decision for it."""
    _sync()
    t0 = time.perf_counter()
    mat = ctl.admit(rid, tokens)
    while not ctl.ready(rid):
        ctl.wait(rid)
        ctl.tick()
    ctl.prefill(rid)
    _sync()
    elapsed = time.perf_counter() - t0
    ctl.finish(rid)
    return elapsed, mat.decision


def latency(producer: ModelProducer, lengths: Sequence[int], repeats: int) -> list[dict[str, Any]]:
    ps = producer.geometry.page_size
    rows = []
    for n in lengths:
        prefix_len = n // ps * ps
        pages = prefix_len // ps + 1
        for path in PATHS:
            policy = {"recompute": "never", "L2": "always", "L3": "always", "cost": "cost"}[path]
            ctl = _controller(producer, policy, 4 * pages + 8, 4 * pages + 8, 4 * pages + 8)
            samples = []
            predicted: list[dict[str, Any]] = []
            try:
                for r in range(repeats + 1):  # the first (r == 0) warms the cost model and caches
                    gen = torch.Generator().manual_seed(1000 * n + r)
                    prefix = torch.randint(
                        0, producer.shape.vocab, (prefix_len,), generator=gen
                    ).tolist()
                    _serve(ctl, 2 * r, prefix)  # puts the prefix in L1, backs it up to L2 and L3
                    ctl.drain()
                    ctl.cp.evict("L1", 10**9)  # every path: the prefix is not in L1
                    if path == "L3":
                        ctl.cp.evict("L2", 10**9)
                    s, d = _serve(ctl, 2 * r + 1, prefix + list(range(ps)))
                    ctl.drain()
                    if r:
                        samples.append(s)
                        predicted.append(
                            {
                                "choice": d.choice,
                                "predicted_ms": {k: v * 1e3 for k, v in d.predicted_s.items()},
                            }
                        )
                choice = dict(ctl.metrics.decisions)
                model_state = ctl.model.state()
                log = ctl.decisions.summary()
            finally:
                ctl.close()
            rows.append(
                {
                    "tokens": n,
                    "prefix_tokens": prefix_len,
                    "path": path,
                    "median_ms": statistics.median(samples) * 1e3,
                    "samples_ms": [x * 1e3 for x in samples],
                    "decisions": choice,
                    "predicted": predicted,
                    "cost_model": model_state,
                    "decision_log": log,
                }
            )
            print(
                f"  {n:>5} tokens  {path:<9} {rows[-1]['median_ms']:8.2f} ms  decisions "
                f"{_counts(choice)}",
                flush=True,
            )
    return rows


def stress(
    producer: ModelProducer, n_prefixes: int = 8, prefix_len: int = 350, n_requests: int = 80
) -> list[dict[str, Any]]:
    ps = producer.geometry.page_size
    per = -(-prefix_len // ps) + 1
    rows = []
    # Warm-up, untimed: the producer compiles or captures once per (start, end) shape, and the
    # first path to need the restore's tail shape would otherwise pay for it in its wall time.
    warm = _controller(producer, "always", 2 * per + 2, n_prefixes * per * 2, n_prefixes * per * 2)
    try:
        ServingLoop(warm, batch_size=1).run(
            repeated_prefix_workload(
                n_prefixes, prefix_len, 3 * n_prefixes, seed=7, vocab=producer.shape.vocab
            )
        )
    finally:
        warm.close()
    for path in PATHS:
        policy = {"recompute": "never", "L2": "always", "L3": "always", "cost": "cost"}[path]
        l2 = 2 * per + 2 if path == "L3" else n_prefixes * per * 2
        ctl = _controller(producer, policy, 2 * per + 2, l2, n_prefixes * per * 2)
        try:
            work = repeated_prefix_workload(
                n_prefixes, prefix_len, n_requests, seed=7, vocab=producer.shape.vocab
            )
            loop = ServingLoop(ctl, batch_size=1)
            report = loop.run(work)
            _sync()
            rows.append(
                {
                    "path": path,
                    "requests": report.requests,
                    "wall_s": report.wall_s,
                    "requests_per_s": report.requests_per_s,
                    "hit_tokens": dict(ctl.metrics.hit_tokens),
                    "recomputed_tokens": ctl.metrics.recomputed_tokens,
                    "decisions": dict(ctl.metrics.decisions),
                }
            )
        finally:
            ctl.close()
        print(
            f"  stress {path:<9} {rows[-1]['requests_per_s']:7.2f} req/s  hit tokens "
            f"{_counts(ctl.metrics.hit_tokens)}",
            flush=True,
        )
    return rows


def _counts(counts: dict[str, int]) -> str:
    """`{"L2": 3, "recompute": 1}` as `L2 3, recompute 1` (progress lines, not dicts)."""
    return ", ".join(f"{k} {v:,}" for k, v in counts.items()) or "none"


def main(argv: Sequence[str] | None = None) -> int:
    p = BenchParser("serving", __doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument(
        "--out", required=True, type=OUTPUT_DIR, help="directory for serving.json (made if missing)"
    )
    p.add_argument("--presets", nargs="+", default=["qwen3-8b", "qwen3-4b"])
    p.add_argument("--mode", default="eager", help="model producer mode: eager, compile, graphs")
    p.add_argument("--lengths", nargs="+", type=int, default=list(LENGTHS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-stress", action="store_true")
    args = p.parse_args(list(argv) if argv is not None else None)
    if not torch.cuda.is_available():
        return no_cuda("serving")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "mode": args.mode,
        "presets": {},
    }
    for preset in args.presets:
        print(f"{preset} ({args.mode})", flush=True)
        producer = ModelProducer(preset, "cuda", mode=args.mode)
        entry = {"latency": latency(producer, args.lengths, args.repeats)}
        if not args.no_stress:
            entry["stress"] = stress(producer)
        result["presets"][preset] = entry
        del producer
        torch.cuda.empty_cache()
        (out / "serving.json").write_text(json.dumps(result, indent=2))
    (out / "serving.md").write_text(report_md(result))
    print(report_md(result))
    return 0


def report_md(result: dict[str, Any]) -> str:
    """Tables: latency per path with speed-up over recompute, and the cost policy's time as
    a ratio to the better forced choice (<= 1.05 is the goal); the stress run likewise."""
    lines = [
        f"# Restore vs recompute through the controller: {result['device']}",
        "",
        f"torch {result['torch']}, model producer mode {result['mode']}, median of repeats.",
        "",
    ]
    for preset, entry in result["presets"].items():
        lines += [
            f"## {preset}: latency (prefix + one new page, admission to prefill done)",
            "",
            "| tokens | recompute ms | L2 ms (speed-up) | L3 ms (speed-up) | cost ms "
            "| cost / best forced |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        by: dict[int, dict[str, float]] = {}
        for row in entry["latency"]:
            by.setdefault(row["tokens"], {})[row["path"]] = row["median_ms"]
        for n, t in sorted(by.items()):
            best = min(t["recompute"], t["L2"], t["L3"])
            lines.append(
                f"| {n} | {t['recompute']:.2f} | {t['L2']:.2f} ({t['recompute'] / t['L2']:.2f}x) | "
                f"{t['L3']:.2f} ({t['recompute'] / t['L3']:.2f}x) | {t['cost']:.2f} | "
                f"{t['cost'] / best:.3f} |"
            )
        if "stress" in entry:
            lines += [
                "",
                f"## {preset}: stress (8 prefixes x 350 tokens, 80 requests, batch 1)",
                "",
                "| path | req/s | vs recompute | hits (L2 / L3 tokens) |",
                "| --- | --- | --- | --- |",
            ]
            rates = {r["path"]: r["requests_per_s"] for r in entry["stress"]}
            for r in entry["stress"]:
                lines.append(
                    f"| {r['path']} | {r['requests_per_s']:.2f} | "
                    f"{r['requests_per_s'] / rates['recompute']:.2f}x | "
                    f"{r['hit_tokens']['L2']} / {r['hit_tokens']['L3']} |"
                )
            best = max(rates["recompute"], rates["L2"], rates["L3"])
            lines.append(f"\ncost / best forced (throughput): {rates['cost'] / best:.3f}")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
