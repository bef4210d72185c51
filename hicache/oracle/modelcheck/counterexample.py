"""A finding as a trace: replay its path on a fresh, traced plane (spec/trace.md).

The search keeps, per state, the action that first reached it, so a finding's path is a
shortest path from the empty plane. The plane is deterministic (allocation, node and op ids
depend only on the calls made), so replaying the path on a fresh plane -- with tracing on and
`check_mode="every"` -- makes the same calls on the same ids and emits the trace
`hicache check-trace` reads: the header (`ControlPlane.trace_header`), then one event per
transition, ending with the event that broke an invariant (kind `invariant`), the call that
crashed (`crash`) or, for `stuck`, the drain from the stuck state up to its failing call.
"""

from __future__ import annotations

from typing import IO

from hicache.core.lifecycle import Lifecycle
from hicache.core.trace import NdjsonSink, Tracer
from hicache.errors import InvariantViolation
from hicache.oracle.modelcheck.actions import apply, is_refusal
from hicache.oracle.modelcheck.config import ModelConfig
from hicache.oracle.modelcheck.drain import drain
from hicache.oracle.modelcheck.search import Finding, initial_plane

ENGINE = "hicache model-check"
"""The trace header's `engine` for a model checker's counterexample."""


class ReplayDiverged(AssertionError):
    """The replayed path did not do what the search saw: a bug in the model checker (its
    copies or its keys), never in the plane under test. Report the config and the path."""


def write_trace(
    cfg: ModelConfig, finding: Finding, stream: IO[str], lifecycle: Lifecycle | None = None
) -> str:
    """Replay `finding.path` (then, for `stuck`, the drain) on a fresh plane of `cfg`, writing
    the trace to `stream`. Returns how the replay ended (the violation, the exception, or why
    the drain is stuck). ReplayDiverged if a call of the path is refused on replay."""
    tracer = Tracer()
    cp = initial_plane(cfg, lifecycle, tracer=tracer, check_mode="every")
    tracer.sink = NdjsonSink(
        stream, cp.trace_header(engine=ENGINE)
    )  # (replaces a walk hook's sink)
    for i, a in enumerate(finding.path):
        try:
            apply(cp, cfg, a)
        except InvariantViolation as e:
            return f"step {i + 1} `{a}`: {e}"
        except Exception as e:  # the search saw this call succeed or crash: sort it out
            if is_refusal(e) and finding.kind != "refusal":
                raise ReplayDiverged(
                    f"step {i + 1} `{a}` was refused on replay ({e}); the search saw it succeed"
                ) from e
            return f"step {i + 1} `{a}` raised {type(e).__name__}: {e}"
    if finding.kind == "stuck":
        return drain(cp, lambda a: apply(cp, cfg, a)) or "the drain succeeded on replay"
    return "the path replayed without the finding"
