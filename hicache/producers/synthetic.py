"""`SyntheticProducer`: KV bytes that are a pure function of the prefix, cheap enough for CPU.

The value written for K/V `kv`, layer `l`, position `p`, head `h`, dim `d` is

    prefix_hash(p) = roll(... roll(roll(SEED, t[0]), t[1]) ..., t[p])      64-bit, wrapping
    roll(x, t)     = x * ROLL + t + 1                                      (mod 2**64)
    element(e)     = ((kv * layers + l) * kv_heads + h) * head_dim + d
    bits           = (fmix(prefix_hash(p)) ^ fmix(element(e) + 1)) * SPREAD (mod 2**64)
    value          = (top 24 bits of `bits` - 2**23) / 2**23                in [-1, 1)

then rounded to the geometry's dtype. Why it catches cross-prefix mix-ups (bug class B15):
changing token i by delta changes prefix_hash(p), for every p >= i, by delta * ROLL**(p-i), and
ROLL is odd, so that is never 0 mod 2**64; `fmix` (the splitmix64 finalizer) and the odd
multiplier are bijections. Two prefixes that differ anywhere before p therefore give unrelated
bits at p in every element; a whole row (all layers, heads and dims) agreeing by chance has
probability far below 2**-100 even in fp8. The position enters through the hash chain, so the
same token at another position has other bytes too.

The hash chain is rolled with one Python step per token; the per-element work is vectorised
torch int64 arithmetic (which wraps mod 2**64) done in bounded chunks of pages.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from hicache.dataplane.geometry import KVGeometry
from hicache.dataplane.handles import LayerGate
from hicache.dataplane.pools import resolve_device, shift_right, torch_dtype
from hicache.producers.base import (
    PageIndex,
    check_produce_args,
    check_range,
    normalize_device,
    packed_page_major,
    seconds_since,
    write_pages,
)

MASK64 = (1 << 64) - 1
SEED = 0xCBF29CE484222325  # FNV-1a offset basis: any non-zero start works
ROLL = 0x100000001B3  # FNV-1a prime; odd, which the prefix-sensitivity argument needs
SPREAD = 0x9E3779B97F4A7C15  # odd (2**64 / golden ratio): spreads low-bit changes upwards
VALUE_BITS = 24  # float32 holds 24 significant bits, so the value is exact before rounding

# Elements computed per chunk of pages: bounds the int64 temporaries (8 bytes each, about
# four alive at once) to ~0.5 GiB whatever the prefix length.
CHUNK_ELEMS_MAX = 1 << 24


def prefix_hashes(tokens: Sequence[int], end: int) -> list[int]:
    """`prefix_hash(p)` for p in [0, end): each depends on every token of tokens[0..p]."""
    out: list[int] = []
    h = SEED
    for t in tokens[:end]:
        h = (h * ROLL + (int(t) & MASK64) + 1) & MASK64
        out.append(h)
    return out


def fmix_scalar(x: int) -> int:
    """splitmix64's finalizer on a Python int (a bijection on 64-bit values); `fmix` is the
    same on torch int64 tensors, and the tests hold them to each other."""
    x &= MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's raw bits (so -0.0 and 0.0, or two NaNs, compare as the bytes they are)."""
    return t.contiguous().view(torch.uint8)


_SIGN_BITS = {1: (torch.uint8, 0x80), 2: (torch.int16, -(1 << 15)), 4: (torch.int32, -(1 << 31))}


def _flip_sign(t: torch.Tensor) -> None:
    """Flip the sign bit of every element of `t` in place (any float format, fp8 included)."""
    dtype, bit = _SIGN_BITS[t.element_size()]
    t.view(dtype).bitwise_xor_(bit)


def _signed(x: int) -> int:
    """A 64-bit pattern as the int64 torch stores for it."""
    return x - (1 << 64) if x >= 1 << 63 else x


