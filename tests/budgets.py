"""The Hypothesis profile this run loads, and fuzz budgets that grow under the fuzz profile.

    profile   chosen by                                   a whole-fuzz test's budget
    --------  ------------------------------------------  ---------------------------------
    dev       the default (a local `pytest`)               `quick`: what the test's claim needs,
    ci        CI=true (Hypothesis' derandomised settings)  with a margin, in a few seconds
    fuzz      HICACHE_HYPOTHESIS_PROFILE=fuzz             `long`: the nightly length

A test whose claim needs a budget (coverage reached, every engine's trace judged) states both:
the README's test command stays within minutes on two cores, and the long runs belong to the
fuzz profile (tests/conftest.py).
"""

from __future__ import annotations

import os
from typing import TypeVar

T = TypeVar("T")

PROFILES = ("dev", "ci", "fuzz")


def profile() -> str:
    """The profile this run loads: HICACHE_HYPOTHESIS_PROFILE, else `ci` under CI, else `dev`."""
    return os.environ.get("HICACHE_HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")


def budget(quick: T, long: T) -> T:
    """`long` under the fuzz profile, else `quick`."""
    return long if profile() == "fuzz" else quick
