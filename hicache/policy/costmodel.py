"""Online latency models for restore-vs-recompute decisions.

Every operation the policy weighs is modelled as a line, learned online:

    seconds = fixed_s + per_unit_s * size        (size: tokens for recompute, bytes otherwise)

    kind        what it times                        unit    prior slope          prior fixed
    ----------  -----------------------------------  ------  -------------------  -----------
    recompute   full prefill (no cached prefix) of    token   50 us/token          1 ms
                `size` new tokens
    tail        prefill of `size` new tokens on a     token   (the recompute line's, until
                cached prefix (an L1 hit, a restore)          its first sample)
    h2d         L2 -> L1 load-back (gather + DMA)     byte    1 / (12 GiB/s)       20 us
    d2h         L1 -> L2 backup                       byte    1 / (12 GiB/s)       20 us
    s2h         L3 -> L2 storage read (promotion)     byte    1 / (3 GiB/s)        100 us
    h2s         L2 -> L3 storage write (backup)       byte    1 / (3 GiB/s)        100 us

The slopes are conservative bandwidths for a PCIe host link and a local disk (a real machine
differs, and the lines learn it). The fixed priors are kept small so that the first decisions
are driven by bandwidth: a kernel launch plus one DMA and event sync is tens of
microseconds, a thread-pool hand-off plus one file syscall about a hundred, and an engine's
shortest prefill launch chain about a millisecond. Storage read and write are separate lines
because writes are usually slower, and one slow backup must not talk the model out of fast
restores.

**What a sample is.** The caller passes the *steady* seconds of one operation: enqueue, queue
wait, kernel / DMA / file service and CPU-side completion, but NOT one-time workspace setup
(a first pinned allocation costs tens of milliseconds and would make a single long transfer
drag the learned bandwidth down for the next 32 samples).

**How a line is learned.** With one sample size, fixed and slope cannot both be identified,
so `LinearCost` keeps the last `WINDOW_SAMPLES` samples and:

- while their sizes barely vary (max - min <= max(1.0, 5% of max)), keeps its slope and learns
  the fixed part as an EWMA (alpha 0.2) of the residual seconds - slope * size, clamped at
  zero (a fixed cost cannot be negative; a sample faster than the slope explains pulls the
  fixed part towards zero, and the slope towards seconds / size). The line's *first* sample
  is taken whole (weight 1, not alpha): the prior is a guess from another machine and weighs
  nothing once this one has been measured. From the prior, an EWMA priced a fresh line near
  its guess for several samples: with tails dearer than full prefills (Qwen3-8B eager,
  tests/test_policy_fixed_cost.py's paced replay) `cost` restored 6 of 20 hits before its
  `tail` line caught up, and 1 (the first guess) taking the first sample whole;
- once they vary more, fits intercept and slope over the window by non-negative least squares.

**The prefill lines: `recompute` and `tail`.** A prefill costs `fixed_s + per_unit_s *
tokens`, and whether a restore pays depends on the split: a restore saves `per_unit_s *
restored tokens` and pays its transfers *and still one prefill* -- the prompt's last page is
always computed (`hicache.policy.policies.prefill_end`), so a fixed cost is paid on every
path. A launch-bound producer (eager PyTorch on a large GPU: tens of ms per prefill whatever
its length) has a large `fixed_s` and a small `per_unit_s`, so recompute wins there; CUDA
graphs shrink `fixed_s`, and restores win.

A restore's prefill is a *tail*: new tokens on a cached prefix. So is a recompute after an L1
hit. A tail need not cost what a full prefill of as many tokens does: the eager model
producer builds the cached prefix into its KV cache layer by layer inside the timed prefill,
so on an H100 (Qwen3-8B) a 14-token tail on a 336-token prefix took 35.3 ms against 29.7 ms
for a full 350-token prefill (benchmarks/results/2026-12-06-batched-copies-h100/README.md).
One line in new tokens cannot hold that: fitted on both, NNLS gave slope 0 and the mean, and
a restore (H2D + the mean) against a recompute (the mean) was a near-tie, apart by the H2D
alone, within the margin that lets `cost` explore (R34): that H100 run restored 25 hits of
80, at 0.885 of the best forced throughput. So a prefill is priced and learned
by whether it reads a cached prefix: `recompute` for a full one (no prefix), `tail` for one on
a prefix (`prefill_kind`); each line is fitted on its own samples only. Two lines rather
than a second variable (cached tokens) in one: a serving run sees tails of one shape per
prompt length (a page on a long prefix), so a three-coefficient fit would rarely be
identified, while each line is, by the rules above, from the samples its own kind produces.
The price: a tail's cost that grows with its prefix is learned only as the average over the
prefixes seen (a long and a short prefix with equal tails are one size to the `tail` line).

The controller times each `produce` and feeds it to its line (`observe_prefill`, with the
cached prefix it read). Until the `tail` line has a sample of its own, a tail is priced by
the `recompute` line (`prefill_s`): the line that knows this producer. That line keeps the
prior's slope while it has seen one size, so it prices a short tail low: the first restore
is a guess, and its tail prefill is the `tail` line's first sample. That guess is
deliberate: a pessimistic price would never restore and so never learn that a fast
producer makes restores pay.

Why the `cost` policy restored every hit under a launch-bound producer (H200, `hicache bench
serving --mode eager`: 0.52 / 0.78 of the best forced throughput for Qwen3-4B / 8B): not
this line. It learned `fixed_s` (a CPU replay of the stress run with a paced producer,
19 ms + 1 us/token, gives fixed 19.1 ms, slope 1.0 us/token after the first tail), but the
controller priced candidates only up to the prompt's last *whole* page. The stress prompts
(350 tokens) end mid-page, so a restore of every cached page left `rest = 0` and was priced
as H2D alone -- no prefill, no `fixed_s` -- against a full prefill: restore won every time
though it cost H2D + a prefill of nearly the same length. The controller now prices through
`prefill_end` (the prompt rounded up to whole pages), the tokens its prefill computes.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Literal

from hicache.core.tiers import Direction, Tier
from hicache.errors import ConfigError, PolicyError

WINDOW_SAMPLES = 32  # samples a line is fitted over; older ones are forgotten
EWMA_ALPHA = 0.2  # weight of the newest residual in the fixed-cost EWMA
SPREAD_FLOOR = 1.0  # sizes within this many units count as "the same size"
SPREAD_FRACTION = 0.05  # ... or within this fraction of the largest size in the window
GIB = float(1 << 30)

Mode = Literal["prior", "ewma", "nnls"]
CostKind = Literal["recompute", "tail", "h2d", "d2h", "s2h", "h2s"]
COST_KINDS: tuple[CostKind, ...] = ("recompute", "tail", "h2d", "d2h", "s2h", "h2s")


def _check_sample(name: str, value: float) -> None:
    # Verify a size or duration is a finite, non-negative number: NaN would poison the window.
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise PolicyError(f"{name} must be a finite number >= 0, got {value!r}")


def nnls_line(sizes: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """The exact least-squares line `seconds ~ fixed + slope * size` with fixed, slope >= 0.

    Returns (fixed, slope). Needs at least two distinct sizes. The problem is convex, so if the
    unconstrained fit is infeasible the optimum lies on the boundary of the quadrant: either
    slope = 0 (best fixed = mean seconds, clamped at 0) or fixed = 0 (best slope through the
    origin, clamped at 0). Both faces are solved and the one with the smaller squared error
    wins.
    """
    n = len(sizes)
    # Verify the line is identifiable: equal lengths and some spread in the sizes.
    if n != len(seconds) or n < 2 or max(sizes) == min(sizes):
        raise PolicyError(f"nnls_line needs >= 2 samples with distinct sizes, got {n}")
    mean_x = math.fsum(sizes) / n
    mean_y = math.fsum(seconds) / n
    var_x = math.fsum((x - mean_x) ** 2 for x in sizes)
    cov_xy = math.fsum((x - mean_x) * (y - mean_y) for x, y in zip(sizes, seconds))
    slope = cov_xy / var_x
    fixed = mean_y - slope * mean_x
    if fixed >= 0.0 and slope >= 0.0:
        return fixed, slope

    def sse(a: float, b: float) -> float:
        return math.fsum((y - a - b * x) ** 2 for x, y in zip(sizes, seconds))

    on_slope_zero = (max(0.0, mean_y), 0.0)
    sum_xy = math.fsum(x * y for x, y in zip(sizes, seconds))
    sum_xx = math.fsum(x * x for x in sizes)  # > 0: the sizes are distinct and >= 0
    on_fixed_zero = (0.0, max(0.0, sum_xy / sum_xx))
    if sse(*on_fixed_zero) < sse(*on_slope_zero):
        return on_fixed_zero
    return on_slope_zero


class LinearCost:
    """One operation's latency line, `fixed_s + per_unit_s * size`, learned online.

    `unit` names what a size counts ("token" or "byte"); it is reported, never converted.
    The line only ever holds non-negative coefficients, so predictions grow with size.
    """

    def __init__(
        self,
        name: str,
        unit: str,
        fixed_s: float,
        per_unit_s: float,
        window: int = WINDOW_SAMPLES,
        alpha: float = EWMA_ALPHA,
    ) -> None:
        for field, value in (("fixed_s", fixed_s), ("per_unit_s", per_unit_s)):
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"cost.{name}.{field}", f"must be finite and >= 0, got {value!r}")
        if window < 2:
            raise ConfigError(f"cost.{name}.window", f"needs >= 2 samples to fit, got {window}")
        if not 0.0 < alpha <= 1.0:
            raise ConfigError(f"cost.{name}.alpha", f"must be in (0, 1], got {alpha!r}")
        self.name = name
        self.unit = unit
        self.prior_fixed_s = fixed_s
        self.prior_per_unit_s = per_unit_s
        self.fixed_s = fixed_s
        self.per_unit_s = per_unit_s
        self.alpha = alpha
        self.mode: Mode = "prior"
        self.samples_seen = 0
        self._window: deque[tuple[float, float]] = deque(maxlen=window)

    def observe(self, size: float, seconds: float) -> None:
        """Learn from one operation of `size` units that took `seconds` steady seconds.

        `seconds` must exclude one-time workspace setup (see the module docstring).
        """
        _check_sample("size", size)
        _check_sample("seconds", seconds)
        self._window.append((float(size), float(seconds)))
        self.samples_seen += 1
        sizes = [x for x, _ in self._window]
        spread = max(sizes) - min(sizes)
        if spread <= max(SPREAD_FLOOR, SPREAD_FRACTION * max(sizes)):
            # One size: only the total at that size is identifiable. A slower-than-line sample
            # feeds the fixed part (an EWMA of the positive residual). A faster one means the
            # slope itself is too steep (a prior from a slower machine: 12 GiB/s against an
            # H200's ~50 GB/s); learning the fixed part alone would leave that case stuck, so
            # the slope moves toward seconds/size and the fixed part decays toward 0.
            # The first sample is taken whole (weight 1): a prior is a guess from another
            # machine, and an EWMA from it kept pricing near the guess for several samples.
            weight = 1.0 if self.samples_seen == 1 else self.alpha
            residual = seconds - self.per_unit_s * size
            self.fixed_s = (1.0 - weight) * self.fixed_s + weight * max(0.0, residual)
            if residual < 0.0 and size > 0:
                self.per_unit_s = (1.0 - weight) * self.per_unit_s + weight * (seconds / size)
            self.mode = "ewma"
        else:
            self.fixed_s, self.per_unit_s = nnls_line(sizes, [y for _, y in self._window])
            self.mode = "nnls"
        # Verify the learned line stays non-negative (predictions must grow with size).
        assert self.fixed_s >= 0.0 and self.per_unit_s >= 0.0, (self.fixed_s, self.per_unit_s)

    def predict(self, size: float) -> float:
        """Predicted seconds for one operation of `size` units (fixed part included)."""
        _check_sample("size", size)
        return self.fixed_s + self.per_unit_s * size

    def state(self) -> dict[str, object]:
        """The line, its mode and its window size, for status output and metrics."""
        return {
            "name": self.name,
            "unit": self.unit,
            "mode": self.mode,
            "fixed_s": self.fixed_s,
            "per_unit_s": self.per_unit_s,
            "prior_fixed_s": self.prior_fixed_s,
            "prior_per_unit_s": self.prior_per_unit_s,
            "window_samples": len(self._window),
            "samples_seen": self.samples_seen,
        }


class CostModel:
    """The six lines the policy needs: the two prefills, full (`recompute`) and on a cached
    prefix (`tail`), per token; the four transfer directions, per byte, storage read (`s2h`)
    and write (`h2s`) kept apart.

    Kinds are the lowercase names in `COST_KINDS`; a `Direction` is accepted for transfers.
    """

    def __init__(
        self,
        recompute_us_per_token: float = 50.0,
        host_gib_per_s: float = 12.0,
        storage_gib_per_s: float = 3.0,
        recompute_fixed_s: float = 1e-3,
        host_fixed_s: float = 20e-6,
        storage_fixed_s: float = 100e-6,
        window: int = WINDOW_SAMPLES,
        alpha: float = EWMA_ALPHA,
        *,
        layerwise: bool = False,
    ) -> None:
        for field, value in (
            ("host_gib_per_s", host_gib_per_s),
            ("storage_gib_per_s", storage_gib_per_s),
        ):
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"cost.{field}", f"must be a finite bandwidth > 0, got {value!r}")
        host_s_per_byte = 1.0 / (host_gib_per_s * GIB)
        storage_s_per_byte = 1.0 / (storage_gib_per_s * GIB)
        priors: dict[CostKind, tuple[str, float, float]] = {
            "recompute": ("token", recompute_fixed_s, recompute_us_per_token * 1e-6),
            "tail": ("token", recompute_fixed_s, recompute_us_per_token * 1e-6),
            "h2d": ("byte", host_fixed_s, host_s_per_byte),
            "d2h": ("byte", host_fixed_s, host_s_per_byte),
            "s2h": ("byte", storage_fixed_s, storage_s_per_byte),
            "h2s": ("byte", storage_fixed_s, storage_s_per_byte),
        }
        self.lines: dict[str, LinearCost] = {
            kind: LinearCost(kind, unit, fixed, slope, window=window, alpha=alpha)
            for kind, (unit, fixed, slope) in priors.items()
        }
        # A restore's H2D lands under its prefill (`restored_prefill_s`): the controller says
        # so where its restores land layer by layer (CacheConfig.layerwise, one rank).
        self.layerwise = layerwise

    def line(self, kind: str | Direction) -> LinearCost:
        """The line for `kind` (one of `COST_KINDS` or a Direction)."""
        key = kind.value.lower() if isinstance(kind, Direction) else kind
        line = self.lines.get(key)
        if line is None:
            raise PolicyError(f"unknown cost kind {kind!r}; expected one of {COST_KINDS}")
        return line

    def observe(self, kind: str | Direction, size: float, seconds: float) -> None:
        """Feed one operation's steady seconds (workspace setup excluded) to its line."""
        self.line(kind).observe(size, seconds)

    def predict(self, kind: str | Direction, size: float) -> float:
        return self.line(kind).predict(size)

    def recompute_s(self, tokens: int) -> float:
        """Predicted seconds of a full prefill (no cached prefix) of `tokens` tokens; 0 when
        there is nothing to prefill."""
        return self.prefill_s(tokens, 0)

    def tail_s(self, tokens: int) -> float:
        """Predicted seconds of a tail prefill: `tokens` new tokens on a cached prefix; 0
        when there is nothing to prefill. Until the `tail` line has a sample of its own it
        prices as the `recompute` line does (the module docstring says why)."""
        return self.prefill_s(tokens, 1)

    @staticmethod
    def prefill_kind(cached_tokens: int) -> CostKind:
        """The line that prices and learns a prefill reading `cached_tokens` cached tokens:
        `tail` when it reads any (a restored or L1-hit prefix), `recompute` when none."""
        _check_sample("cached_tokens", cached_tokens)
        return "tail" if cached_tokens > 0 else "recompute"

    def prefill_s(self, tokens: int, cached_tokens: int) -> float:
        """Predicted seconds to prefill `tokens` new tokens after `cached_tokens` cached ones
        (`prefill_kind` picks the line); 0 when there is nothing to prefill."""
        kind = self.prefill_kind(cached_tokens)
        if kind == "tail" and self.lines["tail"].samples_seen == 0:
            kind = "recompute"  # no tail timed yet: a tail costs what a prefill of its tokens does
        return self.predict(kind, tokens) if tokens > 0 else 0.0

    def observe_prefill(self, tokens: int, cached_tokens: int, seconds: float) -> None:
        """Feed one prefill of `tokens` new tokens after `cached_tokens` cached ones, that took
        `seconds` steady seconds, to its line (`prefill_kind`)."""
        self.observe(self.prefill_kind(cached_tokens), tokens, seconds)

    def restore_s(self, l2_tokens: int, l3_tokens: int, bytes_per_token: int) -> float:
        """Predicted seconds to bring `l2_tokens` from L2 and `l3_tokens` from L3 into L1.

        The L3 part is promoted into L2 (S2H) and then everything is loaded back in one H2D.
        The two steps are modelled serially: the engine may overlap S2H of one request with
        other work, but this request's load-back cannot start before its promotion ends.
        No tokens means no operation, hence 0 s (no fixed cost is paid).
        """
        for name, value in (("l2_tokens", l2_tokens), ("l3_tokens", l3_tokens)):
            _check_sample(name, value)
        if bytes_per_token <= 0:
            raise PolicyError(f"bytes_per_token must be > 0, got {bytes_per_token}")
        seconds = 0.0
        if l3_tokens > 0:
            seconds += self.predict("s2h", l3_tokens * bytes_per_token)
        if l2_tokens + l3_tokens > 0:
            seconds += self.predict("h2d", (l2_tokens + l3_tokens) * bytes_per_token)
        return seconds

    def restored_prefill_s(
        self, l2_tokens: int, l3_tokens: int, bytes_per_token: int, rest: int, cached: int
    ) -> float:
        """Predicted seconds of a restore of `l2_tokens` from L2 and `l3_tokens` from L3 and
        the prefill of the `rest` tokens after `cached` ones: their sum -- or, `layerwise`
        (spec/policies.md, "Pricing"), the S2H, then the larger of the H2D and the prefill,
        which runs on the prefix while it lands."""
        prefill = self.prefill_s(rest, cached)
        if not self.layerwise:
            return self.restore_s(l2_tokens, l3_tokens, bytes_per_token) + prefill
        s2h = 0.0
        if l3_tokens > 0:
            s2h = self.predict("s2h", l3_tokens * bytes_per_token)
        load_back = self.restore_s(l2_tokens + l3_tokens, 0, bytes_per_token)
        return s2h + max(load_back, prefill)

    def restore_cost(self, tier: str | Tier, tokens: int, bytes_per_token: int) -> float:
        """Predicted seconds to restore `tokens` tokens held in `tier` into L1.

        L2: one H2D. L3: S2H into L2, then H2D (serial; see `restore_s`).
        """
        if tier == Tier.L2:
            return self.restore_s(tokens, 0, bytes_per_token)
        if tier == Tier.L3:
            return self.restore_s(0, tokens, bytes_per_token)
        raise PolicyError(
            f"restore_cost: tier must be L2 or L3 (L1 needs no restore), got {tier!r}"
        )

    def state(self) -> dict[str, dict[str, object]]:
        """Every line's state, keyed by kind."""
        return {kind: line.state() for kind, line in self.lines.items()}
