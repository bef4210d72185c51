"""Do two streams of torch's pool overlap, or share one of CUDA's hardware queues? On a GPU.

    PYTHONPATH=. python3 benchmarks/stream_queues.py [--mib 512] [--distances 16] [--out F.json]
    CUDA_DEVICE_MAX_CONNECTIONS=32 PYTHONPATH=. python3 benchmarks/stream_queues.py ...

Why: CUDA multiplexes a context's streams onto `CUDA_DEVICE_MAX_CONNECTIONS` hardware work
queues (8 unless set before the context is made), and two streams on one queue run in the
order their work was submitted. A layer-wise load-back overlaps only while its DMA stream and
the prefill's streams sit on different queues; torch hands its pool of 32 streams out round
robin, so which streams pair up depends on how many a process asked for before. In one serving
bench run (benchmarks/results/2026-12-06-session19-h100, call 2) the 3,500-token layer-wise
L2 restore took 32.98 ms, the whole H2D before the prefill, where a run of that row alone took
22.7 ms on every tree tried: the bench had made many movers (three streams each) first. This
probe tests the queue-sharing explanation directly. Run in session 20 (one H100): with 8 and
with 32 queues, distances 2-16 overlapped, and the serving run lost the layer-wise overlap
with 32 queues as with 8: the cause was two owners of one pool stream (the H2D's was the
forward's), not a queue (hicache/dataplane/ownstreams.py).

For each distance d: stream A (the pool's next) copies `--mib` MiB from pinned memory, then
stream B, d pool streams after A, runs one small kernel, nothing ordering them. B's kernel
ending before A's copy means separate queues ("overlap"); ending after it means B waited
behind A ("serial"). Times are from one event recorded before both, in ms.
"""

from __future__ import annotations

import argparse
import json
import os

import torch

POOL = 32  # torch's streams per priority per device, handed out round robin


def probe(mib: int, distances: int) -> list[dict[str, object]]:
    """One row per distance 1..`distances` (module docstring)."""
    dev = torch.device("cuda")
    host = torch.empty(mib << 20, dtype=torch.uint8).pin_memory()
    dst = torch.empty(mib << 20, dtype=torch.uint8, device=dev)
    x = torch.ones(1 << 20, device=dev)
    torch.cuda.synchronize()
    # Round robin from here: streams[k] is k pool streams after streams[0].
    streams = [torch.cuda.Stream(dev) for _ in range(distances + 1)]  # type: ignore[no-untyped-call]
    main = torch.cuda.current_stream(dev)
    rows = []
    for d in range(1, distances + 1):
        a, b = streams[0], streams[d]
        t0 = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        ea = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        eb = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        t0.record(main)
        a.wait_stream(main)
        b.wait_stream(main)
        with torch.cuda.stream(a):
            dst.copy_(host, non_blocking=True)
            ea.record(a)
        with torch.cuda.stream(b):
            x.mul_(1.0001)
            eb.record(b)
        torch.cuda.synchronize()
        copy_ms, kernel_ms = t0.elapsed_time(ea), t0.elapsed_time(eb)
        rows.append(
            {
                "distance": d,
                "copy_end_ms": round(copy_ms, 3),
                "kernel_end_ms": round(kernel_ms, 3),
                "serial": kernel_ms > 0.8 * copy_ms,
            }
        )
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--mib", type=int, default=512, help="stream A's copy, MiB (default 512)")
    p.add_argument("--distances", type=int, default=16, help="pool distances 1..N (default 16)")
    p.add_argument("--out", help="also write the rows as JSON")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("stream_queues: no CUDA device; nothing measured")
        return 0
    if not 1 <= args.distances < POOL:
        p.error(f"--distances: 1 to {POOL - 1}")
    queues = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "unset (8)")
    rows = probe(args.mib, args.distances)
    print(f"{torch.cuda.get_device_name()}; CUDA_DEVICE_MAX_CONNECTIONS {queues}")
    for r in rows:
        verdict = "serial (one queue)" if r["serial"] else "overlap"
        print(
            f"distance {r['distance']:>2}: copy ends {r['copy_end_ms']:.2f} ms, "
            f"kernel ends {r['kernel_end_ms']:.2f} ms  {verdict}"
        )
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"queues": queues, "mib": args.mib, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
