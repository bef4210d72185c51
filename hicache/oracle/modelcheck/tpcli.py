"""`hicache model-check --config NAME` for a configuration with `ranks` > 1: the TP model.

Prints the counts, how the search ended and the transitions fired; a finding with its
shortest path of steps (tpsearch.py); exit 1 on a finding or on counts that differ from the
manifest (shipped tables, exhaustive search only), else 0.
"""

from __future__ import annotations

from hicache.core.lifecycle import Lifecycle, load_lifecycle
from hicache.oracle.modelcheck.config import ModelConfig
from hicache.oracle.modelcheck.coverage import spec_transitions
from hicache.oracle.modelcheck.tpsearch import TPResult, explore_tp

EXIT_OK, EXIT_FOUND = 0, 1


def run_tp(cfg: ModelConfig, lifecycle: Lifecycle | None, max_states: int | None) -> int:
    res = explore_tp(cfg, lifecycle=lifecycle, max_states=max_states)
    print(tp_summary(res))
    if res.finding is not None:
        f = res.finding
        print(f"finding ({f.kind}): {f.message}")
        print(f"shortest path ({len(f.path)} steps, on every rank unless a rank is named):")
        for i, step in enumerate(f.path, 1):
            print(f"  {i:3d}. {step}")
        return EXIT_FOUND
    names = spec_transitions(lifecycle or load_lifecycle())
    missing = [n for n in names if n not in res.fired]
    print(
        f"transitions fired: {len(names) - len(missing)}/{len(names)}"
        + (f" (not fired: {', '.join(missing)})" if missing else " (every one)")
    )
    got = (res.states, res.edges, res.depth)
    return compare_counts(cfg, got, res.exhaustive and lifecycle is None)


def compare_counts(cfg: ModelConfig, got: tuple[int, int, int], comparable: bool) -> int:
    """Exit status of a clean search with counts `got` (states, edges, depth): 1 when they
    differ from the manifest's. `comparable`: the search was exhaustive, on the shipped
    tables and the full reduction (other searches have no expected counts: 0)."""
    exp = cfg.expected
    if not comparable or exp is None:
        return EXIT_OK
    if got != (exp.states, exp.edges, exp.depth):
        print(
            f"counts differ from the manifest: got states/edges/depth {got}, expected "
            f"{(exp.states, exp.edges, exp.depth)}; if the model changed on purpose, update "
            "hicache/oracle/modelcheck/configs.toml with the reason"
        )
        return EXIT_FOUND
    print("counts match the manifest")
    return EXIT_OK


def ending(exhaustive: bool, finding: str | None) -> str:
    """How a search ended, as its summary line says it (`finding`: the finding's kind)."""
    if exhaustive:
        return "exhaustive"
    return "stopped early" if finding is None else f"FOUND {finding}"


def tp_summary(res: TPResult) -> str:
    """One line: ranks, counts, time, how the search ended."""
    how = ending(res.exhaustive, None if res.finding is None else res.finding.kind)
    rate = res.states / res.seconds if res.seconds > 0 else 0.0
    return (
        f"model-check {res.config.name} ({res.config.ranks} ranks): {res.states} states, "
        f"{res.edges} edges, depth {res.depth}, {res.seconds:.2f} s, {rate:,.0f} states/s, "
        f"{res.refusals} refusals; {how}"
    )


__all__ = ["compare_counts", "ending", "run_tp", "tp_summary"]
