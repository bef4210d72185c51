"""Multi-pool transfer benchmark: group D2H / H2D against the pinned-copy ceiling and MHA.

    hicache bench transfer --preset dsv4,mla --out DIR [--quick] [--repeats N] [--tokens 350,3500]

Per preset (spec/pools.toml), prefix (tokens; each allocating pool moves ceil(tokens /
page_size) pages: the whole prefix in every pool, as a write-through backup does), direction
and kernel mode (groupkernels.py: `table`, `per_pool`, `torch`; on CPU only torch, unless
TRITON_INTERPRET=1; `per_pool` on CUDA writes a D2H into L2 in place, one mapped copy per
pool; beside it the same kernels with every D2H gathered and DMA'd, "per_pool, DMA route",
and with each stage's DMAs one copy_ each instead of one batched driver call, "per_pool,
per-run DMAs"): the group transfer end
to end (issue -> DONE observed, random L1 pages, consecutive L2 pages per pool), median of
`repeats`, the paths taking turns run by run. Beside it, in the same run and on the same byte
count:

    of ceiling   one contiguous pinned copy of the same bytes, timed end to end the same way
    of MHA       the single-pool mover (DeviceHostMover) on Qwen3-8B pages moving the nearest
                 whole number of pages to the same bytes, compared in GB/s
    launches     kernel launches per transfer; dmas: host<->device copies per transfer
    issue ms     host time of the issuing call (median)
    bytes ok     every pool's pages digest equal in L1 and L2 after the checked warm-up run
                 (targets poisoned first), listed per pool

Writes DIR/multipool.json and DIR/multipool.md. On CPU the numbers mean nothing (--quick).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hicache.bench.timing import Poll, Settings, e2e_ms_interleaved, enqueued
from hicache.core.tiers import Direction
from hicache.dataplane.dma import DeviceHostMover
from hicache.dataplane.geometry import preset
from hicache.dataplane.groupgeometry import GroupGeometry
from hicache.dataplane.grouppools import GroupDevicePool, GroupHostPool, pool_digest
from hicache.dataplane.grouptransfer import GroupHandle, GroupMover
from hicache.dataplane.handles import TransferHandle
from hicache.dataplane.pools import DevicePool, HostPool
from hicache.kernels import KernelSet
from hicache.kernels.triton_rows import interpreter_enabled
from hicache.pools import presets

TOKENS = (350, 3500)
TOKENS_QUICK = (8, 24)
POISON = 0xA5
Row = dict[str, Any]


@dataclass
class _Case:
    """One timed path: `start` issues and returns its poll; issue times and handles kept."""

    issue: Callable[[], TransferHandle]
    issue_s: list[float]
    handles: list[TransferHandle]

    def start(self) -> Poll:
        t0 = time.perf_counter()
        handle = self.issue()
        self.issue_s.append(time.perf_counter() - t0)
        self.handles.append(handle)

        def complete() -> bool:
            status = handle.poll()
            if status.final and handle.error is not None:
                raise RuntimeError(f"{handle.direction} failed in the benchmark: {handle.error}")
            return status.final

        return complete


def _case(issue: Callable[[], TransferHandle]) -> _Case:
    return _Case(issue, [], [])


PER_RUN = "per_pool, per-run DMAs"
EAGER = "per_pool, eager"  # no issue graphs: one stage per pool, every call made each time
DMA_ROUTE = "per_pool, DMA route"  # D2Hs gathered and DMA'd, not mapped (grouptransfer.py)


class _GroupRig:
    def __init__(self, name: str, s: Settings, modes: tuple[str, ...]) -> None:
        self.geometry = GroupGeometry.from_group(presets.group(name))
        self.s = s
        most = {src: self.pages(max(s.tokens), src) for src in self.geometry.sources}
        self.l1 = GroupDevicePool(
            self.geometry, {k: max(16, 4 * n) for k, n in most.items()}, s.device
        )
        self.l1.tensor.random_(0, 256)
        self.l2 = GroupHostPool(
            self.geometry, {k: 2 * n + 8 for k, n in most.items()}, pin=s.device.type == "cuda"
        )
        self.movers = {mode: GroupMover(self.l1, self.l2, mode) for mode in modes}
        if "per_pool" in modes:  # the same kernels by DMA; one copy_ per DMA; no graphs
            l1, l2 = self.l1, self.l2
            self.movers[DMA_ROUTE] = GroupMover(l1, l2, "per_pool", mapped_d2h=False)
            self.movers[PER_RUN] = GroupMover(l1, l2, "per_pool", batched=False, mapped_d2h=False)
            self.movers[EAGER] = GroupMover(
                l1, l2, "per_pool", issue_graphs=False, mapped_d2h=False
            )
        self.rng = np.random.default_rng(0)

    def pages(self, tokens: int, source: str) -> int:
        return math.ceil(tokens / self.geometry.group.pool(source).page_size)

    def requests(self, tokens: int) -> dict[Direction, dict[str, tuple[object, object]]]:
        d2h: dict[str, tuple[object, object]] = {}
        h2d: dict[str, tuple[object, object]] = {}
        for src in self.geometry.sources:
            n, cap = self.pages(tokens, src), self.l1.capacity(src)
            picked = self.rng.choice(cap, size=2 * n, replace=False).astype(np.int64)
            l2 = np.arange(n, dtype=np.int64)
            d2h[src] = (picked[:n], l2)
            h2d[src] = (l2, picked[n:])
        return {Direction.D2H: d2h, Direction.H2D: h2d}

    def checked(
        self, mover: GroupMover, direction: Direction, request: dict[str, tuple[object, object]]
    ) -> dict[str, bool]:
        """Poison the targets, run once, compare every pool's digests: {pool: bytes ok}."""
        for p in self.geometry.pools:
            dst = np.asarray(request[p.source][1])  # D2H: L2 pages; H2D: L1 pages
            if direction is Direction.D2H:
                self.l2.bytes_view(p.name)[torch.from_numpy(dst)] = POISON
            else:
                idx = torch.from_numpy(dst).to(self.l1.device)
                self.l1.region(p.name)[:, idx] = POISON
        issue = mover.d2h if direction is Direction.D2H else mover.h2d
        handle = issue(request)
        handle.wait()
        ok = {}
        for p in self.geometry.pools:
            a, b = (np.asarray(x) for x in request[p.source])
            l1_ids, l2_ids = (a, b) if direction is Direction.D2H else (b, a)
            ok[p.name] = bool(
                np.array_equal(
                    pool_digest(self.l1, p.name, l1_ids), pool_digest(self.l2, p.name, l2_ids)
                )
            )
        return ok


