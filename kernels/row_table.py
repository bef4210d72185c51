"""Copy rows of different sizes in one launch, from a table of (source, target, length).

    table    int64 [pieces, 3]: side offset, packed offset, length -- all in *units*
             (a unit = `vec` words of `word_bytes`: 16 bytes when every row and offset allows)
    program  p copies table[p, 2] units between side + table[p, 0] and packed + table[p, 1]
    rows     are cut into pieces of at most `piece_units` units on the host (`build_table`),
             so a 149,760-byte row and a 1,728-byte row both end up as a few equal programs

One tensor holds the source and one the target (a pool group's arena per tier and its packed
workspace), so an offset is all a row needs: one launch serves every pool of a group, whatever
its row size (pool groups: 1,728 to 149,760 bytes per layer-page in DeepSeek V4). Loads are
[units, vec] blocks, so the masked tail of a row still moves whole 16-byte vectors.

`copy_table_torch` is the definition (gathers every word by index); `triton_table` holds the
kernel. No Triton import here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import torch

from hicache.errors import ConfigError, LayoutError

WORD_DTYPES: dict[int, torch.dtype] = {
    8: torch.int64,
    4: torch.int32,
    2: torch.int16,
    1: torch.uint8,
}


@dataclass(frozen=True)
class TableConfig:
    """piece_bytes: the most one program copies; block_bytes: one loop step (powers of two).
    The defaults were the fastest of (16 KiB, 8 KiB), (64 KiB, 8 KiB) and (4 KiB, 2 KiB) for
    the DeepSeek V4 group on an H200 (benchmarks/results/2026-12-01-group-kernels.md)."""

    piece_bytes: int = 4096
    block_bytes: int = 2048
    num_warps: int = 4

    def __post_init__(self) -> None:
        for name in ("piece_bytes", "block_bytes"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ConfigError(f"kernels.table.{name}", f"a power of two >= 16, got {v}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ConfigError("kernels.table.num_warps", f"1, 2, 4, 8 or 16, got {self.num_warps}")


class Segment(NamedTuple):
    """Rows of one pool for one transfer, in bytes. Row (r, page) of the layer-first side
    starts at `side_base + (r * side_pages + page) * row_bytes`; row (i, r) of the packed side
    at `packed_base + (i * rows_per_page + r) * row_bytes`, i the position in `page_ids`."""

    side_base: int
    side_pages: int
    rows_per_page: int
    row_bytes: int
    page_ids: npt.NDArray[np.int64]
    packed_base: int


class RowTable(NamedTuple):
    table: npt.NDArray[np.int64]  # [pieces, 3]
    word_bytes: int
    vec: int  # words per unit

    @property
    def pieces(self) -> int:
        return int(self.table.shape[0])

    @property
    def unit_bytes(self) -> int:
        return self.word_bytes * self.vec


def unit_bytes_for(segments: list[Segment]) -> tuple[int, int]:
    """(word_bytes, vec): the widest unit (16, 8, 4, 2 or 1 bytes) dividing every base and
    row size -- the lowest set bit of their OR, capped at 16."""
    sizes = 0
    for s in segments:
        sizes |= s.side_base | s.packed_base | s.row_bytes
    unit = min(16, sizes & -sizes) if sizes else 16
    return min(8, unit), max(1, unit // 8)


def build_table(segments: list[Segment], config: TableConfig) -> RowTable:
    """The pieces of every row of every segment, in segment order (numpy, vectorized)."""
    word_bytes, vec = unit_bytes_for(segments)
    unit = word_bytes * vec
    piece = max(1, config.piece_bytes // unit)
    parts: list[npt.NDArray[np.int64]] = []
    for s in segments:
        if s.page_ids.size == 0 or s.row_bytes == 0:
            continue
        row_units = s.row_bytes // unit
        k = -(-row_units // piece)
        r = np.arange(s.rows_per_page, dtype=np.int64)[None, :, None]
        j = np.arange(k, dtype=np.int64)[None, None, :] * piece
        ids = s.page_ids.astype(np.int64)[:, None, None]
        pos = np.arange(ids.shape[0], dtype=np.int64)[:, None, None]
        side = s.side_base // unit + (r * s.side_pages + ids) * row_units + j
        packed = s.packed_base // unit + (pos * s.rows_per_page + r) * row_units + j
        length = np.broadcast_to(np.minimum(piece, row_units - j), side.shape)
        parts.append(np.stack([side.ravel(), packed.ravel(), length.ravel()], axis=1))
    table = np.concatenate(parts) if parts else np.zeros((0, 3), dtype=np.int64)
    return RowTable(np.ascontiguousarray(table), word_bytes, vec)


def units_view(t: torch.Tensor, rows: RowTable) -> torch.Tensor:
    """A flat uint8 tensor as `word_bytes` words (same memory)."""
    if t.dtype != torch.uint8 or t.dim() != 1:
        raise LayoutError(
            f"row table operands are flat uint8 tensors, got {t.dtype} {tuple(t.shape)}"
        )
    if t.storage_offset() % rows.unit_bytes or t.numel() % rows.word_bytes:
        raise LayoutError(
            f"operand offset {t.storage_offset()} / size {t.numel()} is not a "
            f"multiple of the {rows.unit_bytes}-byte unit"
        )
    return t.view(WORD_DTYPES[rows.word_bytes])


def copy_table_torch(
    src: torch.Tensor, dst: torch.Tensor, rows: RowTable, *, gather: bool = True
) -> None:
    """Gather: packed[piece's units] = side[piece's units] for every piece (`src` the side
    tensor, `dst` the packed one); scatter (gather=False): side[...] = packed[...] (`src`
    packed, `dst` side). The definition; the Triton kernel is checked against it."""
    if rows.pieces == 0:
        return
    a, b, n = (rows.table * rows.vec).T
    if not gather:
        a, b = b, a
    starts = np.repeat(np.cumsum(n) - n, n)
    within = np.arange(int(n.sum()), dtype=np.int64) - starts
    src_idx = torch.from_numpy(np.repeat(a, n) + within).to(src.device)
    dst_idx = torch.from_numpy(np.repeat(b, n) + within).to(dst.device)
    units_view(dst, rows)[dst_idx] = units_view(src, rows)[src_idx]
