"""Partial trace examples: another example as an engine that emits only part of it would.

An engine may leave out what it does not know (the header's `omits`, spec/trace.md): the
physical `pages`, the composite `states` (`before`/`after`), the `locks` it takes outside a
transition (`lock`/`unlock` events), `node_remove` and `split` events; and it may have fewer
tiers (`capacities` of L1 and L2 only: no L3 events). A `Partial` takes an example's lines,
drops those keys and events, renumbers the seqs, and says what is left to check:

    omits        the trace leaves out                what check-trace can no longer see
    -----------  ----------------------------------  -----------------------------------------
    pages        `pages` of every event              which physical page a transition moves
    states       `before`, `after`                   (the reference derives them)
    locks        `lock`, `unlock` events             restore pins: an eviction they forbid
    node_remove  `node_remove` events                (the reference removes dead nodes itself)
    split        `split` events                      (the reference splits on the prompts)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace

from hicache.core.trace import HEADER_OMITS as EVERYTHING
from hicache.core.trace import OMITTED_EVENTS, OMITTED_KEYS, TraceHeader


@dataclass(frozen=True)
class Partial:
    """Example `name`: example `source` as an engine with `tiers` that omits `omits` would
    emit it. `bad_event`: for a violation, the name of its first bad event, the first so
    named at or after the source's own first bad event (it may move on to the event where
    the omitted part's consequence shows)."""

    name: str
    source: str
    tiers: tuple[str, ...]
    omits: tuple[str, ...]
    verdict: str
    bug_class: str | None
    description: str
    bad_event: str | None = None


def stripped(
    p: Partial, lines: Sequence[str], source_seq: int | None
) -> tuple[tuple[str, ...], int | None]:
    """`lines` (an example's, header first) without what `p` omits; the new lines and the seq
    of the first bad event (None for a valid trace)."""
    source = TraceHeader.from_json(lines[0])
    # Verify the source has no event of a tier the partial engine lacks.
    assert all(json.loads(line).get("tier") in (None, *p.tiers) for line in lines[1:]), p.name
    header = replace(
        source,
        capacities={t: n for t, n in source.capacities.items() if t in p.tiers},
        omits=tuple(p.omits),
    )
    dropped = {e for o in p.omits for e in OMITTED_EVENTS.get(o, ())}
    keys = [k for o in p.omits for k in OMITTED_KEYS.get(o, ())]
    out, seq = [header.to_json()], None
    for line in lines[1:]:
        e = json.loads(line)
        if e["event"] in dropped:
            continue
        was, e["seq"] = e["seq"], len(out)
        for k in keys:
            e.pop(k, None)
        if (
            seq is None
            and p.bad_event is not None
            and source_seq is not None
            and was >= source_seq
            and e["event"] == p.bad_event
        ):
            seq = e["seq"]
        out.append(json.dumps(e, separators=(",", ":"), sort_keys=True))
    # Verify a violation found its first bad event.
    assert (seq is None) == (p.bad_event is None), p.name
    return tuple(out), seq


PARTIALS = (
    Partial(
        "partial_l1_l2_engine",
        "write_back_on_eviction",
        ("L1", "L2"),
        EVERYTHING,
        "valid",
        None,
        "an engine with L1 and L2 only that emits node ids and token ranges, nothing more: "
        "write-back and a load-back, still checked transition by transition",
    ),
    Partial(
        "partial_no_pages",
        "write_through_l3",
        ("L1", "L2", "L3"),
        ("pages",),
        "valid",
        None,
        "write-through to L3 from an engine that does not emit physical pages",
    ),
    Partial(
        "partial_backup_gap",
        "backup_gap",
        ("L1", "L2", "L3"),
        EVERYTHING,
        "violation",
        "B07",
        "backup_gap with everything omittable left out: the issue guard still refuses the gap",
        "h2s_issue",
    ),
    Partial(
        "partial_cached_len_before_publication",
        "cached_len_before_publication",
        ("L1", "L2", "L3"),
        EVERYTHING,
        "violation",
        "B01",
        "cached_len_before_publication with everything omittable left out: I5 still holds it",
        "cached_len",
    ),
    Partial(
        "partial_evict_pinned_promotion",
        "evict_pinned_promotion",
        ("L1", "L2", "L3"),
        EVERYTHING,
        "violation",
        "B04",
        "evict_pinned_promotion without lock events: the eviction the pin forbids is not seen, "
        "its consequence is (the load-back from an L2 copy that is gone)",
        "h2d_issue",
    ),
    Partial(
        "partial_page_mixup_unseen",
        "compute_into_published_page",
        ("L1", "L2", "L3"),
        ("pages",),
        "valid",
        "B15",
        "compute_into_published_page without pages: nothing in the trace shows the page handed "
        "to two owners, so it is valid (what a trace without pages cannot check)",
    ),
)
