"""A violation report names things by the trace's own ids (spec/appendix-tools.md, "check-trace").

The reference numbers its nodes, ops and pages its own way; the maps (maps.py) bind them to
the trace's. A report names what the trace names -- `trace node 7`, `trace op 3`, `trace
request 2`, `trace L2 page 9` -- and a reference id only where the trace has none for it:
`the reference's node 4 (unnamed in the trace)`. What the reference itself says (a refused
call's message, an invariant's report) speaks of its own ids; `TraceNames` rewrites them:

    the reference says      a report says
    ----------------------  --------------------------------------------------------------
    node 4, nodes [4, 5]    trace node 7, trace nodes [7, 8]
    op 2, ops [2]           trace op 3, trace ops [3]
    request 2               trace request 2 (requests are not mapped: the trace's own ids)
    I1 ... pages 0,1        I1 ... trace pages 9,10 (through the tier's page map)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from hicache.invariants.violation import Violation
from hicache.oracle.checktrace.maps import IdMap, PageMap

_MENTION = re.compile(r"\b(node|op|request)(s|\(s\))? (\[[0-9, ]*\]|[0-9]+\b)")
"""An id the reference's text names: `node 4`, `nodes [4, 5]`, `node(s) [4]`, `op 2`,
`request 2`."""


class TraceNames:
    """The reference's ids, as a report on the trace names them."""

    def __init__(self, nodes: IdMap, ops: IdMap, pages: Mapping[str, PageMap]) -> None:
        self.maps = {"node": nodes, "op": ops}
        self.pages = pages

    def text(self, said: str) -> str:
        """`said` (the reference's words, its ids) with every node, op and request it names
        in the trace's ids."""
        return _MENTION.sub(self._mention, said)

    def violation(self, v: Violation | object) -> str:
        """An invariant's report (`Violation.__str__`'s shape) in the trace's ids."""
        if not isinstance(v, Violation):
            return self.text(str(v))
        parts = [v.invariant, v.name]
        if v.tier is not None:
            parts.append(f"[{v.tier}]")
        if v.pages:
            parts.append(self._pages(v.tier, v.pages))
        for kind, ids in (("node", v.nodes), ("op", v.ops)):
            if ids:
                parts.append(f"trace {kind}s {self._ids(kind, ids)}")
        return f"{' '.join(parts)}: {self.text(v.message)}"

    def _mention(self, m: re.Match[str]) -> str:
        kind, plural, ids = m.group(1), m.group(2) or "", m.group(3)
        if ids.startswith("["):
            listed = [int(i) for i in ids[1:-1].split(",") if i.strip()]
            return f"trace {kind}{plural} [{self._ids(kind, listed, ', ')}]"
        if kind == "request":
            return f"trace request {ids}"
        return self.maps[kind].engine_name(int(ids))

    def _ids(self, kind: str, refs: Sequence[int], sep: str = ",") -> str:
        """The trace's ids of `refs` (requests: the same); a ref the trace never named is
        written `reference <id>`."""
        m = self.maps.get(kind)
        out = []
        for r in refs:
            engine = r if m is None else m.to_engine.get(r)
            out.append(f"reference {r}" if engine is None else str(engine))
        return sep.join(out)

    def _pages(self, tier: str | None, refs: Sequence[int]) -> str:
        m = self.pages.get(tier or "")
        named = [None if m is None else m.to_engine.get(int(p)) for p in refs]
        if any(n is None for n in named):  # a trace without pages, or pages it never named
            return f"the reference's pages {','.join(str(p) for p in refs)}"
        return f"trace pages {','.join(str(n) for n in named)}"
