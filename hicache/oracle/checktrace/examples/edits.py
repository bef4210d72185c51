"""Invalid trace examples: each one small, named edit of a valid example's trace.

An `Edit` names its base (a script of valid.py), its verdict and bug class (spec/bugclasses.md)
and its `change`, a function named as the example:

    verdict     the change                                             returns
    ---------   -----------------------------------------------------  -----------------------
    violation   moves, drops, repeats, changes or adds events (dicts);  the index of the first
                `edited` then renumbers seqs and op ids, as the broken  bad event
                engine would have numbered them
    malformed   breaks the lines' format (header first)                the seq to blame, or
                                                                       None
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hicache.oracle.checktrace.examples.valid import PAGE_SIZE

Event = dict[str, object]

Change = Callable[[list[Event]], int]
"""An edit of a violation: changes the events in place, returns the index of the first bad
event (seqs and op ids are renumbered after it, as the broken engine would have numbered
them)."""
Break = Callable[[list[str]], int | None]
"""An edit of a malformed example: changes the lines (header first) in place, returns the
seq of the line to blame, or None where no one event is."""


@dataclass(frozen=True)
class Edit:
    """One invalid example, named after its `change`, applied to the valid example `base`."""

    base: str
    verdict: str
    bug_class: str | None
    description: str
    change: Change | Break

    @property
    def name(self) -> str:
        return self.change.__name__


def _at(events: list[Event], event: str, **fields: object) -> int:
    """Index of the first event named `event` whose `fields` have those values."""
    for i, e in enumerate(events):
        if e["event"] == event and all(e.get(k) == v for k, v in fields.items()):
            return i
    raise LookupError(f"no {event} event with {fields}: the base script changed; fix the edit")


def _repeat(events: list[Event], i: int) -> int:
    """Emit event `i` a second time, right after itself."""
    events.insert(i + 1, json.loads(json.dumps(events[i])))
    return i + 1


def cached_len_before_publication(ev: list[Event]) -> int:
    i = _at(ev, "h2d_complete")
    ev.insert(i, ev.pop(_at(ev, "cached_len", request=2, token_end=4)))
    return i


def evict_pinned_promotion(ev: list[Event]) -> int:
    i = _at(ev, "lock", request=2, tier="L2") + 1
    promoted = ev[_at(ev, "s2h_complete")]
    ev.insert(
        i,
        {
            "event": "evict_l2",
            "tier": "L2",
            "node": promoted["node"],
            "pages": promoted["pages"],
            "token_start": 0,
            "token_end": 4,
            "before": "L2_L3",
            "after": "L3",
        },
    )
    return i


def complete_after_cancel(ev: list[Event]) -> int:
    i = _at(ev, "h2d_cancel")
    ev.insert(
        i + 1, {**ev[i], "event": "h2d_complete", "before": "H2D_PENDING_L2", "after": "L1_L2"}
    )
    return i + 1


def end_with_pending_restore(ev: list[Event]) -> int:
    del ev[_at(ev, "h2d_cancel")]
    # The unlock of the request's pin starts its end_request call, which the reference
    # refuses for the op still pending: the violation is the end_request event itself, the
    # unlocks before it being enabled (spec/appendix-tools.md, "check-trace").
    return _at(ev, "end_request", request=2)


def backup_gap(ev: list[Event]) -> int:
    ev[:] = [e for e in ev if not (str(e["event"]).startswith("h2s_") and e.get("node") == 1)]
    return _at(ev, "h2s_issue", node=2)


def split_op_pages_swapped(ev: list[Event]) -> int:
    upper, lower = (i for i, e in enumerate(ev) if e["event"] == "d2h_complete")
    ev[upper]["pages"], ev[lower]["pages"] = ev[lower]["pages"], ev[upper]["pages"]
    return upper


def split_inside_a_page(ev: list[Event]) -> int:
    i = _at(ev, "split")
    ev[i]["detail"] = {**ev[i]["detail"], "at": PAGE_SIZE // 2}  # type: ignore[dict-item]
    return i


def promoted_l2_freed_after_failed_h2d(ev: list[Event]) -> int:
    i = _at(ev, "h2d_fail") + 1
    ev.insert(
        i,
        {
            **ev[_at(ev, "s2h_complete")],
            "event": "s2h_cancel",
            "before": "S2H_PENDING_L3",
            "after": "L3",
        },
    )
    return i


def discard_twice(ev: list[Event]) -> int:
    return _repeat(ev, _at(ev, "discard", request=1))


def unlock_twice(ev: list[Event]) -> int:
    return _repeat(ev, _at(ev, "unlock", request=2, tier="L1"))


def compute_into_published_page(ev: list[Event]) -> int:
    i = _at(ev, "compute", request=2)
    published = ev[_at(ev, "insert", request=1)]["pages"]
    assert isinstance(published, list) and isinstance(ev[i]["pages"], list)
    ev[i]["pages"] = [published[-1], *ev[i]["pages"][1:]]  # type: ignore[index]
    return i


def serve_invalidated_slot(ev: list[Event]) -> int:
    i = _at(ev, "node_remove", node=1) + 1
    read = ev[_at(ev, "s2h_issue")]
    ev.insert(i, {**read, "op": 1 + max(int(e["op"]) for e in ev if "op" in e)})  # type: ignore[call-overload]
    return i


def no_header(lines: list[str]) -> int | None:
    del lines[0]
    return None


def header_version_2(lines: list[str]) -> int | None:
    lines[0] = lines[0].replace('"version":1', '"version":2')
    return None


def seq_gap(lines: list[str]) -> int | None:
    del lines[6]  # seq 6: the line with seq 7 follows seq 5
    return 7


def unknown_event(lines: list[str]) -> int | None:
    i = next(i for i, line in enumerate(lines) if '"event":"h2s_complete"' in line)
    lines[i] = lines[i].replace('"h2s_complete"', '"h2s_done"')
    return i


def not_json(lines: list[str]) -> int | None:
    lines[4] = lines[4][: len(lines[4]) // 2]
    return None


EDITS = (
    Edit(
        "l3_restore_promotion",
        "violation",
        "B01",
        "request 2's cached_len covers node 1 before the h2d_complete that publishes it in L1 (I5)",
        cached_len_before_publication,
    ),
    Edit(
        "failed_h2d_after_promotion",
        "violation",
        "B02",
        "the failed load-back's cleanup also ends the promotion that completed (s2h_cancel of "
        "an ended op), returning L2 pages the tree owns",
        promoted_l2_freed_after_failed_h2d,
    ),
    Edit(
        "abort_mid_h2d",
        "violation",
        "B03",
        "request 2 ends while its load-back is pending (no h2d_cancel): "
        "its target pages outlive it",
        end_with_pending_restore,
    ),
    Edit(
        "l3_restore_promotion",
        "violation",
        "B04",
        "node 1's promoted L2 copy is evicted between the restore's stages while request 2's "
        "pin locks it",
        evict_pinned_promotion,
    ),
    Edit(
        "abort_mid_h2d",
        "violation",
        "B06",
        "a completion for the cancelled load-back: the op ends twice",
        complete_after_cancel,
    ),
    Edit(
        "write_through_l3",
        "violation",
        "B06",
        "request 1's tail page is released twice (a double free)",
        discard_twice,
    ),
    Edit(
        "write_through_l3",
        "violation",
        "B07",
        "node 2 is backed up to L3 while its parent, node 1, never was",
        backup_gap,
    ),
    Edit(
        "split_during_pending_op",
        "violation",
        "B08",
        "after the split, the backup's two end events carry each other's page of the op's list",
        split_op_pages_swapped,
    ),
    Edit(
        "split_during_pending_op",
        "violation",
        "B08",
        "node 1 is split at a token offset inside a page",
        split_inside_a_page,
    ),
    Edit(
        "l3_restore_promotion",
        "violation",
        "B11",
        "request 2 releases its L1 pin twice: a lock count below zero",
        unlock_twice,
    ),
    Edit(
        "write_through_l3",
        "violation",
        "B15",
        "request 2 computes into an L1 page node 1 holds (a page handed to two owners)",
        compute_into_published_page,
    ),
    Edit(
        "failed_s2h_fallback",
        "violation",
        "B15",
        "after its checksum failed and the slot was invalidated (node 1 removed), node 1 is "
        "read from L3 again",
        serve_invalidated_slot,
    ),
    Edit("write_through_l3", "malformed", None, "the header line is missing", no_header),
    Edit(
        "write_through_l3",
        "malformed",
        None,
        "the header names trace format version 2",
        header_version_2,
    ),
    Edit("write_through_l3", "malformed", None, "the event with seq 6 is lost", seq_gap),
    Edit(
        "write_through_l3",
        "malformed",
        None,
        "an event name that is no transition (h2s_done)",
        unknown_event,
    ),
    Edit("write_through_l3", "malformed", None, "an event line cut in half", not_json),
)


def _renumbered(events: list[Event]) -> list[str]:
    """Seqs 1, 2, ... and op ids in order of first appearance, as one line each."""
    ops: dict[object, int] = {}
    for seq, e in enumerate(events, 1):
        e["seq"] = seq
        if "op" in e:
            e["op"] = ops.setdefault(e["op"], len(ops) + 1)
    return [json.dumps(e, separators=(",", ":"), sort_keys=True) for e in events]


def edited(edit: Edit, base: Sequence[str]) -> tuple[tuple[str, ...], int | None]:
    """`edit` applied to the lines `base`: the edited lines and the seq to blame."""
    lines = list(base)
    if edit.verdict == "malformed":
        seq = edit.change(lines)  # type: ignore[arg-type]
    else:
        events: list[Event] = [json.loads(line) for line in lines[1:]]
        bad = edit.change(events)  # type: ignore[arg-type]
        assert isinstance(bad, int)  # Verify: a violation names its first bad event.
        lines, seq = [lines[0], *_renumbered(events)], bad + 1
    return tuple(lines), seq
