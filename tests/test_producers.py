"""KV producers: the synthetic one byte for byte, the model one against a full prefill.

The model tests need the optional `transformers` and are skipped without it; they run the
`tiny` preset on the CPU in fp32.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Sequence

import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hicache.dataplane.geometry import KVGeometry, preset
from hicache.dataplane.pools import torch_dtype
from hicache.errors import ConfigError, ProducerError
from hicache.producers import KVProducer, ModelProducer, SyntheticProducer
from hicache.producers.synthetic import prefix_hashes, value_scalar

TINY = preset("tiny")
DTYPES = ("bf16", "fp16", "fp32", "fp8")
L1_PAGES = 12
NO_PAGES = torch.tensor([], dtype=torch.int64)


def geometry(dtype: str) -> KVGeometry:
    return dataclasses.replace(TINY, dtype=dtype)


def poisoned_l1(g: KVGeometry) -> torch.Tensor:
    """An L1 whose every byte is 0x5A, so any write shows and any unwritten page can be checked."""
    shape = (2, g.layers, L1_PAGES, g.page_size, g.kv_heads, g.head_dim)
    l1 = torch.empty(shape, dtype=torch_dtype(g))
    l1.view(torch.uint8).fill_(0x5A)
    return l1


def pages(*ids: int) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.int64)


def packed(l1: torch.Tensor, page_ids: torch.Tensor) -> torch.Tensor:
    """Pages of `l1` in packed page-major order, as raw bytes (so fp8 and NaN compare exactly)."""
    return l1.index_select(2, page_ids).permute(2, 0, 1, 3, 4, 5).contiguous().view(torch.uint8)


def raw(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


TOKENS = [7, 3, 11, 2, 9, 4, 8, 1, 6, 5, 10, 12, 0, 13, 14, 15]


# ---------------------------------------------------------------- synthetic


def test_synthetic_is_a_kv_producer() -> None:
    assert isinstance(SyntheticProducer(TINY), KVProducer)


@pytest.mark.parametrize("dtype", DTYPES)
def test_synthetic_expected_is_what_produce_wrote_and_nothing_else(dtype: str) -> None:
    g = geometry(dtype)
    producer = SyntheticProducer(g)
    l1 = poisoned_l1(g)
    before = l1.clone()
    new = pages(9, 2, 5, 0)
    producer.produce(TOKENS, 0, 16, l1, NO_PAGES, new)
    assert torch.equal(packed(l1, new), raw(producer.expected(TOKENS, 0, 16)))
    untouched = pages(*(p for p in range(L1_PAGES) if p not in new.tolist()))
    assert torch.equal(packed(l1, untouched), packed(before, untouched))


@pytest.mark.parametrize("dtype", DTYPES)
def test_synthetic_is_deterministic(dtype: str) -> None:
    g = geometry(dtype)
    first = SyntheticProducer(g).expected(TOKENS, 0, 16)
    again = SyntheticProducer(g).expected(list(TOKENS), 0, 16)
    assert torch.equal(raw(first), raw(again))


@pytest.mark.parametrize("dtype", DTYPES)
def test_synthetic_chunked_equals_one_shot(dtype: str) -> None:
    g = geometry(dtype)
    producer = SyntheticProducer(g)
    l1 = poisoned_l1(g)
    producer.produce(TOKENS, 0, 16, l1, NO_PAGES, pages(0, 1, 2, 3))
    producer.produce(TOKENS, 0, 8, l1, NO_PAGES, pages(11, 4))
    producer.produce(TOKENS, 8, 16, l1, pages(11, 4), pages(7, 6))
    assert torch.equal(packed(l1, pages(0, 1, 2, 3)), packed(l1, pages(11, 4, 7, 6)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("changed", [0, 5, 8])
def test_synthetic_one_earlier_token_changes_every_later_page(dtype: str, changed: int) -> None:
    g = geometry(dtype)
    producer = SyntheticProducer(g)
    other = list(TOKENS)
    other[changed] += 1
    a = producer.expected(TOKENS, 0, 16)
    b = producer.expected(other, 0, 16)
    for p in range(16):
        page, slot = divmod(p, g.page_size)
        same = torch.equal(raw(a[page, :, :, slot]), raw(b[page, :, :, slot]))
        # Positions before the change keep their bytes; every later position's row differs.
        assert same == (p < changed), f"position {p}, token {changed} changed"


def test_synthetic_same_token_at_another_position_differs() -> None:
    producer = SyntheticProducer(TINY)
    a = producer.expected([5] * 8, 0, 8)
    assert not torch.equal(a[0, :, :, 0], a[0, :, :, 1])
    assert not torch.equal(a[0], a[1])


def test_synthetic_values_match_the_scalar_formula() -> None:
    # The vectorised int64 arithmetic must wrap exactly like the Python-int definition.
    g = TINY
    kv = SyntheticProducer(g).expected(TOKENS, 0, 16)
    hashes = prefix_hashes(TOKENS, 16)
    samples = [(0, 0, 0, 0, 0), (15, 1, 1, 1, 15), (6, 1, 0, 1, 3), (9, 0, 1, 0, 9)]
    for p, k, layer, head, dim in samples:
        element = ((k * g.layers + layer) * g.kv_heads + head) * g.head_dim + dim
        page, slot = divmod(p, g.page_size)
        assert float(kv[page, k, layer, slot, head, dim]) == value_scalar(hashes[p], element)


def test_synthetic_chunks_bound_memory_and_keep_bytes() -> None:
    # A chunk of one page must give the bytes of one chunk for the whole range.
    producer = SyntheticProducer(TINY)
    whole = producer.expected(TOKENS, 4, 16)
    producer._chunk_pages = 1
    assert torch.equal(producer.expected(TOKENS, 4, 16), whole)


@settings(max_examples=25, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 2**40), min_size=4, max_size=32),
    data=st.data(),
)
def test_synthetic_any_split_equals_expected(tokens: list[int], data: st.DataObject) -> None:
    g = TINY
    n_pages = len(tokens) // g.page_size
    split = data.draw(st.integers(0, n_pages - 1), label="split page")
    order = data.draw(st.permutations(range(L1_PAGES)), label="page order")
    prefix, new = pages(*order[:split]), pages(*order[split:n_pages])
    producer = SyntheticProducer(g)
    l1 = poisoned_l1(g)
    if split:
        producer.produce(tokens, 0, split * g.page_size, l1, NO_PAGES, prefix)
    producer.produce(tokens, split * g.page_size, n_pages * g.page_size, l1, prefix, new)
    both = torch.cat([prefix, new])
    assert torch.equal(packed(l1, both), raw(producer.expected(tokens, 0, n_pages * g.page_size)))


@pytest.mark.parametrize(
    ("start", "end", "prefix", "new", "field"),
    [
        (0, 6, [], [0, 1], "range"),  # end not page aligned
        (8, 8, [0, 1], [], "range"),  # empty range
        (0, 20, [], [0, 1, 2, 3, 4], "range"),  # past the tokens
        (0, 8, [], [0], "new_pages"),  # one page short
        (4, 8, [], [1], "prefix_pages"),  # prefix pages missing
        (0, 8, [], [0, 0], "pages"),  # a page named twice
        (4, 8, [3], [3], "pages"),  # writing over the prefix
        (0, 8, [], [0, L1_PAGES], "pages"),  # outside L1
    ],
)
def test_bad_arguments_raise_and_write_nothing(
    start: int, end: int, prefix: Sequence[int], new: Sequence[int], field: str
) -> None:
    l1 = poisoned_l1(TINY)
    before = l1.clone()
    with pytest.raises(ProducerError) as err:
        SyntheticProducer(TINY).produce(TOKENS, start, end, l1, pages(*prefix), pages(*new))
    assert err.value.field == field
    assert torch.equal(raw(l1), raw(before))


def test_l1_of_another_geometry_is_refused() -> None:
    wrong = poisoned_l1(geometry("fp16"))
    with pytest.raises(ProducerError, match="l1"):
        SyntheticProducer(TINY).produce(TOKENS, 0, 4, wrong, NO_PAGES, pages(0))


# ---------------------------------------------------------------- model (needs transformers)


@pytest.fixture(scope="module")
def tiny_model() -> ModelProducer:
    pytest.importorskip("transformers")
    return ModelProducer("tiny", "cpu")


def reference_kv(producer: ModelProducer, tokens: Sequence[int]) -> torch.Tensor:
    """Token-major KV `[K/V, layer, tokens, heads, dim]` of one plain transformers prefill with
    transformers' own cache (independent of the producer's gather, write and recording)."""
    cache = importlib.import_module("transformers").DynamicCache()
    kw = {producer._cache_kw: cache}
    with torch.no_grad():
        producer.model(input_ids=torch.tensor([list(tokens)]), use_cache=True, **kw)
    layers = getattr(cache, "layers", None)
    pairs = (
        [(layer.keys, layer.values) for layer in layers]
        if layers is not None
        else list(zip(cache.key_cache, cache.value_cache))
    )
    keys = torch.stack([k[0] for k, _ in pairs])
    values = torch.stack([v[0] for _, v in pairs])
    return torch.stack([keys, values]).transpose(2, 3)


def test_model_full_prefill_matches_transformers(tiny_model: ModelProducer) -> None:
    g = tiny_model.geometry
    l1 = poisoned_l1(g)
    new = pages(3, 0, 8, 5)
    tiny_model.produce(TOKENS, 0, 16, l1, NO_PAGES, new)
    want = reference_kv(tiny_model, TOKENS)
    got = l1.index_select(2, new).flatten(2, 3)
    torch.testing.assert_close(got, want)


def test_model_incremental_from_pages_equals_full_and_writes_only_new_pages(
    tiny_model: ModelProducer,
) -> None:
    g = tiny_model.geometry
    l1 = poisoned_l1(g)
    tiny_model.produce(TOKENS, 0, 16, l1, NO_PAGES, pages(0, 1, 2, 3))
    tiny_model.produce(TOKENS, 0, 8, l1, NO_PAGES, pages(9, 6))
    before = l1.clone()
    seconds = tiny_model.produce(TOKENS, 8, 16, l1, pages(9, 6), pages(11, 4))
    assert seconds > 0
    torch.testing.assert_close(l1[:, :, [11, 4]], l1[:, :, [2, 3]])
    untouched = pages(*(p for p in range(L1_PAGES) if p not in (11, 4)))
    assert torch.equal(packed(l1, untouched), packed(before, untouched))
    assert tiny_model.expected(TOKENS, 8, 16) is None


def test_model_reads_the_prefix_from_the_pages(tiny_model: ModelProducer) -> None:
    # The same new tokens after other prefix KV must give other KV: the pages are attended to.
    g = tiny_model.geometry
    l1 = poisoned_l1(g)
    tiny_model.produce(TOKENS, 0, 8, l1, NO_PAGES, pages(0, 1))
    tiny_model.produce(TOKENS, 8, 16, l1, pages(0, 1), pages(2, 3))
    l1[:, :, 0] *= -1.0
    tiny_model.produce(TOKENS, 8, 16, l1, pages(0, 1), pages(4, 5))
    assert not torch.allclose(l1[:, :, [2, 3]], l1[:, :, [4, 5]])


class LandingGate:
    """A layer-wise load-back on the CPU: layer `l` of `pages` is copied from `source` into
    `l1` when a reader waits for it, as dataplane/layerwise.py's CPU gate does."""

    def __init__(self, l1: torch.Tensor, source: torch.Tensor, pages: torch.Tensor) -> None:
        self.layers = l1.shape[1]
        self.landed_layers = 0
        self.order: list[int] = []
        self._l1, self._source, self._pages = l1, source, pages

    def wait(self, layer: int) -> None:
        self.order.append(layer)
        self.landed_layers = max(self.landed_layers, layer + 1)
        self._l1[:, layer, self._pages] = self._source[:, layer, self._pages]


