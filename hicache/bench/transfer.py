"""Transfer benchmark: D2H / H2D end to end against the DMA ceiling measured in the same run.

    hicache bench transfer --out DIR [--quick] [--repeats N] [--tokens 350,1000,2000,3500]
                           [--page-size 16]

Qwen3-8B geometry (36 layers, 8 KV heads, head_dim 128, bf16, 16-token pages: 2,359,296
bytes per page), prefixes of 350 / 1,000 / 2,000 / 3,500 tokens, random L1 pages. Sections:

    dma       per prefix, direction (D2H, H2D) and L2 layout (consecutive; fragmented: random L2
              pages in random order): DeviceHostMover as configured by default ("hicache": on CUDA
              an H2D of up to 32 fragmented pages of 32 KiB rows goes pitched -- a 2D DMA a page
              into L1 in place; a D2H is one mapped copy -- the SMs write L1's rows into L2 in place
              -- unless one run of L2 pages; otherwise one chunk up to 64 MiB -- an H2D of one L2
              run at any size -- above that chunks doubling from 16 MiB, descending for H2D; one DMA
              per run of consecutive L2 pages of >= 256 KiB, smaller runs staged), the same with
              every transfer packed and DMA'd ("hicache DMA route": neither mapped nor pitched), and
              the DMA route's variants: doubling at every size, one chunk, other first-chunk sizes
              (`--first-chunk-mib`, default 2 and 64), one copy_ per DMA instead of one batched
              driver call ("hicache per-run DMAs", batchcopy.py), and (fragmented) every run staged
              -- the path before per-run DMAs. Plus a torch `index_select` gather + one DMA (the
              baseline a user would write). Each timed end to end: issue -> poll until DONE, from an
              idle device, median of `repeats`, the paths of one case taking turns run by run, each
              round starting one path further on (a drifting machine shifts them alike, and no path
              owns a place); each path's bytes are checked (digests) on its own warm-up run, over
              poisoned targets. Beside it the median CPU time of the issue call (`issue_ms`) and the
              transfer's device time (`device_ms`, CUDA events from its first to its last
              operation), and the route it took (`route`: direct / staged / mixed / mapped /
              pitched, runs, chunks, DMAs). Ceilings of the same byte count in the same run: one
              contiguous pinned copy, timed by CUDA events (device time: the ratio `of_dma_ceiling`)
              and end to end taking turns with each case's paths (`of_dma_ceiling_e2e`: a slow
              moment of the host shifts both). Host buffers allocated after warm-up are counted.
              `--page-size` changes tokens per page (e.g. 1 or 2 puts runs of one page below / above
              the 256 KiB direct-DMA threshold).
    storage   H2S / S2H against raw pwrite / preadv of the same bytes, with extent counts
              (`hicache.bench.storage`).
    kernels   gather / scatter GB/s against a 1 GiB device copy (`hicache.bench.kernels`).

Writes DIR/transfer.json (after every section, so a late failure keeps what was measured) and
DIR/transfer.md. A section whose module is missing is reported as an error and makes the exit
status 1. Without CUDA only `--quick` runs (tiny geometry, a few repeats): it exercises the code,
its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from typing import Any

import numpy as np
import torch

from hicache.app.outputs import OUTPUT_DIR
from hicache.bench import BenchParser, counts, no_cuda
from hicache.bench.timing import (
    FIRST_CHUNK_MIB_OTHER,
    Poll,
    Settings,
    e2e_ms_interleaved,
    enqueued,
)
from hicache.core.pages import Pages
from hicache.core.tiers import Direction
from hicache.dataplane.dma import DeviceHostMover, DmaHandle
from hicache.dataplane.geometry import preset
from hicache.dataplane.handles import TransferHandle
from hicache.dataplane.pools import DevicePool, HostPool, page_digest
from hicache.kernels import KernelSet

TOKENS_DEFAULT = (350, 1000, 2000, 3500)
TOKENS_QUICK = (48, 160)
L1_POOL_PAGES = 1024  # random L1 pages are drawn from this many
DEFAULT_PATH = "hicache"
STAGED_PATH = "hicache staged"  # every run through host staging: only fragmented rows
PER_RUN_PATH = "hicache per-run DMAs"  # a chunk's DMAs one copy_ each, not one batched call
DMA_PATH = "hicache DMA route"  # the default's settings, every transfer packed and DMA'd
BASELINE_PATH = "torch index_select + one DMA"
CEILING_PATH = "ceiling"  # timed with the paths, taking turns, not reported as a path
POISON_BYTE = 0xA5  # written over a path's target pages before its checked warm-up run
Row = dict[str, Any]


def _device_ms(fn: Callable[[], None], s: Settings) -> float:
    """Median device ms of `fn` by CUDA events, synchronized per call (as the ceilings are);
    wall-clock on CPU."""
    times = []
    for i in range(s.warmup + s.repeats):
        if s.device.type != "cuda":
            t0 = time.perf_counter()
            fn()
            elapsed = (time.perf_counter() - t0) * 1e3
        else:
            begin = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            begin.record()
            fn()
            end.record()
            end.synchronize()
            elapsed = begin.elapsed_time(end)
        if i >= s.warmup:
            times.append(elapsed)
    return statistics.median(times)


class _Rig:
    """Pools, one mover per chunking variant, and the buffers the ceilings and baseline use."""

    def __init__(self, s: Settings, max_pages: int) -> None:
        g = s.geometry
        self.s = s
        self.l1 = DevicePool(g, max(L1_POOL_PAGES, 2 * max_pages), s.device)
        self.l1.tensor.view(torch.uint8).random_(0, 256)
        self.l2 = HostPool(g, 2 * max_pages + 64, pin=s.device.type == "cuda")
        self.kernels = KernelSet.create(self.l1.tensor, "auto")
        l1, l2, k = self.l1, self.l2, self.kernels

        def mover(**settings: Any) -> DeviceHostMover:
            """The chunking and route variants are the DMA route's: their transfers pack."""
            return DeviceHostMover(l1, l2, k, **{"mapped_d2h": False, "pitched": False, **settings})

        self.movers = {
            DEFAULT_PATH: DeviceHostMover(l1, l2, k),
            DMA_PATH: mover(),
            "hicache doubling": mover(single_chunk_max_bytes=0),  # chunked at any size
            "hicache one chunk": mover(chunk_pages=1 << 30),
            **{
                f"hicache first {mib} MiB": mover(first_chunk_bytes=mib << 20)
                for mib in s.first_chunk_mib
            },
            STAGED_PATH: mover(direct_min_bytes=1 << 62),  # the fragmented path before
            PER_RUN_PATH: mover(batched=False),  # one copy_ per run (before batching)
        }
        shape = (max_pages, 2, g.layers, g.page_size, g.kv_heads, g.head_dim)
        self.packed = torch.empty(shape, dtype=self.l1.tensor.dtype, device=s.device)
        self.rng = np.random.default_rng(0)

    def ceiling_copy(self, n: int, direction: Direction) -> Callable[[], None]:
        """One contiguous pinned copy of n pages' bytes in `direction` (the ceiling)."""
        host, dev = self.l2.tensor[:n], self.packed[:n]

        def up() -> None:
            dev.copy_(host, non_blocking=True)

        def down() -> None:
            host.copy_(dev, non_blocking=True)

        return down if direction is Direction.D2H else up

    def ceilings(self, n: int) -> Row:
        """The ceiling's device ms each way (CUDA events, synchronized per call). Its end to
        end time is measured with each case's paths, taking turns with them (`bench_dma`)."""
        return {
            f"{d.value.lower()}_device_ms": _device_ms(self.ceiling_copy(n, d), self.s)
            for d in (Direction.D2H, Direction.H2D)
        }

    def baseline(self, direction: Direction, l1_ids: Pages, l2_ids: Pages) -> Callable[[], None]:
        """torch index_select gather + one DMA (D2H), or one DMA + index_copy_ (H2D)."""
        n = l1_ids.size
        idx = torch.from_numpy(l1_ids).to(self.s.device)
        first = int(l2_ids[0])
        host, packed, l1 = self.l2.tensor[first : first + n], self.packed[:n], self.l1.tensor
        if direction is Direction.D2H:

            def d2h() -> None:
                packed.copy_(l1.index_select(2, idx).permute(2, 0, 1, 3, 4, 5))
                host.copy_(packed, non_blocking=True)

            return d2h

        def h2d() -> None:
            packed.copy_(host, non_blocking=True)
            l1.index_copy_(2, idx, packed.permute(1, 2, 0, 3, 4, 5))

        return h2d


