"""Mermaid `stateDiagram-v2` diagrams generated from the lifecycle tables.

The diagrams in spec/lifecycle.md are never edited by hand: each sits between marker
comments and is rewritten by `hicache spec write-diagrams`; `hicache spec check` fails when
an embedded block differs from what the tables generate.

    <!-- BEGIN GENERATED: L2 -->      one block per name in DIAGRAMS
    ```mermaid
    stateDiagram-v2
        ...
    ```
    <!-- END GENERATED -->

Output is deterministic: states and edges follow the tables' order (composite states sorted
by name), so a diff of a block is a diff of the tables.
"""

from __future__ import annotations

import re

from hicache.core.lifecycle import Lifecycle, Transition, composite_name
from hicache.core.tiers import TIERS, Tier
from hicache.errors import SpecError

DIAGRAMS: tuple[str, ...] = ("ownership", "L1", "L2", "L3", "composite")
"""Every generated diagram, in the order the spec shows them."""

_INDENT = "    "
_BEGIN = re.compile(r"^<!-- BEGIN GENERATED: (\S+) -->$")
_END = "<!-- END GENERATED -->"


def ownership_diagram(lc: Lifecycle) -> str:
    """The physical-page ownership machine of one tier (FREE / PRIVATE / TREE)."""
    initial = lc.tables["ownership"]["initial"]
    lines = ["stateDiagram-v2", f"{_INDENT}[*] --> {initial}"]
    lines += [f"{_INDENT}{t.source} --> {t.dest}: {t.name}" for t in lc.ownership_transitions]
    return "\n".join(lines) + "\n"


def tier_diagram(lc: Lifecycle, tier: Tier) -> str:
    """One tier's residency sub-machine; each edge is labelled with its transition name and,
    in brackets, its guards (other tiers' sub-states and lock counts)."""
    lines = ["stateDiagram-v2", f"{_INDENT}[*] --> {lc.initial[tier]}"]
    for t in lc.transitions.values():
        if t.tier == tier:
            lines.append(f"{_INDENT}{t.source} --> {t.dest}: {_label(t)}")
    return "\n".join(lines) + "\n"


def composite_diagram(lc: Lifecycle) -> str:
    """Every reachable (L1, L2, L3) triple, by composite name, and the transitions between
    them. Parallel edges between one pair of states share one arrow, labels joined by ", "."""
    graph = lc.reachable()
    lines = ["stateDiagram-v2", f"{_INDENT}[*] --> {composite_name(lc.initial_states())}"]
    for states in sorted(graph, key=composite_name):
        labels: dict[str, list[str]] = {}  # dest name -> transition names, first-seen order
        for t, dest in graph[states]:
            labels.setdefault(composite_name(dest), []).append(t.name)
        source = composite_name(states)
        lines += [f"{_INDENT}{source} --> {d}: {', '.join(n)}" for d, n in labels.items()]
    return "\n".join(lines) + "\n"


def diagram(lc: Lifecycle, which: str) -> str:
    """The diagram named `which` (one of DIAGRAMS); SpecError for any other name."""
    if which == "ownership":
        return ownership_diagram(lc)
    if which == "composite":
        return composite_diagram(lc)
    if which in {str(t) for t in TIERS}:
        return tier_diagram(lc, Tier(which))
    raise SpecError(f"no diagram named {which!r}; choose from {', '.join(DIAGRAMS)}")


def all_diagrams(lc: Lifecycle) -> dict[str, str]:
    """Every diagram of DIAGRAMS, by name."""
    return {which: diagram(lc, which) for which in DIAGRAMS}


def _label(t: Transition) -> str:
    if not t.guards:
        return t.name
    return f"{t.name} [{', '.join(g.text for g in t.guards)}]"


# -- embedding in markdown ------------------------------------------------------------------


def render_block(which: str, text: str) -> str:
    """The full generated block for one diagram, markers included (no trailing newline)."""
    return f"<!-- BEGIN GENERATED: {which} -->\n```mermaid\n{text}```\n{_END}"


def extract_blocks(markdown: str) -> dict[str, str]:
    """Diagram text of each generated block in `markdown`, by name (fences stripped; "" for
    a block whose markers hold nothing yet).

    SpecError when a block is opened twice, never closed, or has no mermaid fence, because
    a half-edited block cannot be compared or rewritten safely."""
    return {name: body for name, (_, _, body) in _blocks(markdown).items()}


def replace_blocks(markdown: str, diagrams: dict[str, str]) -> tuple[str, list[str]]:
    """`markdown` with each named block's diagram replaced, and the names whose text changed.

    Every name in `diagrams` must already have a block: the author chooses where a diagram
    goes, the tool only refreshes it (SpecError names the missing markers)."""
    blocks = _blocks(markdown)
    missing = [name for name in diagrams if name not in blocks]
    if missing:
        raise SpecError(
            f"no generated block for {', '.join(missing)}; add "
            f"'<!-- BEGIN GENERATED: {missing[0]} -->' and '{_END}' where it belongs"
        )
    lines = markdown.split("\n")
    changed = [name for name in diagrams if blocks[name][2] != diagrams[name]]
    # Replace from the bottom up so earlier line numbers stay valid.
    for name in sorted(diagrams, key=lambda n: blocks[n][0], reverse=True):
        first, last, _ = blocks[name]
        lines[first : last + 1] = render_block(name, diagrams[name]).split("\n")
    return "\n".join(lines), changed


def _blocks(markdown: str) -> dict[str, tuple[int, int, str]]:
    """name -> (begin line, end line, diagram text) of each generated block."""
    found: dict[str, tuple[int, int, str]] = {}
    lines = markdown.split("\n")
    i = 0
    while i < len(lines):
        m = _BEGIN.match(lines[i].strip())
        if m is None:
            i += 1
            continue
        name, first = m.group(1), i
        if name in found:
            raise SpecError(f"generated block {name!r} appears twice (line {i + 1})")
        try:
            last = lines.index(_END, first)
        except ValueError:
            raise SpecError(
                f"generated block {name!r} (line {first + 1}) has no '{_END}'"
            ) from None
        inner = lines[first + 1 : last]
        if any(_BEGIN.match(line.strip()) for line in inner):
            raise SpecError(
                f"generated block {name!r} (line {first + 1}) is not closed before the next one"
            )
        # Verify the block is empty (markers just added) or exactly one mermaid fence:
        # anything else would be lost on rewrite.
        if inner and (len(inner) < 2 or inner[0] != "```mermaid" or inner[-1] != "```"):
            raise SpecError(
                f"generated block {name!r} (line {first + 1}) is not one ```mermaid fence"
            )
        found[name] = (first, last, "\n".join(inner[1:-1]) + "\n" if inner else "")
        i = last + 1
    return found
