"""Properties the lifecycle tables must have (R10), proven from the rows and the composite graph.

The rest of `hicache spec check` compares the tables with their own derivations (prose,
diagrams, the `transitions` machine), so a wrong table edited consistently everywhere passes
it. These properties judge the tables by what they mean instead: each is a claim about
every row, or about every reachable composite state, decided by exhaustive reasoning over
the loaded rows and the composite graph (never by running the reference), and a table that
breaks one fails with a message naming the row (or state) that breaks it. They are listed,
one line each, in spec/lifecycle.md ("Properties the tables must have"), a checked copy of
`PROPERTIES`.

    name                              decided over
    --------------------------------  ---------------------------------------------------
    evict_leaf_only, evict_unlocked   every row with a `free` effect: its guards
    issue_no_gap                      every transfer issue: its guards
    compute_guarded                   every row reserving pages for a request: its guards
    source_locked                     every row: its lock effects, by its direction
    publish_on_complete_only          every row: its ownership effect, by its kind
    pending_exits                     every direction: the rows into and out of its pending
                                      state; the partial-end rule
    pages_balance                     every tier's states: the rows that leave each
    source_resident_while_pending,    the reachable composite graph (lock, tree and request
    every_legal_triple_reachable,     guards taken as satisfiable, as for the composite
    drains_to_absent                  states: spec/lifecycle.md)

What the load already refuses (`hicache.core.lifecycle`: a row whose effects do not fit its
states, an unknown guard form) never reaches these checks: a table that does not load fails
before them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hicache.core.lifecycle import Lifecycle
from hicache.oracle.speccheck import graphprops, rowprops
from hicache.oracle.speccheck.mdtables import Row, TableSpec, compare_rows, parse_tables
from hicache.oracle.speccheck.rowprops import Graph


@dataclass(frozen=True)
class Property:
    """One property: its name, the one-line statement lifecycle.md shows, what it protects
    (invariants and bug classes), and the check that proves it (one problem line per row or
    state that breaks it; none when it holds)."""

    name: str
    statement: str
    protects: str
    check: Callable[[Lifecycle, Graph], list[str]]


PROPERTIES: tuple[Property, ...] = (
    Property(
        "evict_leaf_only",
        "every row that frees a tier's copy (`free(T)`) guards `leaf(T)`: no node loses `T` "
        "while a child holds it",
        "S6, B07",
        rowprops.evict_leaf_only,
    ),
    Property(
        "evict_unlocked",
        "every row that frees `T` guards `locks(T) == 0`: no copy a request serves or a "
        "transfer reads is freed",
        "I2, I5, B04",
        rowprops.evict_unlocked,
    ),
    Property(
        "issue_no_gap",
        "every transfer's issue into `T` guards `parent(T) == RESIDENT`: a tier is never "
        "filled below a gap",
        "S6, B07",
        rowprops.issue_no_gap,
    ),
    Property(
        "compute_guarded",
        "a row that reserves pages for a request (no direction) guards `aligned(range)`, "
        "`range <= prompt` and `no_private(request)`",
        "I3, B08",
        rowprops.compute_guarded,
    ),
    Property(
        "source_locked",
        "a transfer's issue takes exactly one lock, on its source tier, and each of its ends "
        "releases exactly that one; no other row locks or unlocks",
        "I2, S7, B04",
        rowprops.source_locked,
    ),
    Property(
        "publish_on_complete_only",
        "only a `complete` row (an observed completion) or `insert` (a request's own pages) "
        "publishes; every `fail`, `cancel` and `abort` row releases",
        "I5, B01, B02",
        rowprops.publish_on_complete_only,
    ),
    Property(
        "pending_exits",
        "each direction has one issue into its pending state, left by exactly one complete, "
        "one fail and one cancel row of that direction (a partial end, rule "
        "`partial_end_s2h_only`, is its complete then its fail)",
        "I5, B03",
        rowprops.pending_exits,
    ),
    Property(
        "pages_balance",
        "every private or pending state is left by a row that publishes and one that releases, "
        "every `RESIDENT` state by one that frees: a reservation ends on every path",
        "I1, I6, B03",
        rowprops.pages_balance,
    ),
    Property(
        "source_resident_while_pending",
        "in every reachable composite state, each pending transfer's source tier is "
        "`RESIDENT`: no row issues from, or drops, a copy a transfer reads",
        "I2, B04",
        graphprops.source_resident_while_pending,
    ),
    Property(
        "every_legal_triple_reachable",
        "every triple in which each pending transfer's source is `RESIDENT` is reachable: "
        "the guards forbid nothing more",
        "composite states",
        graphprops.every_legal_triple_reachable,
    ),
    Property(
        "drains_to_absent",
        "from every reachable composite state `ABSENT` is reachable: every op can end and "
        "every copy can be dropped",
        "I6, B03",
        graphprops.drains_to_absent,
    ),
)
"""Every property, in the order lifecycle.md lists them."""


def check_properties(lc: Lifecycle) -> list[str]:
    """One problem line per row or state of `lc` that breaks a property; empty: all hold."""
    graph = lc.reachable()
    return [line for p in PROPERTIES for line in p.check(lc, graph)]


def check_property_table(markdown: str) -> list[str]:
    """lifecycle.md's property table (first column `property`) lists `PROPERTIES`: every
    one once, with its statement and what it protects."""
    rows: list[Row] = [
        {"property": p.name, "statement": p.statement, "protects": p.protects} for p in PROPERTIES
    ]
    spec = TableSpec(("property", "statement", "protects"), 1, rows)
    tables = [tb for tb in parse_tables(markdown) if tb.headers and tb.headers[0] == "property"]
    if not tables:
        return ["lifecycle.md: no table whose first column is 'property'"]
    found = [(line, row) for tb in tables for line, row in tb.rows]
    return compare_rows("lifecycle.md", "property", spec, found, source="the property registry")
