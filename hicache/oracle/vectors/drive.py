"""Drive a `CacheUnderTest` through one step and observe it, the same way for the generator
(which records what hicache's controller reports) and the runner (which compares).

    observation    from                           normalised as (spec/vectors.md)
    -------------  -----------------------------  --------------------------------------------
    result         the call's return value        submit: {hits per case tier, cached_len};
                                                  ready/prefill: true/false; others: null
    refused        a HiCacheError from the call   its class name (compared: refused or not)
    crashed        SimulatedCrash from the call   true; the engine is then restarted
    live           `live()`                       sorted request ids
    cached_len     `cached_len(id)` per live id   [[id, tokens], ...] sorted by id
    pending_ops    `pending_ops()`                its length (op ids are the engine's own)
    changes        `changes()`                    the net change of the observed page map over
                                                  the step, per tier: [[state, prefix], ...]
                                                  sorted by prefix (intermediate steps inside
                                                  one call are the engine's business)

The observed page map is built from the engine's own `changes()` reports; the final
snapshot is that map, per tier and state, with its counts. Two checks hold on every step and
are not stored in the files: `check()` reports no findings, and a served page's digest is
the same every time its prefix is served (when `served_digests` gives digests).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hicache.dataplane.faults import SimulatedCrash
from hicache.errors import HiCacheError
from hicache.oracle.vectors.format import CaseConfig
from hicache.testing.protocol import CacheUnderTest, PageChange

ABSENT = "ABSENT"
Prefix = tuple[int, ...]


class StepError(HiCacheError):
    """The engine could not be driven through a step as the case says (an op index past
    its pending ops, findings from its own checks, served bytes that changed): the message
    names the observation; the case fails there."""

    def __init__(self, observation: str, expected: object, got: object) -> None:
        self.observation, self.expected, self.got = observation, expected, got
        super().__init__(f"{observation}: expected {expected!r}, got {got!r}")


class Driver:
    """One engine under one case: `step(op)` runs an operation and returns its observation."""

    def __init__(self, cache: CacheUnderTest, config: CaseConfig) -> None:
        self.cache, self.config = cache, config
        self.tiers = config.tiers
        self.pages: dict[str, dict[Prefix, str]] = {t: {} for t in self.tiers}
        self.digests: dict[
            Prefix, int
        ] = {}  # a served prefix -> the digest it was first served with
        self.prompts: dict[
            int, Prefix
        ] = {}  # request id -> its prompt (digests are keyed by prefix)

    def step(self, op: dict[str, Any]) -> dict[str, Any]:
        """Run `op` (a step's operation, spec/vectors.md) and observe the engine after it."""
        before = {t: dict(p) for t, p in self.pages.items()}
        result: object = None
        refused: str | None = None
        crashed = False
        try:
            result = self._call(op)
        except SimulatedCrash:
            crashed = True
            self.cache.restart()  # a supervisor restarts the process that died
            self.cache.changes()  # the dead engine's last reports: everything goes anyway
            self.pages = {t: {} for t in self.tiers}
        except HiCacheError as e:
            if isinstance(e, StepError):
                raise
            refused = type(e).__name__
        self._apply(self.cache.changes())
        found = self.cache.check()
        if found:
            raise StepError("engine findings (check())", [], found)
        live = sorted(self.cache.live())
        return {
            "result": result,
            "refused": refused,
            "crashed": crashed,
            "live": live,
            "cached_len": [[rid, self.cache.cached_len(rid)] for rid in live],
            "pending_ops": len(self.cache.pending_ops()),
            "changes": self._diff(before),
        }

    def _call(self, op: dict[str, Any]) -> object:
        c, name = self.cache, op["op"]
        if name == "submit":
            got = c.submit(op["request"], op["tokens"])
            self.prompts[op["request"]] = tuple(op["tokens"])
            return {"hits": {t: got.hits.get(t) for t in self.tiers}, "cached_len": got.cached_len}
        if name == "ready":
            return c.ready(op["request"])
        if name == "prefill":
            served = c.prefill(op["request"])
            if served:
                self._served(op["request"])
            return served
        if name in ("complete", "fail"):
            ops = c.pending_ops()
            if not -len(ops) <= op["op_index"] < len(ops):
                raise StepError(f"pending op at index {op['op_index']}", "an op in flight", ops)
            if name == "complete":
                c.complete(ops[op["op_index"]])
            else:
                c.fail(ops[op["op_index"]], op["kind"])
            return None
        simple: dict[str, Callable[[], None]] = {
            "finish": lambda: c.finish(op["request"]),
            "cancel_restore": lambda: c.cancel_restore(op["request"]),
            "tick": c.tick,
            "drain": c.drain,
            "restart": c.restart,
            "evict": lambda: c.evict(op["tier"], op["pages"]),
            "aim": lambda: c.aim(op["action"], op["tier"]),
            "damage_storage": lambda: c.damage_storage(op["how"]),
        }
        simple[name]()
        if name == "restart":
            self.cache.changes()
            self.pages = {t: {} for t in self.tiers}
        return None

    def _served(self, request_id: int) -> None:
        digests = self.cache.served_digests(request_id)
        if digests is None:
            return
        ps, cached = self.config.page_size, self.cache.cached_len(request_id)
        if len(digests) != cached // ps:
            raise StepError(f"served digests of request {request_id}", cached // ps, len(digests))
        tokens = self.prompts[request_id]
        for i, d in enumerate(digests):
            prefix = tokens[: (i + 1) * ps]
            known = self.digests.setdefault(prefix, d)
            if known != d:
                raise StepError(
                    f"digest of served page {i} of request {request_id}", hex(known), hex(d)
                )

    def _apply(self, changes: Sequence[PageChange]) -> None:
        """Apply the engine's reports to the observed map; pages of tiers the case does not
        name are not observed (an engine with L2 running a case of L1 alone)."""
        for ch in changes:
            if ch.tier not in self.pages:
                continue
            if ch.state == ABSENT:
                self.pages[ch.tier].pop(ch.prefix, None)
            else:
                self.pages[ch.tier][ch.prefix] = ch.state

    def _diff(self, before: dict[str, dict[Prefix, str]]) -> dict[str, list[list[Any]]]:
        out: dict[str, list[list[Any]]] = {}
        for t in self.tiers:
            now, was = self.pages[t], before[t]
            moved = sorted(
                p for p in set(now) | set(was) if now.get(p, ABSENT) != was.get(p, ABSENT)
            )
            if moved:
                out[t] = [[now.get(p, ABSENT), list(p)] for p in moved]
        return out

    def final(self) -> dict[str, Any]:
        """The snapshot after the last step: live ids, and per tier the prefixes in each
        state (sorted) with their counts."""
        tiers: dict[str, dict[str, list[list[int]]]] = {}
        usage: dict[str, dict[str, int]] = {}
        for t in self.tiers:
            by_state: dict[str, list[list[int]]] = {}
            for p in sorted(self.pages[t]):
                by_state.setdefault(self.pages[t][p], []).append(list(p))
            tiers[t] = dict(sorted(by_state.items()))
            usage[t] = {s: len(v) for s, v in tiers[t].items()}
        return {"live": sorted(self.cache.live()), "tiers": tiers, "usage": usage}