def fmix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finalizer, elementwise on int64 tensors (multiplication wraps mod 2**64)."""
    x = (x ^ shift_right(x, 30)) * _signed(0xBF58476D1CE4E5B9)
    x = (x ^ shift_right(x, 27)) * _signed(0x94D049BB133111EB)
    return x ^ shift_right(x, 31)


def value_scalar(prefix_hash: int, element: int) -> float:
    """The float32 value of one element, computed with Python ints (the reference `_block`
    is checked against)."""
    bits = ((fmix_scalar(prefix_hash) ^ fmix_scalar(element + 1)) * SPREAD) & MASK64
    top = bits >> (64 - VALUE_BITS)
    return (top - (1 << (VALUE_BITS - 1))) / (1 << (VALUE_BITS - 1))


class SyntheticProducer:
    """KV that depends only on the token prefix (see the module docstring), written through the
    `KVProducer` contract. It never reads `prefix_pages`: the tokens say everything, so a
    restored page can be checked against `expected` without a model."""

    def __init__(self, geometry: KVGeometry, device: str | torch.device = "cpu") -> None:
        self.geometry = geometry
        self.device = normalize_device(resolve_device(device))
        self.dtype = torch_dtype(geometry)
        g = geometry
        elements = 2 * g.layers * g.kv_heads * g.head_dim
        element = torch.arange(elements, dtype=torch.int64, device=self.device)
        # [K/V, layer, 1 (position), head, dim]: broadcast against the positions of a chunk.
        self._salt = fmix(element + 1).view(2, g.layers, 1, g.kv_heads, g.head_dim)
        elems_per_page = 2 * g.layers * g.page_size * g.kv_heads * g.head_dim
        self._chunk_pages = max(1, CHUNK_ELEMS_MAX // elems_per_page)

    def _block(self, hashes: list[int]) -> torch.Tensor:
        """Token-major KV `[K/V, layer, len(hashes), kv_head, head_dim]` in the geometry's dtype."""
        h = torch.tensor([_signed(x) for x in hashes], dtype=torch.int64, device=self.device)
        bits = (fmix(h).view(1, 1, -1, 1, 1) ^ self._salt) * _signed(SPREAD)
        top = shift_right(bits, 64 - VALUE_BITS) - (1 << (VALUE_BITS - 1))
        return (top.to(torch.float32) / float(1 << (VALUE_BITS - 1))).to(self.dtype)

    def _chunks(self, start: int, end: int) -> list[tuple[int, int]]:
        """[start, end) cut into page-aligned token ranges of at most `_chunk_pages` pages."""
        step = self._chunk_pages * self.geometry.page_size
        return [(lo, min(lo + step, end)) for lo in range(start, end, step)]

    def produce(
        self,
        tokens: Sequence[int],
        start: int,
        end: int,
        l1: torch.Tensor,
        prefix_pages: PageIndex,
        new_pages: PageIndex,
    ) -> float:
        """Write the synthetic KV of `tokens[start:end]` into `new_pages` of `l1` (only there);
        return the seconds spent. ProducerError, nothing written, for bad arguments."""
        _, new = check_produce_args(
            self.geometry, self.device, tokens, (start, end), l1, (prefix_pages, new_pages)
        )
        started_s = time.perf_counter()
        hashes = prefix_hashes(tokens, end)
        ps = self.geometry.page_size
        for lo, hi in self._chunks(start, end):
            pages = new[(lo - start) // ps : (hi - start) // ps]
            write_pages(l1, pages, self._block(hashes[lo:hi]))
        return seconds_since(self.device, started_s)

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
        """`LayerwiseProducer.compute_kv` (`wait=False`: queued on the caller's stream, the
        host's seconds): the KV `produce` would write -- as long as the
        prefix it reads is the prefix's true KV. Like a model, it reads each layer of the
        prefix after `gate.wait(layer)`; unlike `produce`, it is sensitive to what it read:
        a layer of the prefix that is not what these tokens give (not landed, or landed
        wrong) makes that layer's KV come out sign-flipped -- wrong in every byte, as a
        model's output would be -- so a caller that keeps KV computed on a bad prefix puts
        wrong bytes in the tree, where the checks see them."""
        prefix, _ = check_produce_args(
            self.geometry, self.device, tokens, (start, end), l1, (prefix_pages, None)
        )
        started_s = time.perf_counter()
        hashes = prefix_hashes(tokens, end)
        kv = torch.cat([self._block(hashes[lo:hi]) for lo, hi in self._chunks(start, end)], dim=2)
        true_prefix = self._block(hashes[:start])  # [K/V, layer, start, head, dim]
        for layer in range(gate.layers):
            gate.wait(layer)  # R83: the layer is read only once it landed
            read = l1[:, layer].index_select(1, prefix).flatten(1, 2)  # [K/V, start, head, dim]
            if not torch.equal(_bits(read), _bits(true_prefix[:, layer])):
                _flip_sign(kv[:, layer])
        if not wait:
            return kv, time.perf_counter() - started_s
        return kv, seconds_since(self.device, started_s)

    def expected(self, tokens: Sequence[int], start: int, end: int) -> torch.Tensor:
        """The packed page-major KV `[n_pages, K/V, layer, page_size, kv_head, head_dim]` that
        `produce` writes for `tokens[start:end]`, on this producer's device."""
        check_range(self.geometry, len(tokens), start, end)
        hashes = prefix_hashes(tokens, end)
        ps = self.geometry.page_size
        chunks = self._chunks(start, end)
        return torch.cat([packed_page_major(self._block(hashes[lo:hi]), ps) for lo, hi in chunks])
