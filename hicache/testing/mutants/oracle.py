"""check-trace's own failure modes: bugs in the oracle the fuzz judges (its self-check).

Each is a comparison or a map of `hicache check-trace` that stops seeing one kind of wrong
trace; the fuzz alone catches it because every run corrupts its own trace with the catalogue
of illegal edits (hicache/oracle/checktrace/illegal.py) and requires check-trace to reject each
(hicache/testing/selfcheck.py): the edit the broken comparison lets through is a failure of
the run, "check-trace accepted an illegal edit". Registered in `hicache.testing.mutants` (its
table names each one); `ZOO` lists this module's mutants in the order `hicache fuzz --mutant
list` prints them.
"""

from __future__ import annotations

import contextlib
from typing import Any

from hicache.testing.mutants.base import Mutant, swapped


def _pages_count() -> contextlib.AbstractContextManager[None]:
    """An eviction's or a release's pages are compared by count only: they unbind the
    reference's pages, whichever pages the trace names (a free or release of pages the
    engine never held, or another node's, passes)."""
    from hicache.oracle.checktrace.compare import HELD_PAGES, Comparer, Mismatch

    original = Comparer.__dict__["_pages"]

    def _pages(self: Any, ref: Any, got: Any) -> None:
        op = self.effect.get(ref.event) or HELD_PAGES.get(ref.event)
        if op not in ("release", "free"):
            return original(self, ref, got)  # type: ignore[no-any-return]
        if len(got.pages) != len(ref.pages):
            raise Mismatch(
                f"pages: the trace moves {len(got.pages)} page(s), the reference {len(ref.pages)}",
                ref,
            )
        self.pages[ref.tier].unbind(ref.pages)
        return None

    return swapped(Comparer, "_pages", _pages)


def _two_ids() -> contextlib.AbstractContextManager[None]:
    """The id map binds an engine id seen for the first time to the reference's node without
    asking whether that node has an id already: one node named by two ids passes."""
    from hicache.oracle.checktrace.maps import IdMap

    original = IdMap.__dict__["match"]

    def match(self: Any, engine: int, ref: int) -> str | None:
        if engine in self.to_ref:
            return original(self, engine, ref)  # type: ignore[no-any-return]
        self.to_ref[engine] = ref
        self.to_engine[ref] = engine
        return None

    return swapped(IdMap, "match", match)


def _no_before() -> contextlib.AbstractContextManager[None]:
    """The field-by-field comparison compares `before` with the reference's own (a typo): a
    wrong `before` passes (the fast path sends it there, where nothing differs)."""
    from hicache.oracle.checktrace.compare import Comparer

    original = Comparer.__dict__["_same"]

    def _same(self: Any, key: str, want: object, have: object, ref: Any) -> None:
        original(self, key, want, want if key == "before" else have, ref)

    return swapped(Comparer, "_same", _same)


def _seq_repeat() -> contextlib.AbstractContextManager[None]:
    """The reader refuses a gap in `seq` but takes a line that repeats (or steps back to) an
    earlier seq as the next event: a line written twice is replayed as an event again."""
    from hicache.oracle.checktrace.reader import Malformed, TraceReader

    original = TraceReader.__dict__["parse"]

    def parse(self: Any, text: str) -> Any:
        try:
            return original(self, text)
        except Malformed as e:
            if e.seq is None or "is due" not in e.why or e.seq > self.seq:
                raise
            self.seq = e.seq - 1  # "no gap": the line is taken as the next event
            return original(self, text)

    return swapped(TraceReader, "parse", parse)


def _walk_no_continuity() -> contextlib.AbstractContextManager[None]:
    """The walk judges each event's (before, after) by the tables' machine but forgets each
    node's walk: an event that does not start where the node's previous one left it passes
    (a dropped, repeated or reordered transition is then invisible to it)."""
    from hicache.core.tracewalk import Walker

    original = Walker.__dict__["step"]

    def step(self: Any, e: Any) -> Any:
        if e.node is not None and e.before is not None:
            self.nodes.pop(e.node, None)  # each state event judged as if the node's first
        return original(self, e)

    return swapped(Walker, "step", step)


ZOO: tuple[Mutant, ...] = (
    Mutant(
        "oracle-pages-count",
        "-",
        "checktrace Comparer._pages",
        "check-trace compares an eviction's or a release's pages by count only",
        _pages_count,
    ),
    Mutant(
        "oracle-two-ids",
        "-",
        "checktrace IdMap.match",
        "check-trace's id map lets one node (or op) be named by two ids",
        _two_ids,
    ),
    Mutant(
        "oracle-no-before",
        "-",
        "checktrace Comparer._same",
        "check-trace compares `before` with the reference's own: a wrong one passes",
        _no_before,
    ),
    Mutant(
        "oracle-seq-repeat",
        "-",
        "checktrace TraceReader.parse",
        "check-trace's reader refuses a gap in seq but replays a repeated line",
        _seq_repeat,
    ),
    Mutant(
        "walk-no-continuity",
        "-",
        "tracewalk Walker.step",
        "the walk judges each step by the machine but not where the node's walk left it",
        _walk_no_continuity,
    ),
)
