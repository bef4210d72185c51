"""Shared-prefix workloads: what the demo and the stress benchmarks serve.

    kind             prefix shared by many requests          unique suffix
    ---------------  --------------------------------------  --------------------------
    system prompt    one of a few long system prompts        a short question
    RAG              a system prompt + one of many documents a question about it
    agent            a system prompt + a growing history     the next turn

Deterministic for a seed. Token ids are small integers; lengths are in tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RequestSpec:
    request_id: int
    tokens: tuple[int, ...]
    decode_tokens: int
    kind: str


def shared_prefix_workload(
    n_requests: int,
    *,
    seed: int = 0,
    system_prompts: int = 3,
    system_len: int = 48,
    documents: int = 16,
    document_len: int = 64,
    agents: int = 4,
    turn_len: int = 24,
    question_len: tuple[int, int] = (6, 20),
    decode_tokens: tuple[int, int] = (2, 8),
    vocab: int = 50_000,
) -> list[RequestSpec]:
    """`n_requests` requests mixing the three kinds (40% RAG, 30% system, 30% agent)."""
    rng = random.Random(seed)

    def text(n: int) -> list[int]:
        return [rng.randrange(vocab) for _ in range(n)]

    systems = [text(system_len) for _ in range(system_prompts)]
    docs = [text(document_len) for _ in range(documents)]
    histories = [list(rng.choice(systems)) for _ in range(agents)]
    out: list[RequestSpec] = []
    for rid in range(n_requests):
        roll = rng.random()
        question = text(rng.randint(*question_len))
        if roll < 0.4:
            kind, tokens = "rag", rng.choice(systems) + rng.choice(docs) + question
        elif roll < 0.7:
            kind, tokens = "system", rng.choice(systems) + question
        else:
            kind = "agent"
            h = histories[rng.randrange(agents)]
            h.extend(text(turn_len))
            tokens = h + question
        out.append(RequestSpec(rid, tuple(tokens), rng.randint(*decode_tokens), kind))
    return out


def repeated_prefix_workload(
    n_prefixes: int, prefix_len: int, n_requests: int, *, seed: int = 0, vocab: int = 50_000
) -> list[RequestSpec]:
    """The stress shape: `n_prefixes` prefixes of `prefix_len` tokens, requests
    cycling through them (each request is exactly one prefix), decode of one token."""
    rng = random.Random(seed)
    prefixes = [tuple(rng.randrange(vocab) for _ in range(prefix_len)) for _ in range(n_prefixes)]
    return [RequestSpec(i, prefixes[i % n_prefixes], 1, "stress") for i in range(n_requests)]
