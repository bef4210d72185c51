"""Where a group transfer's device time goes: every kernel and copy of one transfer, in order.

    PYTHONPATH=. python3 benchmarks/group_timeline.py [--preset dsv4] [--tokens 350]
        [--mode per_pool] [--repeats 5] [--out FILE.json]

At 350 tokens of DeepSeek V4 (six pools, 27 MB) a group H2D's device time (its first to last
device operation) is 0.8-1.0 ms against 0.51 ms for one pinned copy of the same bytes. This
probe runs the multi-pool benchmark's requests (`hicache bench transfer --preset`) through a
GroupMover with its issue graphs on and off, records each transfer with torch.profiler, and
prints for the median transfer (by span) each device operation: its kind (kernel, memcpy),
name, stream, start after the first operation and duration, in microseconds; then the sums
per kind. A diagnostic, not a benchmark: the profiler adds its own overhead to the host side,
not to the device durations it reports.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from hicache.core.tiers import Direction
from hicache.dataplane.groupgeometry import GroupGeometry
from hicache.dataplane.grouppools import GroupDevicePool, GroupHostPool, group_digest
from hicache.dataplane.grouptransfer import GroupMover
from hicache.pools import presets

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def requests(
    geometry: GroupGeometry, tokens: int, caps: dict[str, int], rng: np.random.Generator
) -> dict[Direction, dict[str, tuple[object, object]]]:
    """The multi-pool benchmark's requests: L2 pages in one run, L1 pages drawn at random."""
    d2h: dict[str, tuple[object, object]] = {}
    h2d: dict[str, tuple[object, object]] = {}
    for src in geometry.sources:
        n = -(-tokens // geometry.group.pool(src).page_size)
        picked = rng.choice(caps[src], size=2 * n, replace=False).astype(np.int64)
        l2 = np.arange(n, dtype=np.int64)
        d2h[src], h2d[src] = (picked[:n], l2), (l2, picked[n:])
    return {Direction.D2H: d2h, Direction.H2D: h2d}


def device_ops(trace: Path) -> list[dict[str, Any]]:
    events = json.loads(trace.read_text())["traceEvents"]
    ops = [e for e in events if e.get("cat") in DEVICE_CATEGORIES and "dur" in e]
    return sorted(ops, key=lambda e: float(e["ts"]))


def timeline(mover: GroupMover, direction: Direction, request: Any, repeats: int) -> list[Any]:
    """Per transfer (repeats of them, after a warm-up that captures), its device ops."""
    issue = mover.d2h if direction is Direction.D2H else mover.h2d
    for _ in range(3):  # first sight, capture, replay
        issue(request).wait()
    per: list[list[dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                issue(request).wait()
                torch.cuda.synchronize()
            path = Path(tmp) / f"{i}.json"
            prof.export_chrome_trace(str(path))
            per.append(device_ops(path))
    return per


def summarize(ops: list[dict[str, Any]]) -> dict[str, Any]:
    t0 = float(ops[0]["ts"])
    rows = [
        {
            "cat": e["cat"],
            "name": str(e["name"])[:60],
            "stream": e.get("args", {}).get("stream"),
            "start_us": float(e["ts"]) - t0,
            "dur_us": float(e["dur"]),
        }
        for e in ops
    ]
    span = max(r["start_us"] + r["dur_us"] for r in rows)
    sums: dict[str, float] = {}
    for r in rows:
        sums[r["cat"]] = sums.get(r["cat"], 0.0) + r["dur_us"]
    return {"span_us": span, "sums_us": sums, "ops": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="dsv4")
    p.add_argument("--tokens", type=int, default=350)
    p.add_argument("--mode", default="per_pool")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out")
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("group_timeline.py needs a CUDA GPU")
    geometry = GroupGeometry.from_group(presets.group(a.preset))
    most = {s: -(-a.tokens // geometry.group.pool(s).page_size) for s in geometry.sources}
    caps = {s: max(16, 4 * n) for s, n in most.items()}
    l1 = GroupDevicePool(geometry, caps, "cuda")
    l1.tensor.random_(0, 256)
    l2 = GroupHostPool(geometry, {s: 2 * n + 8 for s, n in most.items()}, pin=True)
    reqs = requests(geometry, a.tokens, caps, np.random.default_rng(0))
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(), "preset": a.preset}
    for graphs in (False, True):
        mover = GroupMover(l1, l2, a.mode, issue_graphs=graphs)
        for direction, request in reqs.items():
            per = [summarize(ops) for ops in timeline(mover, direction, request, a.repeats)]
            pages = {
                s: np.asarray(request[s][0 if direction is Direction.D2H else 1]) for s in request
            }
            other = {
                s: np.asarray(request[s][1 if direction is Direction.D2H else 0]) for s in request
            }
            assert group_digest(l1, pages) == group_digest(l2, other), "bytes differ"
            median = sorted(per, key=lambda t: t["span_us"])[len(per) // 2]
            key = f"{direction.value} graphs={'on' if graphs else 'off'}"
            out[key] = {"spans_us": [t["span_us"] for t in per], "median": median}
            print(
                f"== {a.preset} {a.tokens} tok {key}: span median "
                f"{statistics.median(t['span_us'] for t in per):.1f} us; sums {median['sums_us']}"
            )
            for r in median["ops"]:
                at, dur = f"{r['start_us']:8.1f}", f"+{r['dur_us']:7.1f}"
                print(f"  {at} {dur}  s{r['stream']}  {r['cat']:<10} {r['name']}")
        mover.close()
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
