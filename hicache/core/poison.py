"""A poisoned control plane: what a caller may still do after an `InvariantViolation`.

The control plane checks the invariants *after* a transition is applied (spec/invariants.md,
"Check modes"). When a check fails, the transition's changes are already in place and the
plane's records disagree with each other; every later transition would be validated against
records that are known to be wrong. So the plane is poisoned (spec/invariants.md, "A poisoned
plane"):

    still allowed                          refused with PlanePoisoned (nothing changed)
    -------------------------------------  ---------------------------------------------
    snapshot(), `poisoned` (the cause)     every public method ControlPlane itself
    the queries (hicache.core.queries), clone() defines: every transition
    the tree's read-only queries           the tree's mutators (split, lock, set_value, ...,
    reading requests, ops, page tables     match that splits or refreshes LRU ticks)
    the trace emitted so far

`refuse_when_poisoned` is the class decorator that enforces the right column for a class: each
public method the class itself defines (not one it inherits: the read-only `PlaneQueries`),
unless named as allowed, first checks `self.poisoned`. New methods are refused by
default, so a transition added later cannot forget the rule.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from hicache.errors import InvariantViolation, PlanePoisoned

C = TypeVar("C", bound=type)


def refuse_when_poisoned(*allowed: str) -> Callable[[C], C]:
    """Wrap every public method of the decorated class except `allowed`: while the instance's
    `poisoned` attribute holds an `InvariantViolation`, the method raises `PlanePoisoned`
    before it runs (so it changes nothing)."""

    def decorate(cls: C) -> C:
        for name, method in list(vars(cls).items()):
            if name.startswith("_") or name in allowed or not inspect.isfunction(method):
                continue
            setattr(cls, name, _refusing(name, method))
        return cls

    return decorate


def _refusing(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def refusing(self: Any, *args: Any, **kwargs: Any) -> Any:
        cause: InvariantViolation | None = self.poisoned
        if cause is not None:
            raise PlanePoisoned(name, cause)
        return method(self, *args, **kwargs)

    return refusing
