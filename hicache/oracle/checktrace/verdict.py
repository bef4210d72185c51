"""The checker's answer: an exit code, how far it got, where it stopped, and the report."""

from __future__ import annotations

from dataclasses import dataclass

VALID = 0
"""Exit code: every event was enabled and matched the reference; every invariant held."""

VIOLATION = 1
"""Exit code: an event was not enabled, differed from the reference, or broke an invariant."""

MALFORMED = 2
"""Exit code: the input is not a readable trace (JSON, header, schema, seq, tiers)."""

UNJUDGED = 3
"""Exit code: every event up to `seq` was enabled and matched the reference; event `seq` is
a second L1 copy of a page a load-back is filling, which the header's `duplicate_copies`
allows and the reference does not model (spec/tree.md, "Duplicate copies"): the rest of the
trace is not judged."""


@dataclass(frozen=True)
class Verdict:
    """`exit_code` (VALID / VIOLATION / MALFORMED / UNJUDGED); `events` read and checked;
    `seq` of the first bad (or, UNJUDGED, unjudged) event (None when valid, or malformed
    before any event could be read, e.g. a bad header); `message` the report: one line when
    valid, malformed or unjudged, several for a violation."""

    exit_code: int
    events: int
    seq: int | None
    message: str
