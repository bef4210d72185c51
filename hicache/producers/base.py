"""The KV producer contract: what fills L1 pages when a request recomputes a prefix.

    tokens     t[0] ........ t[start-1] | t[start] ........ t[end-1] | t[end] ...
    KV in      prefix_pages (cached)    | new_pages (written here)   | (not touched)
    pages      start / page_size        | (end - start) / page_size  |

`produce` writes the KV of `tokens[start:end]` into `new_pages` of the L1 tensor
(`[K/V, layer, page, token_in_page, kv_head, head_dim]`, see dataplane/pools.py) and nothing
else. It may read `prefix_pages` (the model producer attends to that KV; the synthetic one
needs only the tokens). It returns the steady seconds the work took -- one-time setup such as
compilation or graph capture is excluded -- which is the recompute sample the cost model
learns from.

`expected` says what the bytes must be, when a producer can say so without an L1: the packed
page-major KV `[n_pages, K/V, layer, token_in_page, kv_head, head_dim]` of `tokens[start:end]`.
A restored page can then be compared byte for byte with what recomputation would have written.

The helpers below are shared by the producers: argument checks (`check_produce_args`), the
layout conversions, and a byte-exact page write that works for every dtype, fp8 included.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
import torch

from hicache.dataplane.geometry import KVGeometry
from hicache.dataplane.handles import LayerGate
from hicache.dataplane.pools import torch_dtype
from hicache.errors import ProducerError

# Page indices as the callers hold them: a torch tensor or a numpy array of int64.
PageIndex = torch.Tensor | npt.NDArray[np.int64]

# Same-width integer dtypes: page writes copy raw bits, so every float format (and fp8, whose
# index_copy_ is not implemented everywhere) moves byte for byte.
_BITS_DTYPE: dict[int, torch.dtype] = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


@runtime_checkable
class KVProducer(Protocol):
    """Fills L1 pages with the KV of a token range (see the module docstring for the contract)."""

    geometry: KVGeometry

    def produce(
        self,
        tokens: Sequence[int],
        start: int,
        end: int,
        l1: torch.Tensor,
        prefix_pages: PageIndex,
        new_pages: PageIndex,
    ) -> float:
        """Write the KV of `tokens[start:end]` into `new_pages` of `l1`, the KV of
        `tokens[:start]` being in `prefix_pages`; return the steady seconds spent."""
        ...

    def expected(self, tokens: Sequence[int], start: int, end: int) -> torch.Tensor | None:
        """The packed page-major KV `produce` writes for `tokens[start:end]`, or None when the
        producer cannot say (a model: the bytes depend on kernels and rounding)."""
        ...


@runtime_checkable
class LayerwiseProducer(Protocol):
    """A producer that can compute on a prefix still landing (spec/restore.md, "Layer-wise
    load-back"): it reads layer `l` of `prefix_pages` only after `gate.wait(l)`."""

    geometry: KVGeometry

    def compute_kv(
        self,
        tokens: Sequence[int],
        start: int,
        end: int,
        l1: torch.Tensor,
        prefix_pages: PageIndex,
        gate: LayerGate,
        *,
        wait: bool = True,
    ) -> tuple[torch.Tensor, float]:
        """The token-major KV `[K/V, layer, end - start, kv_head, head_dim]` that `produce`
        would write for `tokens[start:end]`, reading layer `l` of `prefix_pages` only after
        `gate.wait(l)`, and the seconds until it is computed (waits on the gate included, so
        not a recompute sample). Writes no page: the caller writes the KV (`write_pages`) once
        the prefix is known to have landed, or throws it away.

        `wait=False`: return once the work is queued on the caller's current stream -- the KV
        is there in that stream's order, as any torch result is -- and the seconds are the
        host's to queue it, so the caller's own host work overlaps the device's (on a CPU,
        where work is synchronous, the same as `wait=True`)."""
        ...


def normalize_device(device: torch.device) -> torch.device:
    """`cuda` -> `cuda:<current>`, so it compares equal to a tensor's `.device`."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def check_range(geometry: KVGeometry, n_tokens: int, start: int, end: int) -> None:
    """ProducerError unless `0 <= start < end <= n_tokens` with both ends page aligned."""
    ps = geometry.page_size
    # Verify the range is page aligned (invariant I3): producers write whole pages only.
    if start % ps or end % ps:
        raise ProducerError(
            "range", f"[{start}, {end}) must start and end on a multiple of the page size {ps}"
        )
    # Verify the range is non-empty and inside the prompt.
    if not 0 <= start < end <= n_tokens:
        raise ProducerError(
            "range", f"need 0 <= start < end <= len(tokens) = {n_tokens}, got [{start}, {end})"
        )


def host_page_index(pages: PageIndex, field: str) -> torch.Tensor:
    """`pages` as a 1-D int64 tensor on the host, to check (a device tensor is read back:
    that synchronises; a numpy array is viewed, not copied)."""
    t = torch.from_numpy(np.asarray(pages)) if isinstance(pages, np.ndarray) else pages
    # Verify the indices are a 1-D integer list: a float or 2-D index would mean a caller bug.
    if t.dim() != 1 or t.dtype != torch.int64:
        raise ProducerError(
            field, f"must be 1-D int64 page indices, got {t.dtype} of shape {tuple(t.shape)}"
        )
    return t.cpu()


def upload(host: torch.Tensor, given: PageIndex, device: torch.device) -> torch.Tensor:
    """The page index on `device`: `given` itself when it is there already, else `host` copied
    up without a stream sync (a pageable source is staged before the call returns, so the
    host list may go at once; the device reads it in the current stream's order)."""
    if isinstance(given, torch.Tensor) and given.device == device:
        return given
    return host.to(device, non_blocking=True)


def check_produce_args(
    geometry: KVGeometry,
    device: torch.device,
    tokens: Sequence[int],
    span: tuple[int, int],
    l1: torch.Tensor,
    pages: tuple[PageIndex, PageIndex | None],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Check one `produce` call and return `(prefix_pages, new_pages)` as int64 tensors on
    `device` (`new_pages` None: a `compute_kv`, which writes no page; empty then).
    ProducerError (nothing written) for an unaligned range, a page count that does not
    match it, a page outside L1 or named twice, or an L1 of the wrong shape, dtype or device.
    The page lists are checked on the host before they go up: lists given on the host (numpy,
    as the controller passes them) cost no device round trip; a device tensor is read back,
    which synchronises, so callers check before timing."""
    start, end = span
    check_range(geometry, len(tokens), start, end)
    g = geometry
    shape = (2, g.layers, l1.shape[2] if l1.dim() == 6 else -1, g.page_size, g.kv_heads, g.head_dim)
    # Verify L1 is this geometry's pool on this producer's device.
    if tuple(l1.shape) != shape or l1.dtype != torch_dtype(g) or l1.device != device:
        raise ProducerError(
            "l1",
            f"must be {torch_dtype(g)} of shape [2, {g.layers}, pages, {g.page_size}, "
            f"{g.kv_heads}, {g.head_dim}] on {device}, "
            f"got {l1.dtype} {tuple(l1.shape)} on {l1.device}",
        )
    writes = pages[1] is not None
    given = (pages[0], pages[1] if pages[1] is not None else np.zeros(0, np.int64))
    prefix = host_page_index(given[0], "prefix_pages")
    new = host_page_index(given[1], "new_pages")
    for field, idx, want in (
        ("prefix_pages", prefix, start),
        ("new_pages", new, end - start if writes else 0),
    ):
        # Verify one page per page of tokens: a short list would leave tokens without a page.
        if idx.numel() * g.page_size != want:
            raise ProducerError(
                field, f"{want} tokens need {want // g.page_size} pages, got {idx.numel()}"
            )
    every = np.concatenate([prefix.numpy(), new.numpy()])
    # Verify every page exists in L1 and none is named twice (two tokens' KV in one page, or
    # a write over the prefix being read, are the cross-prefix mix-ups of bug class B15).
    if every.size and (int(every.min()) < 0 or int(every.max()) >= l1.shape[2]):
        raise ProducerError(
            "pages", f"page indices must lie in [0, {l1.shape[2]}), got {every.tolist()}"
        )
    if np.unique(every).size != every.size:
        raise ProducerError(
            "pages", f"a page is named twice in prefix_pages + new_pages: {every.tolist()}"
        )
    return upload(prefix, given[0], device), upload(new, given[1], device)


def gather_prefix(l1: torch.Tensor, prefix_pages: torch.Tensor) -> torch.Tensor:
    """The KV held in `prefix_pages`, token-major: `[K/V, layer, tokens, kv_head, head_dim]`."""
    kv = l1.index_select(2, prefix_pages)  # [2, layers, pages, page_size, heads, dim]
    return kv.flatten(2, 3)


def write_pages(l1: torch.Tensor, new_pages: torch.Tensor, kv: torch.Tensor) -> None:
    """Write token-major KV `[K/V, layer, tokens, kv_head, head_dim]` into `new_pages` of `l1`,
    bit for bit (raw bits are copied, so no dtype, fp8 included, is converted or rounded)."""
    two, layers, _, page_size, heads, dim = l1.shape
    paged = kv.reshape(two, layers, new_pages.numel(), page_size, heads, dim)
    # Verify the KV has L1's dtype: a silent cast here would break byte-for-byte checks.
    if paged.dtype != l1.dtype:
        raise ProducerError("kv", f"produced {paged.dtype}, L1 holds {l1.dtype}")
    bits = _BITS_DTYPE[l1.element_size()]
    l1.view(bits).index_copy_(2, new_pages, paged.view(bits))


def packed_page_major(kv: torch.Tensor, page_size: int) -> torch.Tensor:
    """Token-major KV `[K/V, layer, tokens, kv_head, head_dim]` as packed page-major pages
    `[n_pages, K/V, layer, page_size, kv_head, head_dim]` (the L2 layout; a contiguous copy)."""
    two, layers, tokens, heads, dim = kv.shape
    paged = kv.reshape(two, layers, tokens // page_size, page_size, heads, dim)
    return paged.permute(2, 0, 1, 3, 4, 5).contiguous()


def synchronize(device: torch.device) -> None:
    """Wait for `device`'s queued work (a no-op on the CPU, where work is synchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_since(device: torch.device, started_s: float) -> float:
    """Seconds from `started_s` (a `time.perf_counter()` reading) until `device` is idle."""
    synchronize(device)
    return time.perf_counter() - started_s
