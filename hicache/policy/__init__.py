"""Restore-vs-recompute policy: the online cost model, the policies
that use it, and the log that checks its predictions against what happened.

    costmodel.py   LinearCost (one learned latency line), CostModel (recompute, tail and
                   the 4 transfer directions)
    policies.py    Decision, Policy, PricedPolicy and the four policies: CostPolicy,
                   AlwaysPolicy, NeverPolicy, ThresholdPolicy; make_policy(name, model)
    decisions.py   DecisionLog (per-choice counts, policy skips, prediction error)

Pure Python and numpy; no torch, so the control plane and the trace checker can use it.
"""

from __future__ import annotations

from hicache.policy.costmodel import COST_KINDS, CostModel, LinearCost, nnls_line
from hicache.policy.decisions import DecisionLog
from hicache.policy.policies import (
    POLICY_NAMES,
    AlwaysPolicy,
    Candidates,
    Choice,
    CostPolicy,
    Decision,
    NeverPolicy,
    Policy,
    PricedPolicy,
    ThresholdPolicy,
    make_policy,
    prefill_end,
    price_candidates,
)

__all__ = [
    "COST_KINDS",
    "POLICY_NAMES",
    "AlwaysPolicy",
    "Candidates",
    "Choice",
    "CostModel",
    "CostPolicy",
    "Decision",
    "DecisionLog",
    "LinearCost",
    "NeverPolicy",
    "Policy",
    "PricedPolicy",
    "ThresholdPolicy",
    "make_policy",
    "nnls_line",
    "prefill_end",
    "price_candidates",
]
