"""`ModelProducer`: real prefill compute -- the Qwen3 architecture at real shapes, random weights.

Recompute is what a restore has to beat, so the cost must be the real one: the Hugging Face
`transformers` Qwen3 classes at the published shapes, with weights drawn from `torch.manual_seed`
(nothing is downloaded; the FLOPs and launches are those of the real model, the tokens' meaning
is not). `transformers` is optional: it is imported when a producer is built.

One `produce(tokens, start, end, ...)`:

    l1[:, :, prefix_pages] --gather--> per layer [1, kv_heads, start, head_dim] --> DynamicCache
    model(tokens[start:end], positions start..end-1, cache, last-token logits only)
    the KV each layer appended for the new tokens --> l1[:, :, new_pages]

so the new tokens attend to the cached prefix exactly as in one full prefill of tokens[:end]
(tests check: equal up to rounding). Only the last token's logits are computed, as a serving
engine's prefill does. The new KV is taken from the cache's `update` calls (a recording
subclass of `DynamicCache`), which every recent 4.x and 5.x release routes the KV through.

Modes (`mode=`):

| mode | what runs | one-time setup (not in the returned seconds) |
| --- | --- | --- |
| `eager` | the model as is (default) | none |
| `compile` | `torch.compile(model)` | compiling, at the first call of a shape |
| `graphs` | a CUDA graph per (start, end); CUDA only | capturing, at the first call of a shape |

`graphs` keeps at most `GRAPHS_MAX` captured shapes (least recently used is dropped); each holds
the activations and the KV of its shape in its own memory pool.

Captures are lazy: the first `produce` of a shape captures it, in the middle of serving, while
the transfer engine has work in flight. What may run meanwhile is the contract of
`hicache.dataplane.capture`: the capture runs in a capture window (garbage collected first, the
collector off until the end, finalizers that call CUDA deferred), in thread-local capture mode,
so L3 I/O threads and queued DMAs go on undisturbed. The caller must not issue or poll
transfers from another thread during `produce` (the data plane is single-threaded anyway).
Without the window, a collection inside the capture can unregister a dropped controller's
pinned L2 pool there, which invalidates the capture (`cudaErrorStreamCaptureInvalidated`).

Layer-wise (`compute_kv`, spec/restore.md "Layer-wise load-back"): the prefix is still landing
in L1, layer by layer, and `gate.wait(l)` says when layer `l` is there. In a graph, the KV
cache holds one buffer per layer for the prefix, each filled from L1 just before that layer's
attention reads it (a hook in the recording cache's `update`), after the layer's wait: layer
`l` computes while later layers still land.

    graphs    a second graph per (start, end, L1 tensor) runs the hook inside the capture:
              per layer, a wait on an external event (`torch.cuda.Event(external=True)`, a
              wait node in the graph) and the gather from L1 at the pages of a static index;
              before each replay, a side stream waits on the gate's layer `l` and records
              event `l`; with `gate_layers` K > 1, a wait per group of K layers only, at the
              group's first layer, for its last (`group_ends`: layers land in order)
    eager,    every layer waited for on the stream (no host block), then the usual forward:
    compile   launch-bound, the host's launches overlap the landing anyway, and a hook per
              layer cost more than it saved (Qwen3-8B eager, 350 tokens, H100: 62.6 ms
              against 36.1 for the whole forward on a landed prefix)
"""

from __future__ import annotations

import functools
import importlib
import inspect
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from hicache.dataplane.capture import capture
from hicache.dataplane.geometry import PRESETS as GEOMETRY_PRESETS
from hicache.dataplane.geometry import KVGeometry
from hicache.dataplane.handles import LayerGate
from hicache.dataplane.ownstreams import lend
from hicache.dataplane.pools import TORCH_DTYPES, resolve_device
from hicache.errors import ConfigError, ProducerError
from hicache.producers.base import (
    PageIndex,
    check_produce_args,
    gather_prefix,
    normalize_device,
    seconds_since,
    synchronize,
    write_pages,
)

