"""The trace examples of spec/examples/, generated so that they cannot rot.

    verdict     how a file is made                                        exit
    ---------   --------------------------------------------------------  ----
    valid       a ControlPlane script traced through an NdjsonSink, the      0
                plane's own header first (`record`)
    violation   one named edit of a valid trace (`Edit`: an event moved,     1
                dropped, repeated, changed or added; seqs renumbered), an
                instance of a bug class of spec/bugclasses.md; `seq` is
                its first bad event
    malformed   one named edit that breaks the format (spec/trace.md)        2

`spec/examples/manifest.toml` has one table per file: verdict, `seq` (the first bad event,
where one event is to blame), bug class, the valid example edited, a one-line description. The
files and the manifest are written by

    python3 -m hicache.checktrace.examples spec/examples           # (re)write them
    python3 -m hicache.checktrace.examples --check spec/examples   # exit 1 on any difference

and tests/test_trace_examples.py fails when the committed files differ from what this module
writes, or when `hicache.checktrace.check_lines` disagrees with a manifest verdict.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from hicache.control import ControlPlane
from hicache.tiers import Direction
from hicache.trace import NdjsonSink, TraceHeader, Tracer
from hicache.tree import TreeNode

PAGE_SIZE = 2
CAPACITIES = {"L1": 8, "L2": 8, "L3": 8}
"""Every example runs one control plane of these sizes (tokens per page; pages per tier)."""
MANIFEST = "manifest.toml"
SUFFIX = ".ndjson"
PROMPT = (1, 2, 3, 4, 5)
"""Request 1's prompt in every script: two whole pages (node 1) and a tail page."""

Event = dict[str, object]
Script = Callable[[ControlPlane], None]


@dataclass(frozen=True)
class Example:
    """One file of spec/examples/ and its manifest table. `lines` is the file's text, header
    first (unless the edit removed it); `seq` the first bad event (None: none, or no one
    event is to blame); `base` names the valid trace an invalid one is an edit of (the edit
    is the function of this module named as the example)."""

    name: str
    verdict: str  # valid | violation | malformed
    description: str
    lines: tuple[str, ...]
    seq: int | None = None
    bug_class: str | None = None
    base: str | None = None

    @property
    def file(self) -> str:
        return self.name + SUFFIX

    @property
    def events(self) -> int:
        """Event lines (every line after the header)."""
        return len(self.lines) - 1


# -- valid traces: ControlPlane scripts ----------------------------------------------------


def record(script: Script) -> tuple[str, ...]:
    """Run `script` on a fresh plane of CAPACITIES traced into an NdjsonSink: the lines."""
    header = TraceHeader(PAGE_SIZE, CAPACITIES, engine="hicache control plane")
    stream = io.StringIO()
    cp = ControlPlane(PAGE_SIZE, tuple(CAPACITIES.values()), tracer=Tracer(NdjsonSink(stream, header)))
    # Verify the header written first is the plane's own (spec/trace.md, "Header").
    assert cp.trace_header() == header, f"{cp.trace_header()} != {header}"
    script(cp)
    return tuple(stream.getvalue().splitlines())


