"""Backend choice: the `gather`/`scatter` entry points and `KernelSet`, the per-geometry pick.

    requested   on CUDA                                  on CPU
    ---------   --------------------------------------   ------------------------------------
    "torch"     torch                                    torch
    "triton"    probe must compile, run, match torch     needs TRITON_INTERPRET=1, else raises
    "auto"      probe, time both, pick per direction     torch (the interpreter, if enabled, is
                (Triton failing -> torch, reason says)    verified but too slow to pick)

The `auto` rule keeps Triton for gather if its time is at most 1.05x
torch's, for scatter if at most 1.02x. Times are device times (CUDA events, medians).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch

from hicache.errors import BackendError, ConfigError, LayoutError
from hicache.kernels.launch import on_stream
from hicache.kernels.reference import check_l1, copy_mapped_torch, gather_torch, scatter_torch

BACKENDS = ("triton", "torch")
REQUESTS = ("auto", *BACKENDS)
GATHER_TOLERANCE = 1.05  # Triton kept for gather while t_triton <= 1.05 * t_torch
SCATTER_TOLERANCE = 1.02  # ... and for scatter while t_triton <= 1.02 * t_torch
PROBE_REPS = 20  # timed calls per (backend, direction); the median is used
PROBE_WARMUP = 3
PROBE_PAGES_INTERPRETED = 2  # the interpreter runs every program in Python: keep it tiny
POISON_BYTE = 0xA5  # fills probe outputs, so bytes a kernel forgot to write show up


def load_triton() -> ModuleType:
    """The Triton kernels module; BackendError if Triton cannot be imported."""
    try:
        from hicache.kernels import triton_rows
    except ImportError as exc:
        raise BackendError(
            f"triton is not importable ({exc}); install triton or use backend 'torch'"
        ) from exc
    return triton_rows


def gather(
    l1: torch.Tensor,
    pages: torch.Tensor,
    out: torch.Tensor,
    *,
    backend: str = "triton",
    stream: torch.cuda.Stream | None = None,
) -> None:
    """out[i, kv, l] = l1[kv, l, pages[i]] for every i, kv, l; enqueued on `stream` (default:
    the current stream).

    pages: 1-D int32/int64 on l1's device, values in [0, num_pages) (may repeat).
    out: contiguous [len(pages), 2, layers, page_size, kv_heads, head_dim], l1's dtype.
    Raises LayoutError (a ValueError) on a shape/dtype/device mismatch, BackendError if the
    backend cannot run, ConfigError for an unknown backend name.
    """
    _copy("gather", backend, l1, pages, out, stream)


def scatter(
    packed: torch.Tensor,
    pages: torch.Tensor,
    l1: torch.Tensor,
    *,
    backend: str = "triton",
    stream: torch.cuda.Stream | None = None,
) -> None:
    """l1[kv, l, pages[i]] = packed[i, kv, l]; the mirror of `gather`. Pages must be distinct;
    rows of other pages are untouched."""
    _copy("scatter", backend, packed, pages, l1, stream)


def _copy(
    direction: str,
    backend: str,
    a: torch.Tensor,
    pages: torch.Tensor,
    b: torch.Tensor,
    stream: torch.cuda.Stream | None,
) -> None:
    """Run one backend's copy on `stream`: Triton takes the stream as an argument; torch ops
    run on the current stream, so for them it is made current around the call."""
    if backend == "triton":
        triton_rows = load_triton()
        copy = triton_rows.gather_rows if direction == "gather" else triton_rows.scatter_rows
        copy(a, pages, b, stream=stream)
    elif backend == "torch":
        with on_stream(stream):
            (gather_torch if direction == "gather" else scatter_torch)(a, pages, b)
    else:
        raise ConfigError("kernels.backend", f"one of {BACKENDS}, got {backend!r}")


@dataclass(frozen=True)
class KernelSet:
    """The backends chosen for one KV geometry, and why (`reason`: times, or a fallback cause)."""

    gather_backend: str
    scatter_backend: str
    reason: str

    @classmethod
    def create(
        cls, l1: torch.Tensor, requested: str = "auto", *, probe_pages: int = 64
    ) -> KernelSet:
        """Choose backends for `l1`'s geometry (see the module table).

        The probe reads `probe_pages` random pages of `l1` (never writes it) and scatters
        into a scratch pool of the same geometry; while it runs it holds about
        4 * probe_pages pages of device memory, and it synchronizes the device.
        """
        if requested not in REQUESTS:
            raise ConfigError("kernels.backend", f"one of {REQUESTS}, got {requested!r}")
        if probe_pages < 1:
            raise ConfigError("kernels.probe_pages", f"at least 1, got {probe_pages}")
        check_l1(l1)
        if l1.shape[2] == 0:
            raise LayoutError("l1: the pool has no pages; nothing to probe or move")
        if requested == "torch":
            return cls("torch", "torch", "torch requested")
        on_gpu = l1.device.type == "cuda"
        probe_pages = probe_pages if on_gpu else min(probe_pages, PROBE_PAGES_INTERPRETED)
        if requested == "triton":
            load_triton().check_runnable(l1.device)
            probe = _Probe.build(l1, probe_pages)
            probe.verify_triton()
            chosen = cls("triton", "triton", f"triton requested; {probe.summary}")
        else:
            chosen = cls._auto(l1, probe_pages)
        if "triton" in (chosen.gather_backend, chosen.scatter_backend):
            try:
                _prebuild(l1)
            except BackendError as exc:
                if requested == "triton":
                    raise
                return cls("torch", "torch", f"auto: Triton unusable, falling back to torch: {exc}")
        return chosen

    @classmethod
    def _auto(cls, l1: torch.Tensor, probe_pages: int) -> KernelSet:
        try:
            triton_rows = load_triton()
        except BackendError as exc:
            return cls("torch", "torch", f"auto: {exc}")
        if l1.device.type != "cuda" and not triton_rows.interpreter_enabled():
            return cls(
                "torch",
                "torch",
                f"auto on {l1.device.type}: Triton runs on CPU tensors "
                f"only with TRITON_INTERPRET=1, which is not set; using torch",
            )
        try:
            triton_rows.check_runnable(l1.device)
            probe = _Probe.build(l1, probe_pages)
            probe.verify_triton()
        except BackendError as exc:
            return cls("torch", "torch", f"auto: Triton unusable, falling back to torch: {exc}")
        if l1.device.type != "cuda":
            return cls(
                "torch",
                "torch",
                f"auto on {l1.device.type}: the interpreted Triton "
                f"kernels ran ({probe.summary}), but interpreted Triton is far slower "
                f"than torch; using torch",
            )
        times = probe.time_backends()
        gather_pick = _pick(times, "gather", GATHER_TOLERANCE)
        scatter_pick = _pick(times, "scatter", SCATTER_TOLERANCE)
        timing = ", ".join(f"{key} {ms:.4f} ms" for key, ms in times.items())
        return cls(
            gather_pick,
            scatter_pick,
            f"auto on {probe.pages.numel()} random pages ({probe.summary}): {timing}; "
            f"gather -> {gather_pick} (triton if <= {GATHER_TOLERANCE}x torch), "
            f"scatter -> {scatter_pick} (triton if <= {SCATTER_TOLERANCE}x torch)",
        )

    def gather(
        self,
        l1: torch.Tensor,
        pages: torch.Tensor,
        out: torch.Tensor,
        *,
        stream: torch.cuda.Stream | None = None,
    ) -> None:
        gather(l1, pages, out, backend=self.gather_backend, stream=stream)

    def scatter(
        self,
        packed: torch.Tensor,
        pages: torch.Tensor,
        l1: torch.Tensor,
        *,
        stream: torch.cuda.Stream | None = None,
    ) -> None:
        scatter(packed, pages, l1, backend=self.scatter_backend, stream=stream)

    def copy_mapped(
        self,
        l1: torch.Tensor,
        pages: torch.Tensor,
        pool: torch.Tensor,
        slots: torch.Tensor,
        *,
        to_pool: bool,
        stream: torch.cuda.Stream | None = None,
    ) -> None:
        """pool[slots[i], kv, l] = l1[kv, l, pages[i]] (`to_pool`; else the reverse) on
        `stream`: the gather's backend -- Triton's kernel (kernels/triton_mapped.py), which
        also addresses a pinned host pool in place, or torch's definition, for a pool on l1's
        device (`reference.copy_mapped_torch`)."""
        if self.gather_backend == "triton":
            load_mapped().copy_mapped(l1, pages, pool, slots, to_pool=to_pool, stream=stream)
        else:
            with on_stream(stream):
                copy_mapped_torch(l1, pages, pool, slots, to_pool=to_pool)


def load_mapped() -> ModuleType:
    """The mapped-copy Triton kernel's module; BackendError if Triton cannot be imported."""
    try:
        from hicache.kernels import triton_mapped
    except ImportError as exc:
        raise BackendError(
            f"triton is not importable ({exc}); install triton or use backend 'torch'"
        ) from exc
    return triton_mapped