class _MoverCase:
    """One mover path of one case: `start` issues it (for `e2e_ms_interleaved`), `row()`
    reports it afterwards: the issue call's CPU time and each run's device time (medians),
    whether the bytes arrived, and buffers allocated after warm-up."""

    def __init__(
        self, rig: _Rig, mover: DeviceHostMover, direction: Direction, l1_ids: Pages, l2_ids: Pages
    ) -> None:
        self.rig, self.mover, self.direction = rig, mover, direction
        self.l1_ids, self.l2_ids = l1_ids, l2_ids
        self.issue = mover.d2h if direction is Direction.D2H else mover.h2d
        self.args = (l1_ids, l2_ids) if direction is Direction.D2H else (l2_ids, l1_ids)
        self.failures: list[str] = []
        self.handles: list[TransferHandle] = []
        self.issue_s: list[float] = []
        self._poison_targets()
        complete = self.start()  # warm-up outside the count: first use allocates buffers
        while not complete():
            pass
        # Checked now, on this path's own bytes: later paths of the case write the same pages.
        self.correct = bool(
            np.array_equal(page_digest(rig.l1, l1_ids), page_digest(rig.l2, l2_ids))
        )
        counters = mover.counters[direction]
        self.before = (counters.pinned_allocations, counters.device_allocations)
        del self.handles[:], self.issue_s[:]

    def _poison_targets(self) -> None:
        """Overwrite the pages this path writes, so that a path that moved nothing fails."""
        rig = self.rig
        if self.direction is Direction.D2H:
            rig.l2.tensor.view(torch.uint8)[torch.from_numpy(self.l2_ids)] = POISON_BYTE
        else:
            index = torch.from_numpy(self.l1_ids).to(rig.l1.tensor.device)
            rig.l1.tensor.view(torch.uint8)[:, :, index] = POISON_BYTE

    def start(self) -> Poll:
        t0 = time.perf_counter()
        handle = self.issue(*self.args)
        self.issue_s.append(time.perf_counter() - t0)
        self.handles.append(handle)

        def complete() -> bool:
            status = handle.poll()
            if status.final and handle.error is not None:
                self.failures.append(str(handle.error))
            return status.final

        return complete

    def row(self, median_ms: float) -> Row:
        if self.failures:
            raise RuntimeError(f"{self.direction} failed during the benchmark: {self.failures[0]}")
        timed = slice(self.rig.s.warmup, None)  # the runs `e2e_ms_interleaved` kept
        last = self.handles[-1]
        counters = self.mover.counters[self.direction]
        return {
            "median_ms": median_ms,
            "correct": self.correct,
            "issue_ms": statistics.median(self.issue_s[timed]) * 1e3,
            "device_ms": statistics.median(h.timings.service_s for h in self.handles[timed]) * 1e3,
            "route": str(last.plan) if isinstance(last, DmaHandle) else "-",
            "pinned_allocations_after_warmup": counters.pinned_allocations - self.before[0],
            "device_allocations_after_warmup": counters.device_allocations - self.before[1],
        }


