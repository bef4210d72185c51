"""Restore-vs-recompute policies: given per-tier hit lengths, pick how to fill the prompt.

A request's prefill computes through `prompt_len` tokens: its prompt rounded up to whole pages
(`prefill_end`: a partial last page is computed too); one tree walk says how long a prefix
each tier holds. L1's hit is used as is; beyond it there are up to three ways to fill the rest:

    tokens  0 ........ l1_len ........ l2_len ........ l3_len ........ prompt_len
            [ L1 hit  )[ from L2 (H2D)  )[ from L3 (S2H, then H2D) )[ recompute )

    candidate   restores                                   exists when
    ---------   -----------------------------------------  -----------------------
    recompute   nothing                                    always
    L2          [l1_len, l2_len) by one H2D                 l2_len > l1_len
    L3          [l1_len, l3_len): [l1_len, l2_len) from L2, l3_len > max(l1_len, l2_len)
                the rest promoted from L3; H2D over all of
                it + S2H over the L3 part (serial)

A candidate is only offered if it extends the hit, so no policy can pick a tier that adds
nothing. Every candidate is priced end to end: restore seconds plus the prefill of whatever
is still missing afterwards. Pricing the remainder (instead of subtracting the recompute of
the restored tokens alone) keeps recompute's fixed cost out of the benefit whenever a prefill
runs anyway, and counts it when the restore covers the whole prompt. A prefill is priced by
the cost model's line of its kind (`CostModel.prefill_s`): `recompute` when it reads no
cached prefix (recompute with no L1 hit), `tail` when it does (recompute after an L1 hit,
and every restore's remainder) -- a tail may cost more than a full prefill.

    benefit_s(candidate) = predicted_s["recompute"] - predicted_s[candidate]

Policies (`make_policy` names): `cost` (default), `always`, `never`, `threshold`; their rules
and a worked example are in spec/policies.md, "Restore policies".
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Literal, Protocol

from hicache.choices import RestorePolicy
from hicache.errors import ConfigError, PolicyError
from hicache.policy.costmodel import CostModel

Choice = Literal["recompute", "L2", "L3"]
RESTORE_CHOICES: tuple[Choice, ...] = ("L2", "L3")  # shallow first: ties go to the shallower
POLICY_NAMES: tuple[RestorePolicy, ...] = tuple(RestorePolicy)


@dataclass(frozen=True)
class Decision:
    """One policy decision. Seconds are predictions from the cost model at decision time.

    choice             "recompute", "L2" or "L3"
    tokens_from_cache  tier name -> tokens the chosen path takes from it ("L1", "L2", "L3")
    predicted_s        candidate -> predicted seconds to fill [l1_len, prompt_len) that way;
                       "recompute" always, a restore candidate only if it extends the hit
    extension_tokens   restore candidate -> tokens beyond l1_len it would restore
    benefit_s          predicted_s["recompute"] - predicted_s[choice] (0.0 for recompute;
                       negative only when `cost` explores, see CostPolicy)
    reason             one line saying why, for logs and status
    """

    choice: Choice
    tokens_from_cache: dict[str, int]
    predicted_s: dict[str, float]
    extension_tokens: dict[str, int]
    benefit_s: float
    reason: str


@dataclass(frozen=True)
class Candidates:
    """The priced candidates of one request (what every policy chooses among)."""

    l1_len: int
    prompt_len: int
    split: dict[str, tuple[int, int]]  # restore candidate -> (tokens from L2, tokens from L3)
    predicted_s: dict[str, float]  # "recompute" and every restore candidate

    def benefit_s(self, choice: Choice) -> float:
        return self.predicted_s["recompute"] - self.predicted_s[choice]

    def decision(self, choice: Choice, reason: str) -> Decision:
        from_l2, from_l3 = self.split.get(choice, (0, 0))
        return Decision(
            choice=choice,
            tokens_from_cache={"L1": self.l1_len, "L2": from_l2, "L3": from_l3},
            predicted_s=dict(self.predicted_s),
            extension_tokens={c: a + b for c, (a, b) in self.split.items()},
            benefit_s=self.benefit_s(choice),
            reason=reason,
        )


def prefill_end(n_tokens: int, page_size: int) -> int:
    """The token index a request's prefill computes through: its `n_tokens` prompt tokens
    rounded UP to whole pages. The policies price candidates up to here (their `prompt_len`).

    A hit covers at most `n_tokens - 1` tokens, page-aligned down (the last prompt token is
    always computed), so every path -- a restore of everything the cache holds included --
    still prefills at least the prompt's last page, and pays a prefill's fixed cost. Priced
    only up to the page-aligned-down prompt, a restore of a prompt that ends mid-page was
    charged no prefill at all (spec/policies.md, "Pricing").
    """
    if n_tokens < 0 or page_size < 1:
        raise PolicyError(f"need n_tokens >= 0 and page_size >= 1, got {n_tokens}, {page_size}")
    return -(-n_tokens // page_size) * page_size


def _check_lengths(
    l1_len: int, l2_len: int, l3_len: int, prompt_len: int, bytes_per_token: int
) -> None:
    # Verify the hit lengths describe prefixes of this prompt (the tree never reports more).
    if prompt_len < 1:
        raise PolicyError(f"prompt_len must be >= 1, got {prompt_len}")
    for name, value in (("l1_len", l1_len), ("l2_len", l2_len), ("l3_len", l3_len)):
        if not 0 <= value <= prompt_len:
            raise PolicyError(f"{name} must be in [0, prompt_len={prompt_len}], got {value}")
    if bytes_per_token <= 0:
        raise PolicyError(f"bytes_per_token must be > 0, got {bytes_per_token}")


def price_candidates(
    model: CostModel, l1_len: int, l2_len: int, l3_len: int, prompt_len: int, bytes_per_token: int
) -> Candidates:
    """Enumerate the candidates that extend the L1 hit (R33) and price each end to end."""
    _check_lengths(l1_len, l2_len, l3_len, prompt_len, bytes_per_token)
    split: dict[str, tuple[int, int]] = {}
    if l2_len > l1_len:
        split["L2"] = (l2_len - l1_len, 0)
    if l3_len > max(l1_len, l2_len):
        split["L3"] = (max(0, l2_len - l1_len), l3_len - max(l1_len, l2_len))
    # A prefill is priced by the line of its kind (costmodel.py): `recompute` when it reads
    # no cached prefix, `tail` when it does -- an L1 hit's, or what a restore brought in.
    predicted_s = {"recompute": model.prefill_s(prompt_len - l1_len, l1_len)}
    for choice, (from_l2, from_l3) in split.items():
        cached = l1_len + from_l2 + from_l3
        predicted_s[choice] = model.restored_prefill_s(
            from_l2, from_l3, bytes_per_token, prompt_len - cached, cached
        )
    return Candidates(l1_len, prompt_len, split, predicted_s)


class Policy(Protocol):
    """Decides how to fill a prompt beyond its L1 hit. Lengths are per-tier hit lengths in
    tokens (page aligned by the tree); `bytes_per_token` sizes the transfers."""

    @property
    def name(self) -> str: ...

    def decide(
        self, l1_len: int, l2_len: int, l3_len: int, prompt_len: int, bytes_per_token: int
    ) -> Decision: ...


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


EXPLORE_MARGIN = 0.10
"""How far (relative) above predicted recompute an untimed candidate may be and still be
explored (rule 3 of `CostPolicy`)."""
EXPLORE_SAMPLES = 2
"""Samples a transfer line needs before its candidate is trusted (the first transfer of each
direction is a warm-up the controller does not feed to the model)."""


class PricedPolicy(abc.ABC):
    """Base of the built-in policies: validate and price the candidates with `model`, then
    let `choose` apply the policy's rule. Every decision carries the model's prices, whatever
    the rule, so the decision log can measure prediction error for all policies alike."""

    name = "priced"

    def __init__(self, model: CostModel | None = None) -> None:
        self.model = model if model is not None else CostModel()

    def decide(
        self, l1_len: int, l2_len: int, l3_len: int, prompt_len: int, bytes_per_token: int
    ) -> Decision:
        return self.choose(
            price_candidates(self.model, l1_len, l2_len, l3_len, prompt_len, bytes_per_token)
        )

    @abc.abstractmethod
    def choose(self, cands: Candidates) -> Decision:
        """The decision among `cands` (only candidates that extend the L1 hit are offered)."""


class CostPolicy(PricedPolicy):
    """`cost`: choose by predicted seconds, trying untimed transfer lines within a bound.

    The rule, in order (benefit = predicted recompute seconds - predicted candidate seconds):

      1. Only restore candidates that extend the L1 hit by >= 1 token are offered; a tier
         that adds nothing is never chosen, by this or any rule below.
      2. If some candidate's benefit is > 0, choose the largest (ties: the shallower tier).
      3. Else *explore* (R34): choose the shallowest candidate that is
           (a) untimed: one of its transfer lines (H2D for L2; S2H or H2D for L3) has fewer
               than EXPLORE_SAMPLES samples, so its price still rests on a prior, and
           (b) near: predicted <= (1 + EXPLORE_MARGIN) x predicted recompute.
         Its benefit is then <= 0 but >= -EXPLORE_MARGIN x predicted recompute.
      4. Else recompute (benefit 0).

    So a decision's benefit is negative only while exploring, and never by more than
    EXPLORE_MARGIN of the recompute it replaces. Why explore: the priors come from another
    machine; a pessimistic one would otherwise never be corrected, because a candidate that is
    never chosen is never timed (benchmarks/results/HISTORY.md, "Cost model priors"). Once
    every line of a candidate has EXPLORE_SAMPLES samples, rule 3 no longer applies to it and
    the predictions alone decide.

    Only the restore is weighed: write-through backup runs asynchronously, off the request's
    critical path, so its cost does not count against admission (counting it would make a
    slow disk refuse even the backups that later restores need)."""

    name = "cost"

    def __init__(self, model: CostModel) -> None:
        super().__init__(model)

    def choose(self, cands: Candidates) -> Decision:
        best: Choice | None = None
        for choice in RESTORE_CHOICES:
            if choice in cands.split and (
                best is None or cands.benefit_s(choice) > cands.benefit_s(best)
            ):
                best = choice
        if best is None:
            return cands.decision("recompute", "cost: no tier extends the L1 hit")
        if cands.benefit_s(best) <= 0.0:
            near = self._unexplored_near(cands)
            if near is not None:
                return cands.decision(
                    near,
                    (
                        f"cost: exploring {near}: a transfer line of it has < {EXPLORE_SAMPLES} "
                        f"samples, and it is predicted within {EXPLORE_MARGIN:.0%} of recompute"
                    ),
                )
            return cands.decision(
                "recompute",
                (
                    f"cost: best restore ({best}) predicted {_ms(cands.predicted_s[best])}, "
                    f"not faster than recompute {_ms(cands.predicted_s['recompute'])}"
                ),
            )
        return cands.decision(
            best,
            (
                f"cost: {best} predicted {_ms(cands.predicted_s[best])} vs recompute "
                f"{_ms(cands.predicted_s['recompute'])}, saves {_ms(cands.benefit_s(best))}"
            ),
        )

    def _unexplored_near(self, cands: Candidates) -> Choice | None:
        """The shallowest candidate that rule 3 of the class docstring may explore: one of its
        transfer lines has fewer than EXPLORE_SAMPLES samples and it is predicted within
        EXPLORE_MARGIN of recompute; None if there is none."""
        for choice in RESTORE_CHOICES:
            if choice not in cands.split:
                continue
            lines = ("h2d",) if choice == "L2" else ("h2d", "s2h")
            unexplored = any(self.model.line(k).samples_seen < EXPLORE_SAMPLES for k in lines)
            limit_s = (1.0 + EXPLORE_MARGIN) * cands.predicted_s["recompute"]
            close = cands.predicted_s[choice] <= limit_s
            if unexplored and close:
                return choice
        return None


class AlwaysPolicy(PricedPolicy):
    """`always`: restore from the deepest tier that extends the hit, whatever it costs. The L3
    candidate exists only when L3 reaches beyond both L1 and L2, so it extends the most."""

    name = "always"

    def choose(self, cands: Candidates) -> Decision:
        for choice in reversed(RESTORE_CHOICES):
            if choice in cands.split:
                return cands.decision(choice, f"always: {choice} extends the hit the most")
        return cands.decision("recompute", "always: no tier extends the L1 hit")


class NeverPolicy(PricedPolicy):
    """`never`: always recompute beyond the L1 hit (the baseline every restore must beat)."""

    name = "never"

    def choose(self, cands: Candidates) -> Decision:
        return cands.decision("recompute", "never: restores are disabled")


class ThresholdPolicy(PricedPolicy):
    """`threshold`: SGLang-style fixed rules.

    L3 is used only if the part only L3 holds (beyond L1 and L2) is >= `prefetch_tokens`;
    otherwise L2 is used if what L2 adds beyond L1 is >= `load_back_tokens`; else recompute.
    Both thresholds must be >= 1 (a zero-token restore is never offered anyway).
    """

    name = "threshold"

    def __init__(
        self, prefetch_tokens: int = 256, load_back_tokens: int = 10, model: CostModel | None = None
    ) -> None:
        for field, value in (
            ("prefetch_tokens", prefetch_tokens),
            ("load_back_tokens", load_back_tokens),
        ):
            if not (isinstance(value, int) and value >= 1):
                raise ConfigError(f"policy.{field}", f"must be an integer >= 1, got {value!r}")
        super().__init__(model)
        self.prefetch_tokens = prefetch_tokens
        self.load_back_tokens = load_back_tokens

    def choose(self, cands: Candidates) -> Decision:
        l3_only = cands.split.get("L3", (0, 0))[1]
        l2_extension = cands.split.get("L2", (0, 0))[0]
        if l3_only >= self.prefetch_tokens:
            return cands.decision(
                "L3", (f"threshold: L3 adds {l3_only} >= prefetch_tokens={self.prefetch_tokens}")
            )
        if l2_extension >= self.load_back_tokens:
            return cands.decision(
                "L2",
                (f"threshold: L2 adds {l2_extension} >= load_back_tokens={self.load_back_tokens}"),
            )
        return cands.decision(
            "recompute",
            (
                f"threshold: L3 adds {l3_only} < {self.prefetch_tokens}, "
                f"L2 adds {l2_extension} < {self.load_back_tokens}"
            ),
        )


def make_policy(name: RestorePolicy | str, model: CostModel | None = None) -> Policy:
    """The policy called `name` (one of POLICY_NAMES), sharing `model` (default: priors)."""
    if name not in POLICY_NAMES:
        raise ConfigError("policy", f"unknown policy {name!r}; choose one of {POLICY_NAMES}")
    shared = model if model is not None else CostModel()
    match RestorePolicy(name):
        case RestorePolicy.COST:
            return CostPolicy(shared)
        case RestorePolicy.ALWAYS:
            return AlwaysPolicy(shared)
        case RestorePolicy.NEVER:
            return NeverPolicy(shared)
        case RestorePolicy.THRESHOLD:
            return ThresholdPolicy(model=shared)
