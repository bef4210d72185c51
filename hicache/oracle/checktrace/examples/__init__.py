"""The trace examples of spec/examples/, generated so that they cannot rot.

    verdict     how a file is made                                        exit
    ---------   --------------------------------------------------------  ----
    valid       a ControlPlane script traced through an NdjsonSink, the      0
                plane's own header first (valid.py)
    violation   one named edit of a valid trace (edits.py: an event moved,   1
                dropped, repeated, changed or added; seqs renumbered), an
                instance of a bug class of spec/bugclasses.md; `seq` is
                its first bad event
    malformed   one named edit that breaks the format (spec/trace.md)        2
    partial     another example as an engine that omits parts of the trace   0 or 1
                would emit it (partial.py); what is left is still checked

`spec/examples/manifest.toml` has one table per file: verdict, `seq` (the first bad event,
where one event is to blame), bug class, the example it was made from, a one-line description. The
files and the manifest are written by

    python3 -m hicache.oracle.checktrace.examples spec/examples           # (re)write them
    python3 -m hicache.oracle.checktrace.examples --check spec/examples   # exit 1 on any difference

and tests/test_trace_examples.py fails when the committed files differ from what this package
writes, or when `hicache.oracle.checktrace.check_lines` disagrees with a manifest verdict.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hicache.oracle.checktrace.examples.edits import EDITS, edited
from hicache.oracle.checktrace.examples.partial import PARTIALS, stripped
from hicache.oracle.checktrace.examples.valid import VALID, record

MANIFEST = "manifest.toml"
SUFFIX = ".ndjson"


@dataclass(frozen=True)
class Example:
    """One file of spec/examples/ and its manifest table. `lines` is the file's text, header
    first (unless the edit removed it); `seq` the first bad event (None: none, or no one
    event is to blame); `base` names the valid trace an invalid one is an edit of (the edit
    is the function of edits.py named as the example)."""

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


def examples() -> list[Example]:
    """Every example, each generated afresh: the valid ones, their edits, then the partial
    traces made of either."""
    valid = {name: record(script) for name, script in VALID.items()}
    out = [
        Example(name, "valid", " ".join((script.__doc__ or "").split()), valid[name])
        for name, script in VALID.items()
    ]
    for edit in EDITS:
        lines, seq = edited(edit, valid[edit.base])
        out.append(
            Example(
                edit.name, edit.verdict, edit.description, lines, seq, edit.bug_class, edit.base
            )
        )
    by_name = {ex.name: ex for ex in out}
    for p in PARTIALS:
        source = by_name[p.source]
        lines, seq = stripped(p, source.lines, source.seq)
        out.append(Example(p.name, p.verdict, p.description, lines, seq, p.bug_class, p.source))
    return out


def manifest(found: Sequence[Example]) -> str:
    """manifest.toml: one table per file, keyed by the file's name."""
    out = [
        "# The trace examples of this directory: one table per file, written by",
        "# `python3 -m hicache.oracle.checktrace.examples spec/examples` "
        "(README.md says what each shows).",
        "# verdict: valid (exit 0), violation (exit 1) or malformed (exit 2) under check-trace;",
        "# seq: the first bad event; bug_class: spec/bugclasses.md; base: the example it was made",
        "# from (by the edit of hicache/oracle/checktrace/examples/edits.py named as the file, or as a",  # noqa: E501
        "# partial trace: partial.py).",
        "",
    ]
    for ex in found:
        out.append(f"[{json.dumps(ex.file)}]")
        events = ex.events if ex.verdict == "valid" else None
        fields: dict[str, object] = {
            "verdict": ex.verdict,
            "events": events,
            "seq": ex.seq,
            "bug_class": ex.bug_class,
            "base": ex.base,
            "description": ex.description,
        }
        out += [f"{k} = {json.dumps(v)}" for k, v in fields.items() if v is not None]
        out.append("")
    return "\n".join(out)


def files(found: Sequence[Example]) -> dict[str, str]:
    """File name -> text, manifest included."""
    out = {ex.file: "\n".join(ex.lines) + "\n" for ex in found}
    out[MANIFEST] = manifest(found)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m hicache.oracle.checktrace.examples",
        description="Write (or --check) the trace examples and their manifest.",
    )
    p.add_argument("dir", help="the directory (the repository's copy: spec/examples)")
    p.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 naming each file that differs"
    )
    args = p.parse_args(argv)
    target = Path(args.dir)
    wanted = files(examples())
    if args.check:
        stale = sorted(
            n
            for n, text in wanted.items()
            if not (target / n).is_file() or (target / n).read_text() != text
        )
        extra = sorted(p.name for p in target.glob(f"*{SUFFIX}") if p.name not in wanted)
        for name in stale + extra:
            print(
                f"{target / name}: {'not generated here' if name in extra else 'differs'}; "
                f"rewrite with: python3 -m hicache.oracle.checktrace.examples {target}"
            )
        return 1 if stale or extra else 0
    target.mkdir(parents=True, exist_ok=True)
    for name, text in wanted.items():
        (target / name).write_text(text)
    print(f"wrote {len(wanted)} files to {target}")
    return 0
