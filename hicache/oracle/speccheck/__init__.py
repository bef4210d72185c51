"""The drift check: the spec's prose, diagrams, tables, executor and code must agree.

`check_spec(spec_dir)` reads one spec directory (an edited copy is checked as it stands, not
the cached shipped tables) and returns every difference it finds, one human-readable line
each; an empty list means the spec is consistent. One module per thing compared:

    lifecycle.toml   loads: every row's guards are in the vocabulary and its effects fit its
                     states (hicache.core.lifecycle; the executor runs any row that loads)
    tables           [[composite]] list: reachable set, naming rule, duplicates; lifecycle.md
                     tables (constants, ownership, residency, transitions, guard vocabulary,
                     control-plane rules, composites); the embedded Mermaid blocks
    machine          the `transitions` machine of the rows (hicache/core/pagemachine.py) and the
                     hand-written composition reach the same composite graph
    properties       what the tables must mean, proven from the rows and the composite graph
                     (no eviction under a child, a source locked for the op's life, ...), so a
                     wrong table edited consistently still fails; lifecycle.md's property table
    rules            each control-plane rule of lifecycle.toml is enforced by the reference
                     (a probe per rule must be refused with a typed error)
    invariants       registry CHECKS and the cross-rank RANK_CHECKS vs invariants.md headings,
                     checker and test names
    trace            lifecycle.toml / TraceEvent vs trace.schema.json and trace.md's table;
                     TraceHeader vs trace.header.schema.json
    l3header         l3format.LAYOUT vs l3.md's L3 header table, row by row
    pools            pools.toml loads (every group rule holds) vs pools.md's preset tables,
                     cell by cell
    config           CacheConfig's fields vs config.md's knob table: names, defaults, and
                     the legal values probed on the reference
    tp               tp.toml vs tp.md's point table, point sections and L3 write table; every
                     collective point is called by the code with its op, and no other
    pages            README.md's reading order vs the pages; bug-class ids vs bugclasses.md;
                     metric names in the pages vs what the reference exports
    rulenumbers      every MUST of the pages carries the id of its rule in SUMMARY.md, every
                     id a page or the code cites is defined there, and code cites every rule
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hicache.core.lifecycle import Lifecycle
from hicache.errors import SpecError
from hicache.oracle.speccheck.config import check_config
from hicache.oracle.speccheck.invariants import CheckInfo, check_invariant_headings, registry_checks
from hicache.oracle.speccheck.l3header import check_l3_header
from hicache.oracle.speccheck.machine import check_machine
from hicache.oracle.speccheck.mdtables import parse_tables
from hicache.oracle.speccheck.pages import (
    check_bug_classes,
    check_metric_names,
    check_reading_order,
    reference_metrics,
)
from hicache.oracle.speccheck.pools import check_pools
from hicache.oracle.speccheck.properties import PROPERTIES, check_properties, check_property_table
from hicache.oracle.speccheck.rulenumbers import check_rule_numbers
from hicache.oracle.speccheck.rules import check_rules
from hicache.oracle.speccheck.tables import (
    check_composites,
    check_diagrams,
    check_lifecycle_tables,
    spec_counts,
)
from hicache.oracle.speccheck.tp import check_tp
from hicache.oracle.speccheck.trace import (
    NON_LIFECYCLE_EVENTS,
    check_header_schema,
    check_trace_schema,
)
from hicache.spec import SPEC_DIR, load_toml

__all__ = [
    "NON_LIFECYCLE_EVENTS",
    "PROPERTIES",
    "CheckInfo",
    "check_l3_header",
    "check_rule_numbers",
    "check_rules",
    "check_spec",
    "parse_tables",
    "registry_checks",
    "spec_counts",
]


def check_spec(spec_dir: Path, checks: Sequence[CheckInfo] | None = None) -> list[str]:
    """Every difference between the parts of the spec in `spec_dir`; empty means consistent.

    `checks` defaults to `hicache.invariants.registry.CHECKS` and the cross-rank
    `hicache.invariants.ranks.RANK_CHECKS`; if they cannot be imported, one difference says so
    instead of raising."""
    try:
        lc = Lifecycle(load_toml(spec_dir / "lifecycle.toml"))
    except (OSError, ValueError, KeyError, TypeError, SpecError) as e:
        return [f"lifecycle.toml: cannot be loaded ({type(e).__name__}: {e})"]
    problems = check_composites(lc) + check_machine(lc) + check_properties(lc) + check_rules(lc)
    lifecycle_md = _read(spec_dir / "lifecycle.md", problems)
    if lifecycle_md is not None:
        problems += check_lifecycle_tables(lc, lifecycle_md) + check_property_table(lifecycle_md)
        installed = spec_dir.resolve() == SPEC_DIR.resolve()
        problems += check_diagrams(lc, lifecycle_md, None if installed else str(spec_dir))
    invariants_md = _read(spec_dir / "invariants.md", problems)
    if invariants_md is not None:
        loaded = registry_checks(with_ranks=True) if checks is None else checks
        if isinstance(loaded, str):
            problems.append(loaded)
        else:
            problems += check_invariant_headings(loaded, invariants_md)
    schema_text = _read(spec_dir / "trace.schema.json", problems)
    trace_md = _read(spec_dir / "trace.md", problems)
    if schema_text is not None:
        problems += check_trace_schema(lc, schema_text, trace_md)
    header_text = _read(spec_dir / "trace.header.schema.json", problems)
    if header_text is not None:
        problems += check_header_schema(header_text)
    l3_md = _read(spec_dir / "l3.md", problems)
    if l3_md is not None:
        problems += check_l3_header(l3_md)
    pools_md = _read(spec_dir / "pools.md", problems)
    if pools_md is not None:
        problems += check_pools(pools_md, spec_dir / "pools.toml")
    tp_md = _read(spec_dir / "tp.md", problems)
    if tp_md is not None:
        problems += check_tp(tp_md, spec_dir / "tp.toml")
    pages = {
        p.name: text
        for p in sorted(spec_dir.glob("*.md"))
        if (text := _read(p, problems)) is not None
    }
    config_md = pages.get("config.md")
    problems += ["config.md: missing"] if config_md is None else check_config(config_md)
    problems += check_reading_order(pages) + check_bug_classes(pages)
    metrics = reference_metrics()
    problems += [metrics] if isinstance(metrics, str) else check_metric_names(pages, metrics)
    return problems + check_rule_numbers(spec_dir)


def _read(path: Path, problems: list[str]) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        problems.append(f"{path.name}: cannot be read ({e.strerror or e})")
        return None
