"""`PacedProducer`: another producer's KV, at the pace of a prefill with a fixed cost.

A model's prefill costs about

    seconds(tokens, cached) = fixed_s + per_token_s * tokens + per_cached_token_s * cached

where `fixed_s` is what every prefill pays whatever its length (kernel launches, the host
side of each layer), `per_token_s` the compute of its `tokens` new tokens, and
`per_cached_token_s` what a *tail* prefill pays per token of the cached prefix it reads
(default 0). That last term is what an eager model producer pays to build the cached prefix
into its KV cache layer by layer inside the timed prefill: on an H100, Qwen3-8B eager, a tail
of 14 tokens on a 336-token prefix took 35.3 ms against 29.7 ms for a full 350-token prefill
(benchmarks/results/2026-12-06-batched-copies-h100/README.md), a pace of about 12.2 ms +
50 us/token + 67 us/cached token. Eager PyTorch on a large GPU is
*launch-bound*: `fixed_s` is tens of milliseconds and dominates short and medium prompts, so
a one-page tail prefill costs nearly a full one. CUDA graphs cut `fixed_s` to a millisecond
or so. Whether restoring a prefix beats recomputing it depends on that split, and a CPU
machine has no model to show it: this producer gives one.

`produce` runs the wrapped producer (its bytes, unchanged), then waits until
`pace_s(end - start, start)` seconds have passed since it started (a floor: a
slower inner producer is not sped up), and returns the seconds that passed -- the recompute
sample the cost model learns from, as a model producer's would be. With `sleep=False` it
does not wait and returns exactly the paced seconds, as if it had slept them: the inner
producer's own seconds are not reported, so decisions follow the pace exactly whatever the
machine's load (a loaded CPU once made a 20 ms pace report 50-100 ms and moved a test's
choices), while wall time does not (for tests of the policy's choices, not of throughput).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import torch

from hicache.dataplane.handles import LayerGate
from hicache.errors import ConfigError, ProducerError
from hicache.producers.base import KVProducer, LayerwiseProducer, PageIndex


class PacedProducer:
    """`inner`'s KV, each `produce` taking at least `pace_s(tokens, cached)` seconds (see the
    module docstring). Every cost is seconds, finite and >= 0."""

    def __init__(
        self,
        inner: KVProducer,
        fixed_s: float,
        per_token_s: float,
        *,
        per_cached_token_s: float = 0.0,
        sleep: bool = True,
    ) -> None:
        for field, value in (
            ("fixed_s", fixed_s),
            ("per_token_s", per_token_s),
            ("per_cached_token_s", per_cached_token_s),
        ):
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"paced.{field}", f"must be finite seconds >= 0, got {value!r}")
        self.inner = inner
        self.geometry = inner.geometry
        self.fixed_s = fixed_s
        self.per_token_s = per_token_s
        self.per_cached_token_s = per_cached_token_s
        self.sleep = sleep

    def pace_s(self, tokens: int, cached: int = 0) -> float:
        """The floor, in seconds, of one prefill of `tokens` new tokens after `cached` cached
        ones (a tail prefill when `cached` > 0)."""
        return self.fixed_s + self.per_token_s * tokens + self.per_cached_token_s * cached

    def produce(
        self,
        tokens: Sequence[int],
        start: int,
        end: int,
        l1: torch.Tensor,
        prefix_pages: PageIndex,
        new_pages: PageIndex,
    ) -> float:
        """`inner.produce`, then wait out the pace; returns the steady seconds (module
        docstring). ProducerError from `inner`, nothing written, for bad arguments."""
        started_s = time.perf_counter()
        self.inner.produce(tokens, start, end, l1, prefix_pages, new_pages)
        return self._pace(started_s, end - start, start)

    def _pace(self, started_s: float, tokens: int, cached: int) -> float:
        """Wait out the pace of `tokens` new tokens after `cached` ones, begun at `started_s`;
        the steady seconds."""
        floor_s = self.pace_s(tokens, cached)
        if not self.sleep:
            return floor_s  # the pace, not the machine: see the module docstring
        deadline = started_s + floor_s
        while (left := deadline - time.perf_counter()) > 0:
            time.sleep(left)
        return time.perf_counter() - started_s

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
        """`inner.compute_kv` (ProducerError if `inner` has none), then the pace, as
        `produce` (on the host either way: the pace stands for the device's work)."""
        if not isinstance(self.inner, LayerwiseProducer):
            raise ProducerError("inner", f"{type(self.inner).__name__} has no compute_kv")
        started_s = time.perf_counter()
        kv, _ = self.inner.compute_kv(tokens, start, end, l1, prefix_pages, gate, wait=wait)
        return kv, self._pace(started_s, end - start, start)

    def expected(self, tokens: Sequence[int], start: int, end: int) -> torch.Tensor | None:
        """What `inner` says `produce` writes (pacing changes no byte)."""
        return self.inner.expected(tokens, start, end)
