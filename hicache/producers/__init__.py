"""KV producers: what fills L1 pages with a prefix's KV when a request recomputes.

KVProducer          the contract (`produce`, `expected`), in base.py
SyntheticProducer   KV that is a pure function of the token prefix; CPU-cheap, checkable
                    byte for byte (`expected`)
GroupSyntheticProducer  the same rule for every pool of a pool group (group.py)
PacedProducer       another producer's KV at the pace of `fixed_s + per_token_s * tokens`
                    per prefill (a launch-bound or compute-bound model, on any machine)
ModelProducer       real prefill: Qwen3 at real shapes with random weights (needs the
                    optional `transformers`, imported only when one is built)
"""

from __future__ import annotations

from hicache.producers.base import KVProducer, PageIndex
from hicache.producers.group import GroupSyntheticProducer
from hicache.producers.model import MODEL_PRESETS, ModelProducer, Qwen3Shape
from hicache.producers.paced import PacedProducer
from hicache.producers.synthetic import SyntheticProducer

__all__ = [
    "MODEL_PRESETS",
    "GroupSyntheticProducer",
    "KVProducer",
    "ModelProducer",
    "PacedProducer",
    "PageIndex",
    "Qwen3Shape",
    "SyntheticProducer",
]