@pytest.mark.parametrize("prefix", [(0, 1), (5, 2)])
def test_model_compute_kv_reads_each_layer_once_it_landed(
    tiny_model: ModelProducer, prefix: tuple[int, ...]
) -> None:
    """`compute_kv` on a prefix that lands layer by layer (poisoned until its layer's wait)
    gives the KV `produce` writes on the landed prefix: each layer is read only after its
    wait (a read before it would see the poison), and every layer is waited for, in order."""
    g = tiny_model.geometry
    landed = poisoned_l1(g)
    tiny_model.produce(TOKENS, 0, 8, landed, NO_PAGES, pages(*prefix))
    tiny_model.produce(TOKENS, 8, 16, landed, pages(*prefix), pages(9, 10))
    want = landed.index_select(2, pages(9, 10)).flatten(2, 3)
    l1 = poisoned_l1(g)
    gate = LandingGate(l1, landed, pages(*prefix))
    kv, seconds = tiny_model.compute_kv(TOKENS, 8, 16, l1, pages(*prefix), gate)
    assert seconds > 0 and gate.order == list(range(g.layers))
    torch.testing.assert_close(kv, want)
    assert torch.equal(
        l1[:, :, 9:11].view(torch.uint8), poisoned_l1(g)[:, :, 9:11].view(torch.uint8)
    )