MODES = ("eager", "compile", "graphs")
GRAPHS_MAX = 8  # captured (start, end) shapes kept alive at once
GRAPH_WARMUP_RUNS = 2  # eager runs on a side stream before a capture (lazy library init)
PARAMETER_DTYPES = ("bf16", "fp16", "fp32")  # fp8 KV would need a quantising write

KVPair = tuple[torch.Tensor, torch.Tensor]  # one layer's K and V


@dataclass(frozen=True)
class Qwen3Shape:
    """The sizes of one Qwen3 model (all counts; `head_dim` in elements)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tie_embeddings: bool = False
    rope_theta: float = 1_000_000.0
    max_positions: int = 40_960


MODEL_PRESETS: dict[str, Qwen3Shape] = {
    "qwen3-8b": Qwen3Shape(4096, 36, 32, 8, 128, 12288, 151_936, tie_embeddings=False),
    "qwen3-4b": Qwen3Shape(2560, 36, 32, 8, 128, 9728, 151_936, tie_embeddings=True),
    # Matches the `tiny` KV geometry (2 layers, 2 KV heads, head_dim 16); runs on a CPU.
    "tiny": Qwen3Shape(64, 2, 4, 2, 16, 128, 256, max_positions=4096),
}


def import_transformers() -> Any:
    """The `transformers` module, or ConfigError saying how to install it."""
    try:
        return importlib.import_module("transformers")
    except ImportError:
        raise ConfigError(
            "producer",
            "the model producer runs Hugging Face transformers' Qwen3 classes: "
            "pip install 'transformers>=4.51' (or use the synthetic producer)",
        ) from None


def _recording_cache_type(dynamic_cache: Any) -> Any:
    """A `DynamicCache` subclass that also keeps, per layer, the KV of its latest `update`."""

    class RecordingCache(dynamic_cache):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.new_kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
            # Called with the layer before its update reads the cached prefix (layer-wise).
            self.before_layer: Callable[[int], None] | None = None

        def update(
            self, key: torch.Tensor, value: torch.Tensor, layer: int, *args: Any, **kwargs: Any
        ) -> Any:
            if self.before_layer is not None:
                self.before_layer(layer)
            self.new_kv[layer] = (key, value)
            return super().update(key, value, layer, *args, **kwargs)

    return RecordingCache


@dataclass
class _Captured:
    """One CUDA graph of a prefill shape and the static tensors it reads and writes."""

    graph: Any  # torch.cuda.CUDAGraph
    input_ids: torch.Tensor  # [1, new tokens], filled before each replay
    prefix: list[KVPair]  # per layer, what the captured cache reads
    new_kv: dict[int, KVPair] = field(default_factory=dict)
    # Layer-wise only: the prefix pages the graph gathers from L1 itself, filled before replay.
    prefix_pages: torch.Tensor | None = None


class ModelProducer:
    """Prefill with a randomly initialised Qwen3 (see the module docstring).

    `preset_or_shape`: a name in `MODEL_PRESETS` or a `Qwen3Shape`. `dtype`: the parameter and
    KV dtype (default: the preset geometry's, bf16 for the Qwen3 presets, fp32 for `tiny`).
    `page_size`: default the preset geometry's, else 16. ConfigError at construction for an
    unknown preset or mode, fp8, `graphs` without CUDA, or transformers missing."""

    def __init__(
        self,
        preset_or_shape: str | Qwen3Shape,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        *,
        mode: str = "eager",
        page_size: int | None = None,
        seed: int = 0,
        gate_layers: int = 1,
    ) -> None:
        self.shape, self.geometry = _resolve(preset_or_shape, dtype, page_size)
        if not isinstance(gate_layers, int) or not 1 <= gate_layers <= self.shape.layers:
            raise ConfigError(
                "producer.gate_layers",
                f"an integer in [1, {self.shape.layers}] (layers per wait of a layer-wise "
                f"graph), got {gate_layers!r}",
            )
        self.gate_layers = gate_layers
        self._gate_ends = group_ends(self.shape.layers, gate_layers)  # the layers a replay hands on
        self.device = normalize_device(resolve_device(device))
        self.dtype = TORCH_DTYPES[self.geometry.dtype]
        if mode not in MODES:
            raise ConfigError("producer.mode", f"one of {MODES}, got {mode!r}")
        if mode == "graphs" and self.device.type != "cuda":
            raise ConfigError("producer.mode", "'graphs' captures CUDA graphs: needs a cuda device")
        self.mode = mode
        tf = import_transformers()
        self._cache_type = _recording_cache_type(tf.DynamicCache)
        self.model = _build_model(tf, self.shape, self.device, self.dtype, seed)
        params = inspect.signature(self.model.forward).parameters
        # transformers 5.2x renamed `past_key_values` to `cache`; ask the installed version.
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._call: Any = torch.compile(self.model) if mode == "compile" else self.model
        self._warm: set[tuple[int, int]] = set()  # compile: shapes already compiled
        self._graphs: OrderedDict[tuple[int, int], _Captured] = OrderedDict()
        # Layer-wise graphs (`compute_kv`): one external event per layer, waited on inside the
        # graph; a side stream hands each layer's landing on to it; graphs by (start, end, L1).
        self._gated: list[torch.cuda.Event] | None = None
        self._forwarder: torch.cuda.Stream | None = None
        self._side: torch.cuda.Stream | None = None
        self._gated_graphs: OrderedDict[tuple[int, int, int], _Captured] = OrderedDict()
        if mode == "graphs":
            try:  # an external event is a wait node inside a captured graph (torch >= 2.5)
                self._gated = [
                    torch.cuda.Event(external=True)  # type: ignore[no-untyped-call]
                    for _ in range(self.shape.layers)
                ]
            except TypeError:  # older torch: computed on a landing prefix eagerly instead
                self._gated = None
            self._forwarder = lend(self, self.device)  # never one the movers hold

    def stream_ids(self) -> dict[str, int]:
        """The torch ids of the streams a layer-wise prefill runs on, for a run's record: the
        caller's (where the graph replays) and the forwarder (graphs mode only)."""
        ids = {"caller": int(torch.cuda.current_stream(self.device).stream_id)}
        if self._forwarder is not None:
            ids["forwarder"] = int(self._forwarder.stream_id)
        return ids

    @property
    def parameters(self) -> int:
        """Number of model parameters (tied embeddings counted once)."""
        return sum(p.numel() for p in self.model.parameters())

    def produce(
        self,
        tokens: Sequence[int],
        start: int,
        end: int,
        l1: torch.Tensor,
        prefix_pages: PageIndex,
        new_pages: PageIndex,
    ) -> float:
        """Prefill `tokens[start:end]` on the prefix KV in `prefix_pages`; write the new KV into
        `new_pages` (only there). Returns the steady seconds (gather, forward, write), after
        any one-time compile or capture for this shape. ProducerError for bad arguments."""
        prefix, new = check_produce_args(
            self.geometry, self.device, tokens, (start, end), l1, (prefix_pages, new_pages)
        )
        ids = _token_ids(tokens, start, end, self.shape.vocab)
        with torch.no_grad():
            self._setup(ids, start, l1, prefix)
            started_s = time.perf_counter()
            kv = self._forward(ids, start, gather_prefix(l1, prefix))
            write_pages(l1, new, kv)
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
        """`LayerwiseProducer.compute_kv`: the new tokens' KV, each layer's prefix read from
        L1 only after `gate.wait(layer)` -- when that layer's attention needs it, so layer
        `l` computes while later layers still land (module docstring, "Layer-wise");
        `wait=False`: queued on the caller's stream, the host's seconds."""
        prefix, _ = check_produce_args(
            self.geometry, self.device, tokens, (start, end), l1, (prefix_pages, None)
        )
        if gate.layers != self.shape.layers:
            raise ProducerError("gate", f"{gate.layers} layers, the model has {self.shape.layers}")
        ids = _token_ids(tokens, start, end, self.shape.vocab)
        with torch.no_grad():
            if self.mode == "graphs" and self._gated is not None:
                self._setup_gated(ids, start, l1)
                started_s = time.perf_counter()
                kv = self._replay_gated(ids, start, l1, prefix, gate)
            else:  # every layer on the stream first: the host's launches overlap the landing
                if self.mode != "eager":  # compile, capture: then a sync, the landing's too
                    self._setup(ids, start, l1, prefix)
                started_s = time.perf_counter()
                for layer in range(gate.layers):
                    gate.wait(layer)  # R83: a stream wait; the prefix is read after the last
                kv = self._forward(ids, start, gather_prefix(l1, prefix))
            if not wait:
                return kv, time.perf_counter() - started_s
            return kv, seconds_since(self.device, started_s)

    def expected(self, tokens: Sequence[int], start: int, end: int) -> torch.Tensor | None:
        """None: a model's bytes depend on kernels and rounding; compare with allclose."""
        return None

    # -- layer-wise ---------------------------------------------------------------------------

    def _setup_gated(self, ids: list[int], start: int, l1: torch.Tensor) -> None:
        """Capture, once per (start, end, L1), a graph that gathers each layer's prefix from
        L1 itself after waiting on that layer's external event (outside the timed region)."""
        key = (start, start + len(ids), l1.data_ptr())
        graphs = self._gated_graphs
        if key not in graphs:
            if len(graphs) >= GRAPHS_MAX:
                graphs.popitem(last=False)
            graphs[key] = self._capture(start, len(ids), l1)
            synchronize(self.device)  # only after a capture: a sync would wait for the landing
        graphs.move_to_end(key)

    def _replay_gated(
        self, ids: list[int], start: int, l1: torch.Tensor, prefix: torch.Tensor, gate: LayerGate
    ) -> torch.Tensor:
        """Hand each layer's landing on to the graph's external events, then replay."""
        assert self._gated is not None and self._forwarder is not None, "graphs with events"
        captured = self._gated_graphs[(start, start + len(ids), l1.data_ptr())]
        assert captured.prefix_pages is not None, "a gated capture gathers its own prefix"
        captured.input_ids.copy_(torch.tensor([ids], dtype=torch.int64), non_blocking=True)
        captured.prefix_pages.copy_(prefix, non_blocking=True)
        main = torch.cuda.current_stream(self.device)
        self._forwarder.wait_stream(main)
        with torch.cuda.stream(self._forwarder):
            for layer in self._gate_ends:
                gate.wait(layer)  # the forwarder waits for the layer, then marks the graph's event
                self._gated[layer].record(self._forwarder)
        captured.graph.replay()
        return self._stack(captured.new_kv)

    def _setup(self, ids: list[int], start: int, l1: torch.Tensor, prefix: torch.Tensor) -> None:
        """One-time work for this (start, end) shape, outside the timed region."""
        key = (start, start + len(ids))
        if self.mode == "compile" and key not in self._warm:
            self._forward(ids, start, gather_prefix(l1, prefix))  # compiles; result unused
            self._warm.add(key)
        if self.mode == "graphs" and key not in self._graphs:
            if len(self._graphs) >= GRAPHS_MAX:
                self._graphs.popitem(last=False)
            self._graphs[key] = self._capture(start, len(ids))
        if key in self._graphs:
            self._graphs.move_to_end(key)
        synchronize(self.device)

    def _forward(self, ids: list[int], start: int, prefix_kv: torch.Tensor) -> torch.Tensor:
        """Token-major KV `[K/V, layer, len(ids), kv_head, head_dim]` of the new tokens, given
        the prefix KV (token-major, `start` tokens)."""
        if self.mode == "graphs":
            captured = self._graphs[(start, start + len(ids))]
            captured.input_ids.copy_(torch.tensor([ids], dtype=torch.int64), non_blocking=True)
            for layer, (k, v) in enumerate(captured.prefix):
                k.copy_(prefix_kv[0, layer].transpose(0, 1).unsqueeze(0))
                v.copy_(prefix_kv[1, layer].transpose(0, 1).unsqueeze(0))
            captured.graph.replay()
            return self._stack(captured.new_kv)
        cache, _ = self._cache_from(prefix_kv)
        # Up without a stream sync (a list made on the device directly waits for the stream).
        input_ids = torch.tensor([ids], dtype=torch.int64).to(self.device, non_blocking=True)
        self._run(cache, input_ids, start)
        return self._stack(cache.new_kv)

    def _cache_from(self, prefix_kv: torch.Tensor) -> tuple[Any, list[KVPair]]:
        """A recording cache holding the prefix, and per layer the tensors it holds (which a
        captured graph reads). Every layer is filled, with 0 tokens when there is no prefix,
        so the cache's lazy initialisation never happens inside a capture."""
        cache = self._cache_type()
        held = []
        for layer in range(self.shape.layers):
            k = prefix_kv[0, layer].transpose(0, 1).unsqueeze(0)  # [1, heads, tokens, dim]
            v = prefix_kv[1, layer].transpose(0, 1).unsqueeze(0)
            keys, values = cache.update(k, v, layer)
            held.append((keys, values))
        cache.new_kv.clear()
        return cache, held

    def _run(self, cache: Any, input_ids: torch.Tensor, start: int) -> None:
        """One forward of the new tokens at positions start, start+1, ... on `cache`."""
        n = input_ids.shape[1]
        positions = torch.arange(start, start + n, dtype=torch.int64, device=self.device)
        self._call(
            input_ids=input_ids,
            position_ids=positions.unsqueeze(0),
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kw: cache},
        )

    def _stack(self, new_kv: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Per-layer K and V `[1, kv_heads, n, head_dim]` as token-major `[2, layers, n, heads,
        dim]`."""
        # Verify every layer's KV went through the cache: a transformers version that bypassed
        # `Cache.update` would otherwise leave pages unwritten.
        if sorted(new_kv) != list(range(self.shape.layers)):
            raise ProducerError(
                "transformers",
                f"KV of layers {sorted(new_kv)} reached the cache, expected all "
                f"{self.shape.layers}; this transformers version is not supported (try >=4.51)",
            )
        keys = torch.stack([new_kv[layer][0][0] for layer in range(self.shape.layers)])
        values = torch.stack([new_kv[layer][1][0] for layer in range(self.shape.layers)])
        return torch.stack([keys, values]).transpose(2, 3)

    def _capture(self, start: int, n: int, l1: torch.Tensor | None = None) -> _Captured:
        """Capture one prefill of `n` tokens after a `start`-token prefix as a CUDA graph
        (in a capture window: see the module docstring). With `l1` (layer-wise), the graph
        gathers each layer's prefix from `l1` at the pages of its `prefix_pages` tensor,
        after waiting on that layer's external event (`_gated`)."""
        s = self.shape
        input_ids = torch.zeros((1, n), dtype=torch.int64, device=self.device)
        empty = torch.zeros(
            (2, s.layers, start, s.kv_heads, s.head_dim), dtype=self.dtype, device=self.device
        )
        pages = None
        if l1 is not None:
            pages = torch.zeros(start // self.geometry.page_size, dtype=torch.int64)
            pages = pages.to(self.device)
        if self._side is None:  # the warm-up's stream, lent once
            self._side = lend(self, self.device)
        side = self._side
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(GRAPH_WARMUP_RUNS):
                warm_cache, _ = self._cache_from(empty)
                self._run(warm_cache, input_ids, start)
        torch.cuda.current_stream(self.device).wait_stream(side)
        cache, held = self._cache_from(empty)
        if l1 is not None and pages is not None and self._gated is not None:
            gate = _EventsGate(self._gated, self.device, self.gate_layers)
            cache.before_layer = functools.partial(_fill_layer, l1, pages, held, gate)
        graph = torch.cuda.CUDAGraph()
        capture(graph, lambda: self._run(cache, input_ids, start))
        return _Captured(graph, input_ids, held, dict(cache.new_kv), pages)


def group_ends(layers: int, every: int) -> list[int]:
    """The last layer of each group of `every` layers (the last group may be shorter): the
    layers a gated graph waits for (spec/restore.md, "Layer-wise load-back": layers land in
    order, so the last layer of a group landed means the whole group did)."""
    return [group_end(first, every, layers) for first in range(0, layers, every)]


def group_end(layer: int, every: int, layers: int) -> int:
    """The last layer of `layer`'s group of `every` (of `layers`): the one its wait is for."""
    return min(layer - layer % every + every, layers) - 1


class _EventsGate:
    """A gate over a graph's own external events (what a gated capture waits on). With
    `every` > 1 layers are waited for in groups: a group's first layer waits on the event of
    the group's last layer (`group_ends`), the group's other layers wait for nothing more."""

    def __init__(self, events: list[torch.cuda.Event], device: torch.device, every: int) -> None:
        self.layers = len(events)
        self.landed_layers = 0
        self._events, self._device, self._every = events, device, every

    def wait(self, layer: int) -> None:
        if layer < self.landed_layers:
            return  # its group's wait came first
        last = group_end(layer, self._every, self.layers)
        self.landed_layers = last + 1
        torch.cuda.current_stream(self._device).wait_event(self._events[last])


def _fill_layer(
    l1: torch.Tensor, prefix: torch.Tensor, held: list[KVPair], gate: LayerGate, layer: int
) -> None:
    """Wait for `layer` of the prefix to land (`gate`), then copy it from L1's `prefix`
    pages into the cache's buffers `held[layer]` (`[1, kv_heads, tokens, head_dim]` each)."""
    gate.wait(layer)  # R83: the layer is read only once it landed
    k, v = held[layer]
    if k.shape[2] == 0:
        return
    kv = l1[:, layer].index_select(1, prefix).flatten(1, 2)  # [2, tokens, heads, dim]
    k.copy_(kv[0].transpose(0, 1).unsqueeze(0))
    v.copy_(kv[1].transpose(0, 1).unsqueeze(0))


def _resolve(
    preset_or_shape: str | Qwen3Shape, dtype: torch.dtype | None, page_size: int | None
) -> tuple[Qwen3Shape, KVGeometry]:
    """The model shape and its KV geometry, from a preset name or an explicit shape."""
    if isinstance(preset_or_shape, Qwen3Shape):
        shape, base = preset_or_shape, None
    elif preset_or_shape in MODEL_PRESETS:
        shape, base = MODEL_PRESETS[preset_or_shape], GEOMETRY_PRESETS.get(preset_or_shape)
    else:
        raise ConfigError(
            "producer.preset", f"one of {sorted(MODEL_PRESETS)}, got {preset_or_shape!r}"
        )
    names = {v: k for k, v in TORCH_DTYPES.items()}
    name = names.get(dtype) if dtype is not None else (base.dtype if base is not None else "bf16")
    if name not in PARAMETER_DTYPES:
        raise ConfigError("producer.dtype", f"one of bf16, fp16, fp32 (torch dtypes), got {dtype}")
    if shape.heads % shape.kv_heads:
        raise ConfigError(
            "producer.shape", f"heads {shape.heads} must be a multiple of kv_heads {shape.kv_heads}"
        )
    ps = page_size if page_size is not None else (base.page_size if base is not None else 16)
    geometry = KVGeometry(shape.layers, shape.kv_heads, shape.head_dim, dtype=name, page_size=ps)
    return shape, geometry


def _build_model(
    tf: Any, shape: Qwen3Shape, device: torch.device, dtype: torch.dtype, seed: int
) -> Any:
    """`Qwen3ForCausalLM` with seeded random weights, created directly on `device` in `dtype`."""
    config = tf.Qwen3Config(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.max_positions,
        rope_theta=shape.rope_theta,
        tie_word_embeddings=shape.tie_embeddings,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    # Why the default dtype: parameters are then created in `dtype` on `device` directly, so an
    # 8 B model never exists as a 32 GB fp32 copy on the host.
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = tf.Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    model.eval()
    model.requires_grad_(False)
    return model


def _token_ids(tokens: Sequence[int], start: int, end: int, vocab: int) -> list[int]:
    """tokens[start:end] as ints; ProducerError if one is not a token id of the model."""
    ids = [int(t) for t in tokens[start:end]]
    bad = [t for t in ids if not 0 <= t < vocab]
    # Verify the ids index the embedding table (an out-of-range id is a device-side assert on CUDA).
    if bad:
        raise ProducerError("tokens", f"ids must lie in [0, {vocab}), got {bad[:8]}")
    return ids
