"""The L1 device pool and the L2 host pool: the tensors that hold KV bytes.

    L1  DevicePool  [K/V, layer, page, token_in_page, kv_head, head_dim]   attention order
    L2  HostPool    [page, K/V, layer, token_in_page, kv_head, head_dim]   page-major
                    .l1_order_view()  the same buffer permuted to L1 order (no copy)
                    .bytes_view()     uint8 [page, bytes_per_page]       (what L3 I/O moves)

One L2 page is `bytes_per_page` contiguous bytes, so a run of consecutive L2 pages is one
DMA or one file extent. Both pools are zero-filled at construction: a page nobody wrote has
the same bytes (and digest) in every tier. fp8 is stored as `torch.float8_e4m3fn` and moved
as raw bytes.

`page_digest(pool, pages)` is the per-page fingerprint invariant I4 compares across tiers: it
hashes each page's bytes in the packed page-major order, so the same page bytes give the same
digest whether they sit in L1, L2 or an L3 slot (`digest_rows` hashes raw rows, e.g. slots
read back from the file).
"""

from __future__ import annotations

import gc

import numpy as np
import numpy.typing as npt
import torch

from hicache.core.pages import Pages, pages
from hicache.core.snapshot import UNSERVABLE
from hicache.dataplane.geometry import KVGeometry
from hicache.dataplane.pinned import pinned_empty
from hicache.errors import ConfigError

TORCH_DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
    "fp8": torch.float8_e4m3fn,
}

# Digests gather at most this many bytes at a time, so checking I4 over a large pool never
# needs a second pool's worth of scratch memory.
DIGEST_BATCH_BYTES = 64 << 20