def _layouts(rig: _Rig, n: int) -> dict[str, Pages]:
    consecutive = np.arange(n, dtype=np.int64)
    fragmented = rig.rng.choice(rig.l2.capacity_pages, size=n, replace=False).astype(np.int64)
    return {"consecutive": consecutive, "fragmented": fragmented}


def bench_dma(s: Settings) -> dict[str, object]:
    """The dma section (module docstring): the kernel choice, and one row per (prefix,
    direction, L2 layout, path)."""
    rig = _Rig(s, max(s.page_counts))
    bpp = s.geometry.bytes_per_page
    rows: list[Row] = []
    for tokens, n in zip(s.tokens, s.page_counts):
        ceiling = rig.ceilings(n)
        l1_src = rig.rng.choice(rig.l1.capacity_pages, size=n, replace=False).astype(np.int64)
        others = np.setdiff1d(np.arange(rig.l1.capacity_pages), l1_src)
        l1_dst = rig.rng.choice(others, size=n, replace=False).astype(np.int64)
        for layout, l2_ids in _layouts(rig, n).items():
            for direction, l1_ids in ((Direction.D2H, l1_src), (Direction.H2D, l1_dst)):
                d = direction.value.lower()
                base = {
                    "tokens": tokens,
                    "pages": n,
                    "bytes": n * bpp,
                    "direction": direction.value,
                    "l2": layout,
                    "ceiling_device_ms": ceiling[f"{d}_device_ms"],
                }
                movers = {
                    name: _MoverCase(rig, mover, direction, l1_ids, l2_ids)
                    for name, mover in rig.movers.items()
                    # One run: never staged, and one DMA a chunk (nothing to batch).
                    if (name not in (STAGED_PATH, PER_RUN_PATH) or layout != "consecutive")
                }
                starts = {name: case.start for name, case in movers.items()}
                if layout == "consecutive":  # the baseline copies one host slice, like the anchor
                    starts[BASELINE_PATH] = enqueued(
                        rig.baseline(direction, l1_ids, l2_ids), s.device
                    )
                starts[CEILING_PATH] = enqueued(rig.ceiling_copy(n, direction), s.device)
                medians = e2e_ms_interleaved(starts, s)
                base["ceiling_e2e_ms"] = medians.pop(CEILING_PATH)
                for path, ms in medians.items():
                    case = movers[path].row(ms) if path in movers else {"median_ms": ms}
                    rows.append(_rated({**base, "path": path, **case}))
    k = rig.kernels
    return {
        "gather": k.gather_backend,
        "scatter": k.scatter_backend,
        "reason": k.reason,
        "rows": rows,
    }


