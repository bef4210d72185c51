"""Where an L2 restore's latency goes, plain and layer-wise: one restore's host and device ops.

    PYTHONPATH=. python3 benchmarks/layerwise_timeline.py [--preset qwen3-8b] [--mode graphs]
        [--tokens 3500] [--repeats 3] [--out FILE.json]

`hicache bench serving` puts the layer-wise L2 restore over its floor, max(H2D, tail
prefill); this probe says what the rest is. It runs the bench's latency rounds (a cached
prefix of N tokens + one new page, the prefix evicted from L1) through a controller with
the model producer, for the `L2` and `L2-layerwise` paths, records `--repeats` timed rounds
with torch.profiler, and prints for the median round (by its wall time), from admission:

    host     when the first H2D copy was issued, when the forward was launched (graph launch
             or first kernel launch), when the round ended
    h2d      the H2D copies on the device: first start, last end, busy time; per layer (the
             layer-wise path: the copies in issue order, 2 x runs a layer) when it landed
    compute  the prefill's kernels: first start, last end, busy time (the union of kernel
             intervals), and the idle time inside the span (waits for layers, launch gaps)
    gather   layer-wise in graphs mode: per layer, when the layer's first prefix gather
             (an index_select kernel) started, against when the layer landed (slack: a
             positive gap is the compute arriving after the copy; a ~0 gap, the compute
             waiting for it)

A diagnostic, not a benchmark: the profiler adds its own overhead on the host side (so the
host figures are upper bounds), not to the device durations it reports.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from hicache.bench.serving import (
    LAYERWISE,
    POLICY,
    WARMUP_ROUNDS,
    Subject,
    TimedProducer,
    _controller,
    _serve,
)
from hicache.producers.model import ModelProducer

DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")
HOST = ("cuda_runtime", "cuda_driver")
ROUND = "restore"  # the profiler label around one timed round
PHASES = ("admit", "ready", "prefill", "sync")  # `_serve`'s steps, labelled in the trace
BIG_BYTES = 64 << 10  # an H2D copy of the prefix, not an upload of ids or indices
GAP_US = 30.0  # idle time between kernels worth listing


def _ops(trace: Path) -> dict[str, Any]:
    """The round's label, its device ops and its host CUDA calls, times in us from the label."""
    events = json.loads(trace.read_text())["traceEvents"]
    label = next(e for e in events if e.get("name") == ROUND and "dur" in e)
    t0 = float(label["ts"])

    def rel(e: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": str(e["name"]),
            "cat": e["cat"],
            "stream": e.get("args", {}).get("stream"),
            "bytes": e.get("args", {}).get("bytes"),
            "start": float(e["ts"]) - t0,
            "end": float(e["ts"]) + float(e.get("dur", 0.0)) - t0,
        }

    device = sorted((rel(e) for e in events if e.get("cat") in DEVICE and "dur" in e), key=_start)
    host = sorted((rel(e) for e in events if e.get("cat") in HOST), key=_start)
    phases = {
        str(e["name"]): rel(e)
        for e in events
        if e.get("name") in PHASES and e.get("cat") == "user_annotation" and "dur" in e
    }
    return {"wall": float(label["dur"]), "device": device, "host": host, "phases": phases}


def _start(op: dict[str, Any]) -> float:
    return float(op["start"])


def _busy(ops: list[dict[str, Any]]) -> float:
    """The union of the ops' intervals, us."""
    busy, reach = 0.0, float("-inf")
    for op in sorted(ops, key=_start):
        lo, hi = max(op["start"], reach), op["end"]
        if hi > lo:
            busy += hi - lo
        reach = max(reach, hi)
    return busy


def _is_h2d(op: dict[str, Any]) -> bool:
    return op["cat"] == "gpu_memcpy" and "HtoD" in op["name"]


def _big(op: dict[str, Any]) -> bool:
    """A copy of prefix bytes (its size where the trace has one, else its duration)."""
    size = op["bytes"]
    return bool(size >= BIG_BYTES) if size is not None else op["end"] - op["start"] > 5.0


def summarize(r: dict[str, Any], layers: int) -> dict[str, Any]:
    """The round's figures (module docstring), us from admission."""
    h2d = [op for op in r["device"] if _is_h2d(op)]
    big = [op for op in h2d if _big(op)] or h2d  # not the uploads of ids or page indices
    compute = [op for op in r["device"] if op["cat"] == "kernel"]
    issues = [op for op in r["host"] if "emcpy" in op["name"]]
    launches = [op for op in r["host"] if "GraphLaunch" in op["name"]] or [
        op for op in r["host"] if "LaunchKernel" in op["name"]
    ]
    out: dict[str, Any] = {"wall_us": r["wall"]}
    if issues:
        out["host_first_copy_issue_us"] = issues[0]["start"]
    if launches:
        out["host_forward_launch_us"] = launches[0]["start"]
    if big:
        out["h2d"] = {
            "ops": len(big),
            "first_start_us": big[0]["start"],
            "last_end_us": max(op["end"] for op in big),
            "busy_us": _busy(big),
        }
    # The prefill: kernels from the first one after the H2D began to the end.
    after = [op for op in compute if not big or op["start"] >= big[0]["start"]]
    if after:
        first, last = after[0]["start"], max(op["end"] for op in after)
        busy = _busy(after)
        out["compute"] = {
            "kernels": len(after),
            "first_start_us": first,
            "last_end_us": last,
            "busy_us": busy,
            "idle_in_span_us": last - first - busy,
        }
    out["phases_us"] = {k: (v["start"], v["end"]) for k, v in r["phases"].items()}
    calls: dict[str, list[float]] = {}
    for op in r["host"]:
        calls.setdefault(op["name"], []).append(op["end"] - op["start"])
    top = sorted(calls.items(), key=lambda kv: -sum(kv[1]))[:8]
    out["host_calls"] = [(name, len(d), sum(d)) for name, d in top]
    names: dict[str, int] = {}
    for op in after:
        names[op["name"][:70]] = names.get(op["name"][:70], 0) + 1
    out["kernel_names"] = sorted(names.items(), key=lambda kv: -kv[1])[:12]
    gaps, reach, prev = [], float("-inf"), ""
    for op in after:
        if op["start"] - reach > GAP_US and prev:
            gaps.append((reach, op["start"] - reach, prev, op["name"][:50]))
        if op["end"] > reach:
            reach, prev = op["end"], op["name"][:50]
    out["gaps"] = sorted(gaps, key=lambda g: -g[1])[:12]
    if len(big) >= 2 * layers and len(big) % layers == 0:  # layer-wise: per-layer landings
        per = len(big) // layers
        landed = [max(op["end"] for op in big[i * per : (i + 1) * per]) for i in range(layers)]
        out["landed_us"] = landed
        gathers = [op for op in after if "ndexSelect" in op["name"]]
        if len(gathers) >= layers:
            step = len(gathers) // layers
            starts = [gathers[i * step]["start"] for i in range(layers)]
            out["gather_start_us"] = starts
            out["slack_us"] = [s - landed[i] for i, s in enumerate(starts)]
    return out


