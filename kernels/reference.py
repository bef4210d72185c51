"""Row layouts, the operand checks every backend shares, and the torch gather/scatter.

    L1      [2 (K/V), layers, num_pages, page_size, kv_heads, head_dim]   contiguous
    packed  [n,       2 (K/V), layers,   page_size, kv_heads, head_dim]   contiguous

A *row* is one (page, K/V, layer) slice: page_size * kv_heads * head_dim elements, contiguous in
both layouts. Seen as rows of `row_words` integer words (kl = kv * layers + l):

    L1      [2 * layers, num_pages, row_words]     row (kl, p)
    packed  [n, 2 * layers, row_words]             row (i, kl)

    gather   packed[i, kv, l] = l1[kv, l, pages[i]]     pages may repeat
    scatter  l1[kv, l, pages[i]] = packed[i, kv, l]     pages must be distinct

Bytes are moved, never values: each dtype is reinterpreted as an integer word (the widest of
8/4/2/1 bytes dividing the row and both tensors' offsets), so fp8 and NaN payloads survive bit
for bit and the copy runs on wide loads. This module is the definition; the Triton kernels in
`triton_rows.py` are checked against it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from hicache.errors import LayoutError

# The KV dtypes of `hicache.dataplane.geometry.DTYPE_BYTES` (bf16, fp16, fp32, fp8).
KV_DTYPES: frozenset[torch.dtype] = frozenset(
    {torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn}
)
INDEX_DTYPES: frozenset[torch.dtype] = frozenset({torch.int32, torch.int64})
# Word width in bytes -> the integer dtype rows are moved as, widest first.
WORD_DTYPES: dict[int, torch.dtype] = {
    8: torch.int64,
    4: torch.int32,
    2: torch.int16,
    1: torch.uint8,
}


class RowLayout(NamedTuple):
    """One gather/scatter call in rows and words (sizes in elements of the named unit).

    A NamedTuple, not a dataclass: one is built per call and hashed per launch (the Triton
    plan cache), and both are C-level for a tuple; a launch's Python cost counts at small
    transfers.
    """

    layers: int
    l1_pages: int  # pages in the L1 pool
    n: int  # pages moved (len(pages))
    row_bytes: int
    word_bytes: int  # the integer word the bytes are moved as: 8, 4, 2 or 1
    rows_per_layer: int = 2  # K and V; pool groups' pools may have 1 (an MLA latent, a sidecar)

    @property
    def rows_per_page(self) -> int:
        return self.rows_per_layer * self.layers

    @property
    def rows(self) -> int:
        return self.n * self.rows_per_page

    @property
    def row_words(self) -> int:
        return self.row_bytes // self.word_bytes

    @property
    def word_dtype(self) -> torch.dtype:
        return WORD_DTYPES[self.word_bytes]


def check_l1(l1: torch.Tensor) -> None:
    """Raise LayoutError unless `l1` is a contiguous [2, layers, pages, ps, H, D] KV tensor."""
    if l1.dim() != 6 or l1.shape[0] != 2:
        raise LayoutError(
            f"l1: expected [2, layers, num_pages, page_size, kv_heads, head_dim], "
            f"got shape {tuple(l1.shape)}"
        )
    if l1.dtype not in KV_DTYPES:
        raise LayoutError(f"l1: dtype {l1.dtype} is not one of {sorted(map(str, KV_DTYPES))}")
    if not l1.is_contiguous():
        raise LayoutError("l1: must be contiguous (the L1 pool is allocated contiguous)")


def check_operands(
    l1: torch.Tensor, pages: torch.Tensor, packed: torch.Tensor, *, scatter: bool
) -> RowLayout:
    """Validate one call's tensors and return its row layout; raise LayoutError otherwise.

    Page values are range-checked (and, for scatter, checked distinct) only for CPU indices:
    on a GPU that check would need a host sync, so there it is the caller's contract.
    """
    check_l1(l1)
    _, layers, l1_pages, page_size, kv_heads, head_dim = l1.shape
    if pages.dim() != 1 or pages.dtype not in INDEX_DTYPES:
        raise LayoutError(
            f"pages: expected a 1-D int32/int64 tensor, got {pages.dtype} of shape "
            f"{tuple(pages.shape)}"
        )
    n = pages.shape[0]
    name = "packed" if scatter else "out"
    want = (n, 2, layers, page_size, kv_heads, head_dim)
    if packed.shape != want:
        raise LayoutError(
            f"{name}: expected shape {want} (len(pages), 2, layers, ps, H, D), "
            f"got {tuple(packed.shape)}"
        )
    if packed.dtype != l1.dtype:
        raise LayoutError(f"{name}: dtype {packed.dtype} differs from l1's {l1.dtype}")
    if not packed.is_contiguous():
        raise LayoutError(f"{name}: must be contiguous")
    device = l1.device
    for tensor, label in ((pages, "pages"), (packed, name)):
        if tensor.device != device:
            raise LayoutError(f"{label}: on {tensor.device}, but l1 is on {device}")
    if n > 0 and device.type == "cpu":
        _check_page_values(pages, l1_pages, scatter=scatter)
    element = l1.element_size()
    row_bytes = page_size * kv_heads * head_dim * element
    # element sizes are powers of two, so scaling the OR scales each offset the same way
    offsets = (int(l1.storage_offset()) | int(packed.storage_offset())) * element
    return RowLayout(layers, l1_pages, n, row_bytes, _word_bytes(row_bytes | offsets))


def _check_page_values(pages: torch.Tensor, l1_pages: int, *, scatter: bool) -> None:
    low, high = int(pages.min()), int(pages.max())
    if low < 0 or high >= l1_pages:
        raise LayoutError(f"pages: values must lie in [0, {l1_pages}), got [{low}, {high}]")
    if scatter and int(torch.unique(pages).numel()) != pages.shape[0]:
        raise LayoutError("pages: scatter needs distinct pages (two rows cannot land on one page)")


def _word_bytes(sizes: int) -> int:
    """The widest word (8, 4, 2 or 1 bytes) dividing every byte count OR-ed into `sizes` (the
    row and each tensor's offset in its storage): a power of two divides all of them exactly
    when it divides their bitwise OR, so this is the OR's lowest set bit, capped at 8."""
    return min(8, sizes & -sizes) if sizes else 8


def word_view(tensor: torch.Tensor, layout: RowLayout) -> torch.Tensor:
    """`tensor`'s bytes as `layout.word_dtype` words, same memory, in some contiguous shape.

    One `view` when the last dim holds whole words (the common case: a launch's Python cost
    counts at small transfers), else through a flat byte view.
    """
    if tensor.shape[-1] * tensor.element_size() % layout.word_bytes == 0:
        return tensor.view(layout.word_dtype)
    return tensor.reshape(-1).view(torch.uint8).view(layout.word_dtype)


def l1_rows(l1: torch.Tensor, layout: RowLayout) -> torch.Tensor:
    """`l1` as [2 * layers, num_pages, row_words] words (a view)."""
    return word_view(l1, layout).view(layout.rows_per_page, layout.l1_pages, layout.row_words)


def packed_rows(packed: torch.Tensor, layout: RowLayout) -> torch.Tensor:
    """`packed` as [n, 2 * layers, row_words] words (a view)."""
    return word_view(packed, layout).view(layout.n, layout.rows_per_page, layout.row_words)


def gather_torch(l1: torch.Tensor, pages: torch.Tensor, out: torch.Tensor) -> None:
    """out[i, kv, l] = l1[kv, l, pages[i]]: `index_select` on the page dim, then one copy.

    Enqueued on the current stream; allocates one temporary of out's size.
    """
    layout = check_operands(l1, pages, out, scatter=False)
    if layout.n == 0:
        return
    selected = l1_rows(l1, layout).index_select(1, pages)  # [2L, n, W]
    packed_rows(out, layout).copy_(selected.transpose(0, 1))


def scatter_torch(packed: torch.Tensor, pages: torch.Tensor, l1: torch.Tensor) -> None:
    """l1[kv, l, pages[i]] = packed[i, kv, l]: one `index_copy_` on the page dim.

    Enqueued on the current stream; rows of pages not listed are untouched.
    """
    layout = check_operands(l1, pages, packed, scatter=True)
    if layout.n == 0:
        return
    source = packed_rows(packed, layout).transpose(0, 1)  # [2L, n, W]
    l1_rows(l1, layout).index_copy_(1, pages.long(), source)


def check_mapped(
    l1: torch.Tensor,
    pages: torch.Tensor,
    pool: torch.Tensor,
    slots: torch.Tensor,
    *,
    to_pool: bool,
    values: bool = True,
) -> RowLayout:
    """Validate one mapped copy's tensors (`copy_mapped_torch`) and return its row layout;
    raise LayoutError otherwise.

    `pool` is page-major, [capacity, 2, layers, page_size, kv_heads, head_dim] in l1's dtype,
    contiguous, on l1's device -- or, with l1 on CUDA, in pinned host memory (which the GPU
    addresses in place). `pages` and `slots` are 1-D int32/int64 of one length on l1's
    device. With `values` and CPU indices, their values are range-checked, and the written
    side's checked distinct (on a GPU that would need a host sync: the caller's contract).
    """
    check_l1(l1)
    _, layers, l1_pages, page_size, kv_heads, head_dim = l1.shape
    for t, label in ((pages, "pages"), (slots, "slots")):
        if t.dim() != 1 or t.dtype not in INDEX_DTYPES:
            raise LayoutError(
                f"{label}: expected a 1-D int32/int64 tensor, got {t.dtype} of shape "
                f"{tuple(t.shape)}"
            )
        if t.device != l1.device:
            raise LayoutError(f"{label}: on {t.device}, but l1 is on {l1.device}")
    if slots.shape != pages.shape:
        raise LayoutError(f"slots: {slots.shape[0]} of them for {pages.shape[0]} pages")
    if pool.dim() != 6 or tuple(pool.shape[1:]) != (2, layers, page_size, kv_heads, head_dim):
        raise LayoutError(
            f"pool: expected shape (capacity, 2, {layers}, {page_size}, {kv_heads}, "
            f"{head_dim}), got {tuple(pool.shape)}"
        )
    if pool.dtype != l1.dtype:
        raise LayoutError(f"pool: dtype {pool.dtype} differs from l1's {l1.dtype}")
    if not pool.is_contiguous():
        raise LayoutError("pool: must be contiguous")
    mapped_host = l1.device.type == "cuda" and pool.device.type == "cpu" and pool.is_pinned()
    if pool.device != l1.device and not mapped_host:
        raise LayoutError(
            f"pool: on {pool.device}, but l1 is on {l1.device} (a host pool must be pinned "
            f"for the GPU to address it)"
        )
    n = pages.shape[0]
    if values and n > 0 and l1.device.type == "cpu":
        _check_page_values(pages, l1_pages, scatter=not to_pool)
        low, high = int(slots.min()), int(slots.max())
        if low < 0 or high >= pool.shape[0]:
            raise LayoutError(
                f"slots: values must lie in [0, {pool.shape[0]}), got [{low}, {high}]"
            )
        if to_pool and int(torch.unique(slots).numel()) != n:
            raise LayoutError("slots: distinct slots needed (two rows cannot land on one page)")
    element = l1.element_size()
    row_bytes = page_size * kv_heads * head_dim * element
    offsets = (int(l1.storage_offset()) | int(pool.storage_offset())) * element
    return RowLayout(layers, l1_pages, n, row_bytes, _word_bytes(row_bytes | offsets))


def copy_mapped_torch(
    l1: torch.Tensor, pages: torch.Tensor, pool: torch.Tensor, slots: torch.Tensor, *, to_pool: bool
) -> None:
    """pool[slots[i], kv, l] = l1[kv, l, pages[i]] (`to_pool`), else l1[kv, l, pages[i]] =
    pool[slots[i], kv, l]: the definition of the mapped copy (kernels/triton_mapped.py), for
    tensors on one device. Enqueued on the current stream."""
    layout = check_mapped(l1, pages, pool, slots, to_pool=to_pool)
    if layout.n == 0:
        return
    if pool.device != l1.device:
        raise LayoutError("the torch mapped copy needs pool and l1 on one device")
    rows = word_view(pool, layout).view(pool.shape[0], layout.rows_per_page, layout.row_words)
    if to_pool:
        rows.index_copy_(
            0, slots.long(), l1_rows(l1, layout).index_select(1, pages).transpose(0, 1)
        )
    else:
        l1_rows(l1, layout).index_copy_(
            1, pages.long(), rows.index_select(0, slots).transpose(0, 1)
        )