def _rated(row: Row) -> Row:
    ms = row["median_ms"]
    row["GBps"] = row["bytes"] / (ms * 1e-3) / 1e9
    row["of_dma_ceiling"] = row["ceiling_device_ms"] / ms
    row["of_dma_ceiling_e2e"] = row["ceiling_e2e_ms"] / ms
    return row


def bench_storage_section(s: Settings) -> dict[str, object]:
    from hicache.bench.storage import bench_storage  # delegated; ImportError: section missing

    return bench_storage(
        list(s.tokens), bytes_per_page=s.geometry.bytes_per_page, repeats=max(3, s.repeats // 4)
    )


def bench_kernels_section(s: Settings) -> dict[str, object]:
    from hicache.bench.kernels import bench_kernels  # delegated; ImportError: section missing

    pool_pages = max(64, 2 * max(s.page_counts)) if s.quick else 4096  # --tokens may ask for more
    return bench_kernels(
        preset_name=s.preset_name,
        pool_pages=pool_pages,
        tokens=list(s.tokens),
        iters=s.repeats,
        warmup=s.warmup,
        ceiling_bytes=(16 << 20) if s.quick else (1 << 30),
        device=s.device.type,
        configs=(),
    )


# Kernels run before storage: right after the storage section, synced kernel calls on the H200
# machine took ~30 us more launch latency (two runs; probably the writeback of the gigabytes
# of page cache it dirties -- not isolated).
SECTIONS: dict[str, Callable[[Settings], dict[str, object]]] = {
    "dma": bench_dma,
    "kernels": bench_kernels_section,
    "storage": bench_storage_section,
}


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def format_markdown(result: dict[str, Any]) -> str:
    """transfer.md: the config line, then one table per section that ran."""
    c = result["config"]
    lines = [
        f"# Transfer benchmark: {c['device_name']}",
        "",
        f"torch {c['torch']}, geometry {c['geometry']} ({c['geometry_fields']['page_size']} "
        f"tokens/page), {c['bytes_per_page']:,} bytes/page, median of {c['repeats']} after "
        f"{c['warmup']} warm-up runs.",
        "",
    ]
    for name in SECTIONS:
        section = result.get(name)
        if section is None:
            continue
        if "error" in section:
            lines += [f"## {name}: NOT MEASURED", "", f"{section['error']}", ""]
            continue
        lines += [f"## {name}", ""] + FORMATTERS[name](section) + [""]
    return "\n".join(lines)


def _dma_md(section: dict[str, Any]) -> list[str]:
    out = [
        f"Kernels: gather {section['gather']}, scatter {section['scatter']} ({section['reason']}).",
        "",
        "ms: end to end (issue -> DONE observed); issue ms: CPU time of the issue call; "
        "device ms: the transfer's first to last device operation (CUDA events). dir: D2H "
        "= L1 -> L2, H2D = L2 -> L1; L2: the L2 pages' layout (consecutive, or fragmented: "
        "random pages in random order); of DMA / e2e ceiling: the ceiling's time over this "
        "path's (device / end to end); bytes ok: the path moved the right bytes; allocs: "
        "pinned host / device buffers allocated after warm-up; GB = 1e9 bytes.",
        "",
        "| tokens | pages | dir | L2 | path | route | ms | issue ms | device ms | GB/s "
        "| of DMA ceiling | of e2e ceiling | bytes ok | host/device allocs after warm-up |",
        "|" + " --- |" * 14,
    ]
    for r in section["rows"]:
        mover = "correct" in r
        ok = r.get("correct", "-")
        allocs = (
            f"{r['pinned_allocations_after_warmup']}/{r['device_allocations_after_warmup']}"
            if mover
            else "-"
        )
        issue, device = (f"{r['issue_ms']:.3f}", f"{r['device_ms']:.3f}") if mover else ("-", "-")
        out.append(
            f"| {r['tokens']} | {r['pages']} | {r['direction']} | {r['l2']} | {r['path']} | "
            f"{r.get('route', '-')} | {r['median_ms']:.3f} | {issue} | {device} | {r['GBps']:.1f} "
            f"| {_pct(r['of_dma_ceiling'])} | {_pct(r['of_dma_ceiling_e2e'])} | {ok} | {allocs} |"
        )
    ceilings = {(r["tokens"], r["direction"], r["l2"]): r for r in section["rows"]}
    out += [
        "",
        "Ceilings (one contiguous pinned copy of the same bytes; e2e timed taking turns with "
        "the case's paths):",
        "",
        "| tokens | dir | case's L2 | device ms | GB/s | e2e ms |",
        "|" + " --- |" * 6,
    ]
    for (tokens, direction, layout), r in sorted(ceilings.items()):
        gbps = r["bytes"] / (r["ceiling_device_ms"] * 1e-3) / 1e9
        out.append(
            f"| {tokens} | {direction} | {layout} | {r['ceiling_device_ms']:.3f} | {gbps:.1f} | "
            f"{r['ceiling_e2e_ms']:.3f} |"
        )
    return out


def _storage_md(section: dict[str, Any]) -> list[str]:
    out = [
        "dir: H2S = L2 -> L3 (write), S2H = L3 -> L2 (read); raw: one pwrite / preadv of the "
        "same bytes; (of raw): the mover's GB/s over raw's; extents: runs of consecutive "
        "slots; GB = 1e9 bytes.",
        "",
        "| pages | extents (consecutive/fragmented) | dir | raw GB/s "
        "| consecutive GB/s (of raw) | fragmented GB/s (of raw) |",
        "|" + " --- |" * 6,
    ]
    for r in section["rows"]:
        extents = f"{r['extents_consecutive']}/{r['extents_fragmented']}"
        for d, raw in (("h2s", "raw_write"), ("s2h", "raw_read")):
            out.append(
                f"| {r['pages']} | {extents} | {d.upper()} | {r[raw + '_GBps']:.2f} | "
                f"{r[d + '_consecutive_GBps']:.2f} ({_pct(r[d + '_consecutive_vs_raw'])}) | "
                f"{r[d + '_fragmented_GBps']:.2f} ({_pct(r[d + '_fragmented_vs_raw'])}) |"
            )
    return out


def _kernels_md(section: dict[str, Any]) -> list[str]:
    ceiling = section["ceiling"]
    out = [
        f"Device copy ceiling (bytes read + written): {ceiling['GBps_rw']:,.0f} GB/s, one call "
        f"synced; {ceiling['GBps_rw_queued']:,.0f} GB/s, calls queued back to back. Each "
        f"kernel is compared with the ceiling timed the same way: synced (one call from "
        f"Python, launch latency included) and queued (device time).",
        "",
        "| tokens | pages | kernel | variant | GB/s synced | of ceiling | GB/s queued | of ceiling "
        "| bytes ok |",
        "|" + " --- |" * 9,
    ]
    for case in section["cases"]:
        for direction in ("gather", "scatter"):
            for variant, r in case[direction].items():
                if "error" in r:
                    out.append(
                        f"| {case['tokens']} | {case['pages']} | {direction} | {variant} | "
                        f"error: {r['error']} | | | | |"
                    )
                    continue
                out.append(
                    f"| {case['tokens']} | {case['pages']} | {direction} | {variant} | "
                    f"{r['GBps_rw']:,.0f} | {_pct(r['of_ceiling'])} | "
                    f"{r['GBps_rw_queued']:,.0f} | {_pct(r['of_ceiling_queued'])} | "
                    f"{r['correct']} |"
                )
    return out


FORMATTERS: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "dma": _dma_md,
    "storage": _storage_md,
    "kernels": _kernels_md,
}