def _served(cp: ControlPlane, rid: int, tokens: Sequence[int]) -> None:
    """Request `rid` computes what it misses through its tail page and inserts it (it stays
    live: its prefix lock holds what it inserted)."""
    m = cp.begin_request(rid, tokens)
    cp.compute(rid, -(-len(tokens) // PAGE_SIZE) * PAGE_SIZE - m.lengths[0])
    cp.insert(rid)


def _node(cp: ControlPlane, key_start: int) -> TreeNode:
    """The node whose key starts at token `key_start` of its path (the scripts' nodes differ
    in that)."""
    return next(n for n in cp.tree.nodes() if cp.tree.prefix_tokens(n) - len(n.key) == key_start)


def _back_up(cp: ControlPlane, direction: Direction, node: TreeNode) -> None:
    cp.complete(cp.issue(direction, [node]).op_id)


def write_through_l3(cp: ControlPlane) -> None:
    """Two nodes backed up to L2 and L3, parent first; request 2 extends request 1's prefix."""
    _served(cp, 1, PROMPT)
    _back_up(cp, Direction.D2H, _node(cp, 0))
    cp.end_request(1)
    _served(cp, 2, (1, 2, 3, 4, 6, 7, 8, 9, 10))
    _back_up(cp, Direction.H2S, _node(cp, 0))
    _back_up(cp, Direction.D2H, _node(cp, 4))
    _back_up(cp, Direction.H2S, _node(cp, 4))
    cp.end_request(2)


def _only_in(cp: ControlPlane, tier: str) -> TreeNode:
    """Request 1 computes PROMPT; node 1 is backed up down to `tier` (L2 or L3), then every
    tier above it is evicted."""
    _served(cp, 1, PROMPT)
    node = _node(cp, 0)
    _back_up(cp, Direction.D2H, node)
    if tier == "L3":
        _back_up(cp, Direction.H2S, node)
    cp.end_request(1)
    cp.evict("L1", 8)
    if tier == "L3":
        cp.evict("L2", 8)
    return node


def l3_restore_promotion(cp: ControlPlane) -> None:
    """Request 2 restores node 1 from L3: S2H publishes it in L2 (promotion), H2D in L1, each
    stage pinned (spec/restore.md, "Locks a restore holds"); then `cached_len` covers it."""
    node = _only_in(cp, "L3")
    cp.begin_request(2, PROMPT)
    cp.pin(2, node, "L3")
    cp.complete(cp.issue(Direction.S2H, [node], 2).op_id)
    cp.pin(2, node, "L2")
    cp.complete(cp.issue(Direction.H2D, [node], 2).op_id)
    cp.pin(2, node, "L1")
    cp.advance_cached_len(2, node)
    cp.unpin(2)
    cp.compute(2, PAGE_SIZE)  # the tail page
    cp.insert(2)
    cp.end_request(2)


def failed_h2d_after_promotion(cp: ControlPlane) -> None:
    """The promotion completes, the load-back fails: the promoted L2 copy stays published
    (B02), and request 2 recomputes the prefix (compute, insert)."""
    node = _only_in(cp, "L3")
    cp.begin_request(2, PROMPT)
    cp.pin(2, node, "L3")
    cp.complete(cp.issue(Direction.S2H, [node], 2).op_id)
    cp.pin(2, node, "L2")
    cp.fail(cp.issue(Direction.H2D, [node], 2).op_id)
    cp.unpin(2)
    cp.compute(2, 3 * PAGE_SIZE)
    cp.insert(2)
    cp.end_request(2)


def abort_mid_h2d(cp: ControlPlane) -> None:
    """Request 2's load-back from L2 is cancelled in flight (`h2d_cancel`) and the request
    ends: its pin released, nothing left behind (spec/restore.md)."""
    node = _only_in(cp, "L2")
    cp.begin_request(2, PROMPT)
    cp.pin(2, node, "L2")
    cp.cancel(cp.issue(Direction.H2D, [node], 2).op_id)
    cp.end_request(2)


def failed_s2h_fallback(cp: ControlPlane) -> None:
    """The promotion's read fails its checksum (`s2h_fail`): the pin is released, the slot
    dropped (`invalidate_l3`, the node removed) and request 2 recomputes (compute, insert)."""
    node = _only_in(cp, "L3")
    cp.begin_request(2, PROMPT)
    cp.pin(2, node, "L3")
    cp.fail(cp.issue(Direction.S2H, [node], 2).op_id)
    cp.unpin(2)
    cp.evict_node(node, "L3", "invalidate_l3")
    cp.compute(2, 3 * PAGE_SIZE)
    cp.insert(2)
    cp.end_request(2)


def split_during_pending_op(cp: ControlPlane) -> None:
    """Node 1's backup to L2 is in flight when request 2's match splits it (`split`): the op
    then covers both halves and ends with one event per node, upper first, each with its
    part of the op's one page list (spec/trace.md, rule 4)."""
    _served(cp, 1, PROMPT)
    op = cp.issue(Direction.D2H, [_node(cp, 0)])
    cp.end_request(1)
    _served(cp, 2, (1, 2, 9, 9, 9))
    cp.complete(op.op_id)
    cp.end_request(2)


VALID: dict[str, Script] = {
    "write_through_l3": write_through_l3,
    "l3_restore_promotion": l3_restore_promotion,
    "failed_h2d_after_promotion": failed_h2d_after_promotion,
    "abort_mid_h2d": abort_mid_h2d,
    "failed_s2h_fallback": failed_s2h_fallback,
    "split_during_pending_op": split_during_pending_op,
}
"""Valid examples: name -> script (its docstring is the manifest's description)."""


# -- invalid traces: named edits of valid ones ---------------------------------------------

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
    ev.insert(i, {"event": "evict_l2", "tier": "L2", "node": promoted["node"], "pages": promoted["pages"],
                  "token_start": 0, "token_end": 4, "before": "L2_L3", "after": "L3"})
    return i


def complete_after_cancel(ev: list[Event]) -> int:
    i = _at(ev, "h2d_cancel")
    ev.insert(i + 1, {**ev[i], "event": "h2d_complete", "before": "H2D_PENDING_L2", "after": "L1_L2"})
    return i + 1


def end_with_pending_restore(ev: list[Event]) -> int:
    del ev[_at(ev, "h2d_cancel")]
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
    ev.insert(i, {**ev[_at(ev, "s2h_complete")], "event": "s2h_cancel", "before": "S2H_PENDING_L3", "after": "L3"})
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
    lines[4] = lines[4][:len(lines[4]) // 2]
    return None


EDITS = (
    Edit("l3_restore_promotion", "violation", "B01",
         "request 2's cached_len covers node 1 before the h2d_complete that publishes it in L1 (I5)",
         cached_len_before_publication),
    Edit("failed_h2d_after_promotion", "violation", "B02",
         "the failed load-back's cleanup also ends the promotion that completed (s2h_cancel of "
         "an ended op), returning L2 pages the tree owns", promoted_l2_freed_after_failed_h2d),
    Edit("abort_mid_h2d", "violation", "B03",
         "request 2 ends while its load-back is pending (no h2d_cancel): its target pages outlive it",
         end_with_pending_restore),
    Edit("l3_restore_promotion", "violation", "B04",
         "node 1's promoted L2 copy is evicted between the restore's stages while request 2's "
         "pin locks it", evict_pinned_promotion),
    Edit("abort_mid_h2d", "violation", "B06",
         "a completion for the cancelled load-back: the op ends twice", complete_after_cancel),
    Edit("write_through_l3", "violation", "B06",
         "request 1's tail page is released twice (a double free)", discard_twice),
    Edit("write_through_l3", "violation", "B07",
         "node 2 is backed up to L3 while its parent, node 1, never was", backup_gap),
    Edit("split_during_pending_op", "violation", "B08",
         "after the split, the backup's two end events carry each other's page of the op's list",
         split_op_pages_swapped),
    Edit("split_during_pending_op", "violation", "B08",
         "node 1 is split at a token offset inside a page", split_inside_a_page),
    Edit("l3_restore_promotion", "violation", "B11",
         "request 2 releases its L1 pin twice: a lock count below zero", unlock_twice),
    Edit("write_through_l3", "violation", "B15",
         "request 2 computes into an L1 page node 1 holds (a page handed to two owners)",
         compute_into_published_page),
    Edit("failed_s2h_fallback", "violation", "B15",
         "after its checksum failed and the slot was invalidated (node 1 removed), node 1 is "
         "read from L3 again", serve_invalidated_slot),
    Edit("write_through_l3", "malformed", None, "the header line is missing", no_header),
    Edit("write_through_l3", "malformed", None,
         "the header names trace format version 2", header_version_2),
    Edit("write_through_l3", "malformed", None, "the event with seq 6 is lost", seq_gap),
    Edit("write_through_l3", "malformed", None,
         "an event name that is no transition (h2s_done)", unknown_event),
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


def _edited(edit: Edit, base: tuple[str, ...]) -> Example:
    lines = list(base)
    if edit.verdict == "malformed":
        seq = edit.change(lines)  # type: ignore[arg-type]
    else:
        events: list[Event] = [json.loads(line) for line in lines[1:]]
        bad = edit.change(events)  # type: ignore[arg-type]
        assert isinstance(bad, int)  # Verify: a violation names its first bad event.
        lines, seq = [lines[0], *_renumbered(events)], bad + 1
    return Example(edit.name, edit.verdict, edit.description, tuple(lines), seq, edit.bug_class,
                   edit.base)


def examples() -> list[Example]:
    """Every example, valid ones first, each generated afresh."""
    valid = {name: record(script) for name, script in VALID.items()}
    out = [Example(name, "valid", " ".join((script.__doc__ or "").split()), valid[name])
           for name, script in VALID.items()]
    return out + [_edited(edit, valid[edit.base]) for edit in EDITS]


def manifest(found: Sequence[Example]) -> str:
    """manifest.toml: one table per file, keyed by the file's name."""
    out = ["# The trace examples of this directory: one table per file, written by",
           "# `python3 -m hicache.checktrace.examples spec/examples` (README.md says what each shows).",
           "# verdict: valid (exit 0), violation (exit 1) or malformed (exit 2) under check-trace;",
           "# seq: the first bad event; bug_class: spec/bugclasses.md; base: the valid trace edited (by",
           "# the function of hicache/checktrace/examples.py named as the file).",
           ""]
    for ex in found:
        out.append(f"[{json.dumps(ex.file)}]")
        events = ex.events if ex.verdict == "valid" else None
        fields: dict[str, object] = {"verdict": ex.verdict, "events": events, "seq": ex.seq,
                                     "bug_class": ex.bug_class, "base": ex.base,
                                     "description": ex.description}
        out += [f"{k} = {json.dumps(v)}" for k, v in fields.items() if v is not None]
        out.append("")
    return "\n".join(out)


def files(found: Sequence[Example]) -> dict[str, str]:
    """File name -> text, manifest included."""
    out = {ex.file: "\n".join(ex.lines) + "\n" for ex in found}
    out[MANIFEST] = manifest(found)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m hicache.checktrace.examples",
                                description="Write (or --check) the trace examples and their manifest.")
    p.add_argument("dir", help="the directory (the repository's copy: spec/examples)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each file that differs")
    args = p.parse_args(argv)
    target = Path(args.dir)
    wanted = files(examples())
    if args.check:
        stale = sorted(n for n, text in wanted.items()
                       if not (target / n).is_file() or (target / n).read_text() != text)
        extra = sorted(p.name for p in target.glob(f"*{SUFFIX}") if p.name not in wanted)
        for name in stale + extra:
            print(f"{target / name}: {'not generated here' if name in extra else 'differs'}; "
                  f"rewrite with: python3 -m hicache.checktrace.examples {target}")
        return 1 if stale or extra else 0
    target.mkdir(parents=True, exist_ok=True)
    for name, text in wanted.items():
        (target / name).write_text(text)
    print(f"wrote {len(wanted)} files to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