def _prebuild(l1: torch.Tensor) -> None:
    """Compile every Triton variant transfers on `l1` can need, now rather than while issuing
    one (where loading a module would wait for the device); BackendError if that fails."""
    triton_rows = load_triton()
    try:
        triton_rows.prebuild(l1)
    except triton_rows.LAUNCH_FAILURES as exc:
        raise BackendError(
            f"Triton kernels for this pool failed to compile: "
            f"{type(exc).__name__}: {exc}; use backend 'torch'"
        ) from exc


def _pick(times: dict[str, float], direction: str, tolerance: float) -> str:
    fast_enough = times[f"{direction} triton"] <= tolerance * times[f"{direction} torch"]
    return "triton" if fast_enough else "torch"


@dataclass(frozen=True)
class _Probe:
    """Probe operands: random pages of the real L1 (read only) and a poisoned scratch pool."""

    l1: torch.Tensor
    pages: torch.Tensor  # distinct random pages of l1
    packed: torch.Tensor  # torch's gather of those pages: the expected bytes
    scratch: torch.Tensor  # [2, layers, k + 1, ...]: scatter target, poisoned first
    scratch_pages: torch.Tensor  # k distinct pages of scratch
    spared_page: int  # the scratch page no scatter writes: must stay poisoned

    @classmethod
    def build(cls, l1: torch.Tensor, probe_pages: int) -> _Probe:
        k = min(probe_pages, l1.shape[2])
        generator = torch.Generator().manual_seed(0)  # private: leaves the global RNG alone
        pages = torch.randperm(l1.shape[2], generator=generator)[:k].to(l1.device)
        packed = torch.empty((k, *l1.shape[:2], *l1.shape[3:]), dtype=l1.dtype, device=l1.device)
        gather_torch(l1, pages, packed)
        scratch_shape = (*l1.shape[:2], k + 1, *l1.shape[3:])
        scratch = _poisoned(torch.empty(scratch_shape, dtype=l1.dtype, device=l1.device))
        order = torch.randperm(k + 1, generator=generator)
        return cls(l1, pages, packed, scratch, order[:k].to(l1.device), int(order[k]))

    @property
    def summary(self) -> str:
        return f"probe of {self.pages.numel()} pages ran and matched torch"

    def verify_triton(self) -> None:
        """Run both Triton kernels once; BackendError if they fail or move wrong bytes."""
        triton_rows = load_triton()
        out = _poisoned(torch.empty_like(self.packed))
        triton_rows.gather_rows(self.l1, self.pages, out)
        if not _same_bytes(out, self.packed):
            raise BackendError("Triton gather probe produced bytes different from torch's")
        triton_rows.scatter_rows(self.packed, self.scratch_pages, self.scratch)
        back = torch.empty_like(self.packed)
        gather_torch(self.scratch, self.scratch_pages, back)
        spared = self.scratch[:, :, self.spared_page].reshape(-1).view(torch.uint8)
        if not (_same_bytes(back, self.packed) and bool((spared == POISON_BYTE).all())):
            raise BackendError("Triton scatter probe wrote bytes different from torch's")

    def time_backends(self) -> dict[str, float]:
        """Median device milliseconds of each (direction, backend); CUDA only. Timed on L1's
        device: the events and synchronizations of `cuda_median_ms` follow the current
        device, which for a rank on its second GPU (a TP rank's thread, say) is another."""
        out = torch.empty_like(self.packed)
        calls: dict[str, Callable[[], None]] = {}
        for backend in BACKENDS:
            calls[f"gather {backend}"] = _bind(gather, self.l1, self.pages, out, backend)
            calls[f"scatter {backend}"] = _bind(
                scatter, self.packed, self.scratch_pages, self.scratch, backend
            )
        with torch.cuda.device(self.l1.device):
            return {
                key: cuda_median_ms(call, reps=PROBE_REPS, warmup=PROBE_WARMUP)
                for key, call in calls.items()
            }


def _bind(
    fn: Callable[..., None], a: torch.Tensor, pages: torch.Tensor, b: torch.Tensor, backend: str
) -> Callable[[], None]:
    return lambda: fn(a, pages, b, backend=backend)


def cuda_median_ms(
    fn: Callable[[], None], *, reps: int, warmup: int, sync_each: bool = False
) -> float:
    """Median milliseconds of `fn` on the current CUDA stream, by CUDA events (the current
    device's: run it under `torch.cuda.device` of the tensors `fn` touches).

    sync_each=False queues all calls back to back, so each event pair brackets device time
    only; sync_each=True waits after every call, so launch latency is included.
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    spans = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        fn()
        end.record()
        if sync_each:
            end.synchronize()
        spans.append((start, end))
    torch.cuda.synchronize()
    times = sorted(float(start.elapsed_time(end)) for start, end in spans)
    return times[len(times) // 2]


def _poisoned(tensor: torch.Tensor) -> torch.Tensor:
    tensor.reshape(-1).view(torch.uint8).fill_(POISON_BYTE)
    return tensor


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))
