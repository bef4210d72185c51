"""The kernels of a group transfer: L1 regions <-> the packed workspace, three ways.

    mode       launches per direction          device operands uploaded per transfer
    ---------  ------------------------------  ------------------------------------------
    table      1 (kernels/triton_table.py)     the row table: int64 [pieces, 3]
    per_pool   1 per byte pool moved           each pool's L1 pages (int64)
               (kernels/triton_rows.py, the
               single-pool kernel, R rows/page)
    torch      index_select + copy (gather),   each pool's L1 pages
               index_copy_ (scatter), per pool

`torch` is the definition and the CPU default; both Triton modes are checked against it
(`verify`, run by `choose` on CUDA before a mode is used). Stages: `table` is one stage
covering every pool; the others one stage per pool, so a D2H's DMAs of pool k can start while
pool k+1 is gathered.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from hicache.core.tiers import Direction
from hicache.dataplane.groupplan import GroupPlan, PoolMove, plan_group
from hicache.dataplane.grouppools import GroupDevicePool, GroupHostPool
from hicache.errors import BackendError, ConfigError
from hicache.kernels.launch import on_stream
from hicache.kernels.reference import WORD_DTYPES, RowLayout, _word_bytes
from hicache.kernels.row_table import RowTable, Segment, TableConfig, build_table

MODES = ("table", "per_pool", "torch")
REQUESTS = ("auto", *MODES)
# What `auto` tries on CUDA. The row table is the faster kernel (benchmarks/results/
# 2026-12-01-group-kernels.md), but end to end one launch per pool wins: building and
# uploading a table of every 4 KiB piece costs ~1-2 ms of host time per 3,500-token transfer,
# while the per-pool gathers overlap the DMAs of the pools before them
# (benchmarks/results/2026-12-01-h200-multipool/).
AUTO_CUDA_MODE = "per_pool"


@dataclass(frozen=True)
class Operands:
    """A transfer's uploaded operands: `host` (the int64 words to upload), and where each
    move's L1 indices start in it (per_pool, torch) or the row table (table)."""

    host: npt.NDArray[np.int64]
    index_at: dict[str, int]  # pool -> where its L1 indices start in `host`
    table: RowTable | None


@dataclass(frozen=True)
class GroupKernels:
    mode: str
    reason: str
    table_config: TableConfig = TableConfig()

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError("kernels.group_mode", f"one of {MODES}, got {self.mode!r}")

    def stages(self, plan: GroupPlan) -> list[tuple[PoolMove, ...]]:
        if self.mode == "table":
            return [plan.moves] if plan.moves else []
        return [(m,) for m in plan.moves]

    def operands(self, plan: GroupPlan, l1: GroupDevicePool) -> Operands:
        if self.mode == "table":
            rows = build_table([_segment(m, l1) for m in plan.moves], self.table_config)
            return Operands(rows.table.reshape(-1), {}, rows)
        index_at: dict[str, int] = {}
        at = 0
        for m in plan.moves:
            index_at[m.pool.name] = at
            at += int(m.l1.size)
        host = np.concatenate([m.l1 for m in plan.moves]) if plan.moves else np.zeros(0, np.int64)
        return Operands(host, index_at, None)

    def copy(
        self,
        stage: tuple[PoolMove, ...],
        ops: Operands,
        device_words: torch.Tensor,
        l1: GroupDevicePool,
        packed: torch.Tensor,
        *,
        gather: bool,
        stream: torch.cuda.Stream | None,
    ) -> int:
        """Enqueue one stage's copies on `stream` (CPU: run them); returns kernel launches.
        `device_words` is `ops.host` on L1's device; `packed` the flat uint8 workspace."""
        if self.mode == "table":
            from hicache.kernels.triton_table import copy_table_triton

            assert ops.table is not None
            table = device_words.view(ops.table.pieces, 3)
            src, dst = (l1.tensor, packed) if gather else (packed, l1.tensor)
            copy_table_triton(
                src, dst, ops.table, table, gather=gather, config=self.table_config, stream=stream
            )
            return 1
        launches = 0
        for m in stage:
            i = ops.index_at[m.pool.name]
            idx = device_words[i : i + int(m.l1.size)]
            launches += _copy_pool(self.mode, m, idx, l1, packed, gather=gather, stream=stream)
        return launches