class _MhaRig:
    """Single-pool MHA of the same bytes: DeviceHostMover with the default settings."""

    def __init__(self, s: Settings, most_bytes: int) -> None:
        g = s.geometry
        n = max(1, round(most_bytes / g.bytes_per_page))
        self.l1 = DevicePool(g, max(64, 4 * n), s.device)
        self.l2 = HostPool(g, 2 * n + 8, pin=s.device.type == "cuda")
        self.mover = DeviceHostMover(self.l1, self.l2, KernelSet.create(self.l1.tensor, "auto"))
        self.device_buffer = torch.empty(most_bytes, dtype=torch.uint8, device=s.device)
        self.rng = np.random.default_rng(1)

    def case(self, nbytes: int, direction: Direction) -> tuple[_Case, int]:
        bpp = self.l1.geometry.bytes_per_page
        n = max(1, round(nbytes / bpp))
        l1 = self.rng.choice(self.l1.capacity_pages, size=n, replace=False).astype(np.int64)
        l2 = np.arange(n, dtype=np.int64)
        if direction is Direction.D2H:
            return _case(lambda: self.mover.d2h(l1, l2)), n * bpp
        return _case(lambda: self.mover.h2d(l2, l1)), n * bpp


def _ceiling(
    l2: GroupHostPool, buffer: torch.Tensor, nbytes: int, direction: Direction, device: torch.device
) -> Callable[[], Poll]:
    host, dev = l2.tensor[:nbytes], buffer[:nbytes]
    source, target = (dev, host) if direction is Direction.D2H else (host, dev)

    def copy() -> None:
        target.copy_(source, non_blocking=True)

    return enqueued(copy, device)


def bench_preset(name: str, s: Settings, modes: tuple[str, ...], mha: _MhaRig) -> list[Row]:
    rig = _GroupRig(name, s, modes)
    rows: list[Row] = []
    for tokens in s.tokens:
        for direction, request in rig.requests(tokens).items():
            cases, correct = {}, {}
            for mode, mover in rig.movers.items():
                correct[mode] = rig.checked(mover, direction, request)
                issue = mover.d2h if direction is Direction.D2H else mover.h2d
                cases[mode] = _case(lambda issue=issue, request=request: issue(request))  # type: ignore[misc]
            nbytes = _nbytes(rig, request)
            mha_case, mha_bytes = mha.case(nbytes, direction)
            starts = {m: c.start for m, c in cases.items()}
            starts["mha"] = mha_case.start
            starts["ceiling"] = _ceiling(rig.l2, mha.device_buffer, nbytes, direction, s.device)
            ms = e2e_ms_interleaved(starts, s)
            mha_gbps = mha_bytes / ms["mha"] / 1e6
            for mode, case in cases.items():
                timed = case.handles[s.warmup :]
                last = timed[-1]
                assert isinstance(last, GroupHandle)
                gbps = nbytes / ms[mode] / 1e6
                rows.append(
                    {
                        "preset": name,
                        "tokens": tokens,
                        "direction": direction.value,
                        "mode": mode,
                        "bytes": nbytes,
                        "median_ms": ms[mode],
                        "GBps": gbps,
                        "ceiling_ms": ms["ceiling"],
                        "of_ceiling": ms["ceiling"] / ms[mode],
                        "mha_ms": ms["mha"],
                        "mha_bytes": mha_bytes,
                        "mha_GBps": mha_gbps,
                        "of_mha": gbps / mha_gbps,
                        "launches": last.launches,
                        "dmas": last.dmas,
                        "issue_ms": statistics.median(case.issue_s[s.warmup :]) * 1e3,
                        "device_ms": statistics.median(h.timings.service_s for h in timed) * 1e3,
                        "bytes_ok": correct[mode],
                        "kernels_reason": rig.movers[mode].kernels.reason,
                    }
                )
    return rows


