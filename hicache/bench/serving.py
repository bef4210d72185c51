"""Restore vs recompute through the whole controller, with the model producer on a GPU.

    hicache bench serving --out DIR [--presets qwen3-8b qwen3-4b] [--mode eager graphs compile]
    hicache bench serving --out DIR --paced FIXED_MS US_PER_TOKEN [--paced-cached US]
                          [--presets tiny] [--device cpu]

Each (preset, producer mode) -- by default both `eager` (launch-bound: a prefill's fixed
cost dominates) and `graphs` (CUDA graphs: little fixed cost) -- runs two experiments:
  latency   a prompt = a cached prefix of N tokens + one new page; time from admission until
            its prefill is done (`torch.cuda.synchronize`), with the prefix forced to come
            from: nowhere (recompute, policy `never`), L2 (L1 copy evicted, policy `always`),
            L3 (L1 and L2 copies evicted, `always`), and as the `cost` policy decides (L1 copy
            evicted: it chooses among recompute, L2 and L3); and L2 and L3 again with
            `layerwise` (the H2D lands layer by layer under the prefill: spec/restore.md,
            "Layer-wise load-back"), whose table puts each L2 path over its floor,
            max(H2D, tail prefill), both timed on the L2 path. Each path first runs
            `WARMUP_ROUNDS` untimed rounds: the caches, and the cost model's first guess and
            its explorations (spec/policies.md, R34), are a one-time cost of a new controller,
            not the per-request latency of the path it settles on.
  stress    8 prefixes x 350 tokens, 80 requests, batch 1, through the serving loop; L1 holds
            2 prefixes, so the rest come from L2 (or, with L2 holding 2 as well, from L3).
            Requests per second for every path, the median of `--stress-rounds` rounds (each
            round runs every path once, on a new controller, the order rotated a path per
            round): one 3-5 s run of an eager producer varied by up to 35% from the next (the
            cost path's 79 recomputes at 0.65-0.93 of the forced recompute run's rate).
One table per experiment, a row per (preset, mode). Without CUDA it measures nothing and says
so -- unless `--paced`: the synthetic producer (`PacedProducer`) on `--device` (default cpu)
with a prefill of FIXED_MS + US_PER_TOKEN x tokens, presets naming KV geometries (default
`tiny`), which shows the cost policy against the forced paths on any machine (a launch-bound
pace: `--paced 19 1`; a compute-bound one: `--paced 1 100`). `--paced-cached US` adds US
microseconds per cached prefix token to a tail prefill (one on a cached prefix), as the
eager model producer pays: `--paced 12.2 50 --paced-cached 67` is Qwen3-8B eager on an H100,
where a tail costs more than a full prefill.
Invariant checks are off here (they are the tests' job; here they would be timed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hicache.app.outputs import OUTPUT_DIR
from hicache.app.serving import ServingLoop
from hicache.app.workload import repeated_prefix_workload
from hicache.bench import BenchParser, no_cuda
from hicache.bench.gcpauses import GcPauses, frozen
from hicache.controller.config import CacheConfig
from hicache.controller.controller import CacheController
from hicache.dataplane.geometry import preset as geometry_preset
from hicache.dataplane.taskgroup import MAX_IO_THREADS
from hicache.errors import ConfigError
from hicache.policy import Decision
from hicache.policy.policies import EXPLORE_SAMPLES
from hicache.producers import KVProducer, PacedProducer, SyntheticProducer
from hicache.producers.model import MODES, ModelProducer

LENGTHS = (350, 1000, 2000, 3500)
IO_THREADS = CacheConfig.io_threads  # the configuration's default: what a user gets
PATHS = ("recompute", "L2", "L3", "cost", "L2-layerwise", "L3-layerwise")
POLICY = {"recompute": "never", "L2": "always", "L3": "always", "cost": "cost"}
POLICY.update({"L2-layerwise": "always", "L3-layerwise": "always"})
LAYERWISE = frozenset({"L2-layerwise", "L3-layerwise"})
FROM_L3 = frozenset({"L3", "L3-layerwise"})  # the prefix is evicted from L2 too
"""The paths whose controller lands its H2D layer by layer and prefills on it (`layerwise`,
spec/restore.md, "Layer-wise load-back"); the rest wait for the whole H2D."""
FORCED = ("recompute", "L2", "L3")  # what `cost` chooses among
STRESS_ROUNDS = 3  # stress runs per path: the median is reported (module docstring)
DEFAULT_MODES = ("eager", "graphs")
WARMUP_ROUNDS = 1 + EXPLORE_SAMPLES
"""Untimed latency rounds per path: the first `cost` decision is a guess (no tail prefill has
been timed: the recompute line, which has seen one prefill size, prices it), its first H2D a
warm-up the model does not learn from, and the next EXPLORE_SAMPLES restores may be
explorations; every path gets the same rounds."""
PACED_VOCAB = 50_000  # token ids of the paced (synthetic) producer: any ints will do


@dataclass(frozen=True)
class Subject:
    """What one row measures: a producer, the token ids it accepts, its device, and the mode
    named in the tables (a model producer's mode, or the paced producer's pace)."""

    producer: KVProducer
    vocab: int
    device: str
    mode: str


class TimedProducer:
    """A producer's every `produce` and `compute_kv`, timed: `last_s` is the seconds the
    latest one took (the bench's tail-prefill time, next to the H2D's) -- what it returned,
    or for a `compute_kv` not waited for (`wait=False`, the controller's) on CUDA, the device
    time between events around it, read once the caller has synchronised."""

    def __init__(self, inner: KVProducer) -> None:
        self.inner = inner
        self.geometry = inner.geometry
        self._last_s = 0.0
        self._queued: tuple[torch.cuda.Event, torch.cuda.Event] | None = None

    @property
    def last_s(self) -> float:
        if self._queued is not None:
            began, ended = self._queued
            ended.synchronize()
            self._last_s, self._queued = began.elapsed_time(ended) / 1e3, None
        return self._last_s

    def produce(self, *args: Any) -> float:
        self._last_s, self._queued = self.inner.produce(*args), None
        return self._last_s

    def compute_kv(self, *args: Any, wait: bool = True) -> Any:
        device = args[3].device  # l1
        queued = not wait and device.type == "cuda"
        began = ended = None
        if queued:
            began = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            ended = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            began.record(torch.cuda.current_stream(device))
        kv, seconds = self.inner.compute_kv(*args, wait=wait)  # type: ignore[attr-defined]
        self._last_s, self._queued = seconds, None
        if began is not None and ended is not None:
            ended.record(torch.cuda.current_stream(device))
            self._queued = (began, ended)
        return kv, seconds

    def expected(self, tokens: Sequence[int], start: int, end: int) -> torch.Tensor | None:
        return self.inner.expected(tokens, start, end)


def _controller(
    subject: Subject,
    policy: str,
    l1: int,
    l2: int,
    l3: int,
    *,
    layerwise: bool = False,
    io_threads: int = IO_THREADS,
) -> CacheController:
    cfg = CacheConfig(
        geometry=subject.producer.geometry,
        l1_pages=l1,
        l2_pages=l2,
        l3_slots=l3,
        device=subject.device,
        policy=policy,
        check_mode="off",
        verify=False,
        layerwise=layerwise,
        io_threads=io_threads,
    )
    return CacheController(cfg, subject.producer)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _unlabelled(phase: str) -> contextlib.AbstractContextManager[object]:
    return contextlib.nullcontext()


def _serve(
    ctl: CacheController,
    rid: int,
    tokens: Sequence[int],
    phase: Callable[[str], contextlib.AbstractContextManager[object]] = _unlabelled,
) -> tuple[float, Decision]:
    """Seconds from admission to prefill done, and the policy's decision for it. `phase`
    wraps each step (admit, ready, prefill, sync): a profiler's labels, say."""
    _sync()
    t0 = time.perf_counter()
    with phase("admit"):
        mat = ctl.admit(rid, tokens)
    with phase("ready"):
        while not ctl.ready(rid):
            ctl.wait(rid)
            ctl.tick()
    with phase("prefill"):
        ctl.prefill(rid)
    with phase("sync"):
        _sync()
    elapsed = time.perf_counter() - t0
    ctl.finish(rid)
    return elapsed, mat.decision


def _producer_streams(subject: Subject) -> dict[str, int] | None:
    """The model producer's stream ids (`ModelProducer.stream_ids`), None for another
    producer: with the movers' (their `status`), which streams a row's restore used."""
    ids = getattr(subject.producer, "stream_ids", None)
    return ids() if callable(ids) else None


def latency(
    subject: Subject,
    lengths: Sequence[int],
    repeats: int,
    warmup: int = WARMUP_ROUNDS,
    io_threads: int = IO_THREADS,
) -> list[dict[str, Any]]:
    ps = subject.producer.geometry.page_size
    rows = []
    for n in lengths:
        prefix_len = n // ps * ps
        pages = prefix_len // ps + 1
        for path in PATHS:
            size = 4 * pages + 8
            timed = TimedProducer(subject.producer)
            ctl = _controller(
                Subject(timed, subject.vocab, subject.device, subject.mode),
                POLICY[path],
                size,
                size,
                size,
                layerwise=path in LAYERWISE,
                io_threads=io_threads,
            )
            samples = []
            h2d_ms: list[float] = []  # per timed round: the H2D's device time (service)
            tail_ms: list[float] = []  # ... and its prefill's (produce or compute_kv)
            gc_ms: list[float] = []  # ... and the garbage collector's pauses inside it
            predicted: list[dict[str, Any]] = []
            warmup_choices: list[str] = []
            try:
                for r in range(warmup + repeats):  # r < warmup: caches, guess and explorations
                    gen = torch.Generator().manual_seed(1000 * n + r)
                    prefix = torch.randint(0, subject.vocab, (prefix_len,), generator=gen).tolist()
                    _serve(ctl, 2 * r, prefix)  # puts the prefix in L1, backs it up to L2 and L3
                    ctl.drain()
                    ctl.cp.evict("L1", 10**9)  # every path: the prefix is not in L1
                    if path in FROM_L3:
                        ctl.cp.evict("L2", 10**9)
                    h2d = ctl.metrics.directions["H2D"]
                    before = h2d.service_s
                    with GcPauses() as pauses:
                        s, d = _serve(ctl, 2 * r + 1, prefix + list(range(ps)))
                    tail = timed.last_s
                    ctl.drain()
                    if r < warmup:
                        warmup_choices.append(d.choice)
                    else:
                        samples.append(s)
                        h2d_ms.append((h2d.service_s - before) * 1e3)
                        tail_ms.append(tail * 1e3)
                        gc_ms.append(pauses.seconds * 1e3)
                        predicted.append(
                            {
                                "choice": d.choice,
                                "predicted_ms": {k: v * 1e3 for k, v in d.predicted_s.items()},
                            }
                        )
                choice = dict(ctl.metrics.decisions)
                model_state = ctl.model.state()
                engine = ctl.status()["engine"]
                movers = engine.get("layerwise") if isinstance(engine, dict) else None
                log = ctl.decisions.summary()
            finally:
                ctl.close()
            rows.append(
                {
                    "tokens": n,
                    "prefix_tokens": prefix_len,
                    "path": path,
                    "warmup_choices": warmup_choices,
                    "median_ms": statistics.median(samples) * 1e3,
                    "samples_ms": [x * 1e3 for x in samples],
                    "h2d_ms": statistics.median(h2d_ms),
                    "tail_ms": statistics.median(tail_ms),
                    "gc_ms": gc_ms,  # per timed sample: the collector's pauses inside it
                    "layerwise_prefills": ctl.metrics.layerwise_prefills,
                    "layerwise_mover": movers,  # its ops, its streams, how many went staged
                    "producer_streams": _producer_streams(subject),
                    "decisions": choice,
                    "predicted": predicted,
                    "cost_model": model_state,
                    "decision_log": log,
                }
            )
            print(
                f"  {n:>5} tokens  {path:<9} {rows[-1]['median_ms']:8.2f} ms  decisions "
                f"{_counts(choice)}  gc {sum(gc_ms):.1f} ms in {len(gc_ms)} samples",
                flush=True,
            )
    return rows


def stress(
    subject: Subject,
    n_prefixes: int = 8,
    prefix_len: int = 350,
    n_requests: int = 80,
    io_threads: int = IO_THREADS,
    rounds: int = STRESS_ROUNDS,
) -> list[dict[str, Any]]:
    """One row per path (PATHS): the row of its median round (the upper one of an even
    count), with every round's requests per second (`rounds_requests_per_s`)."""
    if rounds < 1:
        raise ConfigError("rounds", f"stress rounds must be >= 1, got {rounds}")
    ps = subject.producer.geometry.page_size
    vocab = subject.vocab
    per = -(-prefix_len // ps) + 1
    # Warm-up, untimed: the producer compiles or captures once per (start, end) shape, and the
    # first path to need the restore's tail shape would otherwise pay for it in its wall time.
    warm = _controller(
        subject,
        "always",
        2 * per + 2,
        n_prefixes * per * 2,
        n_prefixes * per * 2,
        io_threads=io_threads,
    )
    try:
        ServingLoop(warm, batch_size=1).run(
            repeated_prefix_workload(n_prefixes, prefix_len, 3 * n_prefixes, seed=7, vocab=vocab)
        )
    finally:
        warm.close()
    runs: dict[str, list[dict[str, Any]]] = {path: [] for path in PATHS}
    for r in range(rounds):
        turn = r % len(PATHS)  # rotated: no path always runs first after the warm-up
        for path in PATHS[turn:] + PATHS[:turn]:
            runs[path].append(
                _stress_run(subject, path, n_prefixes, prefix_len, n_requests, per, io_threads)
            )
            last = runs[path][-1]
            print(
                f"  stress {path:<12} round {r + 1}/{rounds} "
                f"{last['requests_per_s']:7.2f} req/s  hit tokens "
                f"{_counts(last['hit_tokens'])}  gc {last.get('gc_ms', 0.0):.1f} ms",
                flush=True,
            )
    rows = []
    for path in PATHS:
        rates = [row["requests_per_s"] for row in runs[path]]
        median = sorted(runs[path], key=lambda row: float(row["requests_per_s"]))[rounds // 2]
        rows.append({**median, "rounds_requests_per_s": rates})
    return rows


def _stress_run(
    subject: Subject,
    path: str,
    n_prefixes: int,
    prefix_len: int,
    n_requests: int,
    per: int,
    io_threads: int,
) -> dict[str, Any]:
    """One stress run of `path` on a new controller: its row."""
    l2 = 2 * per + 2 if path in FROM_L3 else n_prefixes * per * 2
    ctl = _controller(
        subject,
        POLICY[path],
        2 * per + 2,
        l2,
        n_prefixes * per * 2,
        layerwise=path in LAYERWISE,
        io_threads=io_threads,
    )
    try:
        work = repeated_prefix_workload(
            n_prefixes, prefix_len, n_requests, seed=7, vocab=subject.vocab
        )
        with GcPauses() as pauses:
            report = ServingLoop(ctl, batch_size=1).run(work)
            _sync()
        return {
            **pauses.record(),
            "path": path,
            "requests": report.requests,
            "wall_s": report.wall_s,
            "requests_per_s": report.requests_per_s,
            "hit_tokens": dict(ctl.metrics.hit_tokens),
            "recomputed_tokens": ctl.metrics.recomputed_tokens,
            "decisions": dict(ctl.metrics.decisions),
            "cost_model": ctl.model.state(),
            "decision_log": ctl.decisions.summary(),
            # The cost path's decisions in order: when its lines crossed, and why.
            **({"decisions_recent": ctl.decisions.recent()} if path == "cost" else {}),
        }
    finally:
        ctl.close()


def _counts(counts: dict[str, int]) -> str:
    """`{"L2": 3, "recompute": 1}` as `L2 3, recompute 1` (progress lines, not dicts)."""
    return ", ".join(f"{k} {v:,}" for k, v in counts.items()) or "none"


def _paced(text: str) -> float:
    """argparse `type=` of one `--paced` number: finite and >= 0."""
    value = float(text)
    if not (value >= 0 and value != float("inf")):
        raise ValueError(text)
    return value


def _subjects(args: argparse.Namespace) -> Iterator[tuple[str, Subject]]:
    """Yield one Subject per (preset, mode), building each producer only when its turn comes
    (a model producer holds its weights on the GPU)."""
    if args.paced is not None:
        fixed_ms, us_per_token = args.paced
        us_cached = args.paced_cached
        for preset in args.presets or ["tiny"]:
            geometry = geometry_preset(preset)
            inner = SyntheticProducer(geometry, device=args.device)
            producer = PacedProducer(
                inner, fixed_ms * 1e-3, us_per_token * 1e-6, per_cached_token_s=us_cached * 1e-6
            )
            mode = f"paced {fixed_ms:g} ms + {us_per_token:g} us/token"
            if us_cached:
                mode += f" + {us_cached:g} us/cached token"
            yield preset, Subject(producer, PACED_VOCAB, str(inner.device), mode)
        return
    for preset in args.presets or ["qwen3-8b", "qwen3-4b"]:
        for mode in args.mode or DEFAULT_MODES:
            model = ModelProducer(preset, "cuda", mode=mode, gate_layers=args.gate_layers)
            yield preset, Subject(model, model.shape.vocab, str(model.device), mode)
            del model  # the caller has dropped its Subject: free the weights before the next
            torch.cuda.empty_cache()


def main(argv: Sequence[str] | None = None) -> int:
    p = BenchParser("serving", __doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument(
        "--out", required=True, type=OUTPUT_DIR, help="directory for serving.json (made if missing)"
    )
    p.add_argument(
        "--presets",
        nargs="+",
        default=None,
        help="model presets (default qwen3-8b qwen3-4b); with --paced, KV geometries (tiny)",
    )
    p.add_argument(
        "--mode",
        nargs="+",
        choices=MODES,
        default=None,
        help=f"model producer modes, one table row each (default: {' '.join(DEFAULT_MODES)})",
    )
    p.add_argument(
        "--paced",
        nargs=2,
        type=_paced,
        metavar=("FIXED_MS", "US_PER_TOKEN"),
        default=None,
        help="no model: the synthetic producer paced to FIXED_MS + US_PER_TOKEN x tokens per "
        "prefill, on --device (runs without CUDA)",
    )
    p.add_argument(
        "--paced-cached",
        type=_paced,
        metavar="US_PER_CACHED_TOKEN",
        default=0.0,
        help="with --paced: a tail prefill also pays this many us per cached prefix token "
        "(default 0)",
    )
    p.add_argument("--device", default="cpu", help="with --paced: the device (default cpu)")
    p.add_argument("--lengths", nargs="+", type=int, default=list(LENGTHS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--warmup",
        type=int,
        default=WARMUP_ROUNDS,
        help=f"untimed latency rounds per path (default {WARMUP_ROUNDS})",
    )
    p.add_argument("--no-stress", action="store_true")
    p.add_argument(
        "--stress-rounds",
        type=int,
        default=STRESS_ROUNDS,
        help=f"stress runs per path, the median reported (default {STRESS_ROUNDS})",
    )
    p.add_argument(
        "--io-threads",
        type=int,
        default=IO_THREADS,
        help=f"L3 I/O threads of every controller (default {IO_THREADS}, the configuration's "
        "default; an L3 restore's S2H runs on them)",
    )
    p.add_argument(
        "--gate-layers",
        type=int,
        default=1,
        help="graphs mode: layers per wait of a layer-wise prefill's graph (default 1: a wait "
        "per layer; K: a wait per K layers, for the group's last)",
    )
    p.add_argument(
        "--gc-freeze",
        action="store_true",
        help="freeze the garbage collector's heap once each producer is built (gc.freeze, as "
        "serving engines do after warm-up): collections then skip the model's objects",
    )
    args = p.parse_args(list(argv) if argv is not None else None)
    if args.gate_layers < 1:
        p.error(f"argument --gate-layers: >= 1, got {args.gate_layers}")
    if args.repeats < 1 or args.warmup < 0:
        p.error(f"--repeats must be >= 1 and --warmup >= 0, got {args.repeats}, {args.warmup}")
    if args.stress_rounds < 1:
        p.error(f"argument --stress-rounds: >= 1, got {args.stress_rounds}")
    if not 1 <= args.io_threads <= MAX_IO_THREADS:
        p.error(f"argument --io-threads: 1 to {MAX_IO_THREADS}, got {args.io_threads}")
    if args.paced is not None and args.mode is not None:
        p.error("--mode picks model producer modes; --paced runs no model")
    if args.paced is None and args.paced_cached:
        p.error("--paced-cached paces the synthetic producer: it needs --paced")
    if args.paced is None and not torch.cuda.is_available():
        return no_cuda("serving")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    on_cuda = torch.cuda.is_available() and (args.paced is None or args.device.startswith("cuda"))
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if on_cuda else f"{args.device} (no GPU)",
        "torch": torch.__version__,
        "warmup_rounds": args.warmup,
        "io_threads": args.io_threads,
        "stress_rounds": args.stress_rounds,
        "gate_layers": args.gate_layers,
        "gc_freeze": args.gc_freeze,
        "runs": [],
    }
    threads = torch.get_num_threads()
    if args.paced is not None and not on_cuda:
        # The pace is what is measured, not the CPU's kernels: one intra-op thread keeps a
        # synthetic prefill under a millisecond (torch's pool, on a busy 2-core machine, made
        # a 348-token one take 60 ms instead of 0.3, and the pace meaningless).
        torch.set_num_threads(1)
    try:
        for preset, subject in _subjects(args):
            print(f"{preset} ({subject.mode})", flush=True)
            run: dict[str, Any] = {"preset": preset, "mode": subject.mode}
            with frozen() if args.gc_freeze else contextlib.nullcontext():
                run["latency"] = latency(
                    subject, args.lengths, args.repeats, args.warmup, args.io_threads
                )
                if not args.no_stress:
                    run["stress"] = stress(
                        subject, io_threads=args.io_threads, rounds=args.stress_rounds
                    )
            result["runs"].append(run)
            (out / "serving.json").write_text(json.dumps(result, indent=2))
            del subject  # its model producer's weights go before the next one is built
    finally:
        torch.set_num_threads(threads)
    (out / "serving.md").write_text(report_md(result))
    print(report_md(result))
    return 0


def report_md(result: dict[str, Any]) -> str:
    """Two tables, a row per (preset, mode): latency per path with speed-up over recompute
    and the cost policy's time over the better forced choice's (goal <= 1.05); the stress
    run's requests/s likewise, cost over the best forced (goal >= 0.95), with cost's choices."""
    lines = [
        f"# Restore vs recompute through the controller: {result['device']}",
        "",
        f"torch {result['torch']}; latency: median of repeats after "
        f"{result.get('warmup_rounds', 1)} untimed rounds per path; "
        f"{result.get('io_threads', IO_THREADS)} L3 I/O threads"
        + (
            "; the collector's heap frozen once the producer was built."
            if result.get("gc_freeze")
            else "."
        ),
        "",
        "## Latency (prefix + one new page, admission to prefill done)",
        "",
        "| preset | mode | tokens | recompute ms | L2 ms (speed-up) | L3 ms (speed-up) "
        "| cost ms | cost / best forced | cost's choices |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    stress_rows: list[str] = []
    gc_lines: list[str] = []
    for run in result["runs"]:
        paused = [ms for row in run["latency"] for ms in row.get("gc_ms", [])]
        if paused:
            gc_lines.append(
                f"- {run['preset']} {run['mode']}: the garbage collector paused "
                f"{sum(ms > 0 for ms in paused)} of {len(paused)} timed samples, "
                f"{sum(paused):.1f} ms in all, {max(paused):.1f} ms at most"
            )
        by: dict[int, dict[str, float]] = {}
        chose: dict[int, str] = {}
        for row in run["latency"]:
            by.setdefault(row["tokens"], {})[row["path"]] = row["median_ms"]
            if row["path"] == "cost":
                chose[row["tokens"]] = ", ".join(p["choice"] for p in row.get("predicted", []))
        for n, t in sorted(by.items()):
            best = min(t[p] for p in FORCED)
            lines.append(
                f"| {run['preset']} | {run['mode']} | {n} | {t['recompute']:.2f} | "
                f"{t['L2']:.2f} ({t['recompute'] / t['L2']:.2f}x) | "
                f"{t['L3']:.2f} ({t['recompute'] / t['L3']:.2f}x) | {t['cost']:.2f} | "
                f"{t['cost'] / best:.3f} | {chose.get(n, '')} |"
            )
        if "stress" in run:
            rates = {r["path"]: r["requests_per_s"] for r in run["stress"]}
            cost = next(r for r in run["stress"] if r["path"] == "cost")
            best = max(rates[p] for p in FORCED)
            stress_rows.append(
                f"| {run['preset']} | {run['mode']} | {rates['recompute']:.2f} | "
                f"{rates['L2']:.2f} ({rates['L2'] / rates['recompute']:.2f}x) | "
                f"{rates['L3']:.2f} ({rates['L3'] / rates['recompute']:.2f}x) | "
                f"{rates['cost']:.2f} | {rates['cost'] / best:.3f} | "
                f"{_counts(cost['decisions'])} |"
            )
    if gc_lines:
        lines += ["", *gc_lines]
    lines += _layerwise_table(result)
    if stress_rows:
        lines += [
            "",
            "## Stress (8 prefixes x 350 tokens, 80 requests, batch 1; the median of "
            f"{result.get('stress_rounds', 1)} rounds)",
            "",
            "| preset | mode | recompute req/s | L2 req/s (vs recompute) | L3 req/s (vs recompute) "
            "| cost req/s | cost / best forced | cost's choices |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
            *stress_rows,
        ]
    lines.append("")
    return "\n".join(lines)


def _layerwise_table(result: dict[str, Any]) -> list[str]:
    """Layer-wise load-back against its floor: the L2 restore waiting for the whole H2D, then
    prefilling (`L2`), and landing layer by layer under its prefill (`L2-layerwise`), each over
    max(H2D, tail prefill) -- the H2D's device time and the tail prefill's, measured on the `L2`
    path in the same run (goal: layer-wise <= 1.15 x that floor). Empty for results without
    the layer-wise path."""
    rows = []
    for run in result["runs"]:
        by = {(r["tokens"], r["path"]): r for r in run["latency"]}
        for n in sorted({r["tokens"] for r in run["latency"]}):
            base, lw, rec = by.get((n, "L2")), by.get((n, "L2-layerwise")), by.get((n, "recompute"))
            if base is None or lw is None or rec is None or "h2d_ms" not in base:
                continue
            floor = max(base["h2d_ms"], base["tail_ms"])
            l3, l3lw = by.get((n, "L3")), by.get((n, "L3-layerwise"))
            l3_cell = (
                f"{l3['median_ms']:.2f} / {l3lw['median_ms']:.2f} "
                f"({rec['median_ms'] / l3lw['median_ms']:.2f}x)"
                if l3 is not None and l3lw is not None
                else "-"
            )
            rows.append(
                f"| {run['preset']} | {run['mode']} | {n} | {base['h2d_ms']:.2f} | "
                f"{base['tail_ms']:.2f} | {base['median_ms']:.2f} "
                f"({base['median_ms'] / floor:.2f}) | {lw['median_ms']:.2f} "
                f"({lw['median_ms'] / floor:.2f}) | "
                f"{rec['median_ms'] / lw['median_ms']:.2f}x | {l3_cell} | "
                f"{lw['layerwise_prefills']} |"
            )
    if not rows:
        return []
    return [
        "",
        "## Layer-wise load-back (L2 restore; ratio: over max(H2D, tail prefill))",
        "",
        "| preset | mode | tokens | H2D ms | tail prefill ms | L2 ms (/ floor) "
        "| L2 layer-wise ms (/ floor) | layer-wise vs recompute "
        "| L3 ms / L3 layer-wise ms (vs recompute) | layer-wise prefills |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *rows,
    ]


if __name__ == "__main__":
    raise SystemExit(main())
