"""The row-table copy kernel (kernels/row_table.py says what the table is): one program per
piece, [BLOCK, VEC]-word steps, so every load and store is a whole unit (16 bytes when the
table's unit is). Compiled lazily once per mode (TRITON_INTERPRET runs it on CPU tensors); on
a GPU launched through `launch.CompiledCache`. The kernel takes no sizes but the table's: its
specialization key is (device, warps, the three tensors' dtype and alignment, BLOCK, VEC,
direction), so a new transfer size never compiles or dispatches again.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from hicache.errors import BackendError
from hicache.kernels.launch import CompiledCache, arg_key, on_stream
from hicache.kernels.row_table import RowTable, TableConfig, units_view
from hicache.kernels.triton_rows import LAUNCH_FAILURES, check_runnable, interpreter_enabled


def _copy_table(  # type: ignore[no-untyped-def]
    src,
    dst,
    table,
    BLOCK: tl.constexpr,
    VEC: tl.constexpr,
    GATHER: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    """One piece: `length` units of VEC words between the side and the packed tensor."""
    p = tl.program_id(0).to(tl.int64)
    side = tl.load(table + 3 * p)
    packed = tl.load(table + 3 * p + 1)
    length = tl.load(table + 3 * p + 2)
    if GATHER:
        src_at = side * VEC
        dst_at = packed * VEC
    else:
        src_at = packed * VEC
        dst_at = side * VEC
    lanes = tl.arange(0, VEC)[None, :]
    if INTERPRETED:
        # Triton 3.6's interpreter holds a loaded scalar as a 1-element array, which `range`
        # cannot take as a bound ("only 0-dimensional arrays can be converted to Python
        # scalars"); a `while` compares it instead. Compiled, the `for` stays (the software
        # pipeliner schedules a `for`'s loads, not a `while`'s). The two bodies are the same.
        step = 0
        while step < length:
            units = step + tl.arange(0, BLOCK)
            inside = (units < length)[:, None]
            offsets = units[:, None] * VEC + lanes
            tl.store(
                dst + dst_at + offsets, tl.load(src + src_at + offsets, mask=inside), mask=inside
            )
            step += BLOCK
    else:
        for step in range(0, length, BLOCK):
            units = step + tl.arange(0, BLOCK)
            inside = (units < length)[:, None]
            offsets = units[:, None] * VEC + lanes
            tl.store(
                dst + dst_at + offsets, tl.load(src + src_at + offsets, mask=inside), mask=inside
            )


_JITTED: dict[bool, Any] = {}  # interpreted? -> the jitted kernel
_COMPILED: list[CompiledCache] = []


def _kernel(interpreted: bool) -> Any:
    if interpreted not in _JITTED:
        _JITTED[interpreted] = triton.jit(_copy_table)
    return _JITTED[interpreted]


def copy_table_triton(
    src: torch.Tensor,
    dst: torch.Tensor,
    rows: RowTable,
    table: torch.Tensor,
    *,
    gather: bool = True,
    config: TableConfig = TableConfig(),
    stream: torch.cuda.Stream | None = None,
) -> None:
    """`row_table.copy_table_torch` in one launch, enqueued on `stream`. `table` is
    `rows.table` on src's device (int64 [pieces, 3], contiguous), uploaded by the caller.
    BackendError when Triton cannot compile or launch it."""
    if rows.pieces == 0:
        return
    interpreted = interpreter_enabled()
    check_runnable(src.device, interpreted)
    # Verify the table is the uploaded copy: a mismatch would copy from wrong offsets.
    assert tuple(table.shape) == (rows.pieces, 3) and table.is_contiguous(), tuple(table.shape)
    block = max(1, config.block_bytes // rows.unit_bytes)
    on_cpu = src.device.type != "cuda" or interpreted
    args = (units_view(src, rows), units_view(dst, rows), table, block, rows.vec, gather, on_cpu)
    grid = (rows.pieces,)
    options = {"num_warps": config.num_warps}
    try:
        if on_cpu:
            with on_stream(stream):
                _kernel(True)[grid](*args, **options)
            return
        if not _COMPILED:
            _COMPILED.append(CompiledCache(_kernel(False)))
        index = src.device.index if src.device.index is not None else torch.cuda.current_device()
        key = ("table", index, config.num_warps, *(arg_key(a) for a in args))
        with torch.cuda.device(src.device):
            _COMPILED[0].launch(key, grid, args, options, stream=stream)
    except LAUNCH_FAILURES as exc:
        raise BackendError(
            f"Triton row-table copy failed to compile or launch "
            f"({rows.pieces} pieces): {type(exc).__name__}: {exc}; use backend "
            f"'torch'"
        ) from exc