def _nbytes(rig: _GroupRig, request: dict[str, tuple[object, object]]) -> int:
    return sum(len(np.asarray(request[p.source][0])) * p.bytes_per_page for p in rig.geometry.pools)


def _prefix_bytes(name: str, tokens: int) -> int:
    """Bytes a transfer of a `tokens` prefix moves in group `name` (every pool)."""
    g = GroupGeometry.from_group(presets.group(name))
    return sum(
        g.bytes_per_page(src) * math.ceil(tokens / g.group.pool(src).page_size) for src in g.sources
    )


def run(
    presets: list[str],
    out_dir: str,
    *,
    quick: bool,
    repeats: int | None,
    tokens: tuple[int, ...] | None,
) -> int:
    """Measure every preset (`-tiny` variants with `quick`); write multipool.json/.md."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    mha_name = "tiny" if quick else "qwen3-8b"
    s = Settings(
        preset(mha_name),
        mha_name,
        tokens or (TOKENS_QUICK if quick else TOKENS),
        repeats if repeats is not None else (3 if quick else 20),
        1 if quick else 3,
        device,
        quick,
        sections=(),
    )
    modes = ("table", "per_pool", "torch") if cuda or interpreter_enabled() else ("torch",)
    names = [f"{p}-tiny" if quick else p for p in presets]
    mha = _MhaRig(s, max(_prefix_bytes(n, max(s.tokens)) for n in names))
    rows: list[Row] = []
    for name in names:
        rows += bench_preset(name, s, modes, mha)
    result = {
        "config": {
            "device": torch.cuda.get_device_name() if cuda else "cpu (smoke run)",
            "torch": torch.__version__,
            "repeats": s.repeats,
            "warmup": s.warmup,
            "mha_geometry": mha_name,
            "modes": list(modes),
        },
        "rows": rows,
    }
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "multipool.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    text = format_markdown(result)
    with open(os.path.join(out_dir, "multipool.md"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print(text)
    bad = [r for r in rows if not all(r["bytes_ok"].values())]
    return 1 if bad else 0


def format_markdown(result: dict[str, Any]) -> str:
    c = result["config"]
    lines = [
        f"# Multi-pool transfer benchmark: {c['device']}",
        "",
        f"torch {c['torch']}, median of {c['repeats']} after {c['warmup']} warm-up runs. "
        f"ms: end to end (issue -> DONE observed); of ceiling: one contiguous pinned copy "
        f"of the same bytes over this path (time ratio); of MHA: this path's GB/s over the "
        f"single-pool mover's on {c['mha_geometry']} pages of about the same bytes; "
        f"launches / DMAs per transfer; issue ms: host time of the issuing call; device "
        f"ms: first to last device operation; bytes ok: pools whose digests matched "
        f"(of all). GB = 1e9 bytes.",
        "",
        "| preset | tokens | dir | mode | MB | ms | GB/s | of ceiling | of MHA | launches "
        "| DMAs | issue ms | device ms | bytes ok |",
        "|" + " --- |" * 14,
    ]
    for r in result["rows"]:
        ok = sum(r["bytes_ok"].values())
        lines.append(
            f"| {r['preset']} | {r['tokens']} | {r['direction']} | {r['mode']} | "
            f"{r['bytes'] / 1e6:.2f} | {r['median_ms']:.3f} | {r['GBps']:.1f} | "
            f"{100 * r['of_ceiling']:.1f}% | {100 * r['of_mha']:.1f}% | {r['launches']} | "
            f"{r['dmas']} | {r['issue_ms']:.3f} | {r['device_ms']:.3f} | "
            f"{ok}/{len(r['bytes_ok'])} |"
        )
    return "\n".join(lines)


def run_cli(args: argparse.Namespace) -> int:
    """`hicache bench transfer --preset ...`: 0 measured and every byte checked, 1 a pool's
    bytes differed, 2 a usage error."""
    presets = [p for p in args.preset.split(",") if p]
    unknown = sorted(set(presets) - {"dsv4", "mla"})
    if unknown:
        print(
            f"hicache bench transfer: --preset: unknown {unknown}; choose from dsv4, mla",
            file=sys.stderr,
        )
        return 2
    tokens = args.tokens or None  # parsed by hicache.bench.counts
    return run(presets, args.out, quick=args.quick, repeats=args.repeats, tokens=tokens)
