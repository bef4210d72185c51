"""The model checker: every reachable state of the control plane, for small configurations.

`hicache model-check --config NAME` (cli.py) runs a breadth-first search (search.py) over the
states of `hicache.core.control.ControlPlane` on no data plane, from the empty plane, taking every
action a caller may take (actions.py) from a configuration's fixed prompts and capacities
(config.py, configs.toml). States are hashed by a canonical key (canonical.py: node, op and
page names and, where the prompts allow, request ids renamed away); each branch works on its
own copy of the plane (`ControlPlane.clone`). In every state every invariant is checked and
the drain (drain.py) must be able to reach the quiescent state; every spec transition fired is
recorded (coverage.py). A finding comes back as the shortest path to it, replayed as a trace
`hicache check-trace` accepts (counterexample.py). spec/modelcheck.md is the description.

A configuration with `ranks` 2-3 is the TP model (tpsearch.py, tpsteps.py, tpstate.py,
lockstep.py, tpcli.py): N ranks, each its own plane, running the controller's own issue
(C2), completion (C4) and cancel (C5) under independent per-rank faults, checked to stay
one cache (spec/modelcheck.md, "The TP model").
"""

from __future__ import annotations

from hicache.oracle.modelcheck.config import ModelConfig, get_config, load_configs
from hicache.oracle.modelcheck.search import Finding, Result, explore

__all__ = ["Finding", "ModelConfig", "Result", "explore", "get_config", "load_configs"]