def run_path(subject: Subject, path: str, tokens: int, repeats: int) -> list[dict[str, Any]]:
    """`repeats` profiled rounds of `path` after the bench's warm-up rounds."""
    ps = subject.producer.geometry.page_size
    prefix_len = tokens // ps * ps
    size = 4 * (prefix_len // ps + 1) + 8
    timed = TimedProducer(subject.producer)
    sub = Subject(timed, subject.vocab, subject.device, subject.mode)
    ctl = _controller(sub, POLICY[path], size, size, size, layerwise=path in LAYERWISE)
    layers = subject.producer.geometry.layers
    rounds: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(WARMUP_ROUNDS + repeats):
                gen = torch.Generator().manual_seed(1000 * tokens + r)
                prefix = torch.randint(0, subject.vocab, (prefix_len,), generator=gen).tolist()
                _serve(ctl, 2 * r, prefix)
                ctl.drain()
                ctl.cp.evict("L1", 10**9)
                if r < WARMUP_ROUNDS:
                    _serve(ctl, 2 * r + 1, prefix + list(range(ps)))
                else:
                    acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
                    with profile(activities=acts) as prof, record_function(ROUND):
                        tokens_ = prefix + list(range(ps))
                        seconds, _ = _serve(ctl, 2 * r + 1, tokens_, record_function)
                    trace = Path(tmp) / f"{path}-{r}.json"
                    prof.export_chrome_trace(str(trace))
                    row = summarize(_ops(trace), layers)
                    row["serve_ms"], row["tail_ms"] = seconds * 1e3, timed.last_s * 1e3
                    rounds.append(row)
                ctl.drain()
    finally:
        ctl.close()
    return rounds


def _print(path: str, rounds: list[dict[str, Any]]) -> None:
    median = sorted(rounds, key=lambda x: x["wall_us"])[len(rounds) // 2]
    walls = ", ".join(f"{x['wall_us'] / 1e3:.2f}" for x in rounds)
    print(f"== {path}: wall ms {walls} (profiled); median round:")
    for key in ("host_first_copy_issue_us", "host_forward_launch_us"):
        if key in median:
            print(f"  {key:<28} {median[key] / 1e3:8.3f} ms")
    for part in ("h2d", "compute"):
        if part in median:
            fig = ", ".join(
                f"{k} {v / 1e3:.3f} ms" if k.endswith("_us") else f"{k} {v}"
                for k, v in median[part].items()
            )
            print(f"  {part:<8} {fig}")
    for name, (lo, hi) in median["phases_us"].items():
        print(f"  phase {name:<8} {lo / 1e3:8.3f} .. {hi / 1e3:8.3f} ms")
    for name, n, total in median["host_calls"]:
        print(f"  host call {name[:40]:<40} x{n:<5} {total / 1e3:8.3f} ms")
    for name, n in median["kernel_names"]:
        print(f"  kernel x{n:<5} {name}")
    for at, gap, before, after in median["gaps"]:
        print(f"  gap at {at / 1e3:7.3f} ms: {gap:7.1f} us after {before} before {after}")
    if "slack_us" in median:
        for i, (landed, slack) in enumerate(zip(median["landed_us"], median["slack_us"])):
            if i < 4 or i % 6 == 0 or i == len(median["slack_us"]) - 1:
                print(f"  layer {i:>2}: landed {landed / 1e3:7.3f} ms, gather {slack:+8.1f} us")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="qwen3-8b")
    p.add_argument("--mode", default="graphs")
    p.add_argument("--tokens", type=int, nargs="+", default=[3500])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--gate-layers", type=int, default=1, help="layers per in-graph wait")
    p.add_argument("--out")
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("layerwise_timeline.py needs a CUDA GPU")
    model = ModelProducer(a.preset, "cuda", mode=a.mode, gate_layers=a.gate_layers)
    subject = Subject(model, model.shape.vocab, str(model.device), a.mode)
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "preset": a.preset,
        "gate_layers": a.gate_layers,
    }
    for tokens in a.tokens:
        for path in ("L2", "L2-layerwise"):
            rounds = run_path(subject, path, tokens, a.repeats)
            out[f"{tokens} {path}"] = rounds
            print(f"-- {a.preset} {a.mode} {tokens} tokens")
            _print(path, rounds)
            serve = statistics.median(x["serve_ms"] for x in rounds)
            print(f"  serve (profiled) median {serve:.2f} ms")
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
