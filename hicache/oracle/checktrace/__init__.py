"""`hicache check-trace`: judge a trace an engine emitted against the reference.

from hicache.oracle.checktrace import check_lines, Verdict
v = check_lines(open("trace.ndjson"))   # header first; streamed
v.exit_code, v.events, v.seq, v.message

module        one concept
------------  ---------------------------------------------------------------------
schema.py     spec/trace.schema.json compiled into per-event validators
fastschema.py the schema's yes/no fast path
reader.py     header + lines -> checked events; `Malformed` (exit 2)
dispatch.py   which ControlPlane call the next events stand for
maps.py       engine ids and pages <-> the reference's
compare.py    one reference event against one trace event
report.py     the state before a bad event and the transitions enabled then
invariants.py when the invariant checks run, and on what scope
touched.py    the incremental all-clear over what one call touched
replay.py     the loop: `check_lines`
verdict.py    `Verdict` and the exit codes
command.py    the command line (`hicache check-trace FILE`)
generate.py   long valid traces from hicache's controller (tests, benchmark)
"""

from __future__ import annotations

from hicache.oracle.checktrace.replay import check_lines
from hicache.oracle.checktrace.verdict import MALFORMED, VALID, VIOLATION, Verdict

__all__ = ["MALFORMED", "VALID", "VIOLATION", "Verdict", "check_lines"]
