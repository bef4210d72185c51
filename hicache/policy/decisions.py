"""The decision log: what the policy chose, what it predicted, and how wrong it was.

Each decision is recorded when it is made (`record` returns its id) and settled later with the
observed seconds of the chosen path (`settle`), measured the same way the prediction is
priced: restore plus the prefill of what is still missing, steady time only. The log keeps:

    counter            meaning
    -----------------  ---------------------------------------------------------------------
    choices            decisions per choice ("recompute", "L2", "L3")
    policy_skips       decisions that left cached tokens unused: some restore candidate would
                       have extended the hit further than the chosen path
    skipped_tokens     those unused tokens, summed (longest candidate - chosen extension)
    mean_abs_error_s   mean |observed - predicted| over settled decisions, seconds
    mean_error_s       mean (observed - predicted), seconds: > 0 where a path costs more than
                       its lines predict (per choice: a restore's cost that no transfer or
                       prefill sample sees -- issue, completion, publish -- shows here)
    mean_rel_error     mean |observed - predicted| / observed over settled decisions
    pending_dropped    unsettled decisions forgotten because more than `max_pending` were open

Unsettled decisions are held in a bounded table so that a caller that never settles cannot
grow it without limit; the oldest is dropped first and counted.

`recent()` lists the last `RECENT_KEPT` settled decisions in the order they were made, each
with every candidate's price at decision time and the seconds observed: the sequence that
shows when a policy's lines crossed (the counters above only say how often and how far).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass

from hicache.errors import ConfigError, PolicyError
from hicache.policy.policies import Choice, Decision

MAX_PENDING_DEFAULT = 4096
RECENT_KEPT = 256  # settled decisions `recent()` keeps, the newest
CHOICES: tuple[Choice, ...] = ("recompute", "L2", "L3")


@dataclass
class _ErrorStats:
    """Running prediction-error sums for one group of settled decisions."""

    settled: int = 0
    abs_error_sum_s: float = 0.0
    rel_error_sum: float = 0.0
    error_sum_s: float = 0.0

    def add(self, predicted_s: float, observed_s: float) -> None:
        error_s = abs(observed_s - predicted_s)
        self.settled += 1
        self.abs_error_sum_s += error_s
        self.rel_error_sum += error_s / observed_s
        self.error_sum_s += observed_s - predicted_s

    def summary(self) -> dict[str, float | int | None]:
        if self.settled == 0:
            return {
                "settled": 0,
                "mean_abs_error_s": None,
                "mean_rel_error": None,
                "mean_error_s": None,
            }
        return {
            "settled": self.settled,
            "mean_abs_error_s": self.abs_error_sum_s / self.settled,
            "mean_rel_error": self.rel_error_sum / self.settled,
            "mean_error_s": self.error_sum_s / self.settled,
        }


class DecisionLog:
    """Records decisions, settles them against observations, and summarises accuracy."""

    def __init__(self, max_pending: int = MAX_PENDING_DEFAULT) -> None:
        if max_pending < 1:
            raise ConfigError("decisions.max_pending", f"must be >= 1, got {max_pending}")
        self.max_pending = max_pending
        self.decisions = 0
        self.choices: dict[str, int] = {choice: 0 for choice in CHOICES}
        self.policy_skips = 0
        self.skipped_tokens = 0
        self.pending_dropped = 0
        self._pending: OrderedDict[int, Decision] = OrderedDict()
        self._recent: deque[tuple[int, Decision, float]] = deque(maxlen=RECENT_KEPT)
        self._errors = _ErrorStats()
        self._errors_by_choice = {choice: _ErrorStats() for choice in CHOICES}

    def record(self, decision: Decision) -> int:
        """Count `decision` and hold its predicted cost until it is settled; returns its id."""
        # Verify the decision priced the path it chose (every policy prices all candidates).
        if decision.choice not in decision.predicted_s:
            raise PolicyError(f"decision chose {decision.choice!r} but did not price it")
        decision_id = self.decisions
        self.decisions += 1
        self.choices[decision.choice] += 1
        chosen = decision.extension_tokens.get(decision.choice, 0)
        longest = max(decision.extension_tokens.values(), default=0)
        if longest > chosen:
            self.policy_skips += 1
            self.skipped_tokens += longest - chosen
        self._pending[decision_id] = decision
        if len(self._pending) > self.max_pending:
            self._pending.popitem(last=False)
            self.pending_dropped += 1
        return decision_id

    def settle(self, decision_id: int, observed_s: float) -> None:
        """Compare decision `decision_id`'s prediction with the `observed_s` seconds its path
        took. Each decision settles once; `observed_s` must be finite and > 0."""
        if not (math.isfinite(observed_s) and observed_s > 0):
            raise PolicyError(f"observed_s must be finite and > 0, got {observed_s!r}")
        entry = self._pending.pop(decision_id, None)
        if entry is None:
            raise PolicyError(
                f"decision {decision_id} is unknown, already settled, or was dropped "
                f"(more than {self.max_pending} pending); settle each recorded id once"
            )
        predicted_s = entry.predicted_s[entry.choice]
        self._errors.add(predicted_s, observed_s)
        self._errors_by_choice[entry.choice].add(predicted_s, observed_s)
        self._recent.append((decision_id, entry, observed_s))

    def recent(self) -> list[dict[str, object]]:
        """The last RECENT_KEPT settled decisions, oldest first by decision id: `id`,
        `choice`, `predicted_s` (every candidate priced, seconds), `observed_s` (the chosen
        path), `reason`."""
        return [
            {
                "id": decision_id,
                "choice": d.choice,
                "predicted_s": dict(d.predicted_s),
                "observed_s": observed_s,
                "reason": d.reason,
            }
            for decision_id, d, observed_s in sorted(self._recent, key=lambda e: e[0])
        ]

    def summary(self) -> dict[str, object]:
        """Counts and prediction errors (None where nothing has been settled yet)."""
        overall = self._errors.summary()
        return {
            "decisions": self.decisions,
            "settled": overall["settled"],
            "pending": len(self._pending),
            "pending_dropped": self.pending_dropped,
            "choices": dict(self.choices),
            "policy_skips": self.policy_skips,
            "skipped_tokens": self.skipped_tokens,
            "mean_abs_error_s": overall["mean_abs_error_s"],
            "mean_rel_error": overall["mean_rel_error"],
            "mean_error_s": overall["mean_error_s"],
            "by_choice": {c: stats.summary() for c, stats in self._errors_by_choice.items()},
        }