def _settings(args: argparse.Namespace) -> Settings | str:
    """The run's settings, or why it cannot run here."""
    cuda = torch.cuda.is_available()
    name = "tiny" if args.quick else "qwen3-8b"
    geometry = preset(name)
    if args.page_size is not None:
        if args.page_size < 1:
            return f"--page-size must be a positive number of tokens, got {args.page_size}"
        geometry = replace(geometry, page_size=args.page_size)  # dma, storage; not kernels
    default_tokens = TOKENS_QUICK if args.quick else TOKENS_DEFAULT
    tokens = args.tokens or default_tokens
    repeats = args.repeats if args.repeats is not None else (3 if args.quick else 20)
    sections = tuple(args.sections.split(","))
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        return f"--sections: unknown {unknown}; choose from {sorted(SECTIONS)}"
    first = args.first_chunk_mib
    return Settings(
        geometry,
        name,
        tokens,
        repeats,
        1 if args.quick else 3,
        torch.device("cuda" if cuda else "cpu"),
        args.quick,
        first,
        sections,
    )


def _config(s: Settings) -> dict[str, object]:
    name = torch.cuda.get_device_name(s.device) if s.device.type == "cuda" else "cpu (smoke run)"
    return {
        "device_name": name,
        "torch": torch.__version__,
        "geometry": s.preset_name,
        "geometry_fields": asdict(s.geometry),
        "bytes_per_page": s.geometry.bytes_per_page,
        "tokens": list(s.tokens),
        "repeats": s.repeats,
        "warmup": s.warmup,
        "quick": s.quick,
    }


