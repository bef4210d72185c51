"""l3.md's L3 header table against `l3format.LAYOUT`."""

from __future__ import annotations

from hicache.dataplane.l3format import LAYOUT
from hicache.oracle.speccheck.mdtables import _normalise, parse_tables

L3_HEADER_COLUMNS = ("offset", "size", "field", "meaning")


def check_l3_header(readme: str) -> list[str]:
    """l3.md's table with columns `L3_HEADER_COLUMNS` lists `l3format.LAYOUT`, in order."""
    found = [t for t in parse_tables(readme) if t.headers == L3_HEADER_COLUMNS]
    if len(found) != 1:
        columns = ", ".join(L3_HEADER_COLUMNS)
        return [f"l3.md: {len(found)} L3 header tables (columns {columns}), want 1"]
    want = [(str(f.offset), str(f.size), f.name, _normalise(f.meaning)) for f in LAYOUT]
    have = [(line, tuple(row[c] for c in L3_HEADER_COLUMNS)) for line, row in found[0].rows]
    problems = [
        f"l3.md line {line}: L3 header row {' | '.join(row)!r}, the code has {' | '.join(w)!r}"
        for (line, row), w in zip(have, want)
        if row != w
    ]
    if len(have) != len(want):
        problems.append(f"l3.md: L3 header table has {len(have)} rows, the code {len(want)}")
    return problems