def _segment(m: PoolMove, l1: GroupDevicePool) -> Segment:
    p = m.pool
    return Segment(
        l1.arena.offsets[p.name],
        l1.capacity(p.source),
        p.rows_per_page,
        p.row_bytes,
        m.l1,
        m.packed_at,
    )


def _copy_pool(
    mode: str,
    m: PoolMove,
    idx: torch.Tensor,
    l1: GroupDevicePool,
    packed: torch.Tensor,
    *,
    gather: bool,
    stream: torch.cuda.Stream | None,
) -> int:
    """One pool's gather or scatter between its L1 region and its packed part."""
    p, n = m.pool, int(m.l1.size)
    region = l1.region(p.name)  # [R, cap, row_bytes]
    part = packed[m.packed_at : m.packed_at + m.nbytes]
    if mode == "per_pool":
        from hicache.kernels import triton_rows

        word = _word_bytes(p.row_bytes | l1.arena.offsets[p.name] | m.packed_at)
        layout = RowLayout(p.layers, region.shape[1], n, p.row_bytes, word, p.rows_per_layer)
        words = WORD_DTYPES[word]
        triton_rows.launch_layout(
            layout,
            region.reshape(-1).view(words),
            part.view(words),
            idx,
            gather=gather,
            stream=stream,
        )
        return 1
    rows = part.view(n, p.rows_per_page, p.row_bytes)
    with on_stream(stream):
        if gather:
            rows.copy_(region.index_select(1, idx).transpose(0, 1))
            return 2
        region.index_copy_(1, idx, rows.transpose(0, 1))
        return 1


def choose(
    requested: str,
    l1: GroupDevicePool,
    l2: GroupHostPool,
    table_config: TableConfig = TableConfig(),
) -> GroupKernels:
    """The mode for `l1`'s group, and why. `auto`: on CUDA `AUTO_CUDA_MODE` once `verify`
    passes (else torch, the reason says why); on CPU torch (Triton runs there only
    interpreted, far slower). An explicit Triton mode must pass `verify` (BackendError)."""
    if requested not in REQUESTS:
        raise ConfigError("kernels.group_mode", f"one of {REQUESTS}, got {requested!r}")
    if requested == "torch":
        return GroupKernels("torch", "torch requested", table_config)
    on_gpu = l1.device.type == "cuda"
    if requested == "auto" and not on_gpu:
        return GroupKernels(
            "torch", "auto on cpu: Triton would run interpreted; using torch", table_config
        )
    mode = AUTO_CUDA_MODE if requested == "auto" else requested
    chosen = GroupKernels(mode, f"{requested}: {mode}, verified against torch", table_config)
    try:
        verify(chosen, l1, l2)
    except (BackendError, ImportError) as exc:
        if requested != "auto":
            raise
        return GroupKernels("torch", f"auto: {mode} unusable, using torch: {exc}", table_config)
    return chosen


def verify(kernels: GroupKernels, l1: GroupDevicePool, l2: GroupHostPool) -> None:
    """Gather page 0 of every pool with `kernels` and with torch and compare; scatter the
    bytes back to where they came from (L1 unchanged) and compare again. BackendError on any
    difference. Synchronizes the device."""
    request = {s: ([0], [0]) for s in l1.geometry.sources}
    plan = plan_group(Direction.D2H, request, l1, l2)
    if not plan.moves:
        return
    reference = GroupKernels("torch", "reference")
    expected = _gathered(reference, plan, l1)
    if not torch.equal(_gathered(kernels, plan, l1), expected):
        raise BackendError(f"the {kernels.mode} gather moved bytes different from torch's")
    ops = kernels.operands(plan, l1)
    words = torch.from_numpy(ops.host).to(l1.device)
    source = expected.clone()
    for stage in kernels.stages(plan):
        kernels.copy(stage, ops, words, l1, source, gather=False, stream=None)
    if not torch.equal(_gathered(reference, plan, l1), expected):
        raise BackendError(f"the {kernels.mode} scatter wrote bytes different from torch's")


def _gathered(kernels: GroupKernels, plan: GroupPlan, l1: GroupDevicePool) -> torch.Tensor:
    packed = torch.full((plan.packed_bytes,), 0xA5, dtype=torch.uint8, device=l1.device)
    ops = kernels.operands(plan, l1)
    words = torch.from_numpy(ops.host).to(l1.device)
    for stage in kernels.stages(plan):
        kernels.copy(stage, ops, words, l1, packed, gather=True, stream=None)
    if l1.device.type == "cuda":
        torch.cuda.synchronize(l1.device)
    return packed