def _write(out_dir: str, result: dict[str, Any]) -> None:
    with open(os.path.join(out_dir, "transfer.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(out_dir, "transfer.md"), "w", encoding="utf-8") as f:
        f.write(format_markdown(result) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """0: every section measured; 1: a section's module is missing (reported); 2: cannot run."""
    parser = BenchParser("transfer", (__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--out",
        required=True,
        type=OUTPUT_DIR,
        help="directory for transfer.json and transfer.md (made if missing)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes (runs on CPU; numbers mean nothing)"
    )
    parser.add_argument(
        "--repeats", type=int, help="timed runs per case (default 20; 3 with --quick)"
    )
    parser.add_argument(
        "--tokens", type=counts, help="comma-separated prefix lengths (default 350,1000,2000,3500)"
    )
    parser.add_argument("--page-size", type=int, help="tokens per page (default: the preset's, 16)")
    parser.add_argument(
        "--first-chunk-mib",
        type=counts,
        default=",".join(map(str, FIRST_CHUNK_MIB_OTHER)),
        help="first-chunk sizes (MiB) measured as variants beside the default",
    )
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated subset of {','.join(SECTIONS)}",
    )
    parser.add_argument(
        "--preset",
        help="comma-separated pool groups (dsv4, mla): the "
        "multi-pool benchmark instead (hicache/bench/multipool.py)",
    )
    args = parser.parse_args(argv)
    if args.preset and not args.quick and not torch.cuda.is_available():
        return no_cuda("transfer", "pass --quick for a CPU smoke run of the multi-pool path")
    if args.preset:
        from hicache.bench.multipool import run_cli

        return run_cli(args)
    if not args.quick and not torch.cuda.is_available():
        return no_cuda(
            "transfer",
            "run it on a machine with a GPU, or pass --quick for a CPU "
            "smoke run (its numbers mean nothing)",
        )
    settings = _settings(args)
    if isinstance(settings, str):
        print(f"hicache bench transfer: {settings}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    result: dict[str, Any] = {"config": _config(settings)}
    missing = []
    for name, run in SECTIONS.items():
        if name not in settings.sections:
            continue
        try:
            result[name] = run(settings)
        except ImportError as e:  # a piece of hicache is not there: say so, measure the rest
            result[name] = {"error": f"section {name!r} could not run: {e}"}
            missing.append(name)
            print(
                f"hicache bench transfer: SECTION {name.upper()} NOT MEASURED: {e}", file=sys.stderr
            )
        if settings.device.type == "cuda":
            torch.cuda.empty_cache()  # the next section allocates its own pools
        _write(args.out, result)
    print(format_markdown(result))
    print(f"wrote {os.path.join(args.out, 'transfer.json')} and transfer.md")
    return 1 if missing else 0


if __name__ == "__main__":
    raise SystemExit(main())
