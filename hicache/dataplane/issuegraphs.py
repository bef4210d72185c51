"""Captured issue: an issue's index upload and kernel launches replayed as one CUDA graph.

Why. At 350 tokens of Qwen3-8B (22 pages, ~1 ms of DMA) the D2H's DMA cannot start before
the issuing call has uploaded the indices and launched the gather, and each of those calls
costs the issuing thread far more than its device time (one H100 host: the mover at 63.5%
of one pinned copy with 0.59 ms of issue; the same upload and gather replayed as one graph,
then the same DMA, 94.2% with 0.12 ms; benchmarks/graph_issue.py,
benchmarks/results/2026-12-06-session16-h100/).

Users: the single-pool mover (dma.py) for a one-chunk D2H -- the upload and the gather of
`packed[lo:hi]` from L1 -- and the group mover (grouptransfer.py) for a transfer of one stage
-- the operand upload and every pool's gather, or every pool's scatter after the DMAs. What
is captured is exactly the eager work, from the pinned buffer the issue has just filled. A
graph records addresses, so it is keyed by every address and length that work reads or
writes (`GraphKey`, or the group mover's key): it is replayed only for a transfer whose
borrowed buffers sit at those addresses, and then moves that transfer's bytes -- the
indices are read from the pinned buffer when the replay runs, not when it was captured. In a
steady loop the workspace cache hands the same buffers back, so a shape is captured once.
A key seen for the first time runs eagerly (which also loads the kernel); the second sight
captures, on a private stream, in a capture window that defers finalizers and holds the
collector without collecting (capture.py), and replays. A capture that fails turns the
graphs off for this mover (the reason is kept in `status`) and the transfer runs eagerly;
nothing was enqueued by the failed capture. At most GRAPHS_KEPT graphs are kept (all dropped
when full, as plans are).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable
from typing import NamedTuple

import torch

from hicache.dataplane.capture import CAPTURE_ERROR_MODE, capture_window
from hicache.dataplane.ownstreams import lend

ENV = "HICACHE_ISSUE_GRAPHS"  # "0": never capture (the eager issue everywhere)
CAPTURE_AT = 2  # the sight of a key that captures it (the first runs eagerly)
GRAPHS_KEPT = 64


class GraphKey(NamedTuple):
    """Every address and length a single-pool D2H's captured work touches."""

    index_host: int  # data_ptr of the upload's source (pinned)
    index_device: int  # data_ptr of the upload's target
    index_len: int  # entries uploaded
    index_at: int  # where the chunk's indices start in the device index buffer
    packed: int  # data_ptr of the packed buffer (a mapped D2H: of the L2 pool)
    pages: int  # pages gathered: packed[0:pages] (mapped: written to L2)
    mapped: bool = False  # the mapped copy (dma.py) rather than the gather into packed


class IssueGraphs:
    """The captured issues of one mover (module docstring); `enabled` None: on unless
    HICACHE_ISSUE_GRAPHS=0. Off the GPU nothing is ever captured."""

    def __init__(self, device: torch.device, *, enabled: bool | None = None) -> None:
        if enabled is None:
            enabled = os.environ.get(ENV, "1") != "0"
        self.enabled = enabled and device.type == "cuda"
        self.reason = (
            "captured per shape"
            if self.enabled
            else ("off: CPU" if device.type != "cuda" else f"off ({ENV}=0 or issue_graphs=False)")
        )
        self._device = device
        self._stream: torch.cuda.Stream | None = None
        self._graphs: dict[Hashable, torch.cuda.CUDAGraph] = {}
        self._seen: dict[Hashable, int] = {}
        self.captures = 0
        self.replays = 0

    def run(self, key: Hashable, work: Callable[[], None]) -> bool:
        """Replay `key`'s graph on the current stream (capturing it first on its second
        sight); False when the caller must run `work` itself (first sight, graphs off, or
        a failed capture). `key` must name every address and length `work` touches and
        every value its launches bake in: a replay repeats the captured calls exactly."""
        if not self.enabled:
            return False
        graph = self._graphs.get(key)
        if graph is None:
            seen = self._seen.get(key, 0) + 1
            if seen < CAPTURE_AT:
                if len(self._seen) >= GRAPHS_KEPT:
                    self._seen.clear()
                self._seen[key] = seen
                return False
            self._seen.pop(key, None)
            graph = self._capture(work)
            if graph is None:
                return False
            if len(self._graphs) >= GRAPHS_KEPT:
                self._graphs.clear()
            self._graphs[key] = graph
        graph.replay()
        self.replays += 1
        return True

    def _capture(self, work: Callable[[], None]) -> torch.cuda.CUDAGraph | None:
        if self._stream is None:
            self._stream = lend(self, self._device)  # nobody else enqueues while it captures
        graph = torch.cuda.CUDAGraph()
        try:
            with capture_window(collect=False), torch.cuda.stream(self._stream):
                graph.capture_begin(capture_error_mode=CAPTURE_ERROR_MODE)
                try:
                    work()
                finally:
                    graph.capture_end()
        except RuntimeError as e:  # the capture was refused: never again for this mover
            self.enabled, self.reason = False, f"off: a capture failed ({e})"
            self._graphs.clear()
            return None
        self.captures += 1
        return graph

    def status(self) -> dict[str, object]:
        return {
            "reason": self.reason,
            "graphs": len(self._graphs),
            "captures": self.captures,
            "replays": self.replays,
        }