def test_model_without_transformers_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def no_transformers(name: str, package: str | None = None) -> object:
        if name == "transformers":
            raise ImportError("No module named 'transformers'")
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", no_transformers)
    with pytest.raises(ConfigError, match="pip install 'transformers"):
        ModelProducer("tiny")


def test_model_rejects_bad_configuration() -> None:
    pytest.importorskip("transformers")
    with pytest.raises(ConfigError, match="producer.preset"):
        ModelProducer("qwen3-0b")
    with pytest.raises(ConfigError, match="producer.dtype"):
        ModelProducer("tiny", dtype=torch.float8_e4m3fn)
    with pytest.raises(ConfigError, match="producer.mode"):
        ModelProducer("tiny", mode="graphs")  # CPU: no CUDA graphs


# ------------------------------------------- layer-wise graphs: layers waited for in groups


@settings(deadline=None)
@given(layers=st.integers(1, 80), every=st.integers(1, 80))
def test_group_ends_cover_every_layer_once_in_order(layers: int, every: int) -> None:
    """Each layer belongs to the group whose end is the first end at or after it, and that end
    is fewer than `every` layers past it: a wait for the end covers the layer (layers land in
    order), and no layer waits longer than its group."""
    from hicache.producers.model import group_ends

    ends = group_ends(layers, min(every, layers))
    assert ends == sorted(set(ends)) and ends[-1] == layers - 1
    for layer in range(layers):
        end = next(e for e in ends if e >= layer)
        assert end - layer < min(every, layers)


def test_a_gated_graph_waits_once_per_group_for_its_last_layer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The capture's gate (`_EventsGate`): layer l of a group waits, at the group's first
    layer, on the event of the group's last layer, and the rest of the group waits for nothing
    more -- the event the replay records (`group_ends`) is the one the graph waits on."""
    from hicache.producers import model

    waited: list[object] = []

    class Stream:
        def wait_event(self, event: object) -> None:
            waited.append(event)

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    events = [f"event {i}" for i in range(10)]
    for every in (1, 3, 4, 10):
        waited.clear()
        gate = model._EventsGate(events, torch.device("cpu"), every)  # type: ignore[arg-type]
        for layer in range(10):
            gate.wait(layer)
            assert gate.landed_layers > layer
        assert waited == [events[e] for e in model.group_ends(10, every)], every


def test_model_refuses_gate_layers_outside_its_layers() -> None:
    for bad in (0, -1, 10**6):
        with pytest.raises(ConfigError, match="producer.gate_layers"):
            ModelProducer("tiny", gate_layers=bad)