def torch_dtype(geometry: KVGeometry) -> torch.dtype:
    return TORCH_DTYPES[geometry.dtype]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """`None` -> cuda when available, else cpu. ConfigError("device") for anything else that
    cannot hold L1 here (an unknown name, or cuda without a CUDA device)."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ConfigError("device", f"not a torch device name: {device!r} ({e})") from None
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError("device", f"L1 lives on 'cuda' or 'cpu', got {dev.type!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", "cuda was asked for but no CUDA device is available; use 'cpu'")
    if dev.type == "cuda" and dev.index is None:  # one name for one device: tensors say cuda:N
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _check_capacity(field: str, capacity_pages: object) -> int:
    # Why bool is refused: True would silently mean a one-page pool.
    if (
        not isinstance(capacity_pages, int)
        or isinstance(capacity_pages, bool)
        or capacity_pages <= 0
    ):
        raise ConfigError(
            field, f"must be a positive number of pages (at least one), got {capacity_pages!r}"
        )
    return capacity_pages


def allocate(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, *, pin: bool, field: str
) -> torch.Tensor:
    """A zero-filled tensor; ConfigError naming `field` and the size when memory is short.
    Pinned means `pinned.pinned_empty`: the exact size, registered in place, released with the
    tensor (torch's pinned allocator would round a pool up to a power of two and cache it)."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
    try:
        t = pinned_empty(shape, dtype) if pin else torch.empty(shape, dtype=dtype, device=device)
    except RuntimeError as e:  # torch.cuda.OutOfMemoryError and the CPU allocator's failure
        where = "pinned host" if pin else str(device)
        raise ConfigError(
            field, f"cannot allocate {nbytes} bytes of {where} memory ({e}); ask for fewer pages"
        ) from None
    t.view(torch.uint8).zero_()
    return t


def empty_retrying(
    shape: tuple[int, ...] | int, dtype: torch.dtype, device: torch.device, *, pin: bool
) -> torch.Tensor:
    """`torch.empty` for buffers torch's pinned allocator may cache (workspaces, reused); when
    pinned memory runs out, release its cached blocks and try once more (RuntimeError if that
    fails too)."""
    try:
        return torch.empty(shape, dtype=dtype, device=device, pin_memory=pin)
    except RuntimeError:
        if not pin:
            raise
    release_cached_pinned()
    return torch.empty(shape, dtype=dtype, device=device, pin_memory=pin)


def release_cached_pinned() -> None:
    """Give the pinned blocks torch caches but nobody uses back to the system.

    Why: torch keeps freed pinned blocks for reuse by later allocations of a similar size and
    never returns them on its own. The collection first frees buffers that only reference
    cycles still hold.
    """
    gc.collect()
    empty = getattr(getattr(torch, "accelerator", None), "empty_host_cache", None)
    if empty is None:  # torch < 2.12 (the H200 machine has 2.11): the CUDA-only binding
        empty = getattr(torch._C, "_host_emptyCache", None)
    if empty is not None:
        empty()


class DevicePool:
    """L1: `capacity_pages` pages in attention order on `device` (CUDA, or CPU without one)."""

    def __init__(
        self, geometry: KVGeometry, capacity_pages: int, device: str | torch.device
    ) -> None:
        self.geometry = geometry
        self.capacity_pages = _check_capacity("l1_pages", capacity_pages)
        self.device = resolve_device(device)
        g = geometry
        shape = (2, g.layers, capacity_pages, g.page_size, g.kv_heads, g.head_dim)
        self.tensor = allocate(shape, torch_dtype(g), self.device, pin=False, field="l1_pages")

    @property
    def nbytes(self) -> int:
        return self.capacity_pages * self.geometry.bytes_per_page

    def packed(self, page_ids: Pages) -> torch.Tensor:
        """A copy of `page_ids` in packed page-major order `[n, 2, layers, page_size, kv_heads,
        head_dim]`, on the pool's device. Plain torch (index_select), independent of the
        gather kernels it is used to check."""
        idx = torch.from_numpy(pages(page_ids)).to(self.device)
        raw = self.tensor.view(torch.uint8).index_select(2, idx)  # bytes: no dtype kernel needed
        return raw.permute(2, 0, 1, 3, 4, 5).contiguous().view(self.tensor.dtype)


class HostPool:
    """L2: `capacity_pages` page-major pages in host memory, pinned when `pin` (needs CUDA)."""

    def __init__(self, geometry: KVGeometry, capacity_pages: int, *, pin: bool) -> None:
        self.geometry = geometry
        self.capacity_pages = _check_capacity("l2_pages", capacity_pages)
        if pin and not torch.cuda.is_available():
            raise ConfigError(
                "l2.pin", "pinned host memory needs a CUDA device; pass pin=False on CPU"
            )
        self.pinned = pin
        g = geometry
        shape = (capacity_pages, 2, g.layers, g.page_size, g.kv_heads, g.head_dim)
        self.tensor = allocate(
            shape, torch_dtype(g), torch.device("cpu"), pin=pin, field="l2_pages"
        )

    @property
    def nbytes(self) -> int:
        return self.capacity_pages * self.geometry.bytes_per_page

    def l1_order_view(self) -> torch.Tensor:
        """The buffer as `[K/V, layer, page, token, head, dim]` (a permuted view, no copy)."""
        return self.tensor.permute(1, 2, 0, 3, 4, 5)

    def bytes_view(self) -> torch.Tensor:
        """The buffer as uint8 `[capacity_pages, bytes_per_page]` (a view, no copy)."""
        return self.tensor.view(self.capacity_pages, -1).view(torch.uint8)

    def packed(self, page_ids: Pages) -> torch.Tensor:
        """A copy of `page_ids`, packed page-major (the L2 layout already is)."""
        raw = self.tensor.view(torch.uint8).index_select(0, torch.from_numpy(pages(page_ids)))
        return raw.view(self.tensor.dtype)


def page_digest(pool: DevicePool | HostPool, page_ids: Pages) -> npt.NDArray[np.uint64]:
    """One uint64 per page of `page_ids`: a hash of the page's bytes in packed page-major order
    (L1 pages are gathered with plain torch first). Equal bytes give equal digests in every
    tier; see `digest_rows` for how likely different bytes are to collide."""
    ids = pages(page_ids)
    per_batch = max(1, DIGEST_BATCH_BYTES // pool.geometry.bytes_per_page)
    out = np.empty(ids.size, dtype=np.uint64)
    for start in range(0, ids.size, per_batch):
        batch = ids[start : start + per_batch]
        rows = pool.packed(batch).view(batch.size, -1).view(torch.uint8)
        out[start : start + batch.size] = digest_rows(rows)
    return out


_MIX = -7046029254386353131  # 0x9E3779B97F4A7C15 as int64: odd, so multiplying is a bijection
_weights_cache: dict[tuple[int, str], torch.Tensor] = {}


def _word_weights(words: int, device: torch.device) -> torch.Tensor:
    """Fixed odd int64 weights, one per word of a page (splitmix64 of the word's position)."""
    key = (words, str(device))
    w = _weights_cache.get(key)
    if w is None:
        z = np.arange(1, words + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = (z ^ (z >> np.uint64(31))) | np.uint64(1)
        w = torch.from_numpy(z.view(np.int64)).to(device)
        if len(_weights_cache) > 8:  # bounded: a few geometries per process at most
            _weights_cache.clear()
        _weights_cache[key] = w
    return w


def shift_right(x: torch.Tensor, k: int) -> torch.Tensor:
    """The logical right shift of int64 bit patterns `x` by 0 < `k` < 64, as on uint64:
    torch's `>>` on a signed type copies the sign bit into the `k` bits it opens."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def digest_rows(rows: torch.Tensor) -> npt.NDArray[np.uint64]:
    """Digest of each row of a uint8 `[n, bytes]` tensor (any device), as numpy uint64.

    Each 8-byte word x_i (zero-padded at the end) goes through a bijective mix
    f(x) = (x ^ (x >>> 31)) * odd (`>>>` the logical shift: with torch's arithmetic `>>` on
    int64, f(~x) = f(x), and a word with every bit flipped went unseen), and the digest is
    g(sum_i w_i * f(x_i) mod 2**64) with fixed odd weights w_i and g(h) = (h ^ (h >>> 29)) *
    odd. A change confined to one word always changes the digest (an odd weight times a
    non-zero difference is non-zero mod 2**64, and g is a bijection); other changes collide with
    probability about 2**-64 per page, position included, so swapped words or pages are caught too.
    Integer arithmetic only: CPU and CUDA give identical results.
    """
    # Verify the input is raw bytes, one row per page: anything else would hash a dtype's values.
    assert rows.dtype == torch.uint8 and rows.dim() == 2, (rows.dtype, tuple(rows.shape))
    n, nbytes = rows.shape
    pad = (-nbytes) % 8
    if pad or not rows.is_contiguous() or rows.storage_offset() % 8:  # int64 view needs it
        rows = torch.cat([rows, rows.new_zeros((n, pad))], dim=1)
    words = rows.view(torch.int64)
    mixed = (words ^ shift_right(words, 31)) * _MIX
    h = (mixed * _word_weights(words.shape[1], rows.device)).sum(dim=1)
    h = (h ^ shift_right(h, 29)) * _MIX
    result: npt.NDArray[np.uint64] = h.cpu().numpy().view(np.uint64)
    # Real bytes never digest to the reserved UNSERVABLE value (I4 skips it): fold it away.
    result[result == UNSERVABLE] -= np.uint64(1)
    return result
