"""`Recorder`: how a case script drives hicache's controller and records the case.

A script (hicache/oracle/vectors/categories.py) calls the operations below; each runs through a
`Driver` and is recorded with the observation that followed, and the recorded steps are the
case. Every draw comes from the `random.Random` the generator seeds per case, so a seed gives
the same case. Prompts are runs of consecutive token ids (a fresh base per prompt, or a shared
prefix then a fresh run), PAGE_SIZE tokens a page as the controller adapter builds.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from hicache.choices import RestorePolicy, WritePolicy
from hicache.oracle.vectors.drive import Driver
from hicache.oracle.vectors.format import CaseConfig

PAGE_SIZE = 4
LIVE_MAX = 4
ALL = 10_000  # evict(tier, ALL): everything the tier may give up
Tokens = tuple[int, ...]


class Recorder:
    """Runs operations through a `Driver` and records each with its observation."""

    def __init__(self, driver: Driver, rng: random.Random) -> None:
        self.driver, self.rng = driver, rng
        self.steps: list[dict[str, Any]] = []
        self.next_base = rng.randrange(1, 50) * 1000

    def do(self, op: dict[str, Any]) -> dict[str, Any]:
        obs = self.driver.step(op)
        self.steps.append({**op, "expect": obs})
        return obs

    # -- prompts ------------------------------------------------------------------------------

    def fresh(self, pages: int, tail: int | None = None) -> Tokens:
        """A prompt sharing nothing: `pages` whole pages, then a partial tail (1..page-1
        tokens; never 0 here, so the last whole page is cached too)."""
        tail = self.rng.randrange(1, PAGE_SIZE) if tail is None else tail
        base, self.next_base = self.next_base, self.next_base + 1000
        return tuple(range(base, base + pages * PAGE_SIZE + tail))

    def extend(self, prefix: Tokens, pages: int, keep_pages: int) -> Tokens:
        """The first `keep_pages` pages of `prefix`, then a fresh run of `pages` pages and a
        tail."""
        return prefix[: keep_pages * PAGE_SIZE] + self.fresh(pages)

    # -- operations ---------------------------------------------------------------------------

    def submit(self, rid: int, tokens: Sequence[int]) -> dict[str, Any]:
        return self.do({"op": "submit", "request": rid, "tokens": list(tokens)})

    def ready(self, rid: int) -> bool:
        return bool(self.do({"op": "ready", "request": rid})["result"])

    def prefill(self, rid: int) -> bool:
        return bool(self.do({"op": "prefill", "request": rid})["result"])

    def finish(self, rid: int) -> None:
        self.do({"op": "finish", "request": rid})

    def cancel(self, rid: int) -> None:
        self.do({"op": "cancel_restore", "request": rid})

    def tick(self) -> dict[str, Any]:
        return self.do({"op": "tick"})

    def complete(self, index: int = 0) -> None:
        self.do({"op": "complete", "op_index": index})

    def fail(self, index: int, kind: str) -> None:
        self.do({"op": "fail", "op_index": index, "kind": kind})

    def evict(self, tier: str, pages: int = ALL) -> None:
        self.do({"op": "evict", "tier": tier, "pages": pages})

    def drain(self) -> None:
        self.do({"op": "drain"})

    def aim(self, action: str, tier: str) -> None:
        self.do({"op": "aim", "action": action, "tier": tier})

    def pending(self) -> int:
        return int(self.steps[-1]["expect"]["pending_ops"]) if self.steps else 0

    def live(self) -> list[int]:
        return list(self.steps[-1]["expect"]["live"]) if self.steps else []

    def step_through(self, rid: int, limit: int = 8) -> None:
        """Until `rid` is ready (or gone: a crash ends every request): the oldest transfer
        ends, then a tick observes it."""
        for _ in range(limit):
            if rid not in self.live() or self.ready(rid):
                return
            if self.pending():
                self.complete(0)
            self.tick()

    def serve(self, rid: int, tokens: Sequence[int], finish: bool = True) -> bool:
        """Submit, wait until ready, prefill and (`finish`) end the request."""
        self.submit(rid, tokens)
        self.step_through(rid)
        if rid not in self.live():
            return False
        served = self.prefill(rid)
        if finish and rid in self.live():
            self.finish(rid)
        return served

    def backed_up(self, tokens: Sequence[int], rid: int, deep: bool) -> None:
        """`tokens` served and ended, its backups landed, then L1 (and, `deep`, L2) gave up
        what it could: the next admission of `tokens` restores."""
        self.serve(rid, tokens)
        self.drain()
        self.evict("L1")
        if deep:
            self.drain()
            self.evict("L2")


Script = Callable[[Recorder], None]
Builder = Callable[[random.Random], tuple[CaseConfig, Script]]


def config(
    rng: random.Random,
    l1: tuple[int, int] = (7, 12),
    l2: tuple[int, int] = (6, 12),
    l3: tuple[int, int] = (8, 16),
    write_policy: WritePolicy = WritePolicy.WRITE_THROUGH,
    promotion: bool = True,
) -> CaseConfig:
    return CaseConfig(
        PAGE_SIZE,
        {"L1": rng.randint(*l1), "L2": rng.randint(*l2), "L3": rng.randint(*l3)},
        write_policy,
        RestorePolicy.ALWAYS,
        promotion,
    )
